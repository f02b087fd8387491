"""Federating a dataset: per-client split, seen/unseen clients, contiguous layout."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from fedhet.catalog import PARTITIONERS
from fedhet.data.dataset import ClientData, Dataset
from fedhet.data.federate import federate, held_out_counts, validation_counts


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


def _per_client(dataset: Dataset, partition: str, clients: int, test_fraction: float, val_fraction: float) -> tuple:
    """The split as one `rng.permutation` per client cuts it (the rule `federate` vectorises), as row lists."""
    from fedhet.seeding import numpy_rng

    parts = PARTITIONERS.build(partition).split(
        dataset.y.numpy(), clients, numpy_rng(0, "partition"), users=dataset.users.numpy()
    )
    split, cut = numpy_rng(0, "train-test-split"), numpy_rng(0, "train-validation-split")
    train, test, val = [], [], []
    for part in parts:
        perm = split.permutation(part)
        n_test = round(len(perm) * test_fraction)
        if len(perm) >= 2:
            n_test = min(max(n_test, 1 if test_fraction > 0 else 0), len(perm) - 1)
        rest, n_val = cut.permutation(perm[n_test:]) if val_fraction > 0 else perm[n_test:], 0
        if val_fraction > 0:
            n_val = round(len(part) * val_fraction)
            if len(rest) >= 2:
                n_val = min(max(n_val, 1), len(rest) - 1)
            n_val = min(n_val, max(len(rest) - 1, 0))
        test.append(perm[:n_test].tolist())
        val.append(rest[:n_val].tolist())
        train.append(rest[n_val:].tolist())
    return train, test, val


def _rows(data: ClientData) -> list[list[int]]:
    """Each client's rows, as the sample numbers that `_numbered` put in the first feature."""
    return [data.client(k)[0][:, 0].long().tolist() for k in range(data.num_clients)]


def _numbered(n: int, users: int) -> Dataset:
    gen = torch.Generator().manual_seed(0)
    x = torch.stack([torch.arange(n, dtype=torch.float32), torch.randn(n, generator=gen)], dim=1)
    owners = torch.randint(0, users, (n,), generator=gen)
    owners[:3] = users  # a user with 3 samples and one with a single sample
    owners[3] = users + 1
    return Dataset("numbered", x, torch.randint(0, 3, (n,), generator=gen), 3, owners)


@pytest.mark.parametrize(("partition", "clients"), [("natural", 42), ("iid", 30), ("dirichlet", 12), ("quantity", 25)])
@pytest.mark.parametrize(("test_fraction", "val_fraction"), [(0.2, 0.0), (0.25, 0.3), (0.0, 0.1), (0.7, 0.0)])
def test_the_vectorised_split_is_one_permutation_per_client(
    partition: str, clients: int, test_fraction: float, val_fraction: float
) -> None:
    data = _numbered(600, 40)
    fed = federate(data, PARTITIONERS.build(partition), clients, test_fraction=test_fraction, val_fraction=val_fraction)
    train, test, val = _per_client(data, partition, clients, test_fraction, val_fraction)
    assert _rows(fed.train) == train and _rows(fed.test) == test
    assert (fed.val is None) == (val_fraction == 0)
    if fed.val is not None:
        assert _rows(fed.val) == val


def test_held_out_counts_by_hand() -> None:
    sizes = np.array([1, 2, 3, 10, 11])
    # round(n·0.25) = 0, 0 (half to even), 1, 2 (2.5 to even), 3; at least 1 and at most n − 1 from two samples on
    assert held_out_counts(sizes, 0.25).tolist() == [0, 1, 1, 2, 3]
    assert held_out_counts(sizes, 0.0).tolist() == [0, 0, 0, 0, 0]
    assert held_out_counts(np.array([1, 2]), 0.75).tolist() == [1, 1]  # one sample: round(0.75) = 1 (all of it)
    # validation out of the training part: round(total · 0.1), at least one, training keeps one
    assert validation_counts(np.array([1, 2, 8, 24]), np.array([2, 3, 10, 30]), 0.1).tolist() == [0, 1, 1, 3]
    assert validation_counts(np.array([4]), np.array([5]), 0.0).tolist() == [0]
