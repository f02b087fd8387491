"""Per-FedAvg (Fallah, Mokhtari, Ozdaglar, NeurIPS 2020): FedAvg whose clients take MAML steps (Algorithm 1).

The local step is `PerFedAvgRule` (first-order or Hessian-free), a local rule the engine runs for any model.
The server averages the local models uniformly, w ← (1/|S|) Σ_k w_k (Algorithm 1; ``weighting: samples`` weighs
them by size). A client's personalised model is one step of SGD of size α from the global model on a mini-batch of
its training data, w − α ∇f(w; D) (§3: what each user adapts to), scored by personalised evaluation
(``personal_eval``).
"""

from __future__ import annotations

from dataclasses import replace
from typing import ClassVar, Literal

from pydantic import Field
from torch import Tensor

from fedhet.engine.plan import LocalPlan
from fedhet.engine.rules import RULES, GradFn, LocalRule, Tree, axpy
from fedhet.strategies.base import STRATEGIES
from fedhet.strategies.fedavg import FedAvg


@RULES.register
class PerFedAvgRule(LocalRule):
    """Per-FedAvg's local step (Fallah, Mokhtari, Ozdaglar 2020, Algorithm 1 with eqs. 8–10):

        w̃ = w − α ∇f(w; D)                         (personalisation step, batch D)
        FO: d = ∇f(w̃; D')                           (first-order MAML, batch D')
        HF: d = ∇f(w̃; D') − α [∇f(w + δv; D'') − ∇f(w − δv; D'')] / 2δ,  v = ∇f(w̃; D')

    and the client optimiser steps along d (SGD: w ← w − β d, β the local learning rate); HF replaces the
    Hessian-vector product ∇²f(w; D'')v by a finite difference.
    """

    name: ClassVar[str] = "perfedavg"
    description: ClassVar[str] = "Per-FedAvg's MAML step (set by the perfedavg strategy)"
    alpha: float
    hessian_free: bool = False
    delta: float = 1e-3

    @property
    def batches_per_step(self) -> int:
        return 3 if self.hessian_free else 2

    def direction(self, grad_fn: GradFn, w: Tree) -> tuple[Tree, Tensor]:
        g, loss = grad_fn(w, 0)
        v, _ = grad_fn(axpy(w, -self.alpha, g), 1)
        if self.hessian_free:
            plus, _ = grad_fn(axpy(w, self.delta, v), 2)
            minus, _ = grad_fn(axpy(w, -self.delta, v), 2)
            v = {n: v[n] - self.alpha * (plus[n] - minus[n]) / (2 * self.delta) for n in v}
        return v, loss


@STRATEGIES.register
class PerFedAvg(FedAvg):
    """Local w ← w − β ∇f(w − α∇f(w; D); D') (FO) or its Hessian-free correction; β is ``local.lr``."""

    name: ClassVar[str] = "perfedavg"
    description: ClassVar[str] = "Per-FedAvg: MAML local steps, first-order or Hessian-free (Fallah et al. 2020)"
    weighting: Literal["samples", "uniform"] = "uniform"
    alpha: float = Field(0.01, gt=0, description="α: step size of the personalisation step")
    hessian_free: bool = Field(False, description="HF variant (finite-difference Hessian-vector product), else FO")
    delta: float = Field(1e-3, gt=0, description="δ of the finite difference (HF only)")

    def configure(self, round_: int, clients: Tensor, global_params: Tensor) -> LocalPlan:
        plan = super().configure(round_, clients, global_params)
        return replace(plan, rule=PerFedAvgRule(alpha=self.alpha, hessian_free=self.hessian_free, delta=self.delta))

    def personalization(self, clients: Tensor) -> LocalPlan:
        """One SGD step of size α from the global model (the personalised model w − α ∇f(w; D))."""
        return LocalPlan.uniform(clients, 1, self.alpha, self.ctx.local.batch_size, stream="personal-eval")
