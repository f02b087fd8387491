"""Partitioners: disjoint, deterministic, the promised skew, and clear errors when impossible."""

from __future__ import annotations

import numpy as np
import pytest

from fedhet.catalog import PARTITIONERS
from fedhet.errors import ConfigError, DataError

LABELS = np.repeat(np.arange(10), 100)  # 1,000 samples, 10 balanced classes
USERS = np.random.default_rng(7).integers(0, 40, len(LABELS))  # 40 natural users


def split(
    spec: dict, k: int = 20, seed: int = 0, labels: np.ndarray = LABELS, users: np.ndarray | None = None
) -> list[np.ndarray]:
    return PARTITIONERS.build(spec).split(labels, k, np.random.default_rng(seed), users=users)


def check_disjoint(parts: list[np.ndarray], n: int) -> None:
    flat = np.concatenate(parts)
    assert all(p.dtype == np.int64 for p in parts)
    assert len(flat) == len(np.unique(flat)) and flat.min() >= 0 and flat.max() < n


def sizes_of(parts: list[np.ndarray]) -> np.ndarray:
    return np.array([len(p) for p in parts])


def distinct_labels(parts: list[np.ndarray], labels: np.ndarray = LABELS) -> list[int]:
    return [len(np.unique(labels[p])) for p in parts]


ALL_SPECS = [
    {"name": "iid"},
    {"name": "dirichlet", "alpha": 0.3},
    {"name": "shards", "shards_per_client": 2},
    {"name": "label_k", "labels_per_client": 2},
    {"name": "label_clusters"},
    {"name": "dirichlet", "alpha": 0.3, "scheme": "per_client"},
    {"name": "pareto", "shape": 1.0},
    {"name": "nonbalance"},
    {"name": "quantity", "law": "lognormal", "sigma": 1.0},
    {"name": "natural"},
]


def test_every_partitioner_is_registered_with_a_one_line_description() -> None:
    assert {s["name"] for s in ALL_SPECS} <= set(PARTITIONERS.names())
    for cls in PARTITIONERS:
        assert cls.description and "\n" not in cls.description and cls.__doc__


@pytest.mark.parametrize("spec", ALL_SPECS, ids=[str(i) + s["name"] for i, s in enumerate(ALL_SPECS)])
def test_disjoint_deterministic_and_right_count(spec: dict) -> None:
    parts = split(spec, users=USERS)
    assert len(parts) == 20 and all(len(p) > 0 for p in parts)
    check_disjoint(parts, len(LABELS))
    again = split(spec, users=USERS)
    assert all(np.array_equal(a, b) for a, b in zip(parts, again, strict=True))
    other = split(spec, seed=1, users=USERS)
    assert not all(np.array_equal(a, b) for a, b in zip(parts, other, strict=True))


def test_iid_is_even_and_complete() -> None:
    sizes = sizes_of(split({"name": "iid"}, k=7))
    assert sizes.sum() == len(LABELS) and sizes.max() - sizes.min() <= 1
    with pytest.raises(DataError, match="1001 clients"):
        split({"name": "iid"}, k=1001)


def test_parameters_are_validated() -> None:
    with pytest.raises(ConfigError, match="alpha"):
        PARTITIONERS.build({"name": "dirichlet", "alpha": 0})
    with pytest.raises(ConfigError, match="shards_per_client"):
        PARTITIONERS.build({"name": "shards", "shards_per_client": 0})
    with pytest.raises(ConfigError, match="unknown key"):
        PARTITIONERS.build({"name": "pareto", "alpha": 1.0})


def test_dirichlet_skew_grows_as_alpha_shrinks_and_min_size_holds() -> None:
    def mean_distinct(alpha: float) -> float:
        parts = split({"name": "dirichlet", "alpha": alpha, "min_size": 5})
        assert sizes_of(parts).min() >= 5 and sizes_of(parts).sum() == len(LABELS)
        return float(np.mean(distinct_labels(parts)))

    assert mean_distinct(0.05) < 4 < 9 < mean_distinct(100.0)


def test_dirichlet_handles_arbitrary_label_values() -> None:
    labels = LABELS * 7 + 3
    parts = split({"name": "dirichlet", "alpha": 0.5, "min_size": 10}, labels=labels)
    assert sizes_of(parts).min() >= 10 and sizes_of(parts).sum() == len(labels)


def test_dirichlet_repair_meets_min_size_and_keeps_skew() -> None:
    parts = split({"name": "dirichlet", "alpha": 0.01, "min_size": 20, "retries": 1}, k=40)
    assert sizes_of(parts).min() >= 20 and sizes_of(parts).sum() == len(LABELS)
    check_disjoint(parts, len(LABELS))
    assert np.mean(distinct_labels(parts)) < 2.5
    exact = split({"name": "dirichlet", "alpha": 0.01, "min_size": 10, "retries": 1}, k=100)
    assert sizes_of(exact).tolist() == [10] * 100  # 100 clients × 10 = every sample


def test_dirichlet_terminates_at_scale() -> None:
    labels = np.random.default_rng(0).integers(0, 10, 100_000)
    parts = split({"name": "dirichlet", "alpha": 0.01, "min_size": 5}, k=10_000, labels=labels)
    assert len(parts) == 10_000 and sizes_of(parts).min() >= 5 and sizes_of(parts).sum() == len(labels)
    check_disjoint(parts, len(labels))
    assert np.mean(distinct_labels(parts, labels)) < 2  # the repair keeps the strong label skew


def test_dirichlet_impossible_is_a_clear_error() -> None:
    message = r"dirichlet: 200 clients × min_size 10 needs 2000 samples but the dataset has 1000; lower .*min_size"
    with pytest.raises(DataError, match=message):
        split({"name": "dirichlet", "min_size": 10}, k=200)


def test_shards_limit_labels_per_client() -> None:
    parts = split({"name": "shards", "shards_per_client": 2})
    assert all(n <= 2 for n in distinct_labels(parts))
    assert set(sizes_of(parts).tolist()) == {50} and sizes_of(parts).sum() == len(LABELS)
    with pytest.raises(DataError, match=r"needs 1005 samples but the dataset has 1000; lower shards_per_client"):
        split({"name": "shards", "shards_per_client": 5}, k=201)


def test_label_k_gives_exactly_k_labels_used_evenly() -> None:
    parts = split({"name": "label_k", "labels_per_client": 3})
    assert all(n == 3 for n in distinct_labels(parts))
    holders = np.bincount(np.concatenate([np.unique(LABELS[p]) for p in parts]), minlength=10)
    assert holders.tolist() == [6] * 10  # 20 clients × 3 labels over 10 classes
    check_disjoint(parts, len(LABELS))
    assert sizes_of(parts).sum() == len(LABELS)
    with pytest.raises(DataError, match="11 labels per client but the dataset has 10 classes"):
        split({"name": "label_k", "labels_per_client": 11})


def test_label_clusters_share_no_label_across_clusters() -> None:
    parts = split({"name": "label_clusters", "num_clusters": 5, "labels_per_cluster": 2}, k=23)
    assert all(n <= 2 for n in distinct_labels(parts))
    label_sets = [frozenset(np.unique(LABELS[p]).tolist()) for p in parts]
    clusters = set(label_sets)
    assert len(clusters) == 5 and len(frozenset().union(*clusters)) == 10  # disjoint pairs cover the 10 classes
    members = sorted(sum(s == c for s in label_sets) for c in clusters)
    assert members == [4, 4, 5, 5, 5]  # every cluster has clients, sizes differ by at most one
    one_each = split({"name": "label_clusters", "num_clusters": 5, "labels_per_cluster": 2}, k=5)
    assert [len(p) for p in one_each] == [200] * 5
    with pytest.raises(DataError, match="12 labels needed but the dataset has 10 classes"):
        split({"name": "label_clusters", "num_clusters": 6, "labels_per_cluster": 2})
    with pytest.raises(DataError, match="3 clients for 5 clusters"):
        split({"name": "label_clusters"}, k=3)


@pytest.mark.parametrize(
    "spec",
    [
        {"name": "quantity", "law": "pareto", "shape": 0.8, "min_size": 5},
        {"name": "quantity", "sigma": 1.5, "min_size": 5},
    ],
)
def test_quantity_skew_sizes_are_skewed_and_labels_balanced(spec: dict) -> None:
    labels = np.repeat(np.arange(10), 1000)
    parts = split(spec, labels=labels)
    sizes = sizes_of(parts)
    assert sizes.sum() == len(labels) and sizes.min() >= 5
    assert sizes.max() / sizes.min() > 4
    largest = labels[parts[int(np.argmax(sizes))]]
    assert np.abs(np.bincount(largest, minlength=10) / len(largest) - 0.1).max() < 0.05


def test_quantity_skew_extremes() -> None:
    assert set(sizes_of(split({"name": "quantity", "sigma": 0.0, "min_size": 0})).tolist()) == {50}
    heavy = sizes_of(split({"name": "quantity", "law": "pareto", "shape": 0.01, "min_size": 3}, k=300))
    assert heavy.sum() == len(LABELS) and heavy.min() >= 3  # no overflow
    with pytest.raises(DataError, match=r"quantity: 20 clients × min_size 100 needs 2000 samples.*lower .*min_size"):
        split({"name": "quantity", "min_size": 100})


def holders_share_classes_evenly(parts: list[np.ndarray]) -> None:
    """Every class's samples are split evenly (±1) among the clients holding it, and all of them are used."""
    for c in range(10):
        counts = np.array([int((LABELS[p] == c).sum()) for p in parts])
        held = counts[counts > 0]
        assert held.sum() == 100 and held.max() - held.min() <= 1


def test_nonbalance_tiers_of_classes() -> None:
    """FedGSNR App. D.1: 10% of the clients hold all classes, 40% half of them, 50% a fifth."""
    parts = split({"name": "nonbalance"}, k=30)
    check_disjoint(parts, len(LABELS))
    assert sorted(distinct_labels(parts)) == [2] * 15 + [5] * 12 + [10] * 3
    holders_share_classes_evenly(parts)
    sizes, n_labels = sizes_of(parts), np.array(distinct_labels(parts))
    assert sizes[n_labels == 10].min() > sizes[n_labels == 2].max()  # more classes, more samples
    assert distinct_labels(split({"name": "nonbalance"}, k=30, seed=1)) != distinct_labels(parts)  # tiers at random
    custom = split({"name": "nonbalance", "tiers": [(1, 0.3), (3, 0.01)]}, k=8)
    assert sorted(distinct_labels(custom)) == [1] * 6 + [3] * 2  # at least one class
    with pytest.raises(ConfigError, match="tiers"):
        PARTITIONERS.build({"name": "nonbalance", "tiers": [(0.5, 1.5)]})


def test_pareto_classes_per_client() -> None:
    """FedGSNR App. D.1: client i holds max(1, round(C·x_i/max x)) classes, x ~ Pareto(shape)."""
    parts = split({"name": "pareto"}, k=30, seed=3)
    check_disjoint(parts, len(LABELS))
    holders_share_classes_evenly(parts)
    n_labels = np.array(distinct_labels(parts))
    assert n_labels.max() == 10 and n_labels.min() >= 1  # the largest draw holds every class
    # the same draws as the partitioner: x / max x from its generator's first N exponentials
    rng = np.random.default_rng(3)
    rng.permutation(len(LABELS))  # _by_class's shuffle
    log_x = rng.standard_exponential(30) / 1.16
    expected = np.clip(np.rint(np.exp(log_x - log_x.max()) * 10), 1, 10)
    assert n_labels.tolist() == expected.astype(int).tolist()
    heavy = np.mean([np.mean(distinct_labels(split({"name": "pareto", "shape": 0.5}, k=30, seed=s))) for s in range(5)])
    light = np.mean([np.mean(distinct_labels(split({"name": "pareto", "shape": 5.0}, k=30, seed=s))) for s in range(5)])
    assert heavy < 3 < 6 < light  # a heavy tail leaves most clients with few classes


def test_dirichlet_per_client_equal_sizes_and_skew() -> None:
    """Hsu et al.: q_k ~ Dir(α·1_C) per client, equal client sizes; small α, few classes per client."""
    labels = np.repeat(np.arange(10), 180)

    def mean_distinct(alpha: float) -> tuple[float, np.ndarray]:
        parts = split({"name": "dirichlet", "alpha": alpha, "scheme": "per_client", "min_size": 5}, k=30, labels=labels)
        check_disjoint(parts, len(labels))
        return float(np.mean(distinct_labels(parts, labels))), sizes_of(parts)

    low, sizes = mean_distinct(0.1)
    assert sizes.sum() == len(labels) and sizes.max() - sizes.min() <= 10  # ≈ 60 each
    high, _ = mean_distinct(100.0)
    assert low < 5 < 9.5 < high


def test_natural_users() -> None:
    users = np.repeat(np.arange(8), [5, 1, 7, 3, 9, 2, 4, 6])
    labels = np.zeros(len(users), dtype=np.int64)
    parts = split({"name": "natural"}, k=8, labels=labels, users=users)
    assert [len(p) for p in parts] == [5, 1, 7, 3, 9, 2, 4, 6]
    assert all(len(np.unique(users[p])) == 1 for p in parts)
    few = split({"name": "natural", "min_size": 4}, k=3, labels=labels, users=users)
    assert all(len(p) >= 4 for p in few) and len(few) == 3
    with pytest.raises(DataError, match="no natural users; choose another partitioner"):
        split({"name": "natural"}, k=3, labels=labels)
    with pytest.raises(DataError, match=r"9 clients requested but the dataset has 8 users; .*at most 8"):
        split({"name": "natural"}, k=9, labels=labels, users=users)
    with pytest.raises(DataError, match=r"has 5 users with at least 4 samples; .*at most 5"):
        split({"name": "natural", "min_size": 4}, k=6, labels=labels, users=users)
