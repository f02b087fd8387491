"""Local rules: a client's step direction estimated from several mini-batches instead of one gradient.

A rule (Per-FedAvg's MAML step, pFedMe's Moreau-envelope step; see `fedhet.strategies`) is one pure function of
a client's parameters and ``batches_per_step`` mini-batches. ``grad_fn(w, i)`` returns the gradient of the
client's objective (its loss, data terms and parameter terms) on the step's i-th mini-batch at ``w``, and its
loss; the rule returns the direction d that the client optimiser then follows (SGD: w ← w − η d). Rules run on
the autograd backends (sequential and vectorised), with the same numbers on both.
"""

from __future__ import annotations

from collections.abc import Callable

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


RULES: Registry[LocalRule] = Registry("local rule")
