"""HeteroFL (Diao, Ding, Tarokh, ICLR 2021): clients of different capacities train width slices of one global model.

A client of capacity level r ∈ (0, 1] trains the sub-model made of the first ⌈r·d⌉ units of every hidden layer of
width d (the input and output layers whole; §3.1's static slices). Here a sub-model is the full model masked
(`fedhet.engine.plan.LocalPlan.masks`): the weights into and out of the hidden units beyond the slice are zero and
stay zero, which with a zero-preserving activation (φ(0) = 0) and no objective term pulling them is exactly
training the smaller network. Levels are fixed per client (``assignment: fix``) or redrawn for every client each
round (``dynamic``), from ``proportions`` over ``levels`` or an explicit per-client list (``capacities``), seeded.

Aggregation (HeteroFL Eq. 2, with FedAvg's weights p_k): each coordinate j is averaged over the clients whose
sub-model contains it, d_j = Σ_k p_k m_kj (w_j − w_kj) / Σ_k p_k m_kj, and w ← server_step(w, d); a coordinate no
client trained keeps its value (d_j = 0). With every client at level 1 this is FedAvg.

Models: MLPs (``model: mlp``) and the zoo's CNNs without group norm (convolutions are sliced by channels). Not
implemented: HeteroFL's scaler (outputs of sliced layers divided by r in training) and its static batch norm.
"""

from __future__ import annotations

import math
from dataclasses import replace
from typing import ClassVar, Literal

import torch
from pydantic import Field, PrivateAttr, field_validator, model_validator
from torch import Tensor, nn

from fedhet.engine.evaluate import ClientScores
from fedhet.engine.functional import FlatModel
from fedhet.engine.plan import LocalPlan, LocalResult
from fedhet.errors import ConfigError
from fedhet.models.zoo import ConvClassifier, Flatten, ToImage
from fedhet.seeding import numpy_rng
from fedhet.strategies.base import STRATEGIES, ServerContext, Strategy
from fedhet.strategies.fedavg import fedavg_weights

# activations that map a zero hidden unit to zero (φ(0) = 0), and layers that keep a zero channel or unit zero
# (and a kept one as the smaller network computes it: pooling and local response normalisation act per channel, or
# pad with zeros across channels)
_ZERO_PRESERVING = (nn.ReLU, nn.GELU, nn.Tanh, nn.SiLU, nn.ELU, nn.LeakyReLU)
_PASSING = (
    nn.modules.dropout._DropoutNd,
    nn.Flatten,
    nn.Identity,
    nn.MaxPool2d,
    nn.AvgPool2d,
    nn.LocalResponseNorm,
    Flatten,
    ToImage,
)


def level_name(level: float) -> str:
    """How a level is written in column names: 1, 0.5, 0.0625."""
    return f"{level:g}"


def sliced_layers(model: FlatModel, what: str) -> list[str]:
    """The names of the Linear and Conv2d layers of an MLP (`nn.Sequential`) or a zoo CNN (`ConvClassifier`), in
    order; a model with other layers that hold parameters or break φ(0) = 0 is a one-line `ConfigError`."""
    module = model.module
    if not isinstance(module, nn.Sequential | ConvClassifier):
        raise ConfigError(f"{what} slices MLPs and the zoo's CNNs: this model is not a sequence of layers")
    names = []
    for name, layer in module.named_modules():
        if any(True for _ in layer.children()):
            continue
        if isinstance(layer, nn.Linear | nn.Conv2d):
            names.append(name)
        elif not isinstance(layer, _ZERO_PRESERVING + _PASSING):
            raise ConfigError(
                f"{what} slices MLPs and CNNs of Linear/Conv2d layers with ReLU, GELU or Tanh activations, pooling "
                f"and local response normalisation; this model has a {type(layer).__name__} layer"
            )
    if len(names) < 2:
        raise ConfigError(f"{what} needs a model with a hidden layer to slice (model: mlp with hidden: [...])")
    return names


def width_mask(model: FlatModel, layers: list[str], level: float) -> Tensor:
    """(P,) bool: the sub-model of `level`. In every Linear or Conv2d layer, the first ⌈r·d⌉ of its d output units
    or channels (all of the output layer's), reading only the kept units or channels of the layer before (all of
    the input's; a Linear layer after a convolution reads the flattened kept channels)."""
    mask = torch.zeros(model.size, dtype=torch.bool)
    shapes = dict(zip(model.names, model.shapes, strict=True))
    before: tuple[int, int] | None = None  # (units, kept units) of the layer before
    for i, layer in enumerate(layers):
        shape = shapes[f"{layer}.weight"]
        units, inputs = shape[0], shape[1]
        rows = units if i == len(layers) - 1 else math.ceil(level * units - 1e-9)
        read = torch.ones(inputs, dtype=torch.bool)
        if before is not None:
            total, kept = before
            if inputs % total:
                raise ConfigError(f"layer '{layer}' reads {inputs} inputs from {total} units: cannot slice it")
            read = torch.arange(inputs) // (inputs // total) < kept  # a flattened channel is inputs/total features
        weight = torch.zeros(shape, dtype=torch.bool)
        weight[:rows, read] = True
        mask[model.slices[f"{layer}.weight"]] = weight.flatten()
        if f"{layer}.bias" in model.slices:
            bias = torch.zeros(units, dtype=torch.bool)
            bias[:rows] = True
            mask[model.slices[f"{layer}.bias"]] = bias
        before = (units, rows)
    return mask


def masked_average(global_params: Tensor, params: Tensor, masks: Tensor, weights: Tensor) -> Tensor:
    """d_j = Σ_k p_k m_kj (w_j − w_kj) / Σ_k p_k m_kj, and 0 where no client's mask holds j (HeteroFL Eq. 2)."""
    on = masks.to(params.dtype) * weights.to(params.dtype).unsqueeze(1)
    total = on.sum(0)
    moved = (on * (global_params.unsqueeze(0) - params)).sum(0)
    return torch.where(total > 0, moved / total.clamp_min(torch.finfo(params.dtype).tiny), 0.0)


@STRATEGIES.register
class HeteroFL(Strategy):
    """FedAvg of width sub-models: client k trains the slice of its capacity level, each coordinate is averaged
    over the clients that trained it."""

    name: ClassVar[str] = "heterofl"
    description: ClassVar[str] = "HeteroFL: width sub-models per client capacity (Diao et al. 2021), MLPs and CNNs"
    sub_models: ClassVar[bool] = True
    weighting: Literal["samples", "uniform"] = Field("samples", description="FedAvg's client weights p_k")
    levels: list[float] = Field(
        default_factory=lambda: [1.0, 0.5, 0.25, 0.125, 0.0625],
        min_length=1,
        description="capacity levels r in (0, 1]: a client of level r trains ceil(r*d) units of each hidden layer",
    )
    proportions: list[float] | None = Field(
        None, description="the share of clients at each level (default: equal shares)"
    )
    capacities: list[float] | None = Field(
        None, description="an explicit level per client (instead of drawing from proportions; fix only)"
    )
    assignment: Literal["fix", "dynamic"] = Field(
        "fix", description="fix: a level per client for the run; dynamic: redrawn for every client each round"
    )

    _layers: list[str] = PrivateAttr(default_factory=list)
    _masks: dict[float, Tensor] = PrivateAttr(default_factory=dict)
    _fixed: Tensor | None = PrivateAttr(None)
    _evaluated: Tensor | None = PrivateAttr(None)
    _scores: dict[float, ClientScores] = PrivateAttr(default_factory=dict)  # of the evaluated model at each level

    @field_validator("levels", "capacities")
    @classmethod
    def _in_unit_interval(cls, value: list[float] | None) -> list[float] | None:
        if value is not None and any(not 0 < v <= 1 for v in value):
            raise ValueError("capacity levels must be in (0, 1]")
        return value

    @model_validator(mode="after")
    def _consistent(self) -> HeteroFL:
        if len(set(self.levels)) != len(self.levels):
            raise ValueError("levels must differ from each other")
        if self.proportions is not None:
            if len(self.proportions) != len(self.levels):
                raise ValueError(f"proportions needs one share per level ({len(self.levels)})")
            if any(not (p >= 0 and math.isfinite(p)) for p in self.proportions) or sum(self.proportions) <= 0:
                raise ValueError("proportions must be finite, >= 0 and not all 0")
        if self.capacities is not None and self.assignment == "dynamic":
            raise ValueError("capacities gives each client a fixed level: use assignment: fix")
        if self.capacities is not None and any(c not in self.levels for c in self.capacities):
            raise ValueError("every capacity must be one of the levels (each level is evaluated)")
        return self

    def setup(self, ctx: ServerContext) -> None:
        """Check the model (an MLP) and the local objective (nothing pulls a masked coordinate off zero) before
        anything runs; fix the clients' levels."""
        super().setup(ctx)
        what = f"algorithm '{self.name}'"
        self._layers = sliced_layers(ctx.engine.model, what)
        if not ctx.local.plan(torch.zeros(1, dtype=torch.long), ctx.train_sizes[:1]).anchor_free:
            raise ConfigError(
                f"{what}: the local objective has a term that pulls the sliced-off weights off zero (a proximal "
                "term, control variates, a local rule); use plain local training (weight decay is fine)"
            )
        k = ctx.num_clients
        if self.capacities is not None and len(self.capacities) != k:
            raise ConfigError(f"{what}: capacities lists {len(self.capacities)} levels for {k} clients")
        self._masks = {level: width_mask(ctx.engine.model, self._layers, level) for level in self.levels}
        self._fixed = torch.tensor(self.capacities) if self.capacities is not None else self._draw(0)

    def _draw(self, round_: int) -> Tensor:
        """(K,) a level per client: ``fix`` splits the clients in the proportions (as nearly as whole clients
        allow) in a seeded random order; ``dynamic`` draws every client's level independently in round `round_`."""
        k, levels = self.ctx.num_clients, torch.tensor(self.levels)
        shares = torch.tensor(self.proportions or [1.0] * len(self.levels), dtype=torch.float64)
        shares = shares / shares.sum()
        if self.assignment == "dynamic":
            rng = numpy_rng(self.ctx.seed, "heterofl/dynamic", round_)
            return levels[torch.as_tensor(rng.choice(len(levels), size=k, p=shares.numpy()))]
        bounds = torch.round(shares.cumsum(0) * k).long()
        which = torch.bucketize(torch.arange(k), bounds, right=True).clamp_max(len(levels) - 1)
        order = torch.as_tensor(numpy_rng(self.ctx.seed, "heterofl/fix").permutation(k))
        out = torch.empty(k)
        out[order] = levels[which]
        return out

    def capacity(self, round_: int) -> Tensor:
        """(K,) each client's level in round `round_`."""
        if self.assignment == "dynamic":
            return self._draw(round_)
        assert self._fixed is not None
        return self._fixed

    def masks(self, round_: int, clients: Tensor) -> Tensor:
        """(m, P) the sub-model mask of each of `clients` in round `round_`."""
        levels = self.capacity(round_)[clients].tolist()
        return torch.stack([self._masks[level] for level in levels])

    def configure(self, round_: int, clients: Tensor, global_params: Tensor) -> LocalPlan:
        return replace(super().configure(round_, clients, global_params), masks=self.masks(round_, clients))

    def aggregate(self, round_: int, global_params: Tensor, result: LocalResult) -> Tensor:
        p = fedavg_weights(self.ctx.train_sizes[result.clients], self.weighting)
        masks = self.masks(round_, result.clients)
        return self.server_step(global_params, masked_average(global_params, result.params, masks, p))

    def evaluation_params(self, params: Tensor) -> Tensor:
        """The global model (kept: the round's metrics score it at every level)."""
        self._evaluated, self._scores = params, {}
        return params

    def level_scores(self) -> dict[float, ClientScores]:
        """The test scores of the evaluated global model masked to each level (worked out once per evaluation)."""
        if self._evaluated is not None and not self._scores:
            w = self._evaluated
            self._scores = {r: self.ctx.engine.scores(torch.where(m, w, 0.0), "test") for r, m in self._masks.items()}
        return self._scores

    def round_metrics(self) -> dict[str, float]:
        """``test_accuracy_level<r>``: the global model masked to each level, its mean test accuracy over the seen
        clients (as ``test_accuracy``)."""
        seen = self.ctx.engine.data.seen
        return {
            f"test_accuracy_level{level_name(r)}": float(s.accuracy[seen].double().mean())
            for r, s in self.level_scores().items()
        }

    def client_columns(self) -> dict[str, Tensor]:
        """clients.csv: ``capacity`` (each client's level in the last round; dynamic: redrawn each round) and
        ``capacity_test_accuracy`` (the evaluated global model masked to that level, on the client's test data)."""
        scores = self.level_scores()
        if not scores:
            return {}
        levels = self.capacity(self.ctx.round)
        accuracy = torch.full((len(levels),), float("nan"))
        for level, s in scores.items():
            mine = levels == level
            accuracy[mine] = s.accuracy[mine]
        return {"capacity": levels, "capacity_test_accuracy": accuracy}
