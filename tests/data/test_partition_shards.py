"""FedMGDA+'s partitions (§6.1.1): 100 users × 5 label-sorted shards (non-iid) and the iid split, at the paper's
CIFAR-10 scale (50,000 training images, 500 per user)."""

from __future__ import annotations

import numpy as np

from fedhet.catalog import PARTITIONERS

CIFAR_LABELS = np.random.default_rng(0).permutation(np.repeat(np.arange(10), 5000))


def split(spec: dict, seed: int = 0) -> list[np.ndarray]:
    return PARTITIONERS.build(spec).split(CIFAR_LABELS, 100, np.random.default_rng(seed))


def test_hundred_users_five_single_class_shards_each() -> None:
    parts = split({"name": "shards", "shards_per_client": 5})
    flat = np.concatenate(parts)
    assert len(parts) == 100 and sorted(flat.tolist()) == list(range(50_000))  # every image exactly once
    assert {len(p) for p in parts} == {500}
    for p in parts:
        shards = CIFAR_LABELS[p].reshape(5, 100)  # five consecutive shards of 100 label-sorted images
        assert bool((shards == shards[:, :1]).all())  # each shard holds one class
    labels_per_user = [len(np.unique(CIFAR_LABELS[p])) for p in parts]
    assert max(labels_per_user) <= 5 and np.mean(labels_per_user) > 3  # at most 5 classes, usually several
    again = split({"name": "shards", "shards_per_client": 5})
    assert all(np.array_equal(a, b) for a, b in zip(parts, again, strict=True))  # seeded
    other = split({"name": "shards", "shards_per_client": 5}, seed=1)
    assert not all(np.array_equal(a, b) for a, b in zip(parts, other, strict=True))


def test_iid_split_gives_every_user_all_classes_in_equal_amounts() -> None:
    parts = split({"name": "iid"})
    assert {len(p) for p in parts} == {500}
    counts = np.stack([np.bincount(CIFAR_LABELS[p], minlength=10) for p in parts])
    assert counts.min() > 20 and abs(counts.mean() - 50) < 1e-9  # ~50 per class, none missing
