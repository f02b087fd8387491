"""A tiny run of several architectures: a composite model of small members over `tiny_data`, its engine, a context."""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor

from fedhet.data.dataset import FederatedData
from fedhet.engine.architectures import ArchitectureEngine
from fedhet.engine.functional import FlatModel
from fedhet.models.architectures import Architectures
from fedhet.strategies.base import LocalSettings, ServerContext
from helpers.tiny import tiny_data

MEMBERS: list[dict[str, Any]] = [{"name": "mlp", "hidden": []}, {"name": "mlp", "hidden": [5]}]


def composite(
    members: list[dict[str, Any]] | None = None, dim: int = 3, inputs: int = 4, classes: int = 3
) -> FlatModel:
    torch.manual_seed(0)
    spec = Architectures(members=members or MEMBERS, dim=dim)
    return FlatModel(spec.build((inputs,), classes))


def engine(
    members: Tensor | list[int] | None = None,
    sizes: list[int] | None = None,
    backend: str = "sequential",
    model: FlatModel | None = None,
) -> ArchitectureEngine:
    """Clients of `sizes` samples (4 features, 3 classes) whose architectures are `members` (default 0, 1, 0, 1)."""
    sizes = sizes or [6, 8, 5, 7]
    data: FederatedData = tiny_data(sizes, dim=4, classes=3, seed=1)
    out = ArchitectureEngine(model or composite(), data, backend=backend)  # type: ignore[arg-type]
    out.assign(torch.as_tensor(members if members is not None else [i % 2 for i in range(len(sizes))]))
    return out


def context(eng: ArchitectureEngine, steps: int = 2, lr: float = 0.1, batch: int = 4, m: int = 4) -> ServerContext:
    return ServerContext(eng, LocalSettings(steps, lr, batch), seed=0, clients_per_round=m)
