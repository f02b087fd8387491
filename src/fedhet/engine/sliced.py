"""Sub-models trained as the smaller networks they are, on the dense backend.

A plan's ``masks`` (`fedhet.engine.plan.LocalPlan`) give each client a sub-model of the full model; trained as the
masked full model, every client costs the full model's work. Where a mask is exactly the sub-network of some units
of every layer (`unit_structure`: all the weights between kept units, and the kept biases; HeteroFL's, FedRolex's
and FjORD's sub-models are), the clients with the same mask train together on the gathered smaller weights
(a block of clients per distinct sub-model), and their models are scattered back into the full vector with zeros
elsewhere. That is the same computation without the zero products, so the numbers are those of the masked model up
to float rounding; and a sub-model of level r costs about r (or r²) of the full model's work.

Used for plain SGD without optimiser state, terms with tensors, frozen parameters, clipping or dropout (which would
need the dropped units re-drawn at the smaller width); otherwise the masked full model trains.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import numpy as np
import torch
from torch import Tensor, nn

from fedhet.engine.dense import DenseLayer, dense_layers, train_dense
from fedhet.engine.functional import FlatModel
from fedhet.engine.request import Trained, TrainRequest


def unit_structure(layers: list[DenseLayer], mask: Tensor) -> list[Tensor] | None:
    """The kept output units (out,) bool of every layer, where `mask` (P,) is exactly the sub-network of those
    units (each layer's weights between its kept inputs and kept outputs, and the kept outputs' biases; every input
    of the first layer, every output of the last); None otherwise."""
    inputs = torch.ones(layers[0].shape[1], dtype=torch.bool, device=mask.device)
    out = []
    for i, la in enumerate(layers):
        weight = mask[la.weight].view(la.shape)
        rows = mask[la.bias] if la.bias is not None else weight.any(1)
        if i == len(layers) - 1 and not bool(rows.all()):
            return None
        if not torch.equal(weight, rows.unsqueeze(1) & inputs.unsqueeze(0)):
            return None
        out.append(rows)
        inputs = rows
    return out


@dataclass(frozen=True)
class _SubNetwork:
    """A sub-network of units: where its weights and biases are in the full vector (`index`, in the order of a
    network of Linear layers of the kept widths), that network's layers and layout (a model on the meta device),
    and the kept units of every layer."""

    index: Tensor  # (P_sub,)
    model: FlatModel
    layers: list[DenseLayer]
    kept: list[Tensor]  # (k_l,) the kept output units of layer l


_NETWORKS: dict[tuple[object, ...], _SubNetwork] = {}  # the last few sub-networks (a run reuses a handful)


def _sub_network(model: FlatModel, layers: list[DenseLayer], units: list[Tensor]) -> _SubNetwork:
    """The sub-network of the kept `units` of every layer (kept: a run meets the same few again each round)."""
    geometry = tuple((la.weight.start, la.bias.start if la.bias else None, la.shape, la.activation) for la in layers)
    key = (id(model.task), geometry, *(bytes(u.cpu().numpy()) for u in units))  # the cached model keeps the task
    if key in _NETWORKS:
        return _NETWORKS[key]
    index, kept_units = [], []
    inputs = torch.arange(layers[0].shape[1])
    modules: list[nn.Module] = []
    for la, rows in zip(layers, units, strict=True):
        kept = rows.nonzero().flatten().cpu()
        start = la.weight.start or 0
        index.append((start + kept.unsqueeze(1) * la.shape[1] + inputs.unsqueeze(0)).flatten())
        if la.bias is not None:
            index.append((la.bias.start or 0) + kept)
        modules.append(nn.Linear(len(inputs), len(kept), bias=la.bias is not None, device="meta"))
        if la.activation is not None:
            modules.append({"relu": nn.ReLU, "tanh": nn.Tanh, "sigmoid": nn.Sigmoid}[la.activation]())
        kept_units.append(kept)
        inputs = kept
    small = FlatModel(nn.Sequential(*modules), model.task)
    small_layers = dense_layers(small)
    assert small_layers is not None
    if len(_NETWORKS) >= 64:
        _NETWORKS.pop(next(iter(_NETWORKS)))
    _NETWORKS[key] = _SubNetwork(torch.cat(index), small, small_layers, kept_units)
    return _NETWORKS[key]


def sliceable(request: TrainRequest, layers: list[DenseLayer]) -> bool:
    """Whether the request's sub-models may train as the smaller networks (see the module docstring)."""
    cohort = request.cohort
    plain = cohort.optimizer.plain and not cohort.opt_state and cohort.rule is None and cohort.dp_sgd is None
    tensors = any(t.server or t.client for t in cohort.terms)
    return (
        request.plan.masks is not None
        and plain
        and not tensors
        and request.frozen is None
        and request.clip is None
        and not any(la.dropout for la in layers)
    )


def train_sliced(request: TrainRequest, layers: list[DenseLayer]) -> Trained | None:
    """Train the request's clients on their sub-networks, one block per distinct sub-model (None: it does not
    apply, `sliceable`, or some mask is not a sub-network of units; the caller trains the masked full model)."""
    masks = request.plan.masks
    if masks is None or not sliceable(request, layers):
        return None
    grouped = _groups(masks, layers)
    if grouped is None:
        return None
    m, dev, size = request.size, request.anchor.device, request.model.size
    whole = [bool(all(bool(u.all()) for u in units)) for _, units in grouped]
    if len(grouped) == 1 and whole[0]:  # every client trains the whole model: no mask to apply
        return train_dense(replace(request, plan=replace(request.plan, masks=None)), layers)
    params = torch.empty(m, size, device=dev)  # every row written once: trained, or by `_scatter` (zeros elsewhere)
    losses = torch.full((m,), float("nan"), device=dev)
    for (rows, units), full in zip(grouped, whole, strict=True):
        at = rows.to(dev)
        plan = replace(request.plan, masks=None, starts=None).rows(rows)  # not the (m, P) masks' rows: a copy
        starts = request.starts[at] if request.starts is not None else None  # else: the anchor
        if full:
            sub = replace(request, plan=plan, cohort=request.cohort.rows(at), starts=starts, reuse=None)
            params[at], losses[at], _ = train_dense(sub, layers)
            continue
        net = _sub_network(request.model, layers, units)
        index = net.index.to(dev)
        sub = replace(
            request,
            model=net.model,
            anchor=request.anchor[index],
            plan=plan,
            cohort=request.cohort.rows(at),
            starts=starts[:, index] if starts is not None else None,
            reuse=None,
        )
        trained, loss, _ = train_dense(sub, net.layers)
        _scatter(params, at, trained, layers, net)
        losses[at] = loss
    return params, losses, {}


def _scatter(params: Tensor, at: Tensor, trained: Tensor, layers: list[DenseLayer], net: _SubNetwork) -> None:
    """Write the sub-network's models `trained` (g, P_sub) into rows `at` of `params`, zeros elsewhere (each of
    their coordinates written once, as `params` is not cleared first): each layer's kept rows and columns, a strided
    block where the kept units are the first ones."""
    g, m, dev = len(at), len(params), params.device
    inputs: Tensor | None = None  # the kept inputs of the layer (None: all)
    for la, sub, kept in zip(layers, net.layers, net.kept, strict=True):
        out = kept.to(dev)
        weight = trained[:, sub.weight].view(g, *sub.shape)
        target = params[:, la.weight].view(m, *la.shape)
        rows, cols = sub.shape
        prefix = int(kept[-1]) + 1 == len(kept) and (inputs is None or int(inputs[-1]) + 1 == len(inputs))
        if prefix:  # the first k rows and columns
            target[:, :rows, :cols].index_copy_(0, at, weight)
            for rest in (target[:, :rows, cols:], target[:, rows:]):
                if rest.numel():
                    _zero_rows(rest, at)
        else:
            block = torch.zeros(g, *la.shape, device=dev)
            spread = weight if inputs is None else torch.zeros(g, rows, la.shape[1], device=dev)
            if inputs is not None:
                spread.index_copy_(2, inputs.to(dev), weight)
            target.index_copy_(0, at, block.index_copy_(1, out, spread))
        if la.bias is not None and sub.bias is not None:
            bias = params[:, la.bias]
            if prefix:
                bias[:, :rows].index_copy_(0, at, trained[:, sub.bias])
                if rows < la.shape[0]:
                    _zero_rows(bias[:, rows:], at)
            else:
                bias.index_copy_(
                    0, at, torch.zeros(g, la.shape[0], device=dev).index_copy_(1, out, trained[:, sub.bias])
                )
        inputs = kept


def _zero_rows(tensor: Tensor, at: Tensor) -> None:
    """tensor[at] = 0, row by row (2× faster than `index_fill_` on a strided view)."""
    for i in at.tolist():
        tensor[i].zero_()


def _groups(masks: Tensor, layers: list[DenseLayer]) -> list[tuple[Tensor, list[Tensor]]] | None:
    """The rows of `masks` (m, P) grouped by sub-network, each with its kept units (`unit_structure`); None where
    some mask is not a sub-network of units. Rows are grouped by their biases' coordinates (the kept units, where
    every layer has a bias), then each row is checked equal to its group's first (a cohort has few distinct
    sub-models, and sorting (m, P) rows costs more)."""
    rows_np = masks.cpu().numpy()
    if any(la.bias is None for la in layers):
        keys = [row.tobytes() for row in rows_np]
    else:
        probe = np.concatenate([np.arange(la.bias.start or 0, la.bias.stop) for la in layers if la.bias is not None])
        keys = [row.tobytes() for row in rows_np[:, probe]]
    members: dict[bytes, list[int]] = {}
    for i, key in enumerate(keys):
        members.setdefault(key, []).append(i)
    out = []
    for rows in members.values():
        whole = rows_np[rows[0]].tobytes()
        if not all(rows_np[i].tobytes() == whole for i in rows[1:]):
            return None
        units = _unit_structure(layers, masks[rows[0]], whole)
        if units is None:
            return None
        out.append((torch.tensor(rows), units))
    return out


_UNITS: dict[
    tuple[object, ...], list[Tensor] | None
] = {}  # the last few masks' units, by their bytes (a run meets a handful)


def _unit_structure(layers: list[DenseLayer], mask: Tensor, key: bytes) -> list[Tensor] | None:
    """`unit_structure` of `mask` (its bytes: `key`), kept for the next rounds."""
    geometry = tuple((la.weight.start, la.bias.start if la.bias else None, la.shape) for la in layers)
    cached = (geometry, key)
    if cached not in _UNITS:
        if len(_UNITS) >= 16:
            _UNITS.pop(next(iter(_UNITS)))
        _UNITS[cached] = unit_structure(layers, mask)
    return _UNITS[cached]
