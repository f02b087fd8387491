"""SCAFFOLD (Karimireddy et al., ICML 2020, Algorithm 1 with option II control variates)."""

from __future__ import annotations

from typing import Any, ClassVar

import torch
from pydantic import PrivateAttr
from torch import Tensor

from fedhet.engine.plan import LocalPlan, LocalResult
from fedhet.strategies.base import STRATEGIES, ServerContext, Strategy


def scaffold_client_variates(
    c_i: Tensor, c: Tensor, global_params: Tensor, local_params: Tensor, steps: Tensor, lr: Tensor
) -> Tensor:
    """Option II: c_i⁺ = c_i − c + (x − y_i) / (K_i η_l), row-wise for the cohort."""
    scale = (steps.double() * lr.double()).clamp_min(1e-30).float().unsqueeze(1)
    return c_i - c.unsqueeze(0) + (global_params.unsqueeze(0) - local_params) / scale


@STRATEGIES.register
class Scaffold(Strategy):
    """Local steps y ← y − η_l (g(y) + c − c_i); server x ← x + η_g mean Δy, c ← c + (1/N) Σ Δc_i."""

    name: ClassVar[str] = "scaffold"
    description: ClassVar[str] = "SCAFFOLD: control variates correct client drift (Karimireddy et al. 2020)"

    _c: Tensor | None = PrivateAttr(None)
    _client_c: dict[int, Tensor] = PrivateAttr(default_factory=dict)

    def setup(self, ctx: ServerContext) -> None:
        super().setup(ctx)
        self._c = torch.zeros(ctx.engine.model.size)
        self._client_c = {}

    def _c_i(self, clients: Tensor) -> Tensor:
        assert self._c is not None
        zero = torch.zeros_like(self._c)
        return torch.stack([self._client_c.get(int(k), zero) for k in clients])

    def configure(self, round_: int, clients: Tensor, global_params: Tensor) -> LocalPlan:
        plan = super().configure(round_, clients, global_params)
        assert self._c is not None
        plan.correction = self._c.unsqueeze(0) - self._c_i(clients)
        return plan

    def aggregate(self, round_: int, global_params: Tensor, result: LocalResult) -> Tensor:
        assert self._c is not None
        c_i = self._c_i(result.clients)
        new_c_i = scaffold_client_variates(c_i, self._c, global_params, result.params, result.steps, result.lr)
        trained = result.steps > 0
        for row, k in enumerate(result.clients.tolist()):
            if trained[row]:
                self._client_c[k] = new_c_i[row]
        delta_c = (new_c_i - c_i)[trained]
        self._c = self._c + delta_c.sum(0) / self.ctx.num_clients
        delta_y = -result.updates(global_params)
        return global_params + self.server_lr * delta_y.mean(0)

    def state_dict(self) -> dict[str, Any]:
        ids = sorted(self._client_c)
        stacked = torch.stack([self._client_c[k] for k in ids]) if ids else torch.zeros(0)
        return {"c": self._c, "client_ids": torch.tensor(ids, dtype=torch.long), "client_c": stacked}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self._c = state["c"]
        self._client_c = {int(k): row for k, row in zip(state["client_ids"], state["client_c"], strict=True)}
