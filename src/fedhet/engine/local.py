"""Local training of a cohort with autograd: client by client (sequential) or vectorised with `torch.func`.

Both backends run the same step (`fedhet.engine.step`: the gradient of the client's objective, its parameter
terms, the client optimiser) on the same mini-batches (drawn by `batches.local_batches`), so they give the same
numbers up to float rounding, and the same as the dense and conv backends (`fedhet.engine.dense`,
`fedhet.engine.conv`). Dropout masks are seeded per (round, step), identical across clients and backends (vmap
with ``randomness="same"``), and drawn on the CPU on any device (`_masks_from_the_cpu`).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager, nullcontext
from dataclasses import replace
from typing import Any, Literal

import torch
import torch.nn.functional as F
from torch import Tensor, nn
from torch.func import grad, vmap
from torch.utils._pytree import tree_map

from fedhet.data.dataset import ClientData
from fedhet.engine.batches import gather_rows, local_batches, stats_samples
from fedhet.engine.conv import conv_layers, train_conv
from fedhet.engine.dense import dense_layers, train_dense
from fedhet.engine.functional import FlatModel
from fedhet.engine.memory import fit_chunk, training_bytes
from fedhet.engine.objective import Aligned, DataTerm, ModelView, ParameterTerm
from fedhet.engine.privacy import (
    ExampleDP,
    expected_batch,
    poisson_batches,
    refuse_with,
    sgd_noise_key,
    step_noise,
)
from fedhet.engine.request import Trained, TrainRequest
from fedhet.engine.sliced import train_sliced
from fedhet.engine.step import Cohort, aligned, leaf_direction
from fedhet.engine.task import Task
from fedhet.engine.threads import few_threads, torch_threads
from fedhet.errors import ConfigError
from fedhet.seeding import derive_seed

Backend = Literal["sequential", "vectorised", "dense", "conv"]
# The sequential backend trains models of at most this many parameters on one torch thread: a client's mini-batch ops
# are too small to split over a team of threads, as the dense and conv backends' are (one thread per worker). Measured
# on 2 cores (5 rounds, 5 of 8 clients a round, an MLP with GELU of 1k parameters): 26 s with two threads against
# 4.3 s with one (issue 36); on a loaded machine 32.7 s against 1.6 s, and 64 s against 3.9 s for a 3k-parameter CNN.
ONE_THREAD_MAX_PARAMS = 100_000
Tree = dict[str, Tensor]
RULE_STATE = "rule/"  # a rule's state in a backend's returned state dictionary, beside the optimiser's


def _seed_dropout(model: FlatModel, seed: int, round_: int, t: int, stream: str) -> None:
    if model.has_dropout:
        torch.manual_seed(derive_seed(seed, f"dropout/{stream}", round_, t))


_DROPOUTS: dict[type[nn.Module], Callable[..., Tensor]] = {
    nn.Dropout: F.dropout,
    nn.Dropout1d: F.dropout1d,
    nn.Dropout2d: F.dropout2d,
    nn.Dropout3d: F.dropout3d,
}


@contextmanager
def _masks_from_the_cpu(model: FlatModel, device: torch.device) -> Iterator[None]:
    """On another device than the CPU, the model's dropout layers draw their masks on the CPU, as the sequential
    backend's modules draw them (the same function on the same shape, from the same seed), and multiply them in
    on `device`: a run on a GPU then gives the CPU's numbers with dropout too. Under vmap (``randomness="same"``)
    each layer draws one mask per step, shared by the clients, as on the CPU."""
    dropout = nn.modules.dropout._DropoutNd
    patched = [
        m
        for m in model.module.modules()
        if device.type != "cpu" and isinstance(m, dropout) and m.p > 0 and type(m) in _DROPOUTS
    ]
    for m in patched:

        def forward(x: Tensor, m: nn.modules.dropout._DropoutNd = m) -> Tensor:
            if not m.training:
                return x
            return x * _DROPOUTS[type(m)](torch.ones(x.shape), m.p, training=True).to(x.device)

        m.forward = forward
    try:
        yield
    finally:
        for m in patched:
            del m.forward


@contextmanager
def _output_scales(model: FlatModel, scales: Tensor | None) -> Iterator[list[Tensor]]:
    """While open, the outputs of the module's Linear/Conv2d layers (in order) are multiplied by the entries of the
    (L,) tensor put in the yielded list (a plan's ``scales`` row of the client training now); no hooks without."""
    current: list[Tensor] = []
    if scales is None:
        yield current
        return
    layers = [m for m in model.module.modules() if isinstance(m, nn.Linear | nn.Conv2d)]
    handles = [
        layer.register_forward_hook(lambda _m, _i, out, k=k: out * current[0][k]) for k, layer in enumerate(layers)
    ]
    try:
        yield current
    finally:
        for handle in handles:
            handle.remove()


def train_sequential(request: TrainRequest) -> Trained:
    """Clients one after another with plain autograd on one module whose parameters are views of a flat
    buffer (no model copies). The same step as `make_step`; objectives that need more than the module's loss
    (data terms, rules) run `make_step` client by client."""
    model, data, plan, cohort = request.model, request.data, request.plan, request.cohort
    if cohort.autograd_only:
        return _train_functional(request)
    index, weight = local_batches(
        data.offsets, plan.clients, plan.steps, plan.batch_size, request.seed, request.round_, plan.stream
    )
    params = request.start()
    losses = torch.full((request.size,), float("nan"))
    opt_state = {k: v.clone() for k, v in cohort.opt_state.items()}
    with _output_scales(model, plan.scales) as scale:
        for i in range(request.size):
            if plan.scales is not None:
                scale[:] = [plan.scales[i]]
            _train_one(request, i, params, losses, opt_state, index, weight)
    return params, losses, opt_state


def _train_one(
    request: TrainRequest,
    i: int,
    params: Tensor,
    losses: Tensor,
    opt_state: dict[str, Tensor],
    index: Tensor,
    weight: Tensor,
) -> None:
    """`train_sequential`'s steps of client i (row i of `params`, `losses` and `opt_state`, written in place)."""
    model, data, plan, cohort = request.model, request.data, request.plan, request.cohort
    w, g = model.bound_buffers()
    kinds = cohort.optimizer.state_kinds()
    tau = int(plan.steps[i])
    if tau == 0:
        return
    terms = aligned(cohort.parameter_terms, request.anchor, lambda v: v, lambda v, i=i: v[i])  # type: ignore[misc]
    state = {k: v[i] for k, v in opt_state.items()}
    lr = plan.lr[i]
    total = torch.zeros(())
    with torch.no_grad():
        w.copy_(params[i])
        model.bind_statistics(params[i, model.stats])  # updated by the module's forward passes
    for t in range(tau):
        _seed_dropout(model, request.seed, request.round_, t, plan.stream)
        rows = index[i, t]
        sub = plan.step_mask(i, t)  # this step's sub-model (a plan's step masks), or None
        if sub is not None:
            before, stats = w.clone(), model.bound_statistics()
            with torch.no_grad():
                w.masked_fill_(~sub, 0.0)
        g.zero_()
        loss = model.module_batch_loss(data.x[rows], data.y[rows], weight[i, t])
        loss.backward()
        with torch.no_grad():
            new, after = cohort.optimizer.step(w, leaf_direction(g, w, terms), state, lr)
            if sub is not None:  # outside the step's sub-model: the values, state and statistics of before the step
                new = torch.where(sub, new, before)
                after = {k: torch.where(sub, v, state[k]) if kinds[k] == "param" else v for k, v in after.items()}
                if model.stat_names:
                    model.bind_statistics(torch.where(sub[model.stats], model.bound_statistics(), stats))
            w.copy_(request.keep_frozen(new, w))
            state = {k: request.keep_frozen(v, state[k]) if kinds[k] == "param" else v for k, v in after.items()}
        total = total + loss.detach()
    params[i] = w
    params[i, model.stats] = model.bound_statistics()
    losses[i] = total / tau
    for k, v in state.items():
        opt_state[k][i] = v


def make_step(
    model: FlatModel, cohort: Cohort, frozen: frozenset[str] = frozenset()
) -> Callable[..., tuple[Tree, dict[str, Any], dict[str, Any], Tensor]]:
    """One client's local step on parameter dictionaries (vmap it for a cohort; dictionaries are cheaper under
    vmap than one flat vector: no split and cat per step).

    ``step(w, start, x, y, wt, lr, server, client, opt, rule, private) -> (w, opt, rule, loss)``: `server` and
    `client` hold each term's tensors as dictionaries (in the order of ``cohort.terms``), `opt` the optimiser's state
    (dictionaries for "param" states, one number for "count" states) and `rule` the rule's state (dictionaries for
    "param" states, numbers for "scalar" ones); x, y, wt carry a rule's mini-batches on dim 0. The parameters named
    in `frozen` keep their values and their optimiser state. With ``cohort.dp_sgd``, `private` is (the step's
    standard normal noise as a dictionary, empty without noise; the client's expected batch size b_k) and the data
    gradient is DP-SGD's (`private_gradient`); else it is None."""
    terms = [t.term for t in cohort.terms]
    optimizer, rule, task = cohort.optimizer, cohort.rule, model.task
    kinds = optimizer.state_kinds()
    dp = cohort.dp_sgd
    refuse_with(dp, bool(cohort.data_terms), rule is not None, model.has_dropout)
    statistics = frozenset(model.stat_names)
    if dp is not None and statistics:
        raise ConfigError("local.dp_sgd cannot train a model with batch-norm running statistics (per-sample gradients)")
    forward = model.forward  # a data term's forward passes leave the running statistics as they are
    exits = bool(model.exits)  # a multi-exit model trains on the sum of its held exits' losses
    if dp is not None and exits:
        raise ConfigError("local.dp_sgd cannot train a multi-exit model (its per-sample gradients see one output)")
    represent = model.representation if model.has_representation else None

    private_gradient = _private_gradient(forward, task, dp, frozen) if dp is not None else None

    def step(
        w: Tree,
        start: Tree,
        x: Tensor,
        y: Tensor,
        wt: Tensor,
        lr: Tensor,
        server: list[dict[str, Tree]],
        client: list[dict[str, Tree]],
        opt: dict[str, Any],
        rule_state: dict[str, Any],
        private: tuple[Tree, Tensor] | None = None,
    ) -> tuple[Tree, dict[str, Any], dict[str, Any], Tensor]:
        def objective(v: Tree, s: Tree, xb: Tensor, yb: Tensor, wb: Tensor) -> tuple[Tensor, tuple[Tensor, Tree]]:
            out, s = model.forward_tracked(v, s, xb, wb, exits)  # s: the running statistics after this batch
            logits, losses = model.training_losses(out, yb)
            loss = (losses * wb).sum() / wb.sum().clamp_min(1.0)
            total = loss
            z, held = out if exits else (None, None)
            for term, srv, cli in zip(terms, server, client, strict=True):
                if isinstance(term, DataTerm):
                    view = ModelView(forward, v, xb, yb, wb, logits, start, srv, cli, z, held, represent)
                    total = total + term.loss(view)
            return total, (loss, s)

        gradient = grad(objective, has_aux=True)
        stats = {n: w[n] for n in statistics}
        w = {n: v for n, v in w.items() if n not in statistics}  # the trained parameters

        def direction(v: Tree, g: Tree) -> Tree:
            out = {}
            for n in v:
                leaf_terms = [
                    (term, Aligned(start[n], {k: s[n] for k, s in srv.items()}, {k: c[n] for k, c in cli.items()}))
                    for term, srv, cli in zip(terms, server, client, strict=True)
                    if isinstance(term, ParameterTerm)
                ]
                out[n] = leaf_direction(g[n], v[n], leaf_terms)
            return out

        latest = [stats]  # the statistics after the last forward pass (a rule may take several)
        if rule is None:
            if private_gradient is not None and private is not None:
                g, loss = private_gradient(w, x, y, wt, *private)
            else:
                g, (loss, latest[0]) = gradient(w, stats, x, y, wt)
            d = direction(w, g)
        else:

            def grad_fn(v: Tree, i: int) -> tuple[Tree, Tensor]:
                g, (value, latest[0]) = gradient(v, latest[0], x[i], y[i], wt[i])
                return direction(v, g), value

            rule_kinds = rule.state_kinds()  # the rule sees the parameters only; its state keeps the statistics' rows
            own = {k: {n: v[n] for n in w} if rule_kinds[k] == "param" else v for k, v in rule_state.items()}
            d, loss, after = rule.step(grad_fn, w, own, lr)
            rule_state = {
                k: {n: v[n] if n in statistics else after[k][n] for n in model.names}
                if rule_kinds[k] == "param"
                else after[k]
                for k, v in rule_state.items()
            }
        params = [k for k, kind in kinds.items() if kind == "param"]
        counts = {k: opt[k] for k, kind in kinds.items() if kind == "count"}
        new_w: Tree = {}
        new_opt: dict[str, Any] = {k: {} for k in params}
        for n in model.names:
            state = {**{k: opt[k][n] for k in params}, **counts}
            if n in statistics:  # no gradient step, and no count of it
                new_w[n] = latest[0][n]
                for k in params:
                    new_opt[k][n] = state[k]
                continue
            if n in frozen:
                new_w[n], after = w[n], state
            else:
                new_w[n], after = optimizer.step(w[n], d[n], state, lr)
            for k in params:
                new_opt[k][n] = after[k]
            new_opt.update({k: after[k] for k in counts})  # the same new count from every leaf
        return new_w, new_opt, rule_state, loss

    return step


def _private_gradient(
    forward: Callable[[Tree, Tensor], Tensor], task: Task, dp: ExampleDP, frozen: frozenset[str]
) -> Callable[[Tree, Tensor, Tensor, Tensor, Tree, Tensor], tuple[Tree, Tensor]]:
    """DP-SGD's gradient of one client's batch (Abadi et al. 2016, Algorithm 1): per-sample gradients g_i of the
    task's loss (vmap over the batch), each clipped to norm C over the trained parameters, summed with the batch
    weights, plus σ·noise (σ = zC), divided by the expected batch size b_k; and the batch's mean loss."""

    def sample_loss(v: Tree, xs: Tensor, ys: Tensor) -> tuple[Tensor, Tensor]:
        loss = task.loss(forward(v, xs.unsqueeze(0)), ys.unsqueeze(0)).sum()
        return loss, loss

    per_sample = vmap(grad(sample_loss, has_aux=True), in_dims=(None, 0, 0))
    sigma = dp.noise_std

    def private_gradient(
        v: Tree, xb: Tensor, yb: Tensor, wb: Tensor, noise: Tree, denominator: Tensor
    ) -> tuple[Tree, Tensor]:
        g, losses = per_sample(v, xb, yb)
        squares = wb.new_zeros(wb.shape)
        for n, value in g.items():
            if n not in frozen:
                squares = squares + value.reshape(len(wb), -1).pow(2).sum(1)
        factor = (dp.clip / squares.sqrt()).clamp(max=1.0) * wb
        out = {}
        for n, value in g.items():
            total = torch.tensordot(factor, value, dims=1)
            if n in noise:
                total = total + sigma * noise[n]
            out[n] = total / denominator
        return out, (losses * wb).sum() / wb.sum().clamp_min(1.0)

    return private_gradient


def _batches(request: TrainRequest, rows: Tensor | slice, steps: Tensor) -> tuple[Tensor, Tensor]:
    """The mini-batches of the plan's clients `rows` taking `steps`: DP-SGD's Poisson-sampled ones, or the engine's."""
    plan, data = request.plan, request.data
    sample = poisson_batches if plan.dp_sgd is not None and plan.dp_sgd.sampling == "poisson" else local_batches
    return sample(data.offsets, plan.clients[rows], steps, plan.batch_size, request.seed, request.round_, plan.stream)


def _private_inputs(request: TrainRequest, rows: Tensor, step: int, denominators: Tensor) -> tuple[Tree, Tensor]:
    """DP-SGD's `private` step input of the cohort's clients `rows` (indices into the plan): their noise of step
    `step` as a parameter dictionary (m, ...) (empty without noise) and their expected batch sizes (m,)."""
    plan, model = request.plan, request.model
    assert plan.dp_sgd is not None
    if plan.dp_sgd.noise_std == 0:
        return {}, denominators[rows]
    key = sgd_noise_key(plan.stream, plan.phase)
    noise = step_noise(plan.clients[rows], model.size, request.seed, request.round_, key, step)
    return _tree(model, noise.to(denominators.device)), denominators[rows]


def _tree(model: FlatModel, flat: Tensor) -> Tree:
    """Views of flat parameters (..., P) as a dictionary of (..., *shape) tensors."""
    chunks = torch.split(flat, model.numels, dim=-1)
    lead = flat.shape[:-1]
    return {n: c.reshape((*lead, *s)) for n, c, s in zip(model.names, chunks, model.shapes, strict=True)}


def _flat(tree: Tree, m: int) -> Tensor:
    return torch.cat([t.reshape(m, -1) for t in tree.values()], dim=1)


def _state_trees(model: FlatModel, state: dict[str, Tensor], kinds: Mapping[str, str]) -> dict[str, Any]:
    """Flat per-client state as parameter dictionaries for its "param" entries (the others stay vectors)."""
    return {k: _tree(model, v) if kinds[k] == "param" else v for k, v in state.items()}


def _trees(
    model: FlatModel, cohort: Cohort
) -> tuple[list[dict[str, Tree]], list[dict[str, Tree]], dict[str, Any], dict[str, Any]]:
    """The cohort's tensors as parameter dictionaries: each term's server tensors and client rows, the optimiser
    state and the rule's state ("count" and "scalar" states stay vectors)."""
    server = [{k: _tree(model, v) for k, v in t.server.items()} for t in cohort.terms]
    client = [{k: _tree(model, v) for k, v in t.client.items()} for t in cohort.terms]
    opt = _state_trees(model, cohort.opt_state, cohort.optimizer.state_kinds())
    rule = _state_trees(model, cohort.rule_state, cohort.rule.state_kinds()) if cohort.rule is not None else {}
    return server, client, opt, rule


def _flat_state(state: dict[str, Any], m: int) -> dict[str, Tensor]:
    return {k: _flat(v, m) if isinstance(v, dict) else v for k, v in state.items()}


def _frozen_names(request: TrainRequest) -> frozenset[str]:
    """The parameters `request` freezes, by name."""
    return frozenset(n for n, where in request.model.slices.items() if request.is_frozen(where))


def _with_rule_state(opt_state: dict[str, Tensor], rule_state: dict[str, Tensor]) -> dict[str, Tensor]:
    """The state a backend returns: the optimiser's, and the rule's under ``"rule/<name>"``."""
    return {**opt_state, **{f"{RULE_STATE}{k}": v for k, v in rule_state.items()}}


def _train_functional(request: TrainRequest) -> Trained:
    """`make_step` client by client, without vmap (for models vmap cannot run, with data terms or rules)."""
    model, data, plan, cohort = request.model, request.data, request.plan, request.cohort
    seed, round_ = request.seed, request.round_
    step = make_step(model, cohort, _frozen_names(request))
    per_step = cohort.rule.batches_per_step if cohort.rule is not None else 1
    index, weight = _batches(request, slice(None), plan.steps * per_step)
    dp = cohort.dp_sgd
    denominators = expected_batch(data.offsets, plan.clients, plan.batch_size) if dp is not None else None
    m = request.size
    params = request.start()
    losses = torch.full((m,), float("nan"))
    start = _tree(model, request.anchor)
    server, client, opt, rule = _trees(model, cohort)
    opt_state = {k: v.clone() for k, v in cohort.opt_state.items()}
    rule_state = {k: v.clone() for k, v in cohort.rule_state.items()}
    one = lambda tree, i: tree_map(lambda v: v[i], tree)  # noqa: E731
    for i in range(m):
        tau = int(plan.steps[i])
        if tau == 0:
            continue
        w = _tree(model, params[i].clone())
        mine, state, carried = one(client, i), one(opt, i), one(rule, i)
        total = torch.zeros(())
        for t in range(tau):
            _seed_dropout(model, seed, round_, t, plan.stream)
            at = t if cohort.rule is None else slice(t * per_step, (t + 1) * per_step)
            rows = index[i, at]
            private = None
            if denominators is not None:
                noise, denominator = _private_inputs(request, torch.tensor([i]), t, denominators)
                private = (tree_map(lambda v: v[0], noise), denominator[0])
            sub = plan.step_mask(torch.tensor([i]), t) if plan.step_masks is not None else None
            before = (w, state)
            w_in = _restricted(model, w, sub[0]) if sub is not None else w
            w, state, carried, loss = step(
                w_in,
                start,
                gather_rows(data.x, rows),
                data.y[rows],
                weight[i, at],
                plan.lr[i],
                server,
                mine,
                state,
                carried,
                private,
            )
            if sub is not None:
                w, state = _outside_kept(model, cohort, sub[0], (w, state), before)
            w, state, carried = tree_map(torch.Tensor.detach, (w, state, carried))
            total = total + loss.detach()
        params[i] = _flat(tree_map(lambda v: v.unsqueeze(0), w), 1)[0]
        losses[i] = total / tau
        for into, new in ((opt_state, state), (rule_state, carried)):
            for k, v in _flat_state(tree_map(lambda v: v.unsqueeze(0), new), 1).items():
                into[k][i] = v[0]
    return params, losses, _with_rule_state(opt_state, rule_state)


State = tuple[Tree, dict[str, Any]]  # a step's parameters and optimiser state


def _restricted(model: FlatModel, w: Tree, sub: Tensor) -> Tree:
    """The parameters `w` ((..., shape) leaves) with the coordinates outside the step's sub-model `sub` ((..., P)
    bool, a plan's step masks) at zero: what the step's forward pass reads."""
    mask = _tree(model, sub)
    return {n: torch.where(mask[n], v, 0.0) for n, v in w.items()}


def _outside_kept(model: FlatModel, cohort: Cohort, sub: Tensor, after: State, before: State) -> State:
    """The parameters (running statistics included) and the optimiser's "param" states after a step of the
    sub-model `sub` ((..., P) bool), with the coordinates outside it as they were before the step."""
    mask = _tree(model, sub)
    kinds = cohort.optimizer.state_kinds()
    w = {n: torch.where(mask[n], v, before[0][n]) for n, v in after[0].items()}
    opt = {
        k: {n: torch.where(mask[n], v[n], before[1][k][n]) for n in v} if kinds[k] == "param" else v
        for k, v in after[1].items()
    }
    return w, opt


VMAP_ACTIVATIONS = 8  # activations per sample of a generic model under vmap, in multiples of its input's size (a guess)


def vectorised_chunk(request: TrainRequest) -> int:
    """The whole cohort, or as many clients as fit in half the device's free memory (`fit_chunk`; a generic
    model's activations estimated as `VMAP_ACTIVATIONS` times its input)."""
    sample = math.prod(request.data.x.shape[1:])
    per_client = training_bytes(request.model.size, request.plan.batch_size, VMAP_ACTIVATIONS * sample)
    return fit_chunk(request.size, per_client, request.anchor.device)


def train_vectorised(request: TrainRequest) -> Trained:
    """Many clients at once: `vmap` of `make_step` over stacked parameters, in chunks of `chunk_size` clients.

    Runs on the device of the request's tensors and data (the plan's client ids and step counts stay on the CPU)."""
    model, plan, cohort = request.model, request.plan, request.cohort
    dev = request.anchor.device
    chunk = request.chunk_size if request.chunk_size > 0 else vectorised_chunk(request)
    randomness = "same" if model.has_dropout else "error"
    dp = cohort.dp_sgd
    step = make_step(model, cohort, _frozen_names(request))
    scales = plan.scales.to(dev) if plan.scales is not None else None
    with _output_scales(model, scales) as current:

        def scaled_step(scale: Tensor | None, *args: Any) -> tuple[Tree, dict[str, Any], dict[str, Any], Tensor]:
            if scale is not None:  # this client's (L,) row: the output hooks multiply by it (a plan's ``scales``)
                current[:] = [scale]
            return step(*args)

        vstep = vmap(
            scaled_step,
            in_dims=(None if scales is None else 0, 0, None, 0, 0, 0, 0, None, 0, 0, 0, 0 if dp is not None else None),
            randomness=randomness,
        )
        return _train_vectorised(request, vstep, scales, chunk)


def _train_vectorised(request: TrainRequest, vstep: Callable[..., Any], scales: Tensor | None, chunk: int) -> Trained:
    """`train_vectorised`'s chunks of clients, each step a call of `vstep` (the vmapped step, its first argument
    the clients' rows of `scales` or None)."""
    model, data, plan, cohort = request.model, request.data, request.plan, request.cohort
    seed, round_ = request.seed, request.round_
    m, dev = request.size, request.anchor.device
    params = request.start()
    losses = torch.full((m,), float("nan"), device=dev)
    opt_state = {k: v.clone() for k, v in cohort.opt_state.items()}
    rule_state = {k: v.clone() for k, v in cohort.rule_state.items()}
    per_step = cohort.rule.batches_per_step if cohort.rule is not None else 1
    start = _tree(model, request.anchor)
    dp = cohort.dp_sgd is not None
    denominators = expected_batch(data.offsets.cpu(), plan.clients, plan.batch_size).to(dev) if dp else None
    for lo in range(0, m, chunk):
        sel = slice(lo, min(lo + chunk, m))
        steps, lr = plan.steps[sel], plan.lr[sel].to(dev)
        size = len(steps)
        server, client, opt, carried = _trees(model, cohort.rows(sel))
        index, weight = _batches(request, sel, steps * per_step)
        index, weight = index.to(dev), weight.to(dev)
        chunk_rows = torch.arange(m)[sel]
        w, total = _tree(model, params[sel].clone()), torch.zeros(size, device=dev)
        for t in range(index.shape[1] // per_step):
            _seed_dropout(model, seed, round_, t, plan.stream)
            at = t if cohort.rule is None else slice(t * per_step, (t + 1) * per_step)  # a rule's batches on dim 1
            active = steps > t
            if bool(active.all()):
                rows = index[:, at]
                private = _private_inputs(request, chunk_rows, t, denominators) if denominators is not None else None
                sub = plan.step_mask(sel, t)
                sub = sub.to(dev) if sub is not None else None
                before = (w, opt)
                w, opt, carried, loss = vstep(
                    scales[sel] if scales is not None else None,
                    _restricted(model, w, sub) if sub is not None else w,
                    start,
                    gather_rows(data.x, rows),
                    data.y[rows],
                    weight[:, at],
                    lr,
                    server,
                    client,
                    opt,
                    carried,
                    private,
                )
                if sub is not None:
                    w, opt = _outside_kept(model, cohort, sub, (w, opt), before)
                total = total + loss
            else:
                on_cpu = torch.nonzero(active).flatten()
                ids = on_cpu.to(dev)
                rows = index[ids, at]
                pick = lambda v, ids=ids: v[ids]  # noqa: E731
                private = None
                if denominators is not None:
                    private = _private_inputs(request, chunk_rows[on_cpu], t, denominators)
                sub = plan.step_mask(chunk_rows[on_cpu], t)
                sub = sub.to(dev) if sub is not None else None
                w_in = tree_map(pick, w)
                new_w, new_opt, new_carried, loss = vstep(
                    scales[sel][ids] if scales is not None else None,
                    _restricted(model, w_in, sub) if sub is not None else w_in,
                    start,
                    gather_rows(data.x, rows),
                    data.y[rows],
                    weight[ids, at],
                    lr[ids],
                    server,
                    tree_map(pick, client),
                    tree_map(pick, opt),
                    tree_map(pick, carried),
                    private,
                )
                if sub is not None:
                    before = (w_in, tree_map(pick, opt))
                    new_w, new_opt = _outside_kept(model, cohort, sub, (new_w, new_opt), before)
                put = lambda full, new, ids=ids: full.index_put((ids,), new)  # noqa: E731
                w, opt, carried = tree_map(put, (w, opt, carried), (new_w, new_opt, new_carried))
                total[ids] += loss
        params[sel] = _flat(w, size)
        for into, new in ((opt_state, opt), (rule_state, carried)):
            for k, v in _flat_state(new, size).items():
                into[k][sel] = v
        tau = steps.to(dev)
        losses[sel] = torch.where(tau > 0, total / tau.clamp_min(1), torch.nan)
    return params, losses, _with_rule_state(opt_state, rule_state)


def gradient_statistics(
    model: FlatModel,
    data: ClientData,
    w0: Tensor,
    clients: Tensor,
    count: int,
    seed: int,
    round_: int,
    max_elements: int = 1 << 24,
) -> tuple[Tensor, Tensor]:
    """Mean g̃_k and per-coordinate variance diag Σ̃_k of `count` per-sample gradients at `w0` (m, P) each.

    Every client draws `count` of its samples without replacement (fewer if it has fewer; `stats_samples`).
    All clients share `w0`, so the per-sample gradients come from one `vmap(grad)` over a block of samples of a
    chunk of clients, each block holding at most `max_elements` gradient entries (a large model's block is a few
    of one client's samples); blocks are merged with the pairwise update of Chan, Golub & LeVeque (1979), so
    memory does not grow with `count`. The variance divides by the number of samples used (1/B, FedGSNR §3); a
    client without samples gets zeros.
    """
    index, weight = stats_samples(data.offsets, clients, count, seed, round_)
    m, b = index.shape
    per_sample = vmap(
        grad(lambda w, x, y: model.sample_losses(w, x.unsqueeze(0), y.unsqueeze(0)).sum()),
        in_dims=(None, 0, 0),
    )
    means = torch.zeros(m, model.size)
    variances = torch.zeros(m, model.size)  # sums of squared deviations until the chunk's last block
    chunk = max(1, max_elements // max(1, b * model.size))
    block = max(1, min(b, max_elements // model.size))
    for lo in range(0, m, chunk):
        rows = slice(lo, lo + chunk)
        seen = torch.zeros(len(index[rows]), 1)
        for first in range(0, b, block):
            picked = index[rows, first : first + block]
            g = per_sample(w0, data.x[picked.reshape(-1)], data.y[picked.reshape(-1)]).reshape(*picked.shape, -1)
            wt = weight[rows, first : first + block].unsqueeze(2)
            n = wt.sum(1)
            mean = (g * wt).sum(1) / n.clamp_min(1.0)
            squares = (((g - mean.unsqueeze(1)) ** 2) * wt).sum(1)
            share = n / (seen + n).clamp_min(1.0)
            delta = mean - means[rows]
            means[rows] += delta * share
            variances[rows] += squares + delta**2 * (seen * share)
            seen += n
        variances[rows] /= seen.clamp_min(1.0)
    return means, variances


def train_cohort(request: TrainRequest, backend: Backend, placed: ClientData | None = None) -> Trained:
    """Run `request` on `backend`; the results come back on the CPU (a rule's state under ``"rule/<name>"`` in
    the state dictionary, beside the optimiser's).

    With `placed` (the data on an accelerator) the training runs there: the same mini-batches and update, the
    local models come back to the CPU."""
    model = request.model
    model.module.train()
    sizes = request.data.offsets.diff()[request.plan.clients] if model.stat_names else None
    padded = sizes is not None and bool((sizes < request.plan.batch_size).any())  # padding rows: batch norm skips
    cpu = request.anchor.device
    elsewhere = placed is not None and placed.x.device != cpu
    if elsewhere and backend == "sequential":
        raise ConfigError("backend 'sequential' runs on the CPU only: use 'auto', 'dense' or 'vectorised'")
    run = request.on(placed, placed.x.device) if placed is not None and elsewhere else request
    layers = dense_layers(model) if backend == "dense" else None
    spec = conv_layers(model) if backend == "conv" else None
    masks = request.plan.masks
    hand_derived = layers is not None or spec is not None
    if request.plan.step_masks is not None and (hand_derived or request.cohort.rule is not None):
        raise ConfigError(
            f"a plan's per-step sub-models (step masks) run on the sequential and vectorised backends, not on "
            f"'{backend}' (nor with a local rule)"
        )
    if masks is not None:  # sub-models: as the smaller networks, or the masked full one from zeros outside the mask
        sliced = train_sliced(run, layers) if layers is not None else None
        if sliced is not None:
            return _on_cpu(model, sliced, cpu)
        if request.starts is None:
            request = replace(request, starts=torch.where(masks, request.anchor, 0.0))
            run = request.on(placed, placed.x.device) if placed is not None and elsewhere else request
    hooked = backend == "vectorised" or (backend == "sequential" and not request.cohort.autograd_only)
    scaled = layers is not None or spec is not None or hooked
    if request.plan.scales is not None and not scaled:
        raise ConfigError(
            f"layer output factors (a plan's scales: HeteroFL's scaler) run on the dense, conv, vectorised and "
            f"sequential backends (sequential: not with an objective that needs autograd), not on '{backend}'"
        )
    if layers is not None:
        out = train_dense(run, layers)
    elif spec is not None:
        out = train_conv(run, spec)
    elif backend == "sequential":
        with torch_threads(1 if model.size <= ONE_THREAD_MAX_PARAMS else None), model.padded_batches(padded):
            out = train_sequential(request)
    else:
        # DP-SGD's per-sample steps are many small operations: one thread each on a CPU, unless --threads says
        # otherwise (a team of threads made them 3.6-4.4x slower, docs/privacy.md, Speed)
        private = request.plan.dp_sgd is not None and run.anchor.device.type == "cpu"
        threads = few_threads() if private else nullcontext()
        with _masks_from_the_cpu(model, run.anchor.device), threads, model.padded_batches(padded):
            out = train_vectorised(run)
    if masks is not None:  # whatever the optimiser did there, the coordinates outside the mask come back as zero
        out = (out[0].masked_fill_(~masks.to(out[0].device), 0.0), *out[1:])
    return _on_cpu(model, out, cpu)


def _on_cpu(model: FlatModel, out: Trained, cpu: torch.device) -> Trained:
    """The backend's results on the CPU (the module back in evaluation mode)."""
    model.module.eval()
    params, losses, state = out
    return params.detach().to(cpu), losses.detach().to(cpu), {k: v.detach().to(cpu) for k, v in state.items()}
