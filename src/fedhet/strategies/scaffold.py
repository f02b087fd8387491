"""SCAFFOLD (Karimireddy et al., ICML 2020, Algorithm 1 with option II control variates).

The server keeps c; each client keeps its own c_i where it lives (the engine's client store natively, the Flower
node's context under `fedhet.flower`): the plan carries c, the client corrects its steps by c − c_i, updates
c_i ← c_i⁺ (option II, `fedhet.engine.state.ControlVariates`) and returns only Δc_i = c_i⁺ − c_i.
"""

from __future__ import annotations

from typing import Any, ClassVar

import torch
from pydantic import PrivateAttr
from torch import Tensor

from fedhet.engine.plan import LocalPlan, LocalResult
from fedhet.engine.state import ControlVariates, scaffold_client_variates
from fedhet.strategies.base import STRATEGIES, ServerContext, Strategy

__all__ = ["Scaffold", "scaffold_client_variates"]


@STRATEGIES.register
class Scaffold(Strategy):
    """Local steps y ← y − η_l (g(y) + c − c_i); server x ← x + η_g mean Δy, c ← c + (1/N) Σ Δc_i."""

    name: ClassVar[str] = "scaffold"
    description: ClassVar[str] = "SCAFFOLD: control variates correct client drift (Karimireddy et al. 2020)"

    _c: Tensor | None = PrivateAttr(None)

    def setup(self, ctx: ServerContext) -> None:
        super().setup(ctx)
        self._c = torch.zeros(ctx.engine.model.size)

    def configure(self, round_: int, clients: Tensor, global_params: Tensor) -> LocalPlan:
        plan = super().configure(round_, clients, global_params)
        assert self._c is not None
        plan.client_state = ControlVariates(self._c.clone())
        return plan

    def aggregate(self, round_: int, global_params: Tensor, result: LocalResult) -> Tensor:
        assert self._c is not None
        if result.state_delta is None:
            raise RuntimeError("scaffold: the engine returned no control-variate changes (plan.client_state unset)")
        delta_c = result.state_delta[result.steps > 0]
        self._c = self._c + delta_c.sum(0) / self.ctx.num_clients
        delta_y = -result.updates(global_params)
        return global_params + self.server_lr * delta_y.mean(0)

    def state_dict(self) -> dict[str, Any]:
        return {"c": self._c}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self._c = state["c"]
