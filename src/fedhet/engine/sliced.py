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

from dataclasses import replace

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


def _sub_network(model: FlatModel, layers: list[DenseLayer], units: list[Tensor]) -> tuple[Tensor, FlatModel]:
    """The flat indices (P_sub,) of the sub-network's weights and biases, in the order of a network of Linear
    layers of the kept widths, and that network (on the meta device: only its layout is used)."""
    index = []
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
        inputs = kept
    return torch.cat(index), FlatModel(nn.Sequential(*modules), model.task)


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
    distinct, which = torch.unique(masks, dim=0, return_inverse=True)
    structures = [unit_structure(layers, row) for row in distinct]
    if any(s is None for s in structures) or bool(distinct.all()):
        return None
    m, dev = request.size, request.anchor.device
    params = torch.zeros(m, request.model.size, device=dev)
    losses = torch.full((m,), float("nan"), device=dev)
    for g, units in enumerate(structures):
        assert units is not None
        rows = (which == g).nonzero().flatten()
        index, small = _sub_network(request.model, layers, units)
        index = index.to(dev)
        starts = request.starts[rows.to(request.starts.device)] if request.starts is not None else None
        plan = replace(request.plan.rows(rows.cpu()), masks=None)
        sub = replace(
            request,
            model=small,
            anchor=request.anchor[index],
            plan=plan,
            cohort=request.cohort.rows(rows.to(dev)),
            starts=starts[:, index] if starts is not None else None,
            reuse=None,
        )
        sub_layers = dense_layers(small)
        assert sub_layers is not None
        trained, loss, _ = train_dense(sub, sub_layers)
        block = torch.zeros(len(rows), request.model.size, device=dev)
        block[:, index] = trained
        params[rows.to(dev)] = block
        losses[rows.to(dev)] = loss
    return params, losses, {}
