"""Local training of a cohort: one pure update rule, run client by client or vectorised with `torch.func`.

Both backends call the same `_step` on the same mini-batches (drawn by `batches.local_batches`), so they give
the same numbers up to float rounding. Dropout masks are seeded per (round, step), identical across clients
and backends (vmap with ``randomness="same"``).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Literal

import torch
from torch import Tensor
from torch.func import functional_call, grad, grad_and_value, vmap

from fedhet.data.dataset import ClientData
from fedhet.engine.batches import gather_rows, local_batches, stats_samples
from fedhet.engine.dense import dense_layers, train_dense
from fedhet.engine.functional import FlatModel
from fedhet.engine.plan import LocalPlan, LocalResult
from fedhet.engine.rules import LocalRule
from fedhet.errors import ConfigError
from fedhet.seeding import derive_seed

Backend = Literal["sequential", "vectorised", "dense"]


def _seed_dropout(model: FlatModel, seed: int, round_: int, t: int, stream: str) -> None:
    if model.has_dropout:
        torch.manual_seed(derive_seed(seed, f"dropout/{stream}", round_, t))


def train_sequential(
    model: FlatModel, data: ClientData, w0: Tensor, plan: LocalPlan, seed: int, round_: int
) -> tuple[Tensor, Tensor]:
    """Clients one after another with plain autograd on one module whose parameters are views of a flat
    buffer (no model copies). Same update as `make_step`. Returns (params (m, P), mean loss (m,))."""
    index, weight = local_batches(data.offsets, plan.clients, plan.steps, plan.batch_size, seed, round_, plan.stream)
    w, g = model.bound_buffers()
    params = w0.unsqueeze(0).repeat(len(plan.clients), 1)
    losses = torch.full((len(plan.clients),), float("nan"))
    for i in range(len(plan.clients)):
        tau = int(plan.steps[i])
        if tau == 0:
            continue
        corr = plan.correction[i] if plan.correction is not None else None
        lr = plan.lr[i]
        total = torch.zeros(())
        with torch.no_grad():
            w.copy_(w0)
        for t in range(tau):
            _seed_dropout(model, seed, round_, t, plan.stream)
            rows = index[i, t]
            g.zero_()
            loss = model.module_batch_loss(data.x[rows], data.y[rows], weight[i, t])
            loss.backward()
            with torch.no_grad():
                direction = g
                if plan.prox_mu:
                    direction = direction + plan.prox_mu * (w - w0)
                if plan.weight_decay:
                    direction = direction + plan.weight_decay * w
                if corr is not None:
                    direction = direction + corr
                w.copy_(w - lr * direction)
            total = total + loss.detach()
        params[i] = w
        losses[i] = total / tau
    return params, losses


Tree = dict[str, Tensor]


def _loss_grad(model: FlatModel) -> Callable[[Tree, Tensor, Tensor, Tensor], tuple[Tree, Tensor]]:
    """(∇ of the weighted mean mini-batch loss, the loss) at a parameter dictionary."""

    def batch_loss(w: Tree, x: Tensor, y: Tensor, wt: Tensor) -> Tensor:
        losses = torch.nn.functional.cross_entropy(functional_call(model.module, w, (x,)), y, reduction="none")
        return (losses * wt).sum() / wt.sum().clamp_min(1.0)

    return grad_and_value(batch_loss)


def make_step(model: FlatModel, prox_mu: float, weight_decay: float) -> Callable[..., tuple[Tree, Tensor]]:
    """The local SGD step of `LocalPlan`'s docstring for one client, on a parameter dictionary (vmap it for
    many; dictionaries are cheaper under vmap than one flat vector: no split and cat per step)."""
    loss_grad = _loss_grad(model)

    def step(w: Tree, w0: Tree, x: Tensor, y: Tensor, wt: Tensor, lr: Tensor, corr: Tree | None) -> tuple[Tree, Tensor]:
        g, loss = loss_grad(w, x, y, wt)
        out = {}
        for name, value in w.items():
            direction = g[name]
            if prox_mu:
                direction = direction + prox_mu * (value - w0[name])
            if weight_decay:
                direction = direction + weight_decay * value
            if corr is not None:
                direction = direction + corr[name]
            out[name] = value - lr * direction
        return out, loss

    return step


def make_rule_step(model: FlatModel, rule: LocalRule, weight_decay: float) -> Callable[..., tuple[Tree, Tensor]]:
    """A `LocalRule`'s step with `make_step`'s signature; x, y, wt carry the rule's mini-batches on dim 0."""
    loss_grad = _loss_grad(model)

    def step(w: Tree, w0: Tree, x: Tensor, y: Tensor, wt: Tensor, lr: Tensor, corr: Tree | None) -> tuple[Tree, Tensor]:
        def grad_fn(v: Tree, i: int) -> tuple[Tree, Tensor]:
            g, loss = loss_grad(v, x[i], y[i], wt[i])
            return ({n: g[n] + weight_decay * v[n] for n in g} if weight_decay else g), loss

        return rule.step(grad_fn, w, lr)

    return step


def _tree(model: FlatModel, flat: Tensor) -> Tree:
    """Views of stacked flat parameters (m, P) as a dictionary of (m, *shape) tensors."""
    chunks = torch.split(flat, model.numels, dim=-1)
    lead = flat.shape[:-1]
    return {n: c.reshape(*lead, *s) for n, c, s in zip(model.names, chunks, model.shapes, strict=True)}


def _flat(tree: Tree, m: int) -> Tensor:
    return torch.cat([t.reshape(m, -1) for t in tree.values()], dim=1)


def train_vectorised(
    model: FlatModel,
    data: ClientData,
    w0: Tensor,
    plan: LocalPlan,
    seed: int,
    round_: int,
    chunk_size: int = 0,
) -> tuple[Tensor, Tensor]:
    """Many clients at once: `vmap` of the step over stacked parameters, in chunks of `chunk_size` clients.

    Runs on the device of `w0` and `data` (the plan's client ids and step counts stay on the CPU)."""
    m, dev = len(plan.clients), w0.device
    chunk = chunk_size if chunk_size > 0 else max(m, 1)
    params = w0.unsqueeze(0).repeat(m, 1)
    losses = torch.full((m,), float("nan"), device=dev)
    if plan.rule is None:
        step, per_step = make_step(model, plan.prox_mu, plan.weight_decay), 1
    else:
        step, per_step = make_rule_step(model, plan.rule, plan.weight_decay), plan.rule.batches_per_step
    randomness = "same" if model.has_dropout else "error"
    corr_dim = 0 if plan.correction is not None else None
    vstep = vmap(step, in_dims=(0, None, 0, 0, 0, 0, corr_dim), randomness=randomness)
    w0_tree = _tree(model, w0)
    for lo in range(0, m, chunk):
        sel = slice(lo, min(lo + chunk, m))
        clients, steps, lr = plan.clients[sel], plan.steps[sel], plan.lr[sel]
        size = len(clients)
        corr = _tree(model, plan.correction[sel]) if plan.correction is not None else None
        index, weight = local_batches(
            data.offsets, clients, steps * per_step, plan.batch_size, seed, round_, plan.stream
        )
        index, weight = index.to(dev), weight.to(dev)
        w, total = _tree(model, params[sel].clone()), torch.zeros(size, device=dev)
        for t in range(index.shape[1] // per_step):
            _seed_dropout(model, seed, round_, t, plan.stream)
            at = t if plan.rule is None else slice(t * per_step, (t + 1) * per_step)  # a rule's batches on dim 1
            active = steps > t
            if bool(active.all()):
                rows = index[:, at]
                w, loss = vstep(w, w0_tree, gather_rows(data.x, rows), data.y[rows], weight[:, at], lr, corr)
                total = total + loss
            else:
                ids = torch.nonzero(active).flatten().to(dev)
                rows = index[ids, at]
                c = {k: v[ids] for k, v in corr.items()} if corr is not None else None
                sub = {k: v[ids] for k, v in w.items()}
                new, loss = vstep(sub, w0_tree, gather_rows(data.x, rows), data.y[rows], weight[ids, at], lr[ids], c)
                for k in w:
                    w[k] = w[k].index_put((ids,), new[k])
                total[ids] += loss
        params[sel] = _flat(w, size)
        tau = steps.to(dev)
        losses[sel] = torch.where(tau > 0, total / tau.clamp_min(1), torch.nan)
    return params, losses


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
    All clients share `w0`, so the per-sample gradients of the whole cohort come from one `vmap(grad)` over
    its samples, in chunks of clients holding at most `max_elements` gradient entries. The variance divides by
    the number of samples used (1/B, FedGSNR §3); a client without samples gets zeros.
    """
    index, weight = stats_samples(data.offsets, clients, count, seed, round_)
    m, b = index.shape
    per_sample = vmap(
        grad(lambda w, x, y: model.sample_losses(w, x.unsqueeze(0), y.unsqueeze(0)).sum()),
        in_dims=(None, 0, 0),
    )
    means = torch.zeros(m, model.size)
    variances = torch.zeros(m, model.size)
    chunk = max(1, max_elements // max(1, b * model.size))
    for lo in range(0, m, chunk):
        rows = index[lo : lo + chunk]
        g = per_sample(w0, data.x[rows.reshape(-1)], data.y[rows.reshape(-1)]).reshape(len(rows), b, -1)
        wt = weight[lo : lo + chunk].unsqueeze(2)
        n = wt.sum(1).clamp_min(1.0)
        mean = (g * wt).sum(1) / n
        means[lo : lo + chunk] = mean
        variances[lo : lo + chunk] = (((g - mean.unsqueeze(1)) ** 2) * wt).sum(1) / n
    return means, variances


def train_cohort(
    model: FlatModel,
    data: ClientData,
    w0: Tensor,
    plan: LocalPlan,
    *,
    backend: Backend,
    seed: int,
    round_: int,
    chunk_size: int = 0,
    placed: ClientData | None = None,
) -> LocalResult:
    """Run `plan` on `backend` and package the result (on the CPU).

    With `placed` (`data` on an accelerator) the training runs there: the same mini-batches and update, the
    local models come back to the CPU; gradient statistics are computed on the CPU copy."""
    model.module.train()
    run_data, run_w0, run_plan = data, w0, plan
    if placed is not None and placed.x.device != w0.device:
        if backend == "sequential" and plan.rule is None:
            raise ConfigError("backend 'sequential' runs on the CPU only: use 'auto', 'dense' or 'vectorised'")
        run_data, run_w0, run_plan = placed, w0.to(placed.x.device), plan.to(placed.x.device)
    layers = dense_layers(model) if backend == "dense" and plan.rule is None else None
    if layers is not None:
        params, losses = train_dense(model, layers, run_data, run_w0, run_plan, seed, round_, chunk_size)
    elif backend == "sequential" and plan.rule is None:
        params, losses = train_sequential(model, data, w0, plan, seed, round_)
    else:  # vectorised, and every non-SGD rule (vmap of one client is ~8x slower than a whole cohort)
        params, losses = train_vectorised(model, run_data, run_w0, run_plan, seed, round_, chunk_size)
    params, losses = params.detach().to(w0.device), losses.detach().to(w0.device)
    grad_mean = grad_var = None
    if plan.grad_stats_samples > 0:
        model.module.eval()
        grad_mean, grad_var = gradient_statistics(model, data, w0, plan.clients, plan.grad_stats_samples, seed, round_)
    model.module.eval()
    return LocalResult(plan.clients, params, losses, plan.steps, plan.lr, grad_mean, grad_var)
