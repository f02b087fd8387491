"""CIFAR-10 files in the real format (python pickles of uint8 (N, 3072) images and their labels), small, for
recipes that read CIFAR-10 (`fedhet.data.real.CIFAR10`). Their digests are not the published ones: set
``FEDHET_SKIP_CHECKSUMS=1`` to load them."""

from __future__ import annotations

import pickle
from pathlib import Path

import numpy as np

from fedhet.data.real import CIFAR10_BATCHES


def write_cifar10(data_dir: Path, per_batch: int = 20, seed: int = 0) -> Path:
    """``data_dir/cifar10/cifar-10-batches-py/`` with the five training batches and the test batch, `per_batch`
    random images each, every class in turn."""
    folder = data_dir / "cifar10" / "cifar-10-batches-py"
    folder.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(seed)
    for i, name in enumerate(CIFAR10_BATCHES):
        data = rng.integers(0, 256, size=(per_batch, 3072), dtype=np.uint8)
        labels = [(i + j) % 10 for j in range(per_batch)]
        (folder / name).write_bytes(pickle.dumps({b"data": data, b"labels": labels, b"batch_label": name.encode()}))
    return folder
