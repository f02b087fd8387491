"""FedMGDA+ (Hu, Shaloudegi, Zhang, Yu, "Federated Learning Meets Multi-objective Optimization", Algorithm 1),
its vanilla form FedMGDA, and FedAvg-n (FedAvg on normalised updates).

One round (Algorithm 1): participants return g_i = w_t − w_i (their local update); the server

1. normalises ḡ_i = g_i / ‖g_i‖₂ (line 5; ``normalize``; a zero update stays zero);
2. solves λ* = argmin_{λ ∈ Δ, ‖λ − λ0‖_∞ ≤ ε} ‖Σ λ_i ḡ_i‖² (line 6, eq. 25) with `fedhet.methods.fedmgda.min_norm`;
3. steps w_{t+1} = w_t − η_t d_t with d_t = Σ λ*_i ḡ_i (lines 7–9, eq. 22) and η_t = η_g · β^⌊t/100⌋ (§6.1).

ε = 0 is FedAvg with weights λ0 (eq. 1) and ε = 1 is MGDA (eqs. 22–23). The box centre λ0 is the ``weighting``
switch inherited from FedAvg: ``uniform`` (1/n over the sampled clients, as in the authors' code and experiments,
the default here) or ``samples`` (data-size weights n_i / Σ n_j, the other choice eq. 1 allows). With ε = 0, no
normalisation and no decay the server step is computed exactly as FedAvg's, so both give the same model.

``lr_decay`` is β itself (the authors' ``--global_lr_decay``), the factor applied every ``decay_every`` rounds:
the server learning rate's ``step`` schedule (`fedhet.engine.schedules.Step`, the strategy's `server_schedule`);
the paper states the total decay over T rounds ("decay = 1/10"), converted with `beta_for_decay`.
``prox_mu`` adds FedProx's proximal term to the local objective (the paper's MGDA-Prox); the term is
(μ/2)‖w − w_t‖², so the authors' ``--prox_weight`` (μ‖w − w_t‖², no ½) of 0.1 is ``prox_mu = 0.2``.
"""

from __future__ import annotations

import math
import warnings
from typing import ClassVar, Literal

import torch
from pydantic import Field, PrivateAttr
from torch import Tensor

from fedhet.engine.objective import Proximal
from fedhet.engine.plan import LocalPlan, LocalResult
from fedhet.engine.schedules import Schedule, Step
from fedhet.errors import ConfigError
from fedhet.methods.fedmgda.min_norm import solve_min_norm
from fedhet.strategies.base import STRATEGIES, ServerContext, weighted_update
from fedhet.strategies.fedavg import FedAvg, fedavg_weights

__all__ = ["FedAvgN", "FedMGDA", "FedMGDAPlus", "beta_for_decay", "mgda_weights", "normalise_updates", "step_size"]


def normalise_updates(updates: Tensor) -> Tensor:
    """ḡ_i = g_i / ‖g_i‖₂ row by row (Algorithm 1, line 5), the norm taken over all parameters; zero rows stay 0."""
    norms = updates.double().norm(dim=1, keepdim=True)
    scaled = updates.double() / torch.where(norms > 0, norms, torch.ones_like(norms))
    return scaled.to(updates.dtype)


def mgda_weights(updates: Tensor, center: Tensor, eps: float) -> Tensor:
    """λ* of eq. (25) for the rows of `updates`; never raises for a cohort the engine can produce.

    The Gram matrix is formed in float64 from the rows times one power of two (exact, and λ* is scale-free), so
    ⟨g_i, g_j⟩ cannot overflow for huge raw updates. A non-finite update (a diverged client) has no min-norm
    combination: λ0 is used then, which passes the inf/nan on to the model just as FedAvg would. If the solver
    stops at its iteration cap, its best feasible λ is used (with a warning).
    """
    u = updates.double()
    if not bool(torch.isfinite(u).all()):
        msg = "FedMGDA: a client update has inf/nan entries; using λ0 (FedAvg's weights) this round"
        warnings.warn(msg, RuntimeWarning, stacklevel=2)
        return center.float()
    peak = float(u.abs().max()) if u.numel() else 0.0
    if peak > 0.0:
        u = u * 2.0 ** -math.frexp(peak)[1]
    solution = solve_min_norm((u @ u.T).numpy(), center.double().numpy(), eps)
    if not solution.converged:
        warnings.warn(
            f"FedMGDA: the min-norm QP stopped after {solution.iterations} iterations; using its best feasible λ "
            f"(relative KKT violation {solution.kkt_violation:.1e})",
            RuntimeWarning,
            stacklevel=2,
        )
    return torch.as_tensor(solution.weights, dtype=torch.float32)


def step_size(server_lr: float, beta: float, round_: int, every: int = 100) -> float:
    """η_t = η_g · β^⌊t/every⌋ for 0-based round t (§6.1; the authors' code multiplies by η_g): the ``step``
    schedule of the server learning rate."""
    return server_lr * Step(every=every, gamma=beta).factor(round_, 0)


def beta_for_decay(decay: float, rounds: int, every: int = 100) -> float:
    """β = decay^(every/T): the per-`every`-rounds factor whose product over T rounds is `decay` (§6.1).

    The paper's tables write "decay = 0" for no decay; both 0 and 1 give β = 1.
    """
    if decay <= 0 or decay >= 1:
        return 1.0
    return float(decay ** (every / rounds))


@STRATEGIES.register
class FedMGDAPlus(FedAvg):
    """Algorithm 1: min-norm direction of (normalised) updates inside an ε-box around λ0, decaying global step."""

    name: ClassVar[str] = "fedmgda_plus"
    description: ClassVar[str] = "FedMGDA+: min-norm common descent direction of normalised updates (Hu et al.)"
    weighting: Literal["samples", "uniform"] = Field("uniform", description="ε-box centre λ0 (uniform: authors' code)")
    epsilon: float = Field(1.0, ge=0, description="ε: radius of the box ‖λ − λ0‖_∞ ≤ ε (0 FedAvg, 1 MGDA)")
    normalize: bool = Field(True, description="normalise each update to unit ℓ2 norm (Algorithm 1, line 5)")
    lr_decay: float = Field(1.0, gt=0, le=1, description="β: global step multiplied by β every decay_every rounds")
    decay_every: int = Field(100, ge=1, description="rounds between two decays of the global step")
    prox_mu: float = Field(0.0, ge=0, description="local proximal term (μ/2)‖w − w_t‖² (MGDA-Prox)")

    _lambda: Tensor = PrivateAttr(default_factory=lambda: torch.zeros(0))
    _direction_norm: float = PrivateAttr(float("nan"))
    _step: float = PrivateAttr(float("nan"))

    def configure(self, round_: int, clients: Tensor, global_params: Tensor) -> LocalPlan:
        plan = super().configure(round_, clients, global_params)
        return plan.with_terms(Proximal(mu=self.prox_mu)) if self.prox_mu else plan

    def server_schedule(self) -> Schedule:
        """η_t = η_g · β^⌊t/decay_every⌋ (§6.1): the ``step`` schedule with γ = ``lr_decay``."""
        return Step(every=self.decay_every, gamma=self.lr_decay)

    def setup(self, ctx: ServerContext) -> None:
        if ctx.server_schedule is not None and self.lr_decay != 1:
            raise ConfigError(
                "algorithm.lr_decay and schedules.server_lr both schedule FedMGDA+'s global step; keep one (lr_decay "
                f"{self.lr_decay:g} every {self.decay_every} rounds is schedules.server_lr: "
                f"{{name: step, every: {self.decay_every}, gamma: {self.lr_decay:g}}})"
            )
        super().setup(ctx)

    def direction_weights(self, updates: Tensor, clients: Tensor) -> Tensor:
        """λ*: λ0 itself when ε = 0 (no QP, as in the authors' code), else the min-norm solution."""
        center = fedavg_weights(self.ctx.train_sizes[clients], self.weighting)
        return center if self.epsilon == 0 else mgda_weights(updates, center, self.epsilon)

    def aggregate(self, round_: int, global_params: Tensor, result: LocalResult) -> Tensor:
        updates = result.updates(global_params)
        if self.normalize:
            updates = normalise_updates(updates)
        lam = self.direction_weights(updates, result.clients)
        direction = weighted_update(updates, lam)
        self._lambda, self._step = lam, self.server_lr_at(round_)
        self._direction_norm = float(direction.double().norm())
        return self.server_step(global_params, direction, self._step)

    def round_metrics(self) -> dict[str, float]:
        if len(self._lambda) == 0:
            return {}
        lam = self._lambda.double()
        return {
            "mgda_lambda_max": float(lam.max()),
            "mgda_lambda_min": float(lam.min()),
            "mgda_direction_norm": self._direction_norm,
            "server_step": self._step,
        }


@STRATEGIES.register
class FedMGDA(FedMGDAPlus):
    """The vanilla extension of MGDA to FL (§5): eq. (25) on un-normalised updates, constant global step 1.

    ε = 1 (default) is pure MGDA; ε in (0, 1) interpolates to FedAvg (ε = 0), as in the paper's Figs 1, 5–7.
    """

    name: ClassVar[str] = "fedmgda"
    description: ClassVar[str] = "FedMGDA: MGDA on raw (un-normalised) client updates, eps-box to interpolate FedAvg"
    normalize: Literal[False] = False


@STRATEGIES.register
class FedAvgN(FedMGDAPlus):
    """FedAvg-n (§6): FedAvg's weights λ0 on normalised updates, with FedMGDA+'s global step and decay."""

    name: ClassVar[str] = "fedavg_n"
    description: ClassVar[str] = "FedAvg-n: FedAvg over unit-norm client updates with a decaying global step"
    epsilon: float = Field(0.0, ge=0, le=0, description="always 0: λ = λ0")
    normalize: Literal[True] = True
