"""A client's local objective as a list of registered terms: F_k(w) + Σ_j T_j(w).

Two kinds of term, both configurable by name (``local: {terms: [{name: proximal, mu: 0.01}]}``) and addable by a
strategy to its `LocalPlan`:

* `ParameterTerm` — a term of the weights alone (proximal, weight decay, linear corrections, FedDyn). It gives its
  gradient as a *coordinate-wise* function of the weights and of tensors aligned with them (`Aligned`: the received
  model, the term's server tensors, the client's state rows), so every backend applies it to whatever slice of the
  parameters it holds (a layer of the dense backend, a leaf of the vectorised one, the flat vector of the
  sequential one) without knowing its name.
* `DataTerm` — an extra loss on the model's outputs (e.g. MOON's contrastive term). It needs autograd, so it runs
  on the sequential and vectorised backends; `backend: dense` refuses it.

A term may keep per-client state between rounds (``client_state``: vectors of the model's size, e.g. SCAFFOLD's
c_i, FedDyn's ∇L_k(θ_k)). The engine reads the cohort's rows before training (``initial_state`` for a client never
seen), hands them to the term, and stores ``update_state``'s new rows afterwards; with ``reports_state`` the rows'
change goes back to the server in `LocalResult.state_delta` under ``"<term>.<state>"``.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import ClassVar

import torch
from pydantic import Field
from torch import Tensor

from fedhet.registry import Component, Registry

Tree = dict[str, Tensor]


@dataclass(frozen=True)
class Aligned:
    """Tensors shaped like the slice of parameters a `ParameterTerm` is applied to.

    ``start`` is the received (global) model and ``server`` the term's server tensors, both broadcast over
    clients; ``client`` holds the client's state rows (one per client)."""

    start: Tensor
    server: Mapping[str, Tensor]
    client: Mapping[str, Tensor]


@dataclass(frozen=True)
class ModelView:
    """What a `DataTerm` sees of one client's mini-batch: the model as a function of a parameter dictionary, the
    client's weights, the batch and its logits, and the term's aligned tensors as parameter dictionaries; for a
    multi-exit model (`fedhet.models.exits`) also every exit's outputs and which exits the client holds."""

    forward: Callable[[Tree, Tensor], Tensor]  # logits of the model with the given parameters on inputs x
    params: Tree
    x: Tensor
    y: Tensor
    weight: Tensor  # per-sample weights (0 for padding rows)
    logits: Tensor  # forward(params, x)
    start: Tree
    server: Mapping[str, Tree]
    client: Mapping[str, Tree]
    exits: Tensor | None = None  # a multi-exit model's exit outputs (D, B, C); `logits` is their ensemble
    held: Tensor | None = None  # (D,) 1 where the client holds the exit, 0 where its sub-model lacks it
    represent: Callable[[Tree, Tensor], Tensor] | None = None  # z = f(x) before the head (`FlatModel.representation`)

    def mean(self, per_sample: Tensor) -> Tensor:
        """The weighted mean over the batch, as the data loss averages (padding rows count 0)."""
        return (per_sample * self.weight).sum() / self.weight.sum().clamp_min(1.0)


class LocalTerm(Component):
    """Base of local-objective terms (see the module docstring); subclasses are `ParameterTerm` or `DataTerm`."""

    client_state: ClassVar[tuple[str, ...]] = ()
    reports_state: ClassVar[bool] = False

    def server_tensors(self) -> dict[str, Tensor]:
        """Vectors of the model's size the server sends with the plan (default: the term's tensor fields)."""
        return {name: value for name, value in self.__dict__.items() if isinstance(value, Tensor)}

    def initial_state(self, name: str, start: Tensor) -> Tensor:
        """State `name` of a client seen for the first time (`start` is the received model)."""
        return torch.zeros_like(start)

    def update_state(self, name: str, old: Tensor, start: Tensor, final: Tensor, steps: Tensor, lr: Tensor) -> Tensor:
        """New rows (m, P) of state `name` after the cohort's local steps from `start` (P,) to `final` (m, P) with
        `steps` and `lr` (m,) (rows of clients that took no step are kept by the engine whatever this returns)."""
        return old

    def state_key(self, name: str) -> str:
        return f"{self.name}.{name}"


class ParameterTerm(LocalTerm):
    """A term of the weights alone whose gradient is coordinate-wise (see the module docstring)."""

    def gradient(self, w: Tensor, at: Aligned) -> Tensor:
        """∂T/∂w on a slice `w` of the parameters (any shape; leading client dimension when batched)."""
        raise NotImplementedError

    def affine(self) -> tuple[float, float] | None:
        """(λ, κ) when the gradient is λ·w − κ·w_global on every coordinate (weight decay: (λ, 0); proximal:
        (μ, μ)), so that a backend may fold the term into its steps in closed form (the dense backend's first
        layer runs from its inputs' Gram matrices then); None for any other term."""
        return None


class DataTerm(LocalTerm):
    """An extra loss on the model's outputs, differentiated by autograd. With ``needs_exits`` it reads a multi-exit
    model's exits (`ModelView.exits`): a run of another model with it is refused before it starts."""

    needs_exits: ClassVar[bool] = False

    def loss(self, view: ModelView) -> Tensor:
        """The term's value (a scalar) on the client's mini-batch."""
        raise NotImplementedError


TERMS: Registry[LocalTerm] = Registry("local term")


@TERMS.register
class Proximal(ParameterTerm):
    """(μ/2)‖w − w_global‖², gradient μ (w − w_global) (FedProx, Li et al. 2020, eq. 2)."""

    name: ClassVar[str] = "proximal"
    description: ClassVar[str] = "proximal term mu/2 ||w - w_global||^2 (FedProx)"
    mu: float = Field(0.01, ge=0, description="proximal coefficient μ")

    def gradient(self, w: Tensor, at: Aligned) -> Tensor:
        return self.mu * (w - at.start)

    def affine(self) -> tuple[float, float]:
        return self.mu, self.mu


@TERMS.register
class WeightDecay(ParameterTerm):
    """(λ/2)‖w‖², gradient λ w (an L2 penalty; the config's ``local.weight_decay``)."""

    name: ClassVar[str] = "weight_decay"
    description: ClassVar[str] = "L2 penalty lambda/2 ||w||^2"
    lam: float = Field(0.0, ge=0, description="penalty λ")

    def gradient(self, w: Tensor, at: Aligned) -> Tensor:
        return self.lam * w

    def affine(self) -> tuple[float, float]:
        return self.lam, 0.0
