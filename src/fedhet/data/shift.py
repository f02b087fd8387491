"""Per-group data shift (the config's ``shift``, a registered `fedhet.data.shift_config.ShiftComponent`): each client
is put in a ground-truth group (and given a level), and the shift transforms each client's samples after any label
partition (`shift_clients`); the ``domain`` shift instead picks each client's samples from its group's domain
(`fedhet.data.shift_transforms.ByDomain`).
"""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import torch
from torch import Tensor

from fedhet.data.dataset import ClientData, FederatedData
from fedhet.data.shift_config import Groups, Shift, ShiftComponent
from fedhet.data.shift_transforms import Assignment, ByDomain
from fedhet.errors import DataError
from fedhet.seeding import numpy_rng

__all__ = ["Assignment", "ByDomain", "assign_clients", "client_groups", "shift_clients"]


def client_groups(num_clients: int, spec: Groups, seed: int) -> Tensor:
    """(K,) each client's group: k mod G (``cyclic``), or those same balanced groups in a seeded order (``random``)."""
    groups = np.arange(num_clients) % (spec.groups or 1)
    if spec.assign == "random":
        groups = numpy_rng(seed, "shift-groups").permutation(groups)
    return torch.as_tensor(groups, dtype=torch.long)


def assign_clients(shift: ShiftComponent, num_clients: int, seed: int) -> tuple[Tensor, Tensor | None]:
    """(K,) each client's group and (K,) level (None without levels): its group's level, or with ``per_client`` a
    level drawn uniformly in [0, strength] (seeded), the group then the nearest of the groups' levels."""
    groups = client_groups(num_clients, shift, seed)
    by_group = shift.group_levels()
    if by_group is None:
        return groups, None
    table = torch.tensor(by_group, dtype=torch.float64)
    if not getattr(shift, "per_client", False):
        return groups, table[groups]
    levels = torch.as_tensor(numpy_rng(seed, "shift-levels").uniform(0.0, table.max().item(), num_clients))
    return (levels[:, None] - table[None, :]).abs().argmin(dim=1), levels


def shift_clients(data: FederatedData, spec: Shift | ShiftComponent, seed: int) -> FederatedData:
    """`data` with each client's samples transformed by its group's shift (train, validation and test alike), the
    groups in ``data.info["group"]`` and the levels in ``data.info["shift_level"]``; `data` itself when ``spec``
    shifts nothing."""
    shift = spec.component() if isinstance(spec, Shift) else spec
    if not shift.active:
        return data
    groups, levels = assign_clients(shift, data.num_clients, seed)
    num_groups = int(shift.groups or 1)

    def shifted(part: ClientData, split: str) -> ClientData:
        who = Assignment(groups, levels, num_groups, data.num_classes, seed, split)
        out = shift.transform(part, who)
        if not isinstance(out, ClientData) or len(out.y) != len(part.y) or not torch.equal(out.offsets, part.offsets):
            raise DataError(f"shift '{shift.name}' must return the clients' samples (the same offsets), shifted")
        return out

    val = shifted(data.val, "val") if data.val is not None else None
    info = {**data.info, "group": groups, **({"shift_level": levels} if levels is not None else {})}
    return replace(data, train=shifted(data.train, "train"), test=shifted(data.test, "test"), val=val, info=info)
