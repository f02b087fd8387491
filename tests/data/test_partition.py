"""Partitioners: disjoint, deterministic, the promised skew, and clear errors when impossible."""

from __future__ import annotations

import numpy as np
import pytest

from fedhet.catalog import PARTITIONERS
from fedhet.errors import DataError

LABELS = np.repeat(np.arange(10), 100)  # 1,000 samples, 10 balanced classes


def split(spec: dict, k: int = 20, seed: int = 0, labels: np.ndarray = LABELS, users: np.ndarray | None = None):
    return PARTITIONERS.build(spec).split(labels, k, np.random.default_rng(seed), users=users)


def check_disjoint(parts: list[np.ndarray], n: int) -> None:
    flat = np.concatenate(parts)
    assert len(flat) == len(set(flat.tolist())) and flat.min() >= 0 and flat.max() < n


@pytest.mark.parametrize(
    "spec",
    [
        {"name": "iid"},
        {"name": "dirichlet", "alpha": 0.3},
        {"name": "shards", "shards_per_client": 2},
        {"name": "label_k", "labels_per_client": 2},
        {"name": "label_clusters"},
        {"name": "pareto", "shape": 1.0},
        {"name": "nonbalance", "sigma": 1.0},
    ],
)
def test_disjoint_deterministic_and_complete(spec: dict) -> None:
    parts = split(spec)
    assert len(parts) == 20 and all(len(p) > 0 for p in parts)
    check_disjoint(parts, len(LABELS))
    again = split(spec)
    assert all(np.array_equal(a, b) for a, b in zip(parts, again, strict=True))
    other = split(spec, seed=1)
    assert not all(np.array_equal(a, b) for a, b in zip(parts, other, strict=True))


def test_dirichlet_skew_grows_as_alpha_shrinks_and_min_size_holds() -> None:
    def distinct(alpha: float) -> float:
        parts = split({"name": "dirichlet", "alpha": alpha, "min_size": 5})
        assert min(len(p) for p in parts) >= 5
        return float(np.mean([len(np.unique(LABELS[p])) for p in parts]))

    assert distinct(0.05) < distinct(100.0)
    assert distinct(100.0) > 9


def test_dirichlet_terminates_at_scale_with_repair() -> None:
    labels = np.random.default_rng(0).integers(0, 10, 100_000)
    parts = split({"name": "dirichlet", "alpha": 0.01, "min_size": 5, "retries": 2}, k=10_000, labels=labels)
    assert len(parts) == 10_000 and min(len(p) for p in parts) >= 5
    check_disjoint(parts, len(labels))


def test_dirichlet_impossible_is_a_clear_error() -> None:
    with pytest.raises(DataError, match=r"dirichlet: 200 clients × min_size 10 needs 2000 samples.*lower"):
        split({"name": "dirichlet", "min_size": 10}, k=200)


def test_shards_and_label_k_limit_labels_per_client() -> None:
    for p in split({"name": "shards", "shards_per_client": 2}):
        assert len(np.unique(LABELS[p])) <= 2
    parts = split({"name": "label_k", "labels_per_client": 3})
    assert all(len(np.unique(LABELS[p])) == 3 for p in parts)
    with pytest.raises(DataError, match="11 labels per client"):
        split({"name": "label_k", "labels_per_client": 11})


def test_label_clusters_share_no_label_across_clusters() -> None:
    parts = split({"name": "label_clusters", "num_clusters": 5, "labels_per_cluster": 2})
    label_sets = {frozenset(np.unique(LABELS[p]).tolist()) for p in parts}
    assert len(label_sets) == 5 and all(len(s) == 2 for s in label_sets)
    assert len(frozenset().union(*label_sets)) == 10
    with pytest.raises(DataError, match="12 labels needed"):
        split({"name": "label_clusters", "num_clusters": 6, "labels_per_cluster": 2})


def test_quantity_skew_sizes() -> None:
    for spec in ({"name": "pareto", "shape": 0.8, "min_size": 5}, {"name": "nonbalance", "sigma": 1.5, "min_size": 5}):
        sizes = np.array([len(p) for p in split(spec)])
        assert sizes.sum() == len(LABELS) and sizes.min() >= 5
        assert sizes.max() / sizes.min() > 4
    with pytest.raises(DataError, match="lower min_size"):
        split({"name": "pareto", "min_size": 100}, k=20)


def test_natural_users() -> None:
    users = np.repeat(np.arange(8), [5, 1, 7, 3, 9, 2, 4, 6])
    labels = np.zeros(len(users), dtype=np.int64)
    parts = split({"name": "natural"}, k=8, labels=labels, users=users)
    assert [len(p) for p in parts] == [5, 1, 7, 3, 9, 2, 4, 6]
    assert all(len(np.unique(users[p])) == 1 for p in parts)
    few = split({"name": "natural", "min_size": 4}, k=3, labels=labels, users=users)
    assert all(len(p) >= 4 for p in few) and len(few) == 3
    with pytest.raises(DataError, match="no natural users"):
        split({"name": "natural"}, k=3, labels=labels)
    with pytest.raises(DataError, match="at most 8"):
        split({"name": "natural"}, k=9, labels=labels, users=users)
