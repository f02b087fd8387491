"""One local step, written once for every backend: d = g + Σ_j ∇T_j(w), then the client optimiser.

A backend computes the data gradient g in its own way (autograd, vmap, hand-derived matrix products) on its own
slices of the parameters ("leaves": the flat vector, a parameter dictionary's tensors, a layer's weight); the
parameter terms and the optimiser are coordinate-wise, so `leaf_direction` and the optimiser's `step` apply them to
any leaf, given the `Aligned` tensors of that leaf. `Cohort` carries what the backends need besides model and data:
the objective and the cohort's state rows.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field, replace

import torch
from torch import Tensor

from fedhet.engine.objective import Aligned, DataTerm, LocalTerm, ParameterTerm
from fedhet.engine.optimizers import ClientOptimizer
from fedhet.engine.plan import LocalPlan
from fedhet.engine.privacy import ExampleDP
from fedhet.engine.rules import LocalRule

Slicer = Callable[[Tensor], Tensor]  # a flat (..., P) tensor -> one leaf's view of it


@dataclass
class TermInputs:
    """A term of the objective with its server tensors (P,) and the cohort's state rows (m, P)."""

    term: LocalTerm
    server: dict[str, Tensor]
    client: dict[str, Tensor]


@dataclass
class Cohort:
    """The objective of a round's cohort and its state: the terms with their tensors, the optimiser with the
    cohort's optimiser state (``"param"`` states (m, P), ``"count"`` states (m,)), and the rule, if any, with its
    state (``"param"`` (m, P), ``"scalar"`` (m,)); ``dp_sgd`` makes the steps DP-SGD steps."""

    terms: list[TermInputs]
    optimizer: ClientOptimizer
    rule: LocalRule | None
    opt_state: dict[str, Tensor]
    rule_state: dict[str, Tensor] = field(default_factory=dict)
    dp_sgd: ExampleDP | None = None

    @property
    def parameter_terms(self) -> list[TermInputs]:
        return [t for t in self.terms if isinstance(t.term, ParameterTerm)]

    @property
    def data_terms(self) -> list[TermInputs]:
        return [t for t in self.terms if isinstance(t.term, DataTerm)]

    @property
    def autograd_only(self) -> bool:
        """True when the objective needs autograd (a data term, a rule, DP-SGD's per-sample gradients): not for the
        dense and conv backends."""
        return self.rule is not None or bool(self.data_terms) or self.dp_sgd is not None

    @property
    def dense_runs(self) -> bool:
        """True when the dense backend can run the objective: no data term, no rule (DP-SGD's per-sample gradient
        norms it has by ghost clipping, `fedhet.engine.ghost`)."""
        return self.rule is None and not self.data_terms

    def rows(self, sel: Tensor | slice) -> Cohort:
        """The state of the clients `sel` (indices or a slice of the cohort)."""
        return replace(
            self,
            terms=[TermInputs(t.term, t.server, {k: v[sel] for k, v in t.client.items()}) for t in self.terms],
            opt_state={k: v[sel] for k, v in self.opt_state.items()},
            rule_state={k: v[sel] for k, v in self.rule_state.items()},
        )

    def to(self, device: torch.device) -> Cohort:
        return replace(
            self,
            terms=[
                TermInputs(
                    t.term,
                    {k: v.to(device) for k, v in t.server.items()},
                    {k: v.to(device) for k, v in t.client.items()},
                )
                for t in self.terms
            ],
            opt_state={k: v.to(device) for k, v in self.opt_state.items()},
            rule_state={k: v.to(device) for k, v in self.rule_state.items()},
        )


def aligned(terms: list[TermInputs], start: Tensor, leaf: Slicer, rows: Slicer) -> list[tuple[ParameterTerm, Aligned]]:
    """Each parameter term with its tensors cut to one leaf: `leaf` cuts a broadcast (P,) tensor, `rows` the
    cohort's (m, P) rows."""
    out = []
    for t in terms:
        if isinstance(t.term, ParameterTerm):
            server = {k: leaf(v) for k, v in t.server.items()}
            client = {k: rows(v) for k, v in t.client.items()}
            out.append((t.term, Aligned(start, server, client)))
    return out


def leaf_direction(g: Tensor, w: Tensor, terms: list[tuple[ParameterTerm, Aligned]]) -> Tensor:
    """d = g + Σ_j ∇T_j(w) on one leaf."""
    for term, at in terms:
        g = g + term.gradient(w, at)
    return g


def term_gradient(w: Tensor, terms: list[tuple[ParameterTerm, Aligned]]) -> Tensor | None:
    """Σ_j ∇T_j(w) on one leaf (None without parameter terms)."""
    total: Tensor | None = None
    for term, at in terms:
        g = term.gradient(w, at)
        total = g if total is None else total + g
    return total


def affine_part(
    terms: list[tuple[ParameterTerm, Aligned]],
) -> tuple[float, float, list[tuple[ParameterTerm, Aligned]]]:
    """The affine terms of a leaf summed, Σ_j ∇T_j = λ·w − κ·w_global (`ParameterTerm.affine`), and the others."""
    lam = kappa = 0.0
    rest = []
    for term, at in terms:
        form = term.affine()
        if form is None:
            rest.append((term, at))
        else:
            lam, kappa = lam + form[0], kappa + form[1]
    return lam, kappa, rest


def fresh_state(optimizer: ClientOptimizer, m: int, size: int) -> dict[str, Tensor]:
    """The optimiser state of `m` clients starting a round afresh (zeros)."""
    return {name: torch.zeros((m, size) if kind == "param" else (m,)) for name, kind in optimizer.state_kinds().items()}


def fresh_cohort(plan: LocalPlan, start: Tensor) -> Cohort:
    """The plan's cohort as clients seen for the first time: each term's initial state, a fresh optimiser."""
    m = len(plan.clients)
    terms = [
        TermInputs(
            term,
            term.server_tensors(),
            {name: term.initial_state(name, start).expand(m, -1).clone() for name in term.client_state},
        )
        for term in plan.terms
    ]
    rule_state = initial_rule_state(plan.rule, start, m) if plan.rule is not None else {}
    opt_state = fresh_state(plan.optimizer, m, len(start))
    return Cohort(terms, plan.optimizer, plan.rule, opt_state, rule_state, plan.dp_sgd)


def initial_rule_state(rule: LocalRule, start: Tensor, m: int) -> dict[str, Tensor]:
    """A rule's state for `m` clients seen for the first time: (m, P) "param" rows, (m,) "scalar" values."""
    out = {}
    for name, kind in rule.state_kinds().items():
        first = rule.initial_state(name, start)
        out[name] = first.expand(m, -1).clone() if kind == "param" else first.reshape(()).expand(m).clone()
    return out
