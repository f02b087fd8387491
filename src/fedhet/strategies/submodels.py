"""Sub-models of one global model for clients of different capacity (HeteroFL, FedRolex, FjORD).

A sub-model is the full model masked (`fedhet.engine.plan.LocalPlan.masks`): in every Linear or Conv2d layer
(`sliced_layers`) a client keeps a set of the hidden units (or channels) and the weights between kept units; the
weights into and out of the others are zero and stay zero, which with a zero-preserving activation (φ(0) = 0) and
no objective term pulling them is exactly training the smaller network (`unit_mask`). Batch norm keeps the kept
channels' weight, bias and running statistics (a zero channel normalises to 0 and, with weight and bias 0, stays
0: its statistics stay 0); a ResNet's residual additions keep the same channels on both branches (`channels`).
The schemes differ in which units a client keeps: the first ⌈r·d⌉ (HeteroFL, FjORD: `width_mask`), a window
rolling with the round (FedRolex), or any set a plugin chooses (`SubModels.unit_sets`).

`SubModels` is their common strategy: a capacity level r ∈ (0, 1] per client (fixed for the run or redrawn each
round, from ``proportions`` over ``levels`` or an explicit ``capacities`` list, seeded), HeteroFL's Eq. 2
per-coordinate aggregation (`masked_average`), and the global model scored at the first ⌈r·d⌉ units of every
level (``test_accuracy_level<r>``, clients.csv ``capacity``).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Hashable
from dataclasses import dataclass, replace
from typing import Literal

import numpy as np
import torch
from pydantic import Field, PrivateAttr, field_validator, model_validator
from torch import Tensor, nn

from fedhet.engine.evaluate import ClientScores
from fedhet.engine.functional import FlatModel
from fedhet.engine.plan import LocalPlan, LocalResult
from fedhet.errors import ConfigError
from fedhet.models.zoo import BasicBlock, ConvClassifier, Flatten, ResNetNet, ToImage
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
    nn.Unflatten,
    nn.Identity,
    nn.MaxPool2d,
    nn.AvgPool2d,
    nn.LocalResponseNorm,
    Flatten,
    ToImage,
)
_NORMS = nn.modules.batchnorm._BatchNorm  # per channel: sliced with the channels of the layer before it
Group = tuple[Tensor, Tensor]  # the rows (indices) of a cohort's clients with one sub-model, and its mask (P,)


def level_name(level: float) -> str:
    """How a level is written in column names: 1, 0.5, 0.0625."""
    return f"{level:g}"


def sliced_layers(model: FlatModel, what: str) -> list[str]:
    """The names of the Linear and Conv2d layers of an MLP (`nn.Sequential`), a CNN (the zoo's `ConvClassifier` or a
    sequence of layers, with batch norm or without) or a zoo ResNet (`ResNetNet`), in module order; a model with
    other layers that hold parameters or break φ(0) = 0 is a one-line `ConfigError`."""
    module = model.module
    if not isinstance(module, nn.Sequential | ConvClassifier | ResNetNet):
        raise ConfigError(
            f"{what} slices MLPs, CNNs and the zoo's ResNets (resnet8, resnet18): this model is not a sequence of "
            "layers"
        )
    names = []
    for name, layer in module.named_modules():
        if any(True for _ in layer.children()):
            continue
        if isinstance(layer, nn.Linear | nn.Conv2d):
            names.append(name)
        elif not isinstance(layer, _ZERO_PRESERVING + _PASSING + (_NORMS,)):
            raise ConfigError(
                f"{what} slices MLPs and CNNs of Linear/Conv2d layers with ReLU, GELU or Tanh activations, pooling, "
                f"batch norm and local response normalisation; this model has a {type(layer).__name__} layer"
            )
    if len(names) < 2:
        raise ConfigError(f"{what} needs a model with a hidden layer to slice (model: mlp with hidden: [...])")
    return names


@dataclass(frozen=True)
class Channels:
    """The channel groups of a sliced model: a group is a set of units (channels) that every layer on it keeps
    alike, a hidden layer's outputs, or a ResNet's residual stream (the block outputs and the shortcuts added to
    them) or a block's inner channels. ``writes`` and ``reads`` give each sliced layer's output and input group,
    ``norms`` each batch-norm layer's; None is whole (the model's input, the last layer's outputs)."""

    writes: dict[str, int | None]
    reads: dict[str, int | None]
    norms: dict[str, int | None]
    widths: list[int]  # d_g: the units (channels) of each group


def channels(model: FlatModel, layers: list[str]) -> Channels:
    """The channel groups of `model` (`sliced_layers` gives `layers`): for a sequence of layers, layer l writes
    group l (the last: whole) and reads group l − 1 (the first: the whole input), a batch-norm layer normalises the
    group of the sliced layer before it; a ResNet's are `resnet_channels`."""
    if isinstance(model.module, ResNetNet):
        return resnet_channels(model.module)
    shapes = dict(zip(model.names, model.shapes, strict=True))
    last = len(layers) - 1
    writes: dict[str, int | None] = {layer: i if i < last else None for i, layer in enumerate(layers)}
    reads: dict[str, int | None] = {layer: i - 1 if i else None for i, layer in enumerate(layers)}
    norms: dict[str, int | None] = {}
    group: int | None = None
    for name, layer in model.module.named_modules():
        if name in writes:
            group = writes[name]
        elif isinstance(layer, _NORMS):
            norms[name] = group
    return Channels(writes, reads, norms, [int(shapes[f"{layer}.weight"][0]) for layer in layers[:-1]])


def resnet_channels(net: ResNetNet) -> Channels:
    """A ResNet's channel groups: the stem and the blocks of a stage without a downsample branch write one residual
    stream (so the shortcut adds the same channels), a block with a downsample branch starts the next stage's stream
    (its conv2, bn2 and downsample conv and norm write it), each block's conv1 and bn1 an inner group of their own;
    the classifier reads the last stream."""
    widths: list[int] = []

    def new(width: int) -> int:
        widths.append(width)
        return len(widths) - 1

    stream = new(net.conv1.out_channels)
    writes: dict[str, int | None] = {"conv1": stream}
    reads: dict[str, int | None] = {"conv1": None}
    norms: dict[str, int | None] = {"bn1": stream}
    for i in range(net.stages):
        stage = net.get_submodule(f"layer{i + 1}")
        assert isinstance(stage, nn.Sequential)
        for j, block in enumerate(stage):
            assert isinstance(block, BasicBlock)
            at = f"layer{i + 1}.{j}."
            inner = new(block.conv1.out_channels)
            out = stream if isinstance(block.downsample, nn.Identity) else new(block.conv2.out_channels)
            writes |= {f"{at}conv1": inner, f"{at}conv2": out}
            reads |= {f"{at}conv1": stream, f"{at}conv2": inner}
            norms |= {f"{at}bn1": inner, f"{at}bn2": out}
            if out != stream:
                writes[f"{at}downsample.0"], reads[f"{at}downsample.0"] = out, stream
                norms[f"{at}downsample.1"] = out
            stream = out
    writes["fc"], reads["fc"] = None, stream
    return Channels(writes, reads, norms, widths)


def hidden_widths(model: FlatModel, layers: list[str]) -> list[int]:
    """d_g: the units (channels) of every channel group (`channels`; a sequence of layers: the outputs of every
    sliced layer but the last)."""
    return channels(model, layers).widths


def kept(units: int, level: float) -> int:
    """⌈r·d⌉: the units of a layer of width d that a sub-model of level r keeps (at least 1)."""
    return max(1, math.ceil(level * units - 1e-9))


def unit_mask(model: FlatModel, layers: list[str], keep: list[Tensor]) -> Tensor:
    """(P,) bool: the sub-model that keeps the units or channels `keep[g]` ((d_g,) bool) of every channel group g
    (`channels`): a sliced layer's weights from its input group's kept units to its output group's (every output of
    the last layer, every input of the first; a Linear layer after a convolution reads the flattened kept
    channels), a batch-norm layer's weight, bias and running statistics of its group's kept channels (and its count
    of batches)."""
    topology = channels(model, layers)
    mask = torch.zeros(model.size, dtype=torch.bool)
    shapes = dict(zip(model.names, model.shapes, strict=True))

    def units(group: int | None, count: int, where: str) -> Tensor:
        if group is None:
            return torch.ones(count, dtype=torch.bool)
        mine = keep[group]
        if count % len(mine):
            raise ConfigError(f"layer '{where}' reads {count} inputs from {len(mine)} units: cannot slice it")
        return mine.repeat_interleave(count // len(mine))  # a flattened channel: count/total features each

    for layer in layers:
        shape = shapes[f"{layer}.weight"]
        rows = units(topology.writes[layer], shape[0], layer)
        read = units(topology.reads[layer], shape[1], layer)
        spatial = [1] * (len(shape) - 2)
        weight = rows.view(-1, 1, *spatial) & read.view(1, -1, *spatial)
        mask[model.slices[f"{layer}.weight"]] = weight.expand(shape).flatten()
        if f"{layer}.bias" in model.slices:
            mask[model.slices[f"{layer}.bias"]] = rows
    for norm, group in topology.norms.items():
        for leaf in ("weight", "bias", "running_mean", "running_var"):
            where = model.slices.get(f"{norm}.{leaf}")
            if where is not None:
                mask[where] = units(group, where.stop - where.start, norm)
        if f"{norm}.num_batches_tracked" in model.slices:
            mask[model.slices[f"{norm}.num_batches_tracked"]] = True
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
    the layers' outputs in training: HeteroFL's scaler). A scheme that does not cut hidden units overrides
    `level_masks` and `sub_model` instead (DepthFL's depths: `fedhet.strategies.depthfl`)."""

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
        self._prefix = self.level_masks(what)
        if not ctx.local.plan(torch.zeros(1, dtype=torch.long), ctx.train_sizes[:1]).anchor_free:
            raise ConfigError(
                f"{what}: the local objective has a term that pulls the sliced-off weights off zero (a proximal "
                "term, control variates, a local rule); use plain local training (weight decay is fine)"
            )
        k = ctx.num_clients
        if self.capacities is not None and len(self.capacities) != k:
            raise ConfigError(f"{what}: capacities lists {len(self.capacities)} levels for {k} clients")
        if self.assignment == "system":
            self._fixed = self._from_system(ctx, what)
        else:
            self._fixed = torch.tensor(self.capacities) if self.capacities is not None else self._draw(0)
        self._round_masks = None

    def level_masks(self, what: str) -> dict[float, Tensor]:
        """Check the model (`ConfigError` naming `what` if the scheme cannot cut it) and give the (P,) mask of each
        level's sub-model, the one each level is scored at: here the first ⌈r·d⌉ units of every hidden layer."""
        model = self.ctx.engine.model
        self._layers = sliced_layers(model, what)
        self._widths = hidden_widths(model, self._layers)
        return {level: width_mask(model, self._layers, level) for level in self.levels}

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
        """d_g: the width (units or channels) of every hidden layer, in order, or of every channel group of a ResNet
        (`channels`; known after `setup`)."""
        return list(self._widths)

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
        """The units (d_g,) bool of every hidden layer (channel group: `channels`) that `client` trains at `level`
        in round `round_`: the first ⌈r·d_g⌉ (HeteroFL's static slices)."""
        return first_units(self._widths, level)

    def sub_model(self, round_: int, client: int, level: float) -> tuple[Hashable, Callable[[], Tensor]]:
        """A key naming the sub-model `client` trains at `level` in round `round_` (clients with equal keys train the
        same one) and how to build its (P,) mask: the units of `unit_sets`."""
        units = self.unit_sets(round_, client, level)
        key = b"".join(bytes(u.numpy()) for u in units)

        def build() -> Tensor:
            if level in self._prefix and key == b"".join(bytes(u.numpy()) for u in first_units(self._widths, level)):
                return self._prefix[level]
            return unit_mask(self.ctx.engine.model, self._layers, units)

        return key, build

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
        found: dict[Hashable, tuple[Tensor, list[int]]] = {}
        keys = []
        for i, (client, level) in enumerate(zip(clients.tolist(), levels, strict=True)):
            key, build = self.sub_model(round_, client, level)
            if key not in found:
                found[key] = (build(), [])
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
        evaluation). Under the statistics policy ``recompute`` (the default on a model with batch norm) the engine
        scores each level's masked model with batch-norm statistics worked out at that level (`Engine.evaluated`:
        HeteroFL's static batch norm, a forward pass over the training data per level)."""
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
