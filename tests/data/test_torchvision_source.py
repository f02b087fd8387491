"""torchvision datasets as a Dataset (`torchvision` source).

torchvision is not installed with fedhet, so these tests put a small stand-in package on the path that has
the attributes fedhet reads from torchvision's dataset classes (MNIST's uint8 tensor ``data`` (N, H, W) and
``targets``; CIFAR's NumPy ``data`` (N, H, W, C); SVHN's ``data`` (N, C, H, W), ``labels`` and ``split``;
others returning (PIL image, label) items) and their constructor signatures.
"""

from __future__ import annotations

import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch

from fedhet.datasets import load
from fedhet.errors import DataError

STAND_IN = """
import numpy as np
import torch
from PIL import Image


def _found(root, name, download):
    import os

    if not (download or os.path.isdir(os.path.join(root, name))):
        raise RuntimeError("Dataset not found. You can use download=True to download it")


class MNIST:
    classes = [str(i) for i in range(10)]

    def __init__(self, root, train=True, transform=None, target_transform=None, download=False):
        _found(root, "MNIST", download)
        n = 4 if train else 2
        self.data = torch.arange(n * 9, dtype=torch.uint8).reshape(n, 3, 3) * (1 if train else 2)
        self.targets = torch.arange(n) % 10


class CIFAR10:
    classes = ["plane", "car", "bird"]

    def __init__(self, root, train=True, transform=None, target_transform=None, download=False):
        n = 3 if train else 1
        self.data = np.full((n, 2, 2, 3), 10 if train else 20, dtype=np.uint8)
        self.data[:, :, :, 1] = 100
        self.targets = [i % 3 for i in range(n)]


class SVHN:
    def __init__(self, root, split="train", transform=None, target_transform=None, download=False):
        n = {"train": 3, "test": 2, "extra": 5}[split]
        self.data = np.zeros((n, 3, 2, 2), dtype=np.uint8)
        self.labels = np.arange(n) % 10


class Flowers:
    def __init__(self, root, split="train", transform=None, download=False):
        self.sizes = [(3, 2), (3, 2)] if split == "train" else [(3, 2), (4, 4)]

    def __len__(self):
        return len(self.sizes)

    def __getitem__(self, i):
        return Image.new("RGB", self.sizes[i], (255, 0, 0)), i
"""


@pytest.fixture
def torchvision(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    package = tmp_path / "site" / "torchvision"
    package.mkdir(parents=True)
    (package / "__init__.py").write_text("")
    (package / "datasets.py").write_text(textwrap.dedent(STAND_IN))
    monkeypatch.syspath_prepend(str(tmp_path / "site"))
    for name in ("torchvision", "torchvision.datasets"):
        monkeypatch.delitem(sys.modules, name, raising=False)
    yield tmp_path
    for name in ("torchvision", "torchvision.datasets"):
        sys.modules.pop(name, None)


def tv(tmp: Path, **spec: object) -> object:
    return load({"name": "torchvision", **spec}, data_dir=tmp / "data")


def test_mnist_train_and_test_are_concatenated(torchvision: Path) -> None:
    (torchvision / "data" / "torchvision" / "MNIST").mkdir(parents=True)
    data = tv(torchvision, dataset="MNIST", normalize=False)
    assert data.x.shape == (6, 1, 3, 3) and data.num_classes == 10 and data.name == "mnist"
    assert data.y.tolist() == [0, 1, 2, 3, 0, 1]
    assert torch.isclose(data.x[1, 0, 0, 0], torch.tensor(9 / 255))  # train image 1, first pixel 9
    assert torch.isclose(data.x[5, 0, 0, 0], torch.tensor(9 * 2 / 255))  # test image 1, doubled


def test_channels_last_arrays_and_labels_attribute(torchvision: Path) -> None:
    cifar = tv(torchvision, dataset="CIFAR10", normalize=False)
    assert cifar.x.shape == (4, 3, 2, 2) and cifar.num_classes == 3
    assert torch.allclose(cifar.x[:, 1], torch.full((4, 2, 2), 100 / 255))
    svhn = tv(torchvision, dataset="SVHN", kwargs={"split": "extra"})
    assert svhn.x.shape == (5, 3, 2, 2) and svhn.y.tolist() == [0, 1, 2, 3, 4]


def test_datasets_without_a_data_array_are_decoded_item_by_item(torchvision: Path) -> None:
    data = tv(torchvision, dataset="Flowers", normalize=False)
    assert data.x.shape == (2, 3, 2, 3) and torch.allclose(data.x[:, 0], torch.ones(2, 2, 3))
    with pytest.raises(DataError, match="images differ in size"):
        tv(torchvision, dataset="Flowers", kwargs={"split": "test"})


def test_one_line_errors(torchvision: Path) -> None:
    with pytest.raises(DataError, match=r"^dataset 'torchvision': torchvision has no dataset 'MINST' \(did you mean"):
        tv(torchvision, dataset="MINST")
    with pytest.raises(DataError, match=r"Dataset not found.*; rerun with --download$"):
        tv(torchvision, dataset="MNIST")
    with pytest.raises(DataError, match=r"SVHN\(...\) rejects kwargs"):
        tv(torchvision, dataset="SVHN", kwargs={"colour": True})


def test_without_torchvision_the_error_says_what_to_install(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setitem(sys.modules, "torchvision", None)  # makes `import torchvision` fail
    with pytest.raises(DataError, match="needs torchvision: pip install torchvision"):
        tv(tmp_path, dataset="MNIST")


def test_a_torchvision_that_does_not_load_is_a_one_line_error(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A torchvision build made for another torch fails at import with a RuntimeError (seen with a CUDA build of
    torchvision next to the CPU build of torch)."""
    package = tmp_path / "site" / "torchvision"
    package.mkdir(parents=True)
    (package / "__init__.py").write_text("raise RuntimeError('operator torchvision::nms does not exist')\n")
    monkeypatch.syspath_prepend(str(tmp_path / "site"))
    monkeypatch.delitem(sys.modules, "torchvision", raising=False)
    monkeypatch.delitem(sys.modules, "torchvision.datasets", raising=False)
    with pytest.raises(DataError, match=r"^[^\n]*torchvision is installed but does not load \(RuntimeError: operator"):
        tv(tmp_path, dataset="MNIST")
