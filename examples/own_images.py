"""Your own image folder: one subfolder per class, PNG files, and a CNN of your own by import path.

Run: python examples/own_images.py   (writes shapes/ and runs/own_images in the current folder)

The same run from the command line:

    fedhet run --dataset image_folder --set dataset.path=shapes --set dataset.grayscale=true \
        --model torch --set model.target=examples/my_nets.py:CNN --set model.kwargs.channels=4 \
        --set num_clients=8 --set clients_per_round=4 --rounds 10 --out runs/own_images_cli
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
from PIL import Image

import fedhet

HERE = Path(__file__).resolve().parent


def write_shapes(root: Path, per_class: int = 40, side: int = 16) -> None:
    """Noisy 16x16 images of three classes: horizontal bars, vertical bars, and a diagonal."""
    rng = np.random.default_rng(0)
    for cls in ("horizontal", "vertical", "diagonal"):
        (root / cls).mkdir(parents=True, exist_ok=True)
        for i in range(per_class):
            img = rng.integers(0, 80, (side, side))
            k = rng.integers(2, side - 2)
            if cls == "horizontal":
                img[k - 1 : k + 1, :] = 255
            elif cls == "vertical":
                img[:, k - 1 : k + 1] = 255
            else:
                np.fill_diagonal(img, 255)
            Image.fromarray(img.astype(np.uint8)).save(root / cls / f"{i:03d}.png")


def main() -> None:
    write_shapes(Path("shapes"))
    config = {
        "dataset": {"name": "image_folder", "path": "shapes", "grayscale": True},
        "partition": {"name": "dirichlet", "alpha": 1.0},
        "num_clients": 8,
        "clients_per_round": 4,
        "model": {"name": "torch", "target": f"{HERE / 'my_nets.py'}:CNN", "kwargs": {"channels": 4}},
        "rounds": 10,
        "local": {"steps": 5, "lr": 0.1, "batch_size": 8},
    }
    result = fedhet.run(config, out="runs/own_images", overwrite=True)
    print(f"{result.status}: test accuracy {result.final['test_accuracy']:.3f} on {len(result.clients)} clients")
    print("model tensors:", ", ".join(f"{k} {tuple(v.shape)}" for k, v in result.state_dict.items()))


if __name__ == "__main__":
    main()
