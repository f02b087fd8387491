"""Evaluation of models on every client's data in a few large batches, never client by client."""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import torch
from torch import Tensor
from torch.func import vmap

from fedhet.data.dataset import ClientData
from fedhet.engine.batches import gather_rows
from fedhet.engine.dense import DenseLayer
from fedhet.engine.functional import FlatModel
from fedhet.engine.task import CLASSIFICATION, Task
from fedhet.seeding import numpy_rng


@dataclass
class ClientScores:
    """Per-client mean loss and accuracy (K,) of a model (accuracy NaN for a task without one), and the client
    sizes they average over; `extra`: the task's own per-client metrics (`Task.client_scores`: AUC, RMSE, ...), and
    for such a task the outputs and labels of every sample scored with its client (`owner`), for pooled metrics."""

    loss: Tensor
    accuracy: Tensor
    count: Tensor
    extra: dict[str, Tensor] = field(default_factory=dict)
    outputs: Tensor | None = None  # (N, out) of the samples scored, when the task has metrics of its own
    labels: Tensor | None = None  # (N, ...)
    owner: Tensor | None = None  # (N,) the client of each of them

    def select(self, clients: Tensor) -> ClientScores:
        """The scores of `clients`, in that order (with their samples' outputs, owned by their place in it)."""
        extra = {k: v[clients] for k, v in self.extra.items()}
        out = ClientScores(self.loss[clients], self.accuracy[clients], self.count[clients], extra)
        if self.outputs is not None and self.labels is not None and self.owner is not None:
            place = torch.full((len(self.loss),), -1, dtype=torch.long)
            place[clients] = torch.arange(len(clients))
            keep = place[self.owner] >= 0
            out.outputs, out.labels, out.owner = self.outputs[keep], self.labels[keep], place[self.owner[keep]]
        return out

    def pooled(self, task: Task, clients: Tensor) -> dict[str, float]:
        """The task's metrics over the samples of `clients` (a (K,) mask) pooled (none without the outputs)."""
        if self.outputs is None or self.labels is None or self.owner is None:
            return {}
        rows = clients[self.owner]
        return task.pooled_scores(self.outputs[rows], self.labels[rows]) if bool(rows.any()) else {}

    @staticmethod
    def concat(parts: list[ClientScores]) -> ClientScores:
        """Scores of consecutive groups of clients, one after the other (with the samples' outputs where every
        part has them)."""
        loss, accuracy, count = (torch.cat([getattr(p, f) for p in parts]) for f in ("loss", "accuracy", "count"))
        extra = {k: torch.cat([p.extra[k] for p in parts]) for k in (parts[0].extra if parts else {})}
        out = ClientScores(loss, accuracy, count, extra)
        if parts and all(p.outputs is not None and p.labels is not None and p.owner is not None for p in parts):
            starts = np.cumsum([0] + [len(p.loss) for p in parts[:-1]])
            out.outputs = torch.cat([p.outputs for p in parts if p.outputs is not None])
            out.labels = torch.cat([p.labels for p in parts if p.labels is not None])
            out.owner = torch.cat(
                [p.owner + int(at) for p, at in zip(parts, starts, strict=True) if p.owner is not None]
            )
        return out

    def with_task_scores(self, task: Task, outputs: Tensor, labels: Tensor, owner: Tensor) -> ClientScores:
        """These scores with the task's own metrics (`Task.client_scores`) of the samples' `outputs` (N, out) and
        `labels`, each of the client at place `owner` (N,) in them; as they are for a task without such metrics."""
        if task.metrics:
            self.outputs, self.labels, self.owner = outputs.detach().cpu(), labels.cpu(), owner.cpu()
            self.extra = task.client_scores(self.outputs, self.labels, self.owner, len(self.loss))
        return self


@torch.no_grad()
def score_clients(model: FlatModel, params: Tensor, data: ClientData, batch_size: int = 8192) -> ClientScores:
    """Loss and accuracy of ONE model (P,) on every client's data: per-sample results scattered by owner (and the
    task's own metrics, `Task.client_scores`).

    Runs on the device of `data` (the scores come back to the CPU)."""
    model.module.eval()
    task = model.task
    n, k, dev = len(data.y), data.num_clients, data.x.device
    params = params.to(dev)
    loss_sum = torch.zeros(k, dtype=torch.float64, device=dev)
    correct = torch.zeros(k, dtype=torch.float64, device=dev)
    owner = data.owner.to(dev)
    outputs: list[Tensor] = []
    for lo in range(0, n, batch_size):
        x, y = data.x[lo : lo + batch_size], data.y[lo : lo + batch_size]
        logits = model.logits(params, x)
        # the task's loss; cross-entropy as logsumexp − logit of the label: the same values, faster than
        # F.cross_entropy's log-softmax kernel on CPU (docs/performance.md, "Why the engine's constants")
        losses = task.loss_value(logits, y)
        who = owner[lo : lo + batch_size]
        loss_sum.index_add_(0, who, losses.double())
        hit = task.correct(logits, y)
        if hit is not None:
            correct.index_add_(0, who, hit.double())
        if task.metrics:
            outputs.append(logits.cpu())
    denom = data.sizes.double().clamp_min(1)
    accuracy = (correct.cpu() / denom).float() if task.accuracy else torch.full((k,), float("nan"))
    scores = ClientScores((loss_sum.cpu() / denom).float(), accuracy, data.sizes)
    if task.metrics:
        z = torch.cat(outputs) if outputs else torch.zeros(0, task.outputs(1))
        scores.outputs, scores.labels, scores.owner = z, data.y.cpu(), data.owner
        scores.extra = task.client_scores(z, scores.labels, data.owner, k)
    return scores


def scores_of_some(scores: ClientScores, clients: Tensor, sizes: Tensor) -> ClientScores:
    """`scores` of `clients` (in that order) spread over every client (K = len(sizes)); NaN where not scored."""

    def spread(values: Tensor) -> Tensor:
        out = torch.full((len(sizes),), float("nan"), dtype=values.dtype)
        out[clients] = values
        return out

    out = ClientScores(spread(scores.loss), spread(scores.accuracy), sizes)
    out.extra = {name: spread(values) for name, values in scores.extra.items()}
    if scores.owner is not None:
        out.outputs, out.labels, out.owner = scores.outputs, scores.labels, clients[scores.owner]
    return out


@torch.no_grad()
def score_own_models(
    model: FlatModel, params: Tensor, data: ClientData, clients: Tensor, chunk_size: int = 64
) -> ClientScores:
    """Loss and accuracy of client i's OWN model params[i] on client clients[i]'s data (vmap over padded data),
    on the device of `data`; for a task with metrics of its own (AUC, F1, ...), those too (`Task.client_scores`)."""
    model.module.eval()
    dev = data.x.device
    m = len(clients)
    loss, acc = torch.zeros(m), torch.zeros(m)
    sizes = data.sizes[clients]

    task = model.task
    keep = bool(task.metrics)  # the outputs, only for a task with metrics of its own (they may be large)

    def one(w: Tensor, x: Tensor, y: Tensor, wt: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        logits = model.logits(w, x)
        per = task.loss(logits, y)
        denom = wt.sum().clamp_min(1)
        hit = task.correct(logits, y)
        accuracy = (hit.float() * wt).sum() / denom if hit is not None else torch.full_like(denom, float("nan"))
        return (per * wt).sum() / denom, accuracy, logits if keep else denom

    vone = vmap(one)
    outputs, labels, owner = [], [], []  # of every sample scored, for a task with metrics of its own
    for lo in range(0, m, chunk_size):
        ids = clients[lo : lo + chunk_size]
        width = int(data.sizes[ids].max()) if len(ids) else 0
        if width == 0:
            continue
        rows, valid = padded_rows(data, ids)
        w = params[lo : lo + chunk_size].to(dev)
        l_, a_, z = vone(w, data.x[rows], data.y[rows], valid.float().to(dev))
        loss[lo : lo + chunk_size], acc[lo : lo + chunk_size] = l_, a_
        if keep:
            outputs.append(z[valid.to(dev)].cpu())
            labels.append(data.y[rows][valid.to(data.y.device)].cpu())
            owner.append((lo + torch.arange(len(ids))).unsqueeze(1).expand(-1, width)[valid.cpu()])
    scores = ClientScores(loss, acc, sizes)
    if not keep:
        return scores
    empty = torch.zeros(0, dtype=torch.long)
    return scores.with_task_scores(
        task,
        torch.cat(outputs) if outputs else torch.zeros(0, task.outputs(1)),
        torch.cat(labels) if labels else data.y[:0].cpu(),
        torch.cat(owner) if owner else empty,
    )


@torch.no_grad()
def sampled_losses(
    model: FlatModel, data: ClientData, params: Tensor, clients: Tensor, batch: int, seed: int, round_: int, stream: str
) -> Tensor:
    """(1/|B_k|) Σ_{ξ ∈ B_k} f(w, ξ) for each client, B_k drawn without replacement from its data by
    ``numpy_rng(seed, stream, round_, k)`` (the whole data when it is smaller than `batch`)."""
    model.module.eval()
    rows, owner = [], []
    for i, k in enumerate(clients.tolist()):
        lo, hi = int(data.offsets[k]), int(data.offsets[k + 1])
        size = min(batch, hi - lo)
        rows.append(lo + numpy_rng(seed, stream, round_, k).choice(hi - lo, size=size, replace=False))
        owner.append(np.full(size, i))
    if not rows:
        return torch.zeros(0)
    index = torch.as_tensor(np.concatenate(rows), dtype=torch.long)
    per_sample = model.sample_losses(params, data.x[index], data.y[index]).double()
    group = torch.as_tensor(np.concatenate(owner), dtype=torch.long)
    sums = torch.zeros(len(clients), dtype=torch.float64).index_add_(0, group, per_sample)
    return (sums / torch.bincount(group, minlength=len(clients)).double()).float()


def padded_rows(data: ClientData, clients: Tensor) -> tuple[Tensor, Tensor]:
    """Row indices (m, width) of each client's samples, padded to the largest by repeating its first row, and
    the mask of real rows (m, width)."""
    width = int(data.sizes[clients].max()) if len(clients) else 0
    pos = torch.arange(width)
    start = data.offsets[clients].unsqueeze(1)
    valid = pos.unsqueeze(0) < data.sizes[clients].unsqueeze(1)
    return torch.where(valid, start + pos, start), valid


def _client_rows(x: Tensor, rows: Tensor, valid: Tensor) -> Tensor:
    """x[rows] (m·width, ...) for `padded_rows`: a view where the clients' rows follow each other without padding
    (clients of one size, in order), else a copy."""
    first = int(rows[0, 0])
    if bool(valid.all()) and torch.equal(rows.reshape(-1), torch.arange(first, first + rows.numel())):
        return x[first : first + rows.numel()]
    return gather_rows(x, rows.reshape(-1))


# per dense layer: where its weight and its bias start in a client's personal values (None: shared)
Columns = list[tuple[int | None, int | None]]


def personal_columns(layers: list[DenseLayer], mine: Tensor) -> Columns:
    """For each dense layer, the column of a client's personal values (`own` of `score_split_dense`) where its
    weight and its bias start, None for a shared one; `mine` (P,) marks the personal coordinates (whole parameters)."""
    at = torch.cumsum(mine.long(), 0) - 1  # a personal coordinate's column in `own`

    def column(where: slice | None) -> int | None:
        return int(at[where.start]) if where is not None and bool(mine[where].all()) else None

    return [(column(la.weight), column(la.bias)) for la in layers]


@torch.no_grad()
def score_split_dense(
    layers: list[DenseLayer],
    columns: Columns,
    shared: Tensor,
    own: Tensor,
    data: ClientData,
    clients: Tensor,
    task: Task = CLASSIFICATION,
) -> ClientScores:
    """Loss and accuracy of each client's model on its own data, for a dense network whose parameters are the
    shared model's (`shared` (P,)) except its personal ones (`columns`, from `personal_columns`): `own` (m, |mine|)
    holds each client's values there, in the model's order. A layer whose parameters are all shared runs as one
    matrix product over every client's samples, as the global model's evaluation does; a personal one as one product
    per client. So a personal head costs little more than the global model's evaluation; a whole personal model
    costs one (samples × in) · (in × out) product per client and layer. A task's own metrics (AUC, F1, ...) come
    with the scores (`Task.client_scores`)."""
    rows, valid = padded_rows(data, clients)
    m, width = rows.shape
    if width == 0:
        none = ClientScores(torch.zeros(m), torch.zeros(m), data.sizes[clients])
        outputs = torch.zeros(0, layers[-1].shape[0])
        return none.with_task_scores(task, outputs, data.y[:0], torch.zeros(0, dtype=torch.long))

    def part(where: slice, shape: tuple[int, ...], first: int | None) -> Tensor:
        if first is None:
            return shared[where].view(shape)
        return own[:, first : first + where.stop - where.start].reshape(m, *shape)

    a = _client_rows(data.x, rows, valid).reshape(m, width, -1)
    for i, (la, (weight_at, bias_at)) in enumerate(zip(layers, columns, strict=True)):
        weight = part(la.weight, la.shape, weight_at)
        z = (
            torch.bmm(a, weight.mT)
            if weight_at is not None
            else (a.reshape(m * width, -1) @ weight.T).view(m, width, -1)
        )
        if la.bias is not None:
            bias = part(la.bias, (la.shape[0],), bias_at)
            z.add_(bias.unsqueeze(1) if bias_at is not None else bias)
        if la.activation is not None and i < len(layers) - 1:
            z = {"relu": torch.relu, "tanh": torch.tanh, "sigmoid": torch.sigmoid}[la.activation](z)
        a = z
    y = data.y[rows]
    nll = task.loss_value(a, y)
    wt = valid.to(a.dtype)
    denom = wt.sum(1).clamp_min(1)
    loss = (nll * wt).sum(1) / denom
    hit = task.correct(a, y)
    accuracy = (hit.to(a.dtype) * wt).sum(1) / denom if hit is not None else torch.full_like(loss, float("nan"))
    scores = ClientScores(loss.cpu(), accuracy.cpu(), data.sizes[clients])
    owner = torch.arange(m, device=valid.device).unsqueeze(1).expand(-1, width)[valid]
    return scores.with_task_scores(task, a[valid.to(a.device)], y[valid.to(y.device)], owner)
