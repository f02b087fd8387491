"""Two-client cases for the personalised methods, and a reference of full-batch local SGD written with plain
autograd, independent of the engine: with a batch larger than every client's data, each step uses all of a
client's samples, so the steps are deterministic whatever the engine's mini-batch streams."""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import Tensor, nn

from fedhet.data.dataset import FederatedData
from fedhet.engine.engine import Engine
from fedhet.engine.functional import FlatModel
from fedhet.engine.plan import LocalPlan, LocalResult
from fedhet.strategies.base import Strategy
from helpers.tiny import make_context, tiny_data

SIZES = [3, 5]
BATCH = 8  # larger than every client: full-batch steps
STEPS, LR = 2, 0.1
TOL = {"atol": 1e-6, "rtol": 1e-5}


def mlp(seed: int = 0) -> FlatModel:
    """A two-layer network (a body and a head), small enough to check by hand."""
    torch.manual_seed(seed)
    return FlatModel(nn.Sequential(nn.Linear(3, 4), nn.Tanh(), nn.Linear(4, 2)))


def data() -> FederatedData:
    return tiny_data(SIZES, dim=3, classes=2, seed=5)


def setup(strategy: Strategy, backend: str, steps: int = STEPS) -> Engine:
    """`strategy` on a fresh engine over the two clients (both in every round)."""
    engine = Engine(mlp(), data(), backend=backend, seed=1)  # type: ignore[arg-type]
    strategy.setup(make_context(engine, steps=steps, lr=LR, batch=BATCH, m=2))
    return engine


def gradient(model: FlatModel, w: Tensor, k: int) -> Tensor:
    """∇F_k(w): the gradient of client k's mean cross-entropy on all its samples."""
    x, y = data().train.client(k)
    w = w.detach().clone().requires_grad_(True)
    loss = torch.nn.functional.cross_entropy(model.logits(w, x), y)
    (g,) = torch.autograd.grad(loss, w)
    return g


def sgd(
    model: FlatModel,
    w: Tensor,
    k: int,
    steps: int,
    lr: float = LR,
    extra: Callable[[Tensor], Tensor] | None = None,
    frozen: Tensor | None = None,
) -> Tensor:
    """`steps` full-batch SGD steps of client k from `w`: w ← w − η (∇F_k(w) + extra(w)), frozen coordinates kept."""
    for _ in range(steps):
        d = gradient(model, w, k) + (extra(w) if extra is not None else 0.0)
        new = w - lr * d
        w = torch.where(frozen, w, new) if frozen is not None else new
    return w


def run_round(strategy: Strategy, engine: Engine, w: Tensor, round_: int) -> tuple[LocalResult, Tensor]:
    """One round of `strategy` with both clients: its training result and the next global model."""
    clients = torch.tensor([0, 1])
    result = strategy.local_training(round_, clients, w, lambda plan: engine.train(w, plan, round_))
    return result, strategy.aggregate(round_, w, result)


def personal_models(strategy: Strategy, engine: Engine, w: Tensor, round_: int) -> Tensor:
    """(2, P) the clients' personalised models as evaluation builds them after round `round_ - 1`."""
    plan = strategy.personalization(torch.tensor([0, 1]))
    assert isinstance(plan, LocalPlan)
    starts = engine.personal_starts(w, plan, round_)
    assert starts is not None
    return starts


def weighted(models: list[Tensor]) -> Tensor:
    """FedAvg's sample-weighted mean of the two clients' models."""
    n = torch.tensor(SIZES, dtype=torch.float32)
    return (n[0] * models[0] + n[1] * models[1]) / n.sum()
