"""FedProto (Tan, Long, Liu, Zhou, Lu, Jiang, Zhang, AAAI 2022): clients of any architecture share class
prototypes, not weights.

Each client i keeps its whole model (`fedhet.engine.personal`, ``"*"``; with ``model: architectures`` each client
its own architecture, `fedhet.models.architectures`) and trains it on (eq. 8)

    L_i = CE(F_i(x), y) + λ · ‖f_i(x) − C̄^{(y)}‖² / d

where f_i(x) ∈ R^d is the representation before the head and C̄^{(y)} the global prototype of the sample's class
(the mean over the d coordinates and over the mini-batch, as the paper's code's ``MSELoss``; a class without a
global prototype adds 0). After its local steps the client computes its local prototypes (eq. 4)

    C_i^{(j)} = (1/|D_{i,j}|) Σ_{(x, y) ∈ D_{i,j}} f_i(x)

on its whole training data, and the server averages them (eq. 6, weighted by the clients' samples of the class)

    C̄^{(j)} = Σ_i |D_{i,j}| C_i^{(j)} / Σ_i |D_{i,j}|      (``weighting: samples``)

over the round's clients that hold class j; ``weighting: uniform`` is the paper's code's plain mean of the C_i^{(j)}.
A class that no client of the round holds keeps its previous global prototype. Each client's model is its own
(personalised accuracy); the global model never changes. λ = 1 is the paper's default (``--ld 1``).
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any, ClassVar, Literal

import torch
from pydantic import Field, PrivateAttr, field_validator
from torch import Tensor

from fedhet.engine.architectures import ArchitectureEngine
from fedhet.engine.objective import DataTerm, ModelView
from fedhet.engine.personal import Personal
from fedhet.engine.plan import LocalPlan, LocalResult
from fedhet.errors import ConfigError
from fedhet.strategies.base import STRATEGIES, ServerContext, Strategy, Train, by_client
from fedhet.strategies.server import ServerOptimizer

PERSONAL = Personal("fedproto")  # the whole model


def architecture_engine(ctx: ServerContext, method: str) -> ArchitectureEngine:
    """The run's engine, which must route clients to their architectures (``model: architectures``)."""
    if not isinstance(ctx.engine, ArchitectureEngine):
        raise ConfigError(
            f"algorithm '{method}' runs clients of different architectures: use model: architectures (one member "
            "or several), e.g. model: {name: architectures, members: [{name: mlp, hidden: [64]}]}"
        )
    return ctx.engine


def global_prototypes(
    sums: Tensor, counts: Tensor, weighting: Literal["samples", "uniform"] = "samples"
) -> tuple[Tensor, Tensor]:
    """C̄ (C, d) and which classes have one (C,) from the clients' sums (m, C, d) and numbers (m, C) of
    representations per class (eq. 6): the samples-weighted mean Σ_i sums_i / Σ_i counts_i, or (``uniform``) the
    plain mean over clients of their local prototypes sums_i / counts_i. Classes no client holds: 0, absent."""
    held = counts > 0
    present = held.any(0)
    if weighting == "samples":
        total = counts.sum(0).clamp_min(1.0)
        return sums.sum(0) / total.unsqueeze(-1), present
    local = sums / counts.clamp_min(1.0).unsqueeze(-1)  # local prototypes (0 where a client lacks the class)
    return local.sum(0) / held.sum(0).clamp_min(1).unsqueeze(-1), present


class PrototypeTerm(DataTerm):
    """λ · ‖f(x) − C̄^{(y)}‖² / d averaged over the mini-batch (FedProto's eq. 8, the paper code's MSE)."""

    name: ClassVar[str] = "fedproto"
    description: ClassVar[str] = "FedProto's prototype regulariser (Tan et al. 2022)"
    lam: float = Field(1.0, ge=0)
    _prototypes: Tensor = PrivateAttr(default_factory=lambda: torch.zeros(0, 0))  # (C, d)
    _present: Tensor = PrivateAttr(default_factory=lambda: torch.zeros(0, dtype=torch.bool))  # (C,)

    def with_prototypes(self, prototypes: Tensor, present: Tensor) -> PrototypeTerm:
        self._prototypes, self._present = prototypes, present
        return self

    def server_tensors(self) -> dict[str, Tensor]:
        return {}  # the prototypes are not vectors of the model's size: they live on the term

    def loss(self, view: ModelView) -> Tensor:
        if view.represent is None:
            raise ConfigError("fedproto needs a model that gives a representation: model: architectures")
        z = view.represent(view.params, view.x)
        target = self._prototypes.to(z.dtype)[view.y]
        per_sample = (z - target).square().mean(-1) * self._present[view.y].to(z.dtype)
        return self.lam * view.mean(per_sample)


class NoServerStep(Strategy):
    """A strategy whose server takes no step on a global model (its own rule replaces it): ``server_lr`` and
    ``server_optimizer`` are refused rather than ignored."""

    @field_validator("server_lr")
    @classmethod
    def _no_server_lr(cls, value: float) -> float:
        if value != 1.0:
            raise ValueError(f"{cls.name} takes no server step on the weights; leave server_lr out")
        return value

    @field_validator("server_optimizer", mode="after")
    @classmethod
    def _no_server_optimizer(cls, value: ServerOptimizer) -> ServerOptimizer:
        if value.name != "sgd":
            raise ValueError(f"{cls.name} takes no server step on the weights; leave server_optimizer out")
        return value


MIX = {  # the prototype methods' model where the config names none: three MLPs (any input shape)
    "name": "architectures",
    "members": [{"name": "mlp", "hidden": [32]}, {"name": "mlp", "hidden": [64]}, {"name": "mlp", "hidden": [128, 64]}],
}


class SharesPrototypes(NoServerStep):
    """The common part of FedProto and FedGH: personal models (``personal``) of any architecture whose class sums of
    representations (eq. 4) the server collects after each round's training (`round_prototypes`)."""

    architectures: ClassVar[bool] = True
    personal: ClassVar[Personal] = PERSONAL
    default_model: ClassVar[str | dict[str, Any] | None] = MIX  # three architectures where the config names none

    _sums: Tensor | None = PrivateAttr(None)  # (K, C, d) the round's clients' sums of representations per class
    _counts: Tensor | None = PrivateAttr(None)  # (K, C)

    def setup(self, ctx: ServerContext) -> None:
        super().setup(ctx)
        architecture_engine(ctx, self.name)

    def configure(self, round_: int, clients: Tensor, global_params: Tensor) -> LocalPlan:
        return replace(super().configure(round_, clients, global_params), personal=self.personal)

    def local_training(self, round_: int, clients: Tensor, global_params: Tensor, train: Train) -> LocalResult:
        """The clients' local steps, then their class sums of representations on the trained models (eq. 4)."""
        plan = self.configure(round_, clients, global_params)
        result = train(plan)
        self.collect(round_, plan, global_params)
        return result

    def collect(self, round_: int, plan: LocalPlan, global_params: Tensor) -> None:
        """Keep, by client, the sums and numbers of representations of each class under the models the plan's
        clients now hold (read after the round's training: phase 1)."""
        engine = architecture_engine(self.ctx, self.name)
        sums, counts = engine.representations(global_params, replace(plan, phase=1), round_)
        counts = torch.where(plan.steps.unsqueeze(1) > 0, counts, 0.0)  # a client that did not train sends none
        k = self.ctx.num_clients
        self._sums, self._counts = by_client(sums, plan.clients, k), by_client(counts, plan.clients, k)

    def round_prototypes(self, result: LocalResult) -> tuple[Tensor, Tensor]:
        """The sums (m, C, d) and numbers (m, C) of the clients that answered (rows of `result`)."""
        assert self._sums is not None and self._counts is not None
        return self._sums[result.clients], self._counts[result.clients]

    def personalization(self, clients: Tensor) -> LocalPlan:
        local = self.ctx.local
        return LocalPlan.uniform(clients, 0, local.lr, local.batch_size, personal=self.personal)


@STRATEGIES.register
class FedProto(SharesPrototypes):
    """Personal models of any architecture, regularised towards global class prototypes (see the module)."""

    name: ClassVar[str] = "fedproto"
    description: ClassVar[str] = "FedProto: clients of any architecture share class prototypes (Tan et al. 2022)"
    lam: float = Field(1.0, ge=0, description="λ: the weight of the prototype regulariser (eq. 8)")
    weighting: Literal["samples", "uniform"] = Field(
        "samples", description="global prototypes: weighted by the clients' samples of the class (eq. 6) or uniform"
    )

    prototype_accuracy: bool = Field(
        False,
        description="also score each client's nearest-prototype classifier (the paper's second inference) on its "
        "test data after every round: personal_test_accuracy_prototypes",
    )

    _prototypes: Tensor | None = PrivateAttr(None)  # (C, d) the global prototypes
    _present: Tensor | None = PrivateAttr(None)  # (C,) bool: the classes that have one

    def setup(self, ctx: ServerContext) -> None:
        super().setup(ctx)
        engine = architecture_engine(ctx, self.name)
        classes, dim = engine.data.num_classes, engine.dim
        self._prototypes, self._present = torch.zeros(classes, dim), torch.zeros(classes, dtype=torch.bool)

    @property
    def prototypes(self) -> tuple[Tensor, Tensor]:
        """The global prototypes (C, d) and which classes have one (C,)."""
        assert self._prototypes is not None and self._present is not None
        return self._prototypes, self._present

    def configure(self, round_: int, clients: Tensor, global_params: Tensor) -> LocalPlan:
        term = PrototypeTerm(lam=self.lam).with_prototypes(*self.prototypes)
        return super().configure(round_, clients, global_params).with_terms(term)

    def aggregate(self, round_: int, global_params: Tensor, result: LocalResult) -> Tensor:
        """The new global prototypes (eq. 6); the classes no client of the round holds keep theirs."""
        new, present = global_prototypes(*self.round_prototypes(result), self.weighting)
        old, had = self.prototypes
        self._prototypes = torch.where(present.unsqueeze(-1), new, old)
        self._present = had | present
        return global_params

    def round_metrics(self) -> dict[str, float]:
        metrics = {"prototype_classes": float(self.prototypes[1].sum())}
        if self.prototype_accuracy:
            params = self.ctx.params if self.ctx.params is not None else self.ctx.engine.initial_params()
            seen = torch.nonzero(self.ctx.engine.data.seen).flatten()
            accuracy = self.nearest_prototype_accuracy(self.ctx.round, params, seen)
            metrics["personal_test_accuracy_prototypes"] = float(accuracy.double().nanmean())
        return metrics

    def nearest_prototype_accuracy(self, round_: int, global_params: Tensor, clients: Tensor) -> Tensor:
        """(m,) each client's test accuracy when its model predicts the class of the nearest global prototype,
        argmin_j ‖f_i(x) − C̄^(j)‖ over the classes that have one (the paper's inference by prototypes), with the
        models the clients hold after round `round_`; NaN for a client without test data."""
        engine = architecture_engine(self.ctx, self.name)
        prototypes, present = self.prototypes
        plan = replace(self.personalization(clients), phase=1)
        out = torch.full((len(clients),), float("nan"))
        for i, z, y in engine.client_representations(global_params, plan, round_, "test"):
            distance = torch.cdist(z, prototypes).masked_fill(~present, float("inf"))
            if len(y):
                out[i] = (distance.argmin(1) == y).float().mean()
        return out

    def state_dict(self) -> dict[str, Any]:
        prototypes, present = self.prototypes
        return {**super().state_dict(), "prototypes": prototypes.clone(), "present": present.clone()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        super().load_state_dict(state)
        if "prototypes" in state:
            self._prototypes, self._present = state["prototypes"].clone(), state["present"].clone()
