"""FedDyn (Acar et al., "Federated Learning Based on Dynamic Regularization", ICLR 2021) as a fedhet plugin.

This file lives outside fedhet and changes nothing in it: it registers a local-objective term and a strategy,
which then run by name on every backend (dense included) and on Flower nodes. Use it with

    fedhet run --import examples/feddyn/feddyn.py --algorithm feddyn --set algorithm.alpha=0.01

Client k minimises (Algorithm 1, line 6)  L_k(θ) − ⟨∇L_k(θ_k^{t−1}), θ⟩ + (α/2)‖θ − θ^{t−1}‖², whose extra
gradient is −g_k + α(θ − θ^{t−1}) with g_k = ∇L_k(θ_k^{t−1}) kept by the client and updated after training by
the first-order condition g_k ← g_k − α(θ_k^t − θ^{t−1}) (line 7). The server keeps h (lines 9–10):
h ← h − α (1/m) Σ_{k ∈ P_t} (θ_k^t − θ^{t−1}) with m the number of clients, θ^t = mean_{k ∈ P_t} θ_k^t − h/α.
"""

from __future__ import annotations

from typing import Any, ClassVar

import torch
from pydantic import Field, PrivateAttr
from torch import Tensor

from fedhet.engine.objective import TERMS, Aligned, ParameterTerm
from fedhet.engine.plan import LocalPlan, LocalResult
from fedhet.strategies.base import STRATEGIES, ServerContext, Strategy


@TERMS.register
class DynamicRegulariser(ParameterTerm):
    """−⟨g_k, θ⟩ + (α/2)‖θ − θ^{t−1}‖², with g_k the client's state."""

    name: ClassVar[str] = "feddyn"
    description: ClassVar[str] = "FedDyn's dynamic regulariser (Acar et al. 2021)"
    client_state: ClassVar[tuple[str, ...]] = ("grad",)
    alpha: float = Field(0.01, gt=0, description="α")

    def gradient(self, w: Tensor, at: Aligned) -> Tensor:
        return self.alpha * (w - at.start) - at.client["grad"]

    def update_state(self, name: str, old: Tensor, start: Tensor, final: Tensor, steps: Tensor, lr: Tensor) -> Tensor:
        return old - self.alpha * (final - start)


@STRATEGIES.register
class FedDyn(Strategy):
    """Clients train with the dynamic regulariser; the server corrects the average by its state h."""

    name: ClassVar[str] = "feddyn"
    description: ClassVar[str] = "FedDyn: dynamic regularisation (Acar et al. 2021), a plugin example"
    alpha: float = Field(0.01, gt=0, description="α of the regulariser and of the server correction")

    _h: Tensor | None = PrivateAttr(None)

    def setup(self, ctx: ServerContext) -> None:
        super().setup(ctx)
        self._h = torch.zeros(ctx.engine.model.size)

    def configure(self, round_: int, clients: Tensor, global_params: Tensor) -> LocalPlan:
        return super().configure(round_, clients, global_params).with_terms(DynamicRegulariser(alpha=self.alpha))

    def aggregate(self, round_: int, global_params: Tensor, result: LocalResult) -> Tensor:
        assert self._h is not None
        moved = result.params - global_params
        self._h = self._h - self.alpha * moved.sum(0) / self.ctx.num_clients
        # θ^t = mean θ_k − h/α = θ^{t−1} − (mean of (θ^{t−1} − θ_k) + h/α): a server step with η_g = 1
        return self.server_step(global_params, result.updates(global_params).mean(0) + self._h / self.alpha)

    def state_dict(self) -> dict[str, Any]:
        return {**super().state_dict(), "h": self._h}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        super().load_state_dict(state)
        self._h = state["h"]
