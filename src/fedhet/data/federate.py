"""Turn a whole `Dataset` into a `FederatedData`: partition, per-client train/validation/test split, seen/unseen
clients.

The clients' samples are kept as one array of sample indices, client after client, with offsets (the layout of
`ClientData`): the splits cut every client's segment with array operations, and the only per-client Python step
left is the shuffle of each segment, from the same stream and in the same order as one
``rng.permutation(part)`` per client (so the same seed gives the same split as ever).
"""

from __future__ import annotations

import numpy as np
import torch

from fedhet.data.dataset import ClientData, Dataset, FederatedData
from fedhet.data.partition import Partitioner
from fedhet.errors import DataError
from fedhet.seeding import numpy_rng


def federate(
    dataset: Dataset,
    partitioner: Partitioner,
    num_clients: int,
    *,
    unseen_clients: int = 0,
    test_fraction: float = 0.2,
    seed: int = 0,
    val_fraction: float = 0.0,
) -> FederatedData:
    """Split `dataset` among ``num_clients + unseen_clients`` clients.

    Each client's samples are cut into train and test parts (``test_fraction``), then, with ``val_fraction`` > 0,
    that share of the client's samples is taken from its training part as its validation data (from a stream of
    its own: the train/test split is the one a run without validation makes). ``unseen_clients`` clients, drawn at
    random, never train: they are only evaluated (MaxFL's unseen clients).
    """
    total = num_clients + unseen_clients
    if partitioner.by_label and torch.is_floating_point(dataset.y):
        raise DataError(
            f"partitioner '{partitioner.name}' splits by class, and '{dataset.name}' has numeric targets (regression); "
            "use partition iid, quantity or natural"
        )
    users = dataset.users.numpy() if dataset.users is not None else None
    parts = partitioner.split(dataset.y.numpy(), total, numpy_rng(seed, "partition"), users=users)
    if len(parts) != total:
        raise DataError(f"partitioner '{partitioner.name}' made {len(parts)} clients, expected {total}")
    sizes = np.fromiter((len(p) for p in parts), dtype=np.int64, count=total)
    empty = int((sizes == 0).sum())
    if empty:
        raise DataError(
            f"partitioner '{partitioner.name}' left {empty} of {total} clients without data; "
            "use fewer clients or a partitioner with a minimum size"
        )
    order = np.concatenate([np.asarray(p, dtype=np.int64) for p in parts])
    offsets = _offsets(sizes)
    names = client_names(dataset, order, offsets)
    del parts
    shuffle_segments(order, offsets, numpy_rng(seed, "train-test-split"))
    test, train = cut_segments(order, offsets, held_out_counts(sizes, test_fraction))
    val = None
    if val_fraction > 0:
        shuffle_segments(train[0], train[1], numpy_rng(seed, "train-validation-split"))
        val, train = cut_segments(*train, validation_counts(np.diff(train[1]), sizes, val_fraction))
    del order
    unseen = numpy_rng(seed, "unseen").choice(total, size=unseen_clients, replace=False)
    seen = torch.ones(total, dtype=torch.bool)
    seen[torch.as_tensor(unseen, dtype=torch.long)] = False

    def gather(segments: tuple[np.ndarray, np.ndarray]) -> ClientData:
        rows = torch.from_numpy(segments[0])
        return ClientData(dataset.x[rows].contiguous(), dataset.y[rows].contiguous(), torch.from_numpy(segments[1]))

    return FederatedData(
        dataset.name,
        gather(train),
        gather(test),
        dataset.num_classes,
        seen,
        val=gather(val) if val is not None else None,
        task=dataset.task,
        client_names=names,
    )


def _offsets(sizes: np.ndarray) -> np.ndarray:
    return np.concatenate([np.zeros(1, dtype=np.int64), np.cumsum(sizes, dtype=np.int64)])


def shuffle_segments(values: np.ndarray, offsets: np.ndarray, rng: np.random.Generator) -> None:
    """Shuffle each segment ``values[offsets[k]:offsets[k+1]]`` in place, segment after segment: the draws of
    ``rng.permutation`` of each segment in turn (a segment of one sample draws nothing)."""
    shuffle = rng.shuffle
    for lo, hi in zip(offsets[:-1].tolist(), offsets[1:].tolist(), strict=True):
        if hi - lo > 1:
            shuffle(values[lo:hi])


def cut_segments(
    values: np.ndarray, offsets: np.ndarray, heads: np.ndarray
) -> tuple[tuple[np.ndarray, np.ndarray], tuple[np.ndarray, np.ndarray]]:
    """Cut each segment k into its first ``heads[k]`` values and the rest: ((head values, offsets), (rest, offsets)),
    the segments in order."""
    sizes = np.diff(offsets)
    position = np.arange(len(values), dtype=np.int64) - np.repeat(offsets[:-1], sizes)
    in_head = position < np.repeat(heads, sizes)
    return (values[in_head], _offsets(heads)), (values[~in_head], _offsets(sizes - heads))


def held_out_counts(sizes: np.ndarray, test_fraction: float) -> np.ndarray:
    """Each client's test samples: round(n · test_fraction), and at least one (if the fraction is positive) but
    not all when the client has two or more."""
    n_test = np.round(sizes * test_fraction).astype(np.int64)
    low = 1 if test_fraction > 0 else 0
    return np.where(sizes >= 2, np.minimum(np.maximum(n_test, low), sizes - 1), n_test)


def validation_counts(train_sizes: np.ndarray, totals: np.ndarray, val_fraction: float) -> np.ndarray:
    """Each client's validation samples out of its `train_sizes` training samples (it has `totals` in all):
    round(total · val_fraction), at least one when the fraction is positive, and training keeps at least one."""
    n_val = np.round(totals * val_fraction).astype(np.int64)
    if val_fraction > 0:
        n_val = np.where(train_sizes >= 2, np.minimum(np.maximum(n_val, 1), train_sizes - 1), n_val)
    return np.minimum(n_val, np.maximum(train_sizes - 1, 0))


def client_names(dataset: Dataset, order: np.ndarray, offsets: np.ndarray) -> tuple[str, ...] | None:
    """Each client's user name when every client's samples (``order[offsets[k]:offsets[k+1]]``, none empty)
    belong to one named user (a natural split), else None."""
    if dataset.users is None or dataset.user_names is None or len(order) == 0:
        return None
    owners = dataset.users.numpy()[order]
    first = np.minimum.reduceat(owners, offsets[:-1])
    if not np.array_equal(first, np.maximum.reduceat(owners, offsets[:-1])):
        return None
    names = dataset.user_names
    return tuple([names[u] for u in first.tolist()])
