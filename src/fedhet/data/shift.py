"""Per-group data shift (the config's ``shift``, `fedhet.data.shift_config.Shift`): each client is put in a
ground-truth group, and the group's transform is applied to the client's samples after any label partition.

A transform is a function (data part, row groups, number of groups, classes, rng) → data part, listed in
`TRANSFORMS` under the name the config gives (add one as one such function).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import replace

import numpy as np
import torch
from torch import Tensor

from fedhet.data.dataset import ClientData, FederatedData
from fedhet.data.shift_config import Shift
from fedhet.errors import DataError
from fedhet.seeding import numpy_rng

Transform = Callable[[ClientData, Tensor, int, int, np.random.Generator], ClientData]


def client_groups(num_clients: int, spec: Shift, seed: int) -> Tensor:
    """(K,) each client's group: k mod G (``cyclic``), or those same balanced groups in a seeded order (``random``)."""
    groups = np.arange(num_clients) % spec.groups
    if spec.assign == "random":
        groups = numpy_rng(seed, "shift-groups").permutation(groups)
    return torch.as_tensor(groups, dtype=torch.long)


def square_images(x: Tensor) -> Tensor:
    """`x` as (N, ..., s, s) images: flat (N, s²) inputs are one-channel s×s images; a `DataError` otherwise."""
    if not torch.is_floating_point(x):
        raise DataError("shift 'rotation' rotates images; this dataset's inputs are tokens: use another shift")
    if x.dim() == 2:
        side = math.isqrt(x.shape[1])
        if side * side == x.shape[1]:
            return x.view(len(x), side, side)
    elif x.shape[-1] == x.shape[-2]:
        return x
    raise DataError(
        f"shift 'rotation' rotates square images; this dataset's inputs are {tuple(x.shape[1:])}: use another shift"
    )


def rotate(part: ClientData, rows: Tensor, groups: int, classes: int, rng: np.random.Generator) -> ClientData:
    """Each sample of group g rotated by g·90° (`torch.rot90`: exact, a permutation of the pixels)."""
    del classes, rng
    images = square_images(part.x)
    out = images.clone()
    for g in range(1, groups):
        mine = rows == g
        out[mine] = torch.rot90(images[mine], g, dims=(-2, -1))
    return ClientData(out.reshape(part.x.shape), part.y, part.offsets)


def permute_labels(part: ClientData, rows: Tensor, groups: int, classes: int, rng: np.random.Generator) -> ClientData:
    """Each label y of group g replaced by π_g(y): π_0 the identity, π_1.. seeded permutations of the classes."""
    if torch.is_floating_point(part.y):
        raise DataError("shift 'labels' permutes class labels; a regression dataset has none: use another shift")
    tables = [torch.arange(classes)]
    tables += [torch.as_tensor(rng.permutation(classes), dtype=torch.long) for _ in range(1, groups)]
    y = part.y.clone()
    for g in range(1, groups):
        mine = rows == g
        y[mine] = tables[g][part.y[mine]]
    return ClientData(part.x, y, part.offsets)


TRANSFORMS: dict[str, Transform] = {"rotation": rotate, "labels": permute_labels}


def shift_clients(data: FederatedData, spec: Shift, seed: int) -> FederatedData:
    """`data` with each client's samples transformed by its group's transform (train, validation and test alike),
    the groups in ``data.info["group"]``; `data` itself when ``spec`` shifts nothing."""
    if not spec.active:
        return data
    groups = client_groups(data.num_clients, spec, seed)
    transform = TRANSFORMS[spec.name]

    def shifted(part: ClientData) -> ClientData:
        rows = torch.repeat_interleave(groups, part.offsets.diff())  # each sample's group
        rng = numpy_rng(seed, "shift")  # the same tables for every split
        return transform(part, rows, spec.groups, data.num_classes, rng)

    val = shifted(data.val) if data.val is not None else None
    info = {**data.info, "group": groups}
    return replace(data, train=shifted(data.train), test=shifted(data.test), val=val, info=info)
