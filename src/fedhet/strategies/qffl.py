"""q-FFL / q-FedAvg (Li, Sanjabi, Beirami, Smith, "Fair Resource Allocation in Federated Learning", ICLR 2020).

Objective: min_w f_q(w) = Σ_k p_k F_k^{q+1}(w) / (q + 1); q = 0 is FedAvg's objective and large q approaches
AFL's min-max (FedMGDA+ §3, Li et al. §3). q-FedAvg (Li et al., Algorithm 3) takes one server step per round from
the participants' local models w̄_k and their losses F_k(w_t) at the received model:

    Δw_k = L (w_t − w̄_k),    Δ_k = F_k^q Δw_k,    h_k = q F_k^{q−1} ‖Δw_k‖² + L F_k^q,
    w_{t+1} = w_t − Σ_k Δ_k / Σ_k h_k,

with L an estimate of the Lipschitz constant of ∇F_k. Li et al. take L = 1/η, the inverse of the local learning
rate (their released ``qffedavg.py``: Δw_k = (w_t − w̄_k)/η and L F_k^q = F_k^q/η), so that Δw_k is the sum of
the local gradients; that is the default here (``lipschitz`` unset: L = 1/η_l, the run's ``local.lr``). A value
given explicitly is used as it is: the FedMGDA+ authors' code defaults to L = 1 and their Table 5 grid is
L ∈ {0.1, 1, 10}, so the FedMGDA+ recipes pass L. F_k is what client k *reports* (so loss attacks such as
FedMGDA+'s bias attack reach it through `ServerContext.client_losses`). ``loss: mean`` is the mean loss over the
client's training data (Li et al.); ``batch_sum`` multiplies it by the number of local mini-batches ⌈n_k / b⌉,
the "non-averaged total" of the FedMGDA+ authors' code, on which their bias levels (1000–10000) are set; the
attack is applied to the total, as in that code. Losses are floored at 1e-10 (as Li et al.'s code does by adding
1e-10), so that F^{q−1} stays finite. ``server_lr`` scales the step (1 is the paper's rule).
"""

from __future__ import annotations

import math
from typing import Any, ClassVar, Literal

import torch
from pydantic import Field, PrivateAttr
from torch import Tensor

from fedhet.engine.plan import LocalPlan, LocalResult
from fedhet.strategies.base import STRATEGIES, Strategy, by_client

__all__ = ["QFFL", "qffl_objective", "qffl_step"]


def qffl_step(global_params: Tensor, updates: Tensor, losses: Tensor, q: float, lipschitz: float) -> Tensor:
    """The q-FedAvg direction Σ_k Δ_k / Σ_k h_k (subtract it from w_t); `updates` are w_t − w̄_k (m, P)."""
    f = losses.double().clamp_min(1e-10)
    dw = lipschitz * updates.double()
    fq = f**q
    h = lipschitz * fq
    if q != 0:
        h = h + q * f ** (q - 1) * (dw * dw).sum(dim=1)
    return ((fq.unsqueeze(1) * dw).sum(0) / h.sum()).to(global_params.dtype)


def qffl_objective(losses: Tensor, q: float, weights: Tensor | None = None) -> float:
    """f_q = Σ_k p_k F_k^{q+1} / (q + 1) (uniform p_k when `weights` is None)."""
    f = losses.double()
    p = torch.full_like(f, 1.0 / len(f)) if weights is None else weights.double()
    return float((p * f ** (q + 1)).sum() / (q + 1))


@STRATEGIES.register
class QFFL(Strategy):
    """q-FedAvg: participants weighted by F_k^q with the adaptive step 1 / Σ h_k."""

    name: ClassVar[str] = "qffl"
    description: ClassVar[str] = "q-FFL / q-FedAvg: fair resource allocation, weights F_k^q (Li et al. 2020)"
    q: float = Field(1.0, ge=0, description="fairness exponent q (0: FedAvg; large q: AFL-like)")
    lipschitz: float | None = Field(
        None, gt=0, description="L: Lipschitz-constant estimate; unset: 1/η_l, the local learning rate (Li et al.)"
    )
    loss: Literal["mean", "batch_sum"] = Field("mean", description="F_k: mean loss, or × number of mini-batches")

    _losses: Tensor = PrivateAttr(default_factory=lambda: torch.zeros(0))

    @property
    def lipschitz_constant(self) -> float:
        """L: the configured value, or 1/η_l (the run's local learning rate) when none is given (Li et al.)."""
        return self.lipschitz if self.lipschitz is not None else 1.0 / self.ctx.local.lr

    def derived(self) -> dict[str, Any]:
        return {"lipschitz": self.lipschitz_constant} if self.lipschitz is None else {}

    def reported_losses(self, clients: Tensor, global_params: Tensor) -> Tensor:
        """F_k(w_t) as the clients report it (after any loss attack)."""
        if self.loss == "mean":
            return self.ctx.client_losses(global_params, clients)
        batch = self.ctx.local.batch_size
        batches = torch.tensor([math.ceil(int(n) / batch) for n in self.ctx.train_sizes[clients]], dtype=torch.float64)
        honest = self.ctx.engine.losses_at(global_params, clients, "train").double() * batches
        return self.ctx.attack.report_losses(clients, honest)

    def configure(self, round_: int, clients: Tensor, global_params: Tensor) -> LocalPlan:
        self._losses = by_client(self.reported_losses(clients, global_params), clients, self.ctx.num_clients)
        return super().configure(round_, clients, global_params)

    def aggregate(self, round_: int, global_params: Tensor, result: LocalResult) -> Tensor:
        losses = self._losses[result.clients]
        direction = qffl_step(global_params, result.updates(global_params), losses, self.q, self.lipschitz_constant)
        return self.server_step(global_params, direction)

    def round_metrics(self) -> dict[str, float]:
        known = self._losses[~torch.isnan(self._losses)]
        return {"qffl_loss_max": float(known.max())} if len(known) else {}
