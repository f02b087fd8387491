"""Agnostic Federated Learning (Mohri, Sivek, Suresh, ICML 2019), as the FedMGDA+ paper runs it (eq. 10/18).

min_w max_{λ ∈ Δ} L(w, λ) = Σ_k λ_k F_k(w), solved by stochastic gradient descent–ascent with one mixture weight
per client (Λ = Δ, FedMGDA+ footnote 3):

    w ← w − γ_w (K/m) Σ_{k∈S} λ_k Δ_k            (Δ_k = w − w_k, the local update as a gradient estimate)
    λ ← Proj_Δ(λ + γ_λ (K/m) Σ_{k∈S} F_k e_k)     (∇_λ L = (F_1, …, F_K), estimated from the cohort S)

γ_w is ``server_lr`` and γ_λ is ``lambda_lr``; both updates use the λ of the start of the round. With full
participation (m = K, as on Adult in both papers) the K/m factors are 1 and this is the FedMGDA+ authors' rule
w ← w + γ_w Σ λ_k (w_k − w), λ ← Proj_Δ(λ + γ_λ F) with λ initialised uniform; with partial participation they
make the cohort sums unbiased estimates of the full ones. F_k is the loss client k *reports* (loss attacks apply):
at the received model on its whole training set (``loss_at: global``, the exact ∂L/∂λ_k) or the mean mini-batch
loss of its local training (``local``, the authors' code). Proj_Δ is the sort-based Euclidean projection
(Wang & Carreira-Perpiñán 2013).

AFL's output is the *average* of the iterates, w̄_T = (1/T) Σ_{t=1..T} w_t (Mohri et al., Stochastic-AFL; the
FedMGDA+ authors' code, which averages the models after each round): with ``output: average`` (default) that
average is what the run evaluates and reports, while training continues from the last iterate; ``output: last``
reports the last iterate (use it with the ``improved_users`` metric, which compares consecutive iterates). The
average leaves out the initial model w⁰; ``average_initial: true`` includes it, w̄_T = (1/(T+1)) Σ_{t=0..T} w_t,
as FLGo's AFL does (its running mean starts from the initial model). The two differ by (w⁰ − w̄_T)/(T + 1), a
difference that fades as 1/T.
"""

from __future__ import annotations

from typing import Any, ClassVar, Literal

import torch
from pydantic import Field, PrivateAttr
from torch import Tensor

from fedhet.engine.plan import LocalPlan, LocalResult
from fedhet.strategies.base import STRATEGIES, ServerContext, Strategy, by_client, weighted_update

__all__ = ["AFL", "project_simplex"]


def project_simplex(v: Tensor) -> Tensor:
    """argmin_{x ∈ Δ} ‖x − v‖₂: x = max(v − τ, 0) with τ from the sorted values (Wang & Carreira-Perpiñán)."""
    x = v.double()
    u = x.sort(descending=True).values
    cumulative = u.cumsum(0) - 1.0
    index = torch.arange(1, len(u) + 1, dtype=torch.float64)
    rho = int(torch.nonzero(u - cumulative / index > 0).flatten().max())
    tau = cumulative[rho] / (rho + 1)
    return (x - tau).clamp_min(0.0).to(v.dtype)


@STRATEGIES.register
class AFL(Strategy):
    """Gradient descent on w and projected ascent on the mixture weights λ over all clients."""

    name: ClassVar[str] = "afl"
    description: ClassVar[str] = "agnostic FL: minimax over client mixture weights, projected ascent (Mohri et al.)"
    lambda_lr: float = Field(0.1, ge=0, description="γ_λ: step size of the ascent on λ")
    loss_at: Literal["global", "local"] = Field("global", description="F_k at the received model or during training")
    output: Literal["average", "last"] = Field("average", description="report the average of the iterates or the last")
    average_initial: bool = Field(False, description="include the initial model w⁰ in the average (FLGo's choice)")

    _lambda: Tensor = PrivateAttr(default_factory=lambda: torch.zeros(0, dtype=torch.float64))
    _losses: Tensor = PrivateAttr(default_factory=lambda: torch.zeros(0))
    _average: Tensor = PrivateAttr(default_factory=lambda: torch.zeros(0, dtype=torch.float64))
    _count: int = PrivateAttr(0)

    def setup(self, ctx: ServerContext) -> None:
        super().setup(ctx)
        self._lambda = torch.full((ctx.num_clients,), 1.0 / ctx.num_clients, dtype=torch.float64)
        self._average, self._count = torch.zeros(0, dtype=torch.float64), 0

    @property
    def mixture(self) -> Tensor:
        """λ over all clients (K,)."""
        return self._lambda

    def configure(self, round_: int, clients: Tensor, global_params: Tensor) -> LocalPlan:
        if self.loss_at == "global":
            self._losses = by_client(self.ctx.client_losses(global_params, clients), clients, self.ctx.num_clients)
        return super().configure(round_, clients, global_params)

    def aggregate(self, round_: int, global_params: Tensor, result: LocalResult) -> Tensor:
        clients = result.clients
        scale = self.ctx.num_clients / len(clients)
        lam = self._lambda[clients]
        new = self.server_step(global_params, scale * weighted_update(result.updates(global_params), lam))
        if self.loss_at == "local":
            losses = self.ctx.attack.report_losses(clients, result.train_loss)
        else:
            losses = self._losses[clients]
        gradient = torch.zeros_like(self._lambda)
        gradient[clients] = scale * losses.double()
        self._lambda = project_simplex(self._lambda + self.lambda_lr * gradient)
        if self._count == 0 and self.average_initial:  # global_params is w⁰ in the first round
            self._average, self._count = global_params.double().clone(), 1
        self._count += 1
        if self._count == 1:
            self._average = new.double().clone()
        else:
            self._average += (new.double() - self._average) / self._count
        return new

    def evaluation_params(self, params: Tensor) -> Tensor:
        """w̄ = the mean of the iterates so far (``output: average``), else the current iterate."""
        if self.output == "last" or self._count == 0:
            return params
        return self._average.to(params.dtype)

    def round_metrics(self) -> dict[str, float]:
        return {"afl_lambda_max": float(self._lambda.max())} if len(self._lambda) else {}

    def state_dict(self) -> dict[str, Any]:
        return {
            **super().state_dict(),
            "lambda": self._lambda.clone(),
            "average": self._average.clone(),
            "count": self._count,
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        super().load_state_dict(state)
        self._lambda = state["lambda"].clone()
        self._average, self._count = state["average"].clone(), int(state["count"])
