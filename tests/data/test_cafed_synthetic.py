"""CA-Fed's datasets: App. F synthetic task (two groups, 20% label noise in the second), label-swapped groups."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

from fedhet.catalog import DATASETS, PARTITIONERS
from fedhet.data.cafed_synthetic import CAFedSynthetic, SwappedGroups, sigmoid
from fedhet.data.embedded import Digits
from fedhet.data.federate import federate
from fedhet.data.real import MNIST_FILES
from fedhet.errors import ConfigError
from fedhet.seeding import numpy_rng


def test_synthetic_layout_and_label_noise() -> None:
    source = CAFedSynthetic(clients=4, dim=10, samples=4000)
    data = source.load(Path("unused"))
    assert data.x.shape == (16_000, 10) and data.num_classes == 2
    np.testing.assert_array_equal(data.users.numpy(), np.repeat(np.arange(4), 4000))  # type: ignore[union-attr]
    np.testing.assert_array_equal(source.group_of_clients(), [0, 0, 1, 1])
    w_star = numpy_rng(42, "cafed-synthetic").normal(0.0, 1.0, 10)  # the generator's first draw
    s = sigmoid(data.x.double().numpy() @ w_star)
    y = data.y.numpy()
    clean, noisy = slice(0, 8000), slice(8000, 16_000)
    # E[y | x] = σ in group 1, 0.8σ + 0.2(1 − σ) in group 2
    assert abs((y[clean] - s[clean]).mean()) < 0.02
    assert abs((y[noisy] - (0.8 * s[noisy] + 0.2 * (1 - s[noisy]))).mean()) < 0.02
    agree = (y == (s > 0.5)).astype(float)
    assert agree[clean].mean() - agree[noisy].mean() == pytest.approx(0.2 * (2 * agree[clean].mean() - 1), abs=0.03)
    again = CAFedSynthetic(clients=4, dim=10, samples=4000).load(Path("unused"))
    assert torch.equal(again.y, data.y)


def test_synthetic_federates_one_client_per_user() -> None:
    source = DATASETS.build({"name": "cafed_synthetic", "samples": 200})
    data = federate(source.load(Path("unused")), PARTITIONERS.build("natural"), 24, test_fraction=0.25, seed=1)
    assert data.num_clients == 24
    assert (data.train.sizes == 150).all() and (data.test.sizes == 50).all()


def test_swapped_groups_on_digits() -> None:
    source = SwappedGroups(base="digits", clients=24, pairs=2)
    base = Digits().load(Path("unused"))
    data = source.load(Path("unused"))
    users = data.users.numpy()  # type: ignore[union-attr]
    sizes = np.bincount(users)
    assert len(sizes) == 24 and sizes.max() - sizes.min() <= 1
    assert torch.equal(data.x, base.x)
    first, second = users < 12, users >= 12
    np.testing.assert_array_equal(data.y.numpy()[first], base.y.numpy()[first])  # group 1 untouched
    table = source.swap_tables(10)[1]
    assert (table != np.arange(10)).sum() == 4 and (table[table] == np.arange(10)).all()  # two disjoint swaps
    np.testing.assert_array_equal(data.y.numpy()[second], table[base.y.numpy()[second]])
    both = SwappedGroups(base="digits", swapped=[0, 1]).swap_tables(10)
    assert set(both) == {0, 1}
    with pytest.raises(ConfigError, match="does not exist"):
        SwappedGroups(base="digits", swapped=[2]).load(Path("unused"))


def test_swapped_groups_read_mnist_idx_files(tmp_path: Path) -> None:
    folder = tmp_path / "mnist"
    folder.mkdir()
    rng = np.random.default_rng(0)
    for name, n in zip(MNIST_FILES, (30, 30, 18, 18), strict=True):  # IDX: magic, dims, uint8 payload
        array = rng.integers(0, 256, (n, 28, 28)) if "images" in name else np.arange(n) % 10
        header = bytes([0, 0, 0x08, array.ndim]) + b"".join(int(d).to_bytes(4, "big") for d in array.shape)
        (folder / name).write_bytes(header + array.astype(np.uint8).tobytes())
    data = SwappedGroups(base="mnist", clients=4).load(tmp_path)
    base = DATASETS.build({"name": "mnist", "flatten": True}).load(tmp_path)
    assert data.x.shape == (48, 784) and torch.equal(data.x, base.x)
    users = data.users.numpy()  # type: ignore[union-attr]
    table = SwappedGroups(base="mnist", clients=4).swap_tables(10)[1]
    second = users >= 2
    np.testing.assert_array_equal(data.y.numpy()[second], table[base.y.numpy()[second]])
    np.testing.assert_array_equal(data.y.numpy()[~second], base.y.numpy()[~second])
