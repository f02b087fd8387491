"""SCAFFOLD (Karimireddy et al., ICML 2020, Algorithm 1 with option II control variates).

The server keeps c; each client keeps its own c_i where it lives (the engine's client store natively, the Flower
node under `fedhet.flower`): the plan carries c in the `ControlVariates` term, the client corrects its steps by
c − c_i, updates c_i ← c_i⁺ (option II) and returns only Δc_i = c_i⁺ − c_i.
"""

from __future__ import annotations

from typing import Any, ClassVar

import torch
from pydantic import PrivateAttr
from torch import Tensor

from fedhet.engine.objective import TERMS, Aligned, ParameterTerm
from fedhet.engine.plan import LocalPlan, LocalResult
from fedhet.strategies.base import STRATEGIES, ServerContext, Strategy


def scaffold_client_variates(
    c_i: Tensor, c: Tensor, global_params: Tensor, local_params: Tensor, steps: Tensor, lr: Tensor
) -> Tensor:
    """SCAFFOLD option II (Algorithm 1 line 12): c_i⁺ = c_i − c + (x − y_i) / (K_i η_l), row-wise for the cohort.

    One new (m, P) tensor, the rest in place: with a large model, every fresh cohort-sized tensor costs memory
    and the time to fault its pages in."""
    scale = (steps.double() * lr.double()).clamp_min(1e-30).float().unsqueeze(1)
    out = global_params.unsqueeze(0) - local_params
    return out.div_(scale).add_(c_i).sub_(c.unsqueeze(0))


@TERMS.register
class ControlVariates(ParameterTerm):
    """SCAFFOLD's client side: the linear term ⟨c − c_i, w⟩ (gradient c − c_i) with c_i kept by the client and
    updated by option II after the local steps; the change Δc_i goes back to the server."""

    name: ClassVar[str] = "scaffold"
    description: ClassVar[str] = "SCAFFOLD's control-variate correction c - c_i (set by the scaffold strategy)"
    client_state: ClassVar[tuple[str, ...]] = ("c_i",)
    reports_state: ClassVar[bool] = True
    c: Tensor  # the server's control variate (P,)

    def gradient(self, w: Tensor, at: Aligned) -> Tensor:
        return at.server["c"] - at.client["c_i"]

    def update_state(self, name: str, old: Tensor, start: Tensor, final: Tensor, steps: Tensor, lr: Tensor) -> Tensor:
        return scaffold_client_variates(old, self.c, start, final, steps, lr)


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
        assert self._c is not None
        return super().configure(round_, clients, global_params).with_terms(ControlVariates(c=self._c.clone()))

    def aggregate(self, round_: int, global_params: Tensor, result: LocalResult) -> Tensor:
        assert self._c is not None
        delta_c = result.state_delta.get(ControlVariates(c=self._c).state_key("c_i"))
        if delta_c is None:
            raise RuntimeError("scaffold: the engine returned no control-variate changes")
        self._c = self._c + delta_c.sum(0) / self.ctx.num_clients  # Δc_i is 0 for a client that took no step
        return self.server_step(global_params, result.updates(global_params).mean(0))

    def state_dict(self) -> dict[str, Any]:
        return {**super().state_dict(), "c": self._c}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        super().load_state_dict(state)
        self._c = state["c"]
