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


def test_a_validation_split_comes_out_of_training_and_leaves_the_test_split_as_it_was(digits: Dataset) -> None:
    plain = federate(digits, PARTITIONERS.build("iid"), 6, test_fraction=0.2, seed=3)
    split = federate(digits, PARTITIONERS.build("iid"), 6, test_fraction=0.2, seed=3, val_fraction=0.1)
    assert plain.val is None and split.val is not None
    assert torch.equal(split.test.x, plain.test.x) and torch.equal(split.test.offsets, plain.test.offsets)
    total = plain.train.sizes + plain.test.sizes
    assert torch.equal(split.val.sizes, torch.round(total * 0.1).long())
    assert torch.equal(split.train.sizes + split.val.sizes, plain.train.sizes)
    for k in range(6):  # the validation samples are some of the client's former training samples, none twice
        before = {tuple(r) for r in plain.train.client(k)[0].tolist()}
        after = [tuple(r) for r in torch.cat([split.train.client(k)[0], split.val.client(k)[0]]).tolist()]
        assert sorted(after) == sorted(before)
    assert split.summary()["val_samples"] == float(split.val.sizes.sum())


def test_clients_are_named_by_their_user_when_each_is_one_user() -> None:
    x = torch.randn(8, 2)
    users = torch.tensor([0, 0, 1, 1, 1, 2, 2, 2])
    data = Dataset("t", x, torch.tensor([0, 1] * 4), 2, users, user_names=("east", "north", "west"))
    natural = federate(data, PARTITIONERS.build("natural"), 3, test_fraction=0.25)
    assert natural.client_names == ("east", "north", "west")
    assert federate(data, PARTITIONERS.build("iid"), 2, test_fraction=0.25).client_names is None  # mixed users
