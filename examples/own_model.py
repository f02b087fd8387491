"""Your own PyTorch model: by import path (YAML/CLI) or as the class itself (Python).

Run: python examples/own_model.py

From the command line, the model is named by import path, 'package.module:Class' or 'path/to/file.py:Class':

    fedhet run --dataset digits --set dataset.image=true --model torch \
        --set model.target=examples/my_nets.py:CNN --set model.kwargs.channels=8 --rounds 5
"""

from __future__ import annotations

import sys
from pathlib import Path

import torch
from torch import nn

import fedhet

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))  # so that `import my_nets` below works from any folder

from my_nets import CNN  # noqa: E402

BASE = {
    "dataset": {"name": "digits", "image": True},  # scikit-learn's 8x8 digits as (1, 8, 8) images
    "num_clients": 10,
    "clients_per_round": 5,
    "rounds": 5,
    "local": {"steps": 10, "lr": 0.3, "batch_size": 16},
}


def main() -> None:
    # 1. by import path, as in a YAML file; kwargs go to the constructor, input_shape and num_classes are added
    by_path = fedhet.run(
        {**BASE, "model": {"name": "torch", "target": f"{HERE / 'my_nets.py'}:CNN", "kwargs": {"channels": 8}}}
    )
    print(f"by import path: test accuracy {by_path.final['test_accuracy']:.3f}")

    # 2. the class itself, from Python (kwargs as in a YAML file)
    by_class = fedhet.run({**BASE, "model": {"name": "torch", "target": CNN, "kwargs": {"channels": 8}}})
    print(f"the class:      test accuracy {by_class.final['test_accuracy']:.3f}")

    # 3. the final global model, back in a module of your own
    net = CNN((1, 8, 8), 10, channels=8)
    net.load_state_dict(by_class.state_dict)
    digits = fedhet.datasets.load({"name": "digits", "image": True})
    with torch.no_grad():
        accuracy = (net(digits.x).argmax(1) == digits.y).float().mean()
    print(f"the trained CNN on all 1,797 digits: accuracy {accuracy:.3f}")

    # 4. BatchNorm's running statistics are model state: averaged like the parameters (model.batch_norm: aggregate),
    #    or each client's own with FedBN (algorithm: fedbn); docs/batchnorm.md
    class WithBatchNorm(nn.Module):
        def __init__(self, num_classes: int) -> None:
            super().__init__()
            self.net = nn.Sequential(nn.Conv2d(1, 4, 3), nn.BatchNorm2d(4), nn.Flatten(), nn.Linear(144, num_classes))

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return self.net(x)

    shared = fedhet.run({**BASE, "model": WithBatchNorm})
    fedbn = fedhet.run({**BASE, "model": WithBatchNorm, "algorithm": "fedbn", "personal_eval": {"appeal": False}})
    print(f"with batch norm: FedAvg {shared.final['test_accuracy']:.3f}, ", end="")
    print(f"FedBN's own models {fedbn.final['personal_test_accuracy']:.3f}")
    print(f"averaged statistics: net.1.running_mean {shared.state_dict['net.1.running_mean'].tolist()}")


if __name__ == "__main__":
    main()
