"""Embedded datasets load offline with the documented shapes."""

from __future__ import annotations

from pathlib import Path

import torch

from fedhet.data.embedded import BreastCancer, Digits, LeafSynthetic


def test_digits_is_the_real_sklearn_set(tmp_path: Path) -> None:
    ds = Digits().load(tmp_path)
    assert len(ds) == 1797 and ds.x.shape == (1797, 64) and ds.num_classes == 10
    assert set(ds.y.unique().tolist()) == set(range(10))
    assert abs(float(ds.x.mean())) < 1e-5
    assert Digits(image=True).load(tmp_path).x.shape == (1797, 1, 8, 8)


def test_breast_cancer(tmp_path: Path) -> None:
    ds = BreastCancer().load(tmp_path)
    assert ds.x.shape == (569, 30) and ds.num_classes == 2


def test_leaf_synthetic_users_and_determinism(tmp_path: Path) -> None:
    a = LeafSynthetic(num_users=5, alpha=0.5, beta=0.5).load(tmp_path)
    b = LeafSynthetic(num_users=5, alpha=0.5, beta=0.5).load(tmp_path)
    assert torch.equal(a.x, b.x) and torch.equal(a.y, b.y)
    assert a.users is not None and set(a.users.tolist()) == set(range(5))
    assert a.x.shape[1] == 60 and int(a.y.max()) < 10
    sizes = torch.bincount(a.users)
    assert int(sizes.min()) >= 50
    c = LeafSynthetic(num_users=5, alpha=0.5, beta=0.5, seed=1).load(tmp_path)
    assert not torch.equal(a.y[:50], c.y[:50]) or not torch.equal(a.x[:50], c.x[:50])
