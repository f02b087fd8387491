"""FjORD (Horváth, Laskaridis, Almeida, Leontiadis, Venieris, Lane, NeurIPS 2021): ordered dropout.

A client of capacity p_max ∈ (0, 1] trains, at every local mini-batch, the sub-model of the first ⌈p·d⌉ units of
every hidden layer (ordered dropout, §3), p drawn uniformly from the levels ``levels`` that are at most p_max (the
paper's U_{p_max}(D), §3.2): ``draws: batch`` (the default), p drawn for every (client, step) from the run's seeded
stream (seed, "fjord", round, client), whatever the cohort and the backend, carried to the engine as per-step
sub-models (`fedhet.engine.plan.LocalPlan.step_masks`). ``draws: round`` draws one p per client per round (seeded
by (seed, round)): the behaviour, and the numbers, of fedhet's FjORD before per-batch draws. Aggregation: each
coordinate is averaged over the clients that trained it (`fedhet.strategies.submodels.masked_average`, as FjORD's
§3.3 aggregates the sub-models); with per-batch draws a client counts for the units of its widest drawn p (the
union of its steps' sub-models: a unit its draws never reached it did not train). Not implemented: FjORD's
self-distillation.
"""

from __future__ import annotations

from dataclasses import replace
from typing import ClassVar, Literal

import torch
from pydantic import Field, PrivateAttr
from torch import Tensor

from fedhet.engine.plan import LocalPlan, LocalResult
from fedhet.seeding import numpy_rng
from fedhet.strategies.base import STRATEGIES
from fedhet.strategies.submodels import SubModels


@STRATEGIES.register
class FjORD(SubModels):
    """Ordered dropout: at each local step (``draws: round``: each round) a client trains the first ⌈p·d⌉ units,
    p drawn from the levels ≤ its capacity."""

    name: ClassVar[str] = "fjord"
    description: ClassVar[str] = "FjORD: ordered dropout, p <= capacity drawn per mini-batch (Horvath et al. 2021)"
    draws: Literal["batch", "round"] = Field(
        "batch", description="batch: p drawn for every local mini-batch (the paper); round: once per client per round"
    )

    _taken: tuple[Tensor, Tensor] | None = PrivateAttr(None)  # (clients, the steps they took) in `aggregate`
    _drawn: tuple[int, Tensor, Tensor, Tensor] | None = PrivateAttr(None)  # (round, clients, steps, (m, T) draws)

    def _allowed(self, round_: int) -> tuple[Tensor, Tensor]:
        """The levels in increasing order, and (K,) how many of them each client may draw (those ≤ its p_max)."""
        levels = torch.tensor(sorted(self.levels))
        return levels, (levels.unsqueeze(0) <= self.capacity(round_).unsqueeze(1)).sum(1)

    def step_draws(self, round_: int, clients: Tensor, steps: Tensor) -> Tensor:
        """(m, T) the index (into the sorted levels) of the p each of `clients` trains at each of its `steps` local
        steps in round `round_` (T: the most steps; 0 beyond a client's): uniform over the levels ≤ its capacity,
        from the stream (seed, "fjord", round, client), so that a client's draws depend on nothing else."""
        last = self._drawn
        if last is not None and last[0] == round_ and torch.equal(last[1], clients) and torch.equal(last[2], steps):
            return last[3]
        _, allowed = self._allowed(round_)
        out = torch.zeros(len(clients), int(steps.max()) if len(steps) else 0, dtype=torch.long)
        for i, (client, tau) in enumerate(zip(clients.tolist(), steps.tolist(), strict=True)):
            u = torch.as_tensor(numpy_rng(self.ctx.seed, "fjord", round_, client).random(tau))
            out[i, :tau] = (u * allowed[client]).long().clamp_max(allowed[client] - 1)
        self._drawn = (round_, clients.clone(), steps.clone(), out)
        return out

    def _steps(self, clients: Tensor) -> Tensor:
        """(m,) the local steps of `clients`: those they took (while `aggregate` reads a result), else the run's."""
        if self._taken is not None and torch.equal(self._taken[0], clients):
            return self._taken[1]
        return self.ctx.local.plan(clients, self.ctx.train_sizes[clients]).steps

    def trained_levels(self, round_: int, clients: Tensor) -> Tensor:
        """(m,) the widest p each of `clients` trains in round `round_`, whose sub-model holds every one it trains
        (``draws: round``: the one p; a client without steps: its capacity). One draw stream per client of the
        federation, so that a client's p does not depend on the others in the cohort."""
        levels, allowed = self._allowed(round_)
        if self.draws == "batch":
            steps = self._steps(clients)
            widest = self.step_draws(round_, clients, steps).max(1).values if steps.numel() and steps.max() else None
            top = allowed[clients] - 1
            return levels[torch.where(steps > 0, widest, top) if widest is not None else top]
        u = torch.as_tensor(numpy_rng(self.ctx.seed, "fjord/p", round_).random(len(allowed)))
        pick = (u * allowed).long().clamp_max(allowed - 1)  # the levels ≤ p_max are levels[:allowed]
        return levels[pick][clients]

    def configure(self, round_: int, clients: Tensor, global_params: Tensor) -> LocalPlan:
        """The sub-model plan (`SubModels.configure`: each client's widest sub-model as its mask) and, with ``draws:
        batch``, each step's sub-model: one mask per level, indexed per (client, step)."""
        plan = super().configure(round_, clients, global_params)
        if self.draws == "round":
            return plan
        index = self.step_draws(round_, clients, plan.steps)
        taken = torch.arange(index.shape[1]).unsqueeze(0) < plan.steps.unsqueeze(1)
        if not index.numel() or bool((~taken | (index == index.max(1, keepdim=True).values)).all()):
            return plan  # every client's steps train one sub-model (its mask): no per-step masks needed
        levels = sorted(self.levels)
        return replace(plan, step_masks=torch.stack([self._prefix[r] for r in levels]), step_index=index)

    def aggregate(self, round_: int, global_params: Tensor, result: LocalResult) -> Tensor:
        """Eq. 2 over the clients' sub-models; with per-batch draws each client counts for the widest p of the steps
        it took (fewer than planned where a deadline cut its work: `fedhet.systems.clock`)."""
        if self.draws == "batch" and not torch.equal(result.steps, self._steps(result.clients)):
            self._taken, self._round_masks = (result.clients, result.steps), None
        try:
            return super().aggregate(round_, global_params, result)
        finally:
            if self._taken is not None:
                self._taken, self._round_masks = None, None
