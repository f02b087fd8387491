"""Federating a dataset: per-client split, seen/unseen clients, contiguous layout."""

from __future__ import annotations

import torch

from fedhet.catalog import PARTITIONERS
from fedhet.data.dataset import Dataset
from fedhet.data.federate import federate


def test_split_and_unseen(digits: Dataset) -> None:
    fed = federate(digits, PARTITIONERS.build("iid"), 8, unseen_clients=4, test_fraction=0.25, seed=1)
    assert fed.num_clients == 12
    assert int(fed.seen.sum()) == 8 and len(fed.unseen_ids) == 4
    total = int(fed.train.sizes.sum() + fed.test.sizes.sum())
    assert total == len(digits)
    ratio = fed.test.sizes.double() / (fed.train.sizes + fed.test.sizes).double()
    assert bool(((ratio - 0.25).abs() < 0.02).all())
    # rows of client k are contiguous and the owner map agrees with the offsets
    assert torch.equal(
        fed.train.owner[: int(fed.train.sizes[0])], torch.zeros(int(fed.train.sizes[0]), dtype=torch.long)
    )
    again = federate(digits, PARTITIONERS.build("iid"), 8, unseen_clients=4, test_fraction=0.25, seed=1)
    assert torch.equal(fed.train.x, again.train.x) and torch.equal(fed.seen, again.seen)


def test_natural_partition_of_synthetic_users() -> None:
    from fedhet.data.embedded import LeafSynthetic

    ds = LeafSynthetic(num_users=6).load(None)  # type: ignore[arg-type]
    fed = federate(ds, PARTITIONERS.build("natural"), 6, test_fraction=0.2, seed=0)
    assert fed.num_clients == 6
    assert int(fed.train.sizes.sum() + fed.test.sizes.sum()) == len(ds)
