"""Ditto (Li, Hu, Beirami, Smith, ICML 2021, Algorithm 1): fair and robust federated learning through
personalisation.

Each selected client k updates the global model as FedAvg does (w_k from w^t) and, from the same w^t, its own
personal model v_k by s steps of

    v_k ← v_k − η (∇F_k(v_k) + λ (v_k − w^t))      (Algorithm 1, line 7; the objective h_k of eq. 2)

kept on the client (`fedhet.engine.personal`; a client's first v_k is the model's initialisation). The personal
learning rate η (``personal_lr``) and steps s (``personal_steps``) are the paper's own; by default they are the
global model's (local.lr, which η then follows through ``schedules.local_lr``, and local.steps or epochs). The
server averages the w_k. λ = 0 is local training alone; λ → ∞ is FedAvg's global model, but a discrete step
overshoots w^t once ηλ ≥ 2 (plain SGD: v_k − w^t is multiplied by 1 − ηλ each step), so such a λ is refused.
The personalised model of a client is its v_k.

``personal`` (default ``["*"]``: the whole model, the paper's) may name a part of the model instead, e.g. ``[head]``:
then v_k is that part only (the rest of the client's model is the global one, frozen in the personal steps), so
each client keeps only the head's bytes (what makes Ditto affordable for a million clients, docs/performance.md).

Both trainings of a round draw the same mini-batches (the same stream: the paper does not say whether v_k's
mini-batches are w_k's), so the dense backend's second training reuses what the first computed from them
(`fedhet.engine.reuse`).
"""

from __future__ import annotations

from dataclasses import replace
from typing import ClassVar

import torch
from pydantic import Field, SerializerFunctionWrapHandler, model_serializer
from torch import Tensor

from fedhet.engine.objective import Proximal
from fedhet.engine.optimizers import SGD, ClientOptimizer
from fedhet.engine.personal import Personal, parameter_names
from fedhet.engine.plan import MAX_STEPS, LocalPlan, LocalResult
from fedhet.errors import ConfigError
from fedhet.strategies.base import STRATEGIES, ServerContext, Train
from fedhet.strategies.fedavg import FedAvg

PERSONAL = Personal("ditto")  # the whole model
WHOLE = ["*"]


def stable_pull(optimizer: ClientOptimizer) -> float | None:
    """The bound on ηλ below which SGD's steps on the pull λ/2 ||v − w||² converge (heavy ball: 2(1 + μ); Nesterov:
    2(1 + μ)/(1 + 2μ); plain SGD: 2); None for other optimisers (Adam's steps are bounded by η whatever λ)."""
    if not isinstance(optimizer, SGD):
        return None
    mu = optimizer.momentum
    return 2 * (1 + mu) / (1 + 2 * mu) if optimizer.nesterov else 2 * (1 + mu)


@STRATEGIES.register
class Ditto(FedAvg):
    """FedAvg for w; each selected client also takes s steps v_k ← v_k − η (∇F_k(v_k) + λ (v_k − w)) (eq. 2)."""

    name: ClassVar[str] = "ditto"
    description: ClassVar[str] = "Ditto: a personal model per client, pulled towards the global one (Li et al. 2021)"
    lam: float = Field(
        0.1, ge=0, allow_inf_nan=False, description="λ: how strongly each personal model is pulled towards the global"
    )
    personal_lr: float | None = Field(
        None, gt=0, allow_inf_nan=False, description="η: the personal model's learning rate (default: local.lr)"
    )
    personal_steps: int | None = Field(
        None, ge=1, le=MAX_STEPS, description="s: the personal model's steps per round (default: local.steps/epochs)"
    )
    personal: list[str] = Field(
        default_factory=lambda: list(WHOLE),
        min_length=1,
        description="the personal parameters: '*' (the whole model), or names/patterns such as 'head' (the rest of "
        "v_k is the global model's)",
    )

    @model_serializer(mode="wrap")
    def _as_before(self, handler: SerializerFunctionWrapHandler) -> dict[str, object]:
        """The spec (and a run's identity) as before ``personal`` existed, when it is the whole model."""
        data: dict[str, object] = handler(self)
        if data.get("personal") == WHOLE:
            data.pop("personal")
        return data

    @property
    def spec(self) -> Personal:
        return PERSONAL if self.personal == WHOLE else Personal("ditto", tuple(self.personal))

    def _shared(self) -> tuple[str, ...]:
        """The parameters outside v_k (frozen in the personal steps): none for the whole model."""
        if self.personal == WHOLE:
            return ()
        model = self.ctx.engine.model
        mine = parameter_names(model, self.personal, "algorithm.personal of ditto")
        return tuple(n for n in model.names if n not in mine)

    def setup(self, ctx: ServerContext) -> None:
        super().setup(ctx)
        lr = self.personal_lr if self.personal_lr is not None else ctx.local.lr
        bound = stable_pull(ctx.local.optimizer)
        if bound is not None and lr * self.lam >= bound:
            which = "algorithm.personal_lr" if self.personal_lr is not None else "local.lr"
            raise ConfigError(
                f"algorithm.lam {self.lam:g} × {which} {lr:g} = {lr * self.lam:g}: each personal step would overshoot "
                f"the global model (SGD diverges once η·λ ≥ {bound:g}), and the personal models end at chance; use "
                f"lam < {bound / lr:g} (a very large lam is FedAvg's global model: algorithm fedavg)"
            )
        if self.personal_steps is not None:
            ctx.check_steps("algorithm.personal_steps", self.personal_steps, ctx.clients_per_round)
        self._shared()  # personal parameters the model does not have: refused before anything runs

    def personal_plan(self, plan: LocalPlan) -> LocalPlan:
        """The personal steps of `plan`'s clients: λ's pull instead of any proximal term, η and s where set (a
        client without training data takes no step)."""
        own = tuple(t for t in plan.terms if t.name != Proximal.name)
        frozen = (*plan.frozen, *self._shared())
        personal = replace(plan, terms=(*own, Proximal(mu=self.lam)), personal=self.spec, phase=1, frozen=frozen)
        if self.personal_lr is not None:
            personal.lr = torch.full_like(plan.lr, self.ctx.scheduled_lr(self.personal_lr))
        if self.personal_steps is not None:
            personal.steps = torch.where(plan.steps > 0, self.personal_steps, 0)
        return personal

    def local_training(self, round_: int, clients: Tensor, global_params: Tensor, train: Train) -> LocalResult:
        plan = self.configure(round_, clients, global_params)
        result = train(plan)
        train(self.personal_plan(plan))
        return result

    def personalization(self, clients: Tensor) -> LocalPlan:
        local = self.ctx.local
        return LocalPlan.uniform(clients, 0, local.lr, local.batch_size, personal=self.spec)
