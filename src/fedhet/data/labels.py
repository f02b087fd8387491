"""Label corruption of a share of clients (MaxFL's label flipping, label swapping, noisy clients)."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import torch
from torch import Tensor

from fedhet.data.dataset import ClientData, FederatedData
from fedhet.data.label_noise import LabelNoise
from fedhet.errors import DataError
from fedhet.seeding import numpy_rng


def label_map(spec: LabelNoise, num_classes: int, rng: np.random.Generator) -> Tensor | None:
    """The class → class table of a deterministic mapping (None for ``random``)."""
    classes = np.arange(num_classes)
    if spec.mapping == "reverse":
        table = num_classes - 1 - classes
    elif spec.mapping == "shift":
        table = (classes + 1) % num_classes
    elif spec.mapping == "permutation":
        table = classes.copy()
        order = rng.permutation(num_classes)
        table[order] = np.roll(order, 1)  # a cycle through a random order: no class maps to itself
    elif spec.mapping == "pairs":
        table = classes.copy()
        for a, b in spec.pairs:
            table[a], table[b] = b, a
    else:
        return None
    return torch.as_tensor(table, dtype=torch.long)


def _corrupt(
    part: ClientData, clients: Tensor, table: Tensor | None, rate: float, num_classes: int, rng: np.random.Generator
) -> ClientData:
    y = part.y.clone()
    for k in clients.tolist():
        lo, hi = int(part.offsets[k]), int(part.offsets[k + 1])
        chosen = np.flatnonzero(rng.random(hi - lo) < rate) + lo
        rows = torch.as_tensor(chosen, dtype=torch.long)
        if table is not None:
            y[rows] = table[y[rows]]
        else:
            offset = torch.as_tensor(rng.integers(1, num_classes, len(rows)), dtype=torch.long)
            y[rows] = (y[rows] + offset) % num_classes
    return ClientData(part.x, y, part.offsets)


def corrupt_labels(data: FederatedData, spec: LabelNoise, seed: int) -> FederatedData:
    """Apply `spec` to ``round(fraction · K)`` clients drawn uniformly without replacement; marks them in
    ``data.info["corrupted"]``."""
    count = round(spec.fraction * data.num_clients)
    if count and data.task == "regression":
        raise DataError("label_noise changes class labels; a regression dataset has none: set label_noise.fraction: 0")
    flags = torch.zeros(data.num_clients, dtype=torch.bool)
    if count == 0:
        data.info["corrupted"] = flags
        return data
    rng = numpy_rng(seed, "label-noise")
    clients = torch.as_tensor(np.sort(rng.choice(data.num_clients, size=count, replace=False)), dtype=torch.long)
    flags[clients] = True
    table = label_map(spec, data.num_classes, rng)
    train = _corrupt(data.train, clients, table, spec.rate, data.num_classes, rng)
    test = (
        data.test if spec.splits == "train" else _corrupt(data.test, clients, table, spec.rate, data.num_classes, rng)
    )
    # the validation samples are some of the client's training samples: corrupted as those are (after the test split,
    # so that a run without validation draws what it drew before)
    val = _corrupt(data.val, clients, table, spec.rate, data.num_classes, rng) if data.val is not None else None
    return replace(data, train=train, test=test, val=val, info={**data.info, "corrupted": flags})
