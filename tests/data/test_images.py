"""Image folders (one subfolder per class, PNG/JPEG) as a Dataset (`image_folder` source)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from PIL import Image

from fedhet.datasets import load
from fedhet.errors import DataError

ONE_LINE = "^[^\n]+$"


def save(path: Path, pixels: np.ndarray, mode: str | None = None) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    Image.fromarray(pixels.astype(np.uint8), mode=mode).save(path)
    return path


def folder(path: Path, **spec: Any) -> Any:
    return load({"name": "image_folder", "path": str(path), **spec})


def test_classes_are_sorted_subfolders_and_pixels_are_exact(tmp_path: Path) -> None:
    save(tmp_path / "dog" / "a.png", np.full((2, 3), 255))
    save(tmp_path / "cat" / "b.png", np.zeros((2, 3)))
    save(tmp_path / "cat" / "nested" / "c.PNG", np.full((2, 3), 51))
    (tmp_path / "cat" / "notes.txt").write_text("ignored")
    data = folder(tmp_path, grayscale=True, normalize=False)
    assert data.x.shape == (3, 1, 2, 3) and data.num_classes == 2
    assert data.y.tolist() == [0, 0, 1]  # cat/b.png, cat/nested/c.PNG, dog/a.png
    assert torch.allclose(data.x[:, 0, 0, 0], torch.tensor([0.0, 0.2, 1.0]))


def test_rgb_jpeg_and_palette_images_become_three_channels(tmp_path: Path) -> None:
    rng = np.random.default_rng(0)
    save(tmp_path / "a" / "1.jpg", rng.integers(0, 255, (4, 4, 3)))
    save(tmp_path / "b" / "2.png", rng.integers(0, 255, (4, 4, 4)), mode="RGBA")
    Image.fromarray(rng.integers(0, 255, (4, 4)).astype(np.uint8)).convert("P").save(tmp_path / "b" / "3.gif")
    data = folder(tmp_path)
    assert data.x.shape == (3, 3, 4, 4)
    # standardised per channel over the whole dataset
    assert torch.allclose(data.x.mean(dim=(0, 2, 3)), torch.zeros(3), atol=1e-5)
    assert torch.allclose(data.x.std(dim=(0, 2, 3), unbiased=False), torch.ones(3), atol=1e-4)


def test_size_resizes_every_image(tmp_path: Path) -> None:
    save(tmp_path / "a" / "1.png", np.zeros((10, 6)))
    save(tmp_path / "b" / "2.png", np.zeros((3, 5)))
    data = folder(tmp_path, size=[4, 7], grayscale=True)
    assert data.x.shape == (2, 1, 4, 7)


def test_users_from_file_names(tmp_path: Path) -> None:
    for cls in ("a", "b"):
        for user in ("ann", "bob"):
            save(tmp_path / cls / f"{user}_{cls}.png", np.zeros((2, 2)))
    data = folder(tmp_path, grayscale=True, user_pattern="^([^_]+)_")
    assert data.users is not None and data.users.tolist() == [0, 1, 0, 1]


@pytest.mark.parametrize(
    ("layout", "spec", "message"),
    [
        ({"a/1.png": (2, 2), "b/2.png": (3, 2)}, {}, "images differ in size: 'a/1.png' is 2x2, 'b/2.png' is 3x2"),
        ({"a/1.png": (2, 2)}, {}, "has 1 class subfolder(s)"),
        ({"a/1.png": (2, 2), "b/readme.txt": None}, {}, "class folder '"),
        ({"a/1.png": (2, 2), "b/2.png": "garbage"}, {}, "cannot decode '"),
        ({"a/1.png": (2, 2), "b/x.png": (2, 2)}, {"user_pattern": "^(u)"}, "user_pattern finds no user in 'a/1.png'"),
        ({"a/1.png": (2, 2), "b/x.png": (2, 2)}, {"user_pattern": "("}, "user_pattern is not a regular expression"),
    ],
)
def test_bad_folders_are_one_line_errors(
    tmp_path: Path, layout: dict[str, Any], spec: dict[str, Any], message: str
) -> None:
    for name, content in layout.items():
        path = tmp_path / name
        path.parent.mkdir(parents=True, exist_ok=True)
        if isinstance(content, tuple):
            save(path, np.zeros(content))
        else:
            path.write_text(content or "text")
    with pytest.raises(DataError, match=ONE_LINE) as err:
        folder(tmp_path, **spec)
    assert message in str(err.value), str(err.value)


def test_a_file_instead_of_a_folder(tmp_path: Path) -> None:
    save(tmp_path / "one.png", np.zeros((2, 2)))
    with pytest.raises(DataError, match="is not a folder"):
        folder(tmp_path / "one.png")
