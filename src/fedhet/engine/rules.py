"""Local rules: a client's step direction estimated from several mini-batches instead of one gradient.

A rule (Per-FedAvg's MAML step, pFedMe's Moreau-envelope step; see `fedhet.strategies`) is one pure function of
a client's parameters and ``batches_per_step`` mini-batches. ``grad_fn(w, i)`` returns the gradient of the
client's objective (its loss, data terms and parameter terms) on the step's i-th mini-batch at ``w``, and its
loss; the rule returns the direction d that the client optimiser then follows (SGD: w ← w − η d). Rules run on
the autograd backends (sequential and vectorised), with the same numbers on both.

A rule may carry per-client state from step to step and from round to round (APFL's personal model and mixing
weight): ``state_kinds`` names it ("param": shaped like the model, "scalar": one number), ``initial_state`` gives a
client's first value, and ``step`` returns the new state with the direction. The engine keeps it with the
client (`fedhet.engine.state`, under ``"<rule>.<state>"``), like a term's state rows.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from torch import Tensor

from fedhet.registry import Component, Registry

Tree = dict[str, Tensor]
GradFn = Callable[[Tree, int], tuple[Tree, Tensor]]


def axpy(w: Tree, scale: float | Tensor, d: Tree) -> Tree:
    """w + scale · d, leaf by leaf."""
    return {n: w[n] + scale * d[n] for n in w}


class LocalRule(Component):
    """Base of local rules; ``direction`` runs on parameter dictionaries (under `vmap` for a cohort)."""

    @property
    def batches_per_step(self) -> int:
        return 1

    def direction(self, grad_fn: GradFn, w: Tree) -> tuple[Tree, Tensor]:
        """The step direction at `w` and the loss to report (of the step's first mini-batch)."""
        raise NotImplementedError

    def state_kinds(self) -> dict[str, str]:
        """The rule's per-client state: name -> "param" (a tree like the model's) or "scalar" (default: none)."""
        return {}

    def initial_state(self, name: str, start: Tensor) -> Tensor:
        """State `name` of a client seen for the first time, flat: (P,) for "param", () for "scalar" (`start` is
        the received model)."""
        return torch.zeros_like(start) if self.state_kinds()[name] == "param" else torch.zeros(())

    def step(self, grad_fn: GradFn, w: Tree, state: dict[str, Any], lr: Tensor) -> tuple[Tree, Tensor, dict[str, Any]]:
        """The direction, the loss to report and the new state (trees for "param" states) for a step with learning
        rate `lr` (default: `direction`, the state unchanged)."""
        d, loss = self.direction(grad_fn, w)
        return d, loss, state

    def state_key(self, name: str) -> str:
        return f"{self.name}.{name}"


RULES: Registry[LocalRule] = Registry("local rule")
