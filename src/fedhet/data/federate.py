"""Turn a whole `Dataset` into a `FederatedData`: partition, per-client train/validation/test split, seen/unseen
clients."""

from __future__ import annotations

import numpy as np
import torch

from fedhet.data.dataset import ClientData, Dataset, FederatedData, split_indices, split_validation
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
    empty = [k for k, p in enumerate(parts) if len(p) == 0]
    if empty:
        raise DataError(
            f"partitioner '{partitioner.name}' left {len(empty)} of {total} clients without data; "
            "use fewer clients or a partitioner with a minimum size"
        )
    split_rng = numpy_rng(seed, "train-test-split")
    train_parts, test_parts = zip(*(split_indices(p, test_fraction, split_rng) for p in parts), strict=True)
    val_parts = None
    if val_fraction > 0:
        val_rng = numpy_rng(seed, "train-validation-split")
        cut = [split_validation(t, len(p), val_fraction, val_rng) for t, p in zip(train_parts, parts, strict=True)]
        train_parts, val_parts = zip(*cut, strict=True)
    unseen = numpy_rng(seed, "unseen").choice(total, size=unseen_clients, replace=False)
    seen = torch.ones(total, dtype=torch.bool)
    seen[torch.as_tensor(unseen, dtype=torch.long)] = False

    def gather(index_lists: tuple[np.ndarray, ...]) -> ClientData:
        idx = [torch.as_tensor(np.asarray(i, dtype=np.int64)) for i in index_lists]
        return ClientData.from_parts([dataset.x[i] for i in idx], [dataset.y[i] for i in idx])

    return FederatedData(
        dataset.name,
        gather(train_parts),
        gather(test_parts),
        dataset.num_classes,
        seen,
        val=gather(val_parts) if val_parts is not None else None,
        task=dataset.task,
        client_names=client_names(dataset, parts),
    )


def client_names(dataset: Dataset, parts: list[np.ndarray]) -> tuple[str, ...] | None:
    """Each client's user name when every client's samples belong to one named user (a natural split), else None."""
    if dataset.users is None or dataset.user_names is None:
        return None
    names = []
    for part in parts:
        owners = np.unique(dataset.users.numpy()[part])
        if len(owners) != 1:
            return None
        names.append(dataset.user_names[int(owners[0])])
    return tuple(names)
