"""Sub-models of one global model for clients of different capacity (HeteroFL, FedRolex, FjORD).

A sub-model is the full model masked (`fedhet.engine.plan.LocalPlan.masks`): in every Linear or Conv2d layer
(`sliced_layers`) a client keeps a set of the hidden units (or channels) and the weights between kept units; the
weights into and out of the others are zero and stay zero, which with a zero-preserving activation (φ(0) = 0) and
no objective term pulling them is exactly training the smaller network (`unit_mask`). The schemes differ in which
units a client keeps: the first ⌈r·d⌉ (HeteroFL, FjORD: `width_mask`), a window rolling with the round
(FedRolex), or any set a plugin chooses (`SubModels.unit_sets`).

`SubModels` is their common strategy: a capacity level r ∈ (0, 1] per client (fixed for the run or redrawn each
round, from ``proportions`` over ``levels`` or an explicit ``capacities`` list, seeded), HeteroFL's Eq. 2
per-coordinate aggregation (`masked_average`), and the global model scored at the first ⌈r·d⌉ units of every
level (``test_accuracy_level<r>``, clients.csv ``capacity``).
"""

from __future__ import annotations

import math
from dataclasses import replace
from typing import Literal

import numpy as np
import torch
from pydantic import Field, PrivateAttr, field_validator, model_validator
from torch import Tensor, nn

from fedhet.engine.evaluate import ClientScores
from fedhet.engine.functional import FlatModel
from fedhet.engine.plan import LocalPlan, LocalResult
from fedhet.errors import ConfigError
from fedhet.models.zoo import ConvClassifier, Flatten, ToImage
from fedhet.seeding import numpy_rng
from fedhet.strategies.base import ServerContext, Strategy
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
SCALING_BACKENDS = ("dense", "conv", "sequential")  # the backends that run `LocalPlan.scales`
Group = tuple[Tensor, Tensor]  # the rows (indices) of a cohort's clients with one sub-model, and its mask (P,)


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


def hidden_widths(model: FlatModel, layers: list[str]) -> list[int]:
    """d_l: the output units (channels) of every sliced layer but the last."""
    shapes = dict(zip(model.names, model.shapes, strict=True))
    return [int(shapes[f"{layer}.weight"][0]) for layer in layers[:-1]]


def kept(units: int, level: float) -> int:
    """⌈r·d⌉: the units of a layer of width d that a sub-model of level r keeps (at least 1)."""
    return max(1, math.ceil(level * units - 1e-9))


def unit_mask(model: FlatModel, layers: list[str], keep: list[Tensor]) -> Tensor:
    """(P,) bool: the sub-model that keeps, in sliced layer l, the output units or channels `keep[l]` ((d_l,) bool;
    every output of the last layer), reading only the kept units or channels of the layer before (all of the
    input's; a Linear layer after a convolution reads the flattened kept channels)."""
    mask = torch.zeros(model.size, dtype=torch.bool)
    shapes = dict(zip(model.names, model.shapes, strict=True))
    before: Tensor | None = None  # the kept units of the layer before
    for i, layer in enumerate(layers):
        shape = shapes[f"{layer}.weight"]
        units, inputs = shape[0], shape[1]
        rows = torch.ones(units, dtype=torch.bool) if i == len(layers) - 1 else keep[i]
        read = torch.ones(inputs, dtype=torch.bool)
        if before is not None:
            if inputs % len(before):
                raise ConfigError(f"layer '{layer}' reads {inputs} inputs from {len(before)} units: cannot slice it")
            read = before[torch.arange(inputs) // (inputs // len(before))]  # a flattened channel: inputs/total
        weight = torch.zeros(shape, dtype=torch.bool)
        weight[rows.nonzero().flatten().unsqueeze(1), read.nonzero().flatten()] = True
        mask[model.slices[f"{layer}.weight"]] = weight.flatten()
        if f"{layer}.bias" in model.slices:
            mask[model.slices[f"{layer}.bias"]] = rows
        before = rows
    return mask


def first_units(widths: list[int], level: float) -> list[Tensor]:
    """The first ⌈r·d_l⌉ units of every hidden layer (HeteroFL's and FjORD's sub-model of level r)."""
    return [torch.arange(d) < kept(d, level) for d in widths]


def width_mask(model: FlatModel, layers: list[str], level: float) -> Tensor:
    """(P,) bool: the sub-model of the first ⌈r·d⌉ units (channels) of every hidden layer (`unit_mask`)."""
    return unit_mask(model, layers, first_units(hidden_widths(model, layers), level))


def masked_average(
    global_params: Tensor, params: Tensor, masks: Tensor, weights: Tensor, groups: list[Group] | None = None
) -> Tensor:
    """d_j = Σ_k p_k m_kj (w_j − w_kj) / Σ_k p_k m_kj, and 0 where no client's mask holds j (HeteroFL Eq. 2),
    computed as w_j − Σ_k p_k m_kj w_kj / Σ_k p_k m_kj. With `groups` (the rows of each distinct mask, as
    `SubModels.masks` gives them) the sums run per distinct mask, each over its clients' masked parts only
    (`_group_sums`), and G passes over P."""
    p = weights.to(params.dtype)
    if groups is None:
        total = p @ masks.to(params.dtype)
        kept = p @ params.masked_fill(~masks, 0.0)
    else:
        share = torch.zeros(len(groups), len(p), dtype=params.dtype)
        for g, (rows, _) in enumerate(groups):
            share[g, rows] = p[rows]
        sums = _group_sums(params, groups, share)  # (G, P): each group's weighted sum of its clients' models
        total = torch.zeros_like(global_params)
        kept = torch.zeros_like(global_params)
        for (_, mask), part, weight in zip(groups, sums, share.sum(1).tolist(), strict=True):
            total.add_(mask, alpha=weight)
            kept.add_(part.masked_fill_(~mask, 0.0))
    mean = kept / total.clamp_min(torch.finfo(params.dtype).tiny)
    return torch.where(total > 0, global_params - mean, 0.0)


SPAN_GAP = 4096  # coordinates outside a mask that `_group_sums` reads rather than start another span


def _group_sums(params: Tensor, groups: list[Group], share: Tensor) -> Tensor:
    """(G, P) share @ params, row g over the spans of group g's mask only (its runs of True, those less than
    `SPAN_GAP` apart merged), client by client: a pass over what each client trained, not over all of (m, P).
    The same terms as the matrix product's, added client after client (the product's own order differs for some
    shapes: the last bits may differ); the product where a mask is scattered (more than 16 spans)."""
    spans: list[list[tuple[int, int]]] = []
    for _, mask in groups:
        edges = np.flatnonzero(np.diff(mask.numpy().view(np.int8), prepend=0, append=0))  # run starts, stops
        starts, stops = edges[0::2], edges[1::2]
        if not len(starts):
            spans.append([])
            continue
        join = np.flatnonzero(starts[1:] - stops[:-1] >= SPAN_GAP)  # the gaps that start a new span
        spans.append(list(zip(starts[np.r_[0, join + 1]].tolist(), stops[np.r_[join, -1]].tolist(), strict=True)))
    if any(len(s) > 16 for s in spans):
        return share @ params
    sums = torch.zeros(len(groups), params.shape[1], dtype=params.dtype)
    for out, weights, (rows, _), runs in zip(sums, share.tolist(), groups, spans, strict=True):
        for k in rows.tolist():
            for a, b in runs:
                out[a:b].add_(params[k, a:b], alpha=weights[k])
    return sums


class SubModels(Strategy):
    """FedAvg of sub-models: client k trains the sub-model of its level in the round (`unit_sets`: by default the
    first ⌈r·d⌉ units), each coordinate is averaged over the clients that trained it (`masked_average`).

    A scheme overrides `unit_sets` (which units a client of level r keeps in round t), and may override
    `trained_levels` (the level a client trains at in a round: its capacity by default) and `scales` (factors on
    the layers' outputs in training: HeteroFL's scaler)."""

    sub_models = True
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
    assignment: Literal["fix", "dynamic", "system"] = Field(
        "fix",
        description="fix: a level per client for the run; dynamic: redrawn for every client each round; system: "
        "each client's capacity from the system model (system.capacity)",
    )

    _layers: list[str] = PrivateAttr(default_factory=list)
    _widths: list[int] = PrivateAttr(default_factory=list)
    _prefix: dict[float, Tensor] = PrivateAttr(default_factory=dict)  # the first ⌈r·d⌉ units of each level
    _fixed: Tensor | None = PrivateAttr(None)
    _round_masks: tuple[int, Tensor, Tensor, list[Group]] | None = PrivateAttr(None)  # the last round's masks
    _evaluated: Tensor | None = PrivateAttr(None)
    _scores: dict[float, ClientScores] = PrivateAttr(default_factory=dict)  # of the evaluated model at each level

    @field_validator("levels", "capacities")
    @classmethod
    def _in_unit_interval(cls, value: list[float] | None) -> list[float] | None:
        if value is not None and any(not 0 < v <= 1 for v in value):
            raise ValueError("capacity levels must be in (0, 1]")
        return value

    @model_validator(mode="after")
    def _consistent(self) -> SubModels:
        if len(set(self.levels)) != len(self.levels):
            raise ValueError("levels must differ from each other")
        if self.proportions is not None:
            if len(self.proportions) != len(self.levels):
                raise ValueError(f"proportions needs one share per level ({len(self.levels)})")
            if any(not (p >= 0 and math.isfinite(p)) for p in self.proportions) or sum(self.proportions) <= 0:
                raise ValueError("proportions must be finite, >= 0 and not all 0")
        if self.capacities is not None and self.assignment != "fix":
            raise ValueError("capacities gives each client a fixed level: use assignment: fix")
        if self.capacities is not None and any(c not in self.levels for c in self.capacities):
            raise ValueError("every capacity must be one of the levels (each level is evaluated)")
        return self

    def setup(self, ctx: ServerContext) -> None:
        """Check the model (an MLP or a zoo CNN) and the local objective (nothing pulls a masked coordinate off
        zero) before anything runs; fix the clients' levels."""
        super().setup(ctx)
        what = f"algorithm '{self.name}'"
        model = ctx.engine.model
        self._layers = sliced_layers(model, what)
        self._widths = hidden_widths(model, self._layers)
        if not ctx.local.plan(torch.zeros(1, dtype=torch.long), ctx.train_sizes[:1]).anchor_free:
            raise ConfigError(
                f"{what}: the local objective has a term that pulls the sliced-off weights off zero (a proximal "
                "term, control variates, a local rule); use plain local training (weight decay is fine)"
            )
        k = ctx.num_clients
        if self.capacities is not None and len(self.capacities) != k:
            raise ConfigError(f"{what}: capacities lists {len(self.capacities)} levels for {k} clients")
        self._prefix = {level: width_mask(model, self._layers, level) for level in self.levels}
        if self.assignment == "system":
            self._fixed = self._from_system(ctx, what)
        else:
            self._fixed = torch.tensor(self.capacities) if self.capacities is not None else self._draw(0)
        self._round_masks = None

    def _from_system(self, ctx: ServerContext, what: str) -> Tensor:
        """(K,) each client's capacity as the system model gives it (`fedhet.systems.base.Capacity`)."""
        if ctx.system.capacity is None:
            raise ConfigError(
                f"{what}: assignment: system takes each client's level from the system model's capacity, and the "
                "run sets none; set system.capacity (levels, proportions, by), or use assignment: fix"
            )
        levels = ctx.system.capacities()
        unknown = sorted(set(levels.tolist()) - set(self.levels))
        if unknown:
            raise ConfigError(
                f"{what}: the system model gives capacity levels {unknown} that algorithm.levels {self.levels} "
                "lacks; give both the same levels"
            )
        return levels.float()

    @property
    def widths(self) -> list[int]:
        """d_l: the width (units or channels) of every hidden layer, in order (known after `setup`)."""
        return list(self._widths)

    def check_scaling(self) -> None:
        """Refuse in one line a run whose cohorts would train on a backend without `LocalPlan.scales`."""
        backend = self.ctx.engine.backend_for(self.ctx.clients_per_round)
        if backend not in SCALING_BACKENDS:
            raise ConfigError(
                f"algorithm '{self.name}': the scaler runs on the dense, conv and sequential backends; this run "
                f"trains on '{backend}': set algorithm.scaler=false or backend=sequential"
            )

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
        """(K,) each client's capacity level in round `round_`."""
        if self.assignment == "dynamic":
            return self._draw(round_)
        assert self._fixed is not None
        return self._fixed

    def trained_levels(self, round_: int, clients: Tensor) -> Tensor:
        """(m,) the level each of `clients` trains at in round `round_`: its capacity."""
        return self.capacity(round_)[clients]

    def unit_sets(self, round_: int, client: int, level: float) -> list[Tensor]:
        """The units (d_l,) bool of every hidden layer that `client` trains at `level` in round `round_`: the first
        ⌈r·d_l⌉ (HeteroFL's static slices)."""
        return first_units(self._widths, level)

    def scales(self, levels: Tensor) -> Tensor | None:
        """(m, L) factors on the outputs of the L sliced layers in training (`LocalPlan.scales`), or None."""
        return None

    def masks(self, round_: int, clients: Tensor) -> Tensor:
        """(m, P) the sub-model mask of each of `clients` in round `round_`."""
        return self.grouped_masks(round_, clients)[0]

    def grouped_masks(self, round_: int, clients: Tensor) -> tuple[Tensor, list[Group]]:
        """(m, P) the sub-model mask of each of `clients` in round `round_`, and the rows of each distinct one."""
        last = self._round_masks
        if last is not None and last[0] == round_ and torch.equal(last[1], clients):
            return last[2], last[3]
        levels = self.trained_levels(round_, clients).tolist()
        model = self.ctx.engine.model
        found: dict[bytes, tuple[Tensor, list[int]]] = {}
        keys = []
        for i, (client, level) in enumerate(zip(clients.tolist(), levels, strict=True)):
            units = self.unit_sets(round_, client, level)
            key = b"".join(bytes(u.numpy()) for u in units)
            if key not in found:
                prefix = level in self._prefix and key == b"".join(
                    bytes(u.numpy()) for u in first_units(self._widths, level)
                )
                found[key] = (self._prefix[level] if prefix else unit_mask(model, self._layers, units), [])
            found[key][1].append(i)
            keys.append(key)
        masks = torch.stack([found[key][0] for key in keys]) if keys else torch.zeros(0, model.size, dtype=torch.bool)
        groups = [(torch.tensor(rows), mask) for mask, rows in found.values()]
        self._round_masks = (round_, clients.clone(), masks, groups)
        return masks, groups

    def configure(self, round_: int, clients: Tensor, global_params: Tensor) -> LocalPlan:
        plan = replace(super().configure(round_, clients, global_params), masks=self.masks(round_, clients))
        scales = self.scales(self.trained_levels(round_, clients))
        return replace(plan, scales=scales) if scales is not None else plan

    def aggregate(self, round_: int, global_params: Tensor, result: LocalResult) -> Tensor:
        p = fedavg_weights(self.ctx.train_sizes[result.clients], self.weighting)
        masks, groups = self.grouped_masks(round_, result.clients)
        return self.server_step(global_params, masked_average(global_params, result.params, masks, p, groups))

    def evaluation_params(self, params: Tensor) -> Tensor:
        """The global model (kept: the round's metrics score it at every level)."""
        self._evaluated, self._scores = params, {}
        return params

    def level_scores(self) -> dict[float, ClientScores]:
        """The test scores of the evaluated global model at the first ⌈r·d⌉ units of each level (once per
        evaluation)."""
        if self._evaluated is not None and not self._scores:
            w = self._evaluated
            self._scores = {r: self.ctx.engine.scores(torch.where(m, w, 0.0), "test") for r, m in self._prefix.items()}
        return self._scores

    def round_metrics(self) -> dict[str, float]:
        """``test_accuracy_level<r>``: the global model at each level, its mean test accuracy over the seen clients
        (as ``test_accuracy``); ``capacity_test_accuracy_q1``..``q4``: each seen client's accuracy at its own level,
        averaged over the quarter of clients of the lowest capacities (q1) up to the highest (q4; ties in
        capacity split by client number), so that the cost to weak devices is seen."""
        seen = self.ctx.engine.data.seen
        metrics = {
            f"test_accuracy_level{level_name(r)}": float(s.accuracy[seen].double().mean())
            for r, s in self.level_scores().items()
        }
        own = self._own_level_accuracy()
        if own is not None:
            levels, accuracy = own
            ids = torch.nonzero(seen).flatten()
            order = ids[torch.argsort(levels[ids], stable=True)]
            for q, quarter in enumerate(torch.tensor_split(order, 4), start=1):
                value = float(accuracy[quarter].double().mean()) if len(quarter) else float("nan")
                metrics[f"capacity_test_accuracy_q{q}"] = value
        return metrics

    def _own_level_accuracy(self) -> tuple[Tensor, Tensor] | None:
        """(K,) each client's capacity level and the evaluated global model's test accuracy at that level on its
        data (None before an evaluation)."""
        scores = self.level_scores()
        if not scores:
            return None
        levels = self.capacity(self.ctx.round)
        accuracy = torch.full((len(levels),), float("nan"))
        for level, s in scores.items():
            mine = levels == level
            accuracy[mine] = s.accuracy[mine]
        return levels, accuracy

    def client_columns(self) -> dict[str, Tensor]:
        """clients.csv: ``capacity`` (each client's level in the last round; dynamic: redrawn each round) and
        ``capacity_test_accuracy`` (the evaluated global model at that level, on the client's test data)."""
        own = self._own_level_accuracy()
        if own is None:
            return {}
        levels, accuracy = own
        return {"capacity": levels, "capacity_test_accuracy": accuracy}
