"""FedNova (Wang et al., NeurIPS 2020, "Tackling the objective inconsistency problem in heterogeneous federated
optimization", eqs. 6–7): normalised averaging when clients take different numbers of local steps.

Client i runs τ_i local steps; its cumulative update is Δ_i = x − y_i = η_i G_i a_i, with a_i the weights of its
τ_i gradients. The server averages the normalised gradients d_i = Δ_i / (η_i ‖a_i‖₁) and steps by the effective
number of steps: x ← x − η_g (Σ_i p_i η_i ‖a_i‖₁) Σ_i p_i d_i, with p_i = n_i / Σ n_j over the cohort
(τ_eff = Σ p_i ‖a_i‖₁, the paper's default choice). For plain local SGD a_i = 1 and ‖a_i‖₁ = τ_i; with a proximal
term μ (and an L2 penalty λ), each step shrinks the distance to x by (1 − α), α = η(μ + λ), and
‖a_i‖₁ = (1 − (1 − α)^τ_i) / α (the paper's FedProx case). With equal steps and plain SGD it is FedAvg exactly;
``epochs > 0`` gives each client τ_i = epochs · n_i / B steps, as in the paper's experiments.
"""

from __future__ import annotations

from typing import ClassVar

import torch
from pydantic import Field
from torch import Tensor

from fedhet.engine.plan import LocalPlan, LocalResult
from fedhet.strategies.base import STRATEGIES
from fedhet.strategies.fedavg import fedavg_weights
from fedhet.strategies.fedprox import FedProx


def fednova_norms(steps: Tensor, lr: Tensor, shrink: float) -> Tensor:
    """‖a_i‖₁ per client: τ_i for plain SGD (`shrink` = μ + λ = 0), else (1 − (1 − η_i s)^τ_i) / (η_i s)."""
    tau = steps.double()
    if shrink == 0:
        return tau
    alpha = lr.double() * shrink
    return (1 - (1 - alpha) ** tau) / alpha


def epoch_steps(sizes: Tensor, batch_size: int, epochs: float) -> Tensor:
    """τ_i = max(1, round(epochs · n_i / B)): local epochs over unequal datasets, the source of unequal steps in
    FedNova's experiments (Wang et al. 2020, §6)."""
    return torch.clamp(torch.round(epochs * sizes.double() / batch_size), min=1).long()


def fednova_direction(updates: Tensor, p: Tensor, lr: Tensor, norms: Tensor) -> Tensor:
    """(Σ p_i η_i ‖a_i‖₁) Σ p_i Δ_i / (η_i ‖a_i‖₁) over the clients with ‖a_i‖₁ > 0 (p re-normalised); the
    server takes x − η_g times this."""
    active = norms > 0
    if not bool(active.any()):
        return torch.zeros_like(updates[0]) if len(updates) else updates.new_zeros(updates.shape[1:])
    p = p.double()[active]
    p = p / p.sum()
    scale = lr.double()[active] * norms[active]  # η_i ‖a_i‖₁
    d = updates[active].double() / scale.unsqueeze(1)
    step = (p * scale).sum() * (p @ d)
    return step.to(updates.dtype)


@STRATEGIES.register
class FedNova(FedProx):
    """Normalised averaging over unequal local steps (Wang et al. 2020); local solver SGD, optionally proximal."""

    name: ClassVar[str] = "fednova"
    description: ClassVar[str] = "FedNova: normalised averaging of updates from unequal local steps (Wang et al. 2020)"
    mu: float = Field(0.0, ge=0, description="proximal coefficient μ of the local solver (0: plain SGD)")
    epochs: float = Field(
        0.0, ge=0, description="> 0: client i runs τ_i = max(1, round(epochs·n_i/B)) steps; 0: the run's local steps"
    )

    def configure(self, round_: int, clients: Tensor, global_params: Tensor) -> LocalPlan:
        plan = super().configure(round_, clients, global_params)
        if self.epochs > 0:
            plan.steps = epoch_steps(self.ctx.train_sizes[clients], plan.batch_size, self.epochs)
        return plan

    def aggregate(self, round_: int, global_params: Tensor, result: LocalResult) -> Tensor:
        p = fedavg_weights(self.ctx.train_sizes[result.clients], self.weighting)
        norms = fednova_norms(result.steps, result.lr, self.mu + self.ctx.local.weight_decay)
        return self.server_step(global_params, fednova_direction(result.updates(global_params), p, result.lr, norms))
