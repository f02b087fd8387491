"""A tiny federated dataset, models small enough for hand-checked numbers, and a server context over them."""

from __future__ import annotations

from typing import ClassVar

import torch
from torch import nn

from fedhet.data.dataset import ClientData, FederatedData
from fedhet.engine.engine import Engine
from fedhet.engine.functional import FlatModel
from fedhet.engine.objective import Aligned, ParameterTerm
from fedhet.engine.plan import LocalPlan
from fedhet.engine.step import Cohort, fresh_cohort
from fedhet.strategies.base import LocalSettings, ServerContext


def tiny_data(sizes: list[int], dim: int = 3, classes: int = 2, seed: int = 0) -> FederatedData:
    """Clients with `sizes` random samples each (train = test data)."""
    gen = torch.Generator().manual_seed(seed)
    xs = [torch.randn(n, dim, generator=gen) for n in sizes]
    ys = [torch.randint(0, classes, (n,), generator=gen) for n in sizes]
    part = ClientData.from_parts(xs, ys)
    return FederatedData("tiny", part, part, classes, torch.ones(len(sizes), dtype=torch.bool))


def linear_model(dim: int = 3, classes: int = 2, seed: int = 0) -> FlatModel:
    torch.manual_seed(seed)
    return FlatModel(nn.Linear(dim, classes))


class Shift(ParameterTerm):
    """A constant per-client vector c_k added to the gradient (the shape of SCAFFOLD's correction), for tests."""

    name: ClassVar[str] = "test_shift"
    client_state: ClassVar[tuple[str, ...]] = ("c",)

    def gradient(self, w: torch.Tensor, at: Aligned) -> torch.Tensor:
        return at.client["c"]


def cohort(plan: LocalPlan, w0: torch.Tensor, shift: torch.Tensor | None = None) -> Cohort:
    """The plan's cohort with fresh state; with `shift` (m, P), a `Shift` term in the plan gets those rows."""
    out = fresh_cohort(plan, w0)
    for inputs in out.terms:
        if isinstance(inputs.term, Shift) and shift is not None:
            inputs.client = {"c": shift}
    return out


def make_context(engine: Engine, steps: int = 5, lr: float = 0.1, batch: int = 4, m: int = 3) -> ServerContext:
    return ServerContext(engine, LocalSettings(steps, lr, batch), seed=0, clients_per_round=m)
