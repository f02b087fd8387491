"""Local SGD for dense networks with hand-derived gradients: the `dense` backend.

Most of the papers' models are stacks of `nn.Linear` layers with element-wise activations under cross-entropy
(logistic regression, the MLPs). For those, this module runs `LocalPlan`'s update

    w ← w − η_k (∇F_k(w; ξ) + μ (w − w_global) + c_k + λ w)

for a chunk of clients at once with batched matrix products (`torch.baddbmm`), without autograd or vmap:

    forward   Z_l = A_{l−1} W_lᵀ + b_l,  A_l = σ_l(Z_l) (· dropout mask),  A_0 = x
    loss      per-sample cross-entropy, weighted mean over the (padded) mini-batch
    backward  D_L = (softmax(Z_L) − onehot(y)) · wt / Σ wt,   D_{l−1} = (D_l W_l) ⊙ σ'_{l−1}(Z_{l−1})
    gradient  ∇W_l = D_lᵀ A_{l−1},  ∇b_l = Σ_rows D_l

Each client's weights are updated in place inside the (m, P) result (``W.baddbmm_(−η D_lᵀ, A_{l−1})``), so
a step allocates only batch-sized temporaries. A chunk of clients runs all its local steps before the next
chunk starts, so that the chunk's weights stay in cache. Clients are processed in order of decreasing step
count, so the clients still training at step t are a prefix of the chunk (a view, not a copy).

The mini-batches (`batches.local_batches`) and dropout masks (seeded per round and step, the same for every
client) are those of the sequential and vectorised backends, so all three give the same numbers up to float
rounding (tested). `dense_layers` says whether a model qualifies; other models use the generic backends.
"""

from __future__ import annotations

from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from fedhet.data.dataset import ClientData
from fedhet.engine.batches import local_batches
from fedhet.engine.functional import FlatModel
from fedhet.engine.plan import LocalPlan
from fedhet.engine.threads import torch_threads
from fedhet.seeding import derive_seed

ACTIVATIONS = (nn.ReLU, nn.Tanh, nn.Sigmoid)
CHUNK_BYTES = 16 << 20  # a chunk's weights: large enough to amortise each op's Python cost, not much larger
MIN_CHUNK_BYTES = 256 << 10
BLOCK = 512  # clients whose mini-batches are drawn at once (bounds the index and target tensors)


@dataclass(frozen=True)
class DenseLayer:
    """One `nn.Linear` layer: where its weight (out, in) and bias live in the flat parameter vector, and the
    activation and dropout that follow it."""

    weight: slice
    bias: slice | None
    shape: tuple[int, int]  # (out, in)
    activation: str | None  # "relu", "tanh", "sigmoid" or None
    dropout: float = 0.0


def _leaves(module: nn.Module) -> list[nn.Module]:
    if isinstance(module, nn.Sequential):
        return [leaf for child in module for leaf in _leaves(child)]
    return [module]


def _is_flatten(module: nn.Module) -> bool:
    if isinstance(module, nn.Flatten):
        return module.start_dim == 1 and module.end_dim == -1
    return type(module).__name__ == "Flatten" and not list(module.parameters())  # fedhet.models.zoo.Flatten


def dense_layers(model: FlatModel) -> list[DenseLayer] | None:
    """The model as a list of dense layers, or None when it is not (an optional leading Flatten, then Linear
    layers each optionally followed by ReLU/Tanh/Sigmoid and Dropout, ending with a Linear layer)."""
    leaves = _leaves(model.module)
    if leaves and _is_flatten(leaves[0]):
        leaves = leaves[1:]
    offsets: dict[int, slice] = {}
    start = 0
    for p, n in zip(model.module.parameters(), model.numels, strict=True):
        offsets[id(p)] = slice(start, start + n)
        start += n
    layers: list[DenseLayer] = []
    pending: dict[str, object] | None = None
    for leaf in leaves:
        if isinstance(leaf, nn.Linear):
            if pending is not None:
                layers.append(DenseLayer(**pending))  # type: ignore[arg-type]
            bias = offsets[id(leaf.bias)] if leaf.bias is not None else None
            shape = (leaf.out_features, leaf.in_features)
            pending = {"weight": offsets[id(leaf.weight)], "bias": bias, "shape": shape, "activation": None}
        elif isinstance(leaf, ACTIVATIONS) and pending is not None and pending["activation"] is None:
            pending["activation"] = type(leaf).__name__.lower()
        elif isinstance(leaf, nn.Dropout) and pending is not None and pending["activation"] is not None:
            pending["dropout"] = float(leaf.p)
        else:
            return None
    if pending is None or pending["activation"] is not None:
        return None  # the last layer must be a bare Linear (its outputs are the logits)
    layers.append(DenseLayer(**pending))  # type: ignore[arg-type]
    if sum(1 for _ in model.module.parameters()) != sum(1 + (la.bias is not None) for la in layers):
        return None
    return layers


def default_chunk(model: FlatModel, clients: int, workers: int) -> int:
    """Clients per chunk: an equal share of the cohort per worker, but at most `CHUNK_BYTES` of weights and at
    least `MIN_CHUNK_BYTES` (tiny chunks cost more in threads than they save). Measured on 2 cores, MLP
    784-200-10 with 100 clients on two workers: 127 ms per round's training with 4 clients per chunk, 96-105
    with 8 to 24, 124 with 50; 784-800-10: 360 ms with 4 to 12, 459 with 24."""
    weights = 4 * model.size
    share = -(-clients // max(workers, 1))
    return max(1, min(max(share, -(-MIN_CHUNK_BYTES // weights)), CHUNK_BYTES // weights, BLOCK))


def train_dense(
    model: FlatModel,
    layers: list[DenseLayer],
    data: ClientData,
    w0: Tensor,
    plan: LocalPlan,
    seed: int,
    round_: int,
    chunk_size: int = 0,
    workers: int = 0,
) -> tuple[Tensor, Tensor]:
    """Run `plan` with hand-derived gradients (see the module docstring). Returns (params (m, P), loss (m,)).

    On the CPU, chunks run on `workers` threads (default: torch's intra-op thread count), each op on one
    core: chunks are independent, and small ops gain more from running side by side than from splitting each
    one. Elsewhere (CUDA) everything runs on the device of `w0` and `data`, chunks one after another."""
    m, dev = len(plan.clients), w0.device
    losses = torch.full((m,), float("nan"), device=dev)
    if m == 0 or int(plan.steps.max()) == 0:
        return w0.unsqueeze(0).repeat(m, 1), losses
    order = torch.argsort(plan.steps, descending=True, stable=True)
    in_place = bool((order == torch.arange(m)).all())  # chunks are then slices (views) of the result
    params = torch.empty(m, model.size, device=dev)
    x_all = data.x.reshape(len(data.x), -1)
    masks = _dropout_masks(layers, plan, seed, round_, dev)
    workers = 1 if dev.type != "cpu" else workers or torch.get_num_threads()
    chunk = chunk_size if chunk_size > 0 else default_chunk(model, m, workers)
    block = max(chunk * workers, BLOCK)  # every worker gets chunks of each block
    for start in range(0, m, block):
        ids = order[start : start + block]
        batches = _Batches(data, plan, ids, layers[-1].shape[0], seed, round_)
        target = params[start : start + block] if in_place else None

        def run(lo: int, ids: Tensor = ids, batches: _Batches = batches, target: Tensor | None = target) -> None:
            part = slice(lo, lo + chunk)
            work = target[part] if target is not None else torch.empty(len(ids[part]), model.size, device=dev)
            work.copy_(w0.expand(len(work), -1))  # written just before use: the chunk's weights start in cache
            _train_chunk(layers, work, w0, x_all, plan, ids[part], batches, part, masks)
            if target is None:
                params[ids[part]] = work

        _map(run, range(0, len(ids), chunk), workers)
        losses[ids] = batches.losses()
    return params, losses


_pools: dict[int, ThreadPoolExecutor] = {}  # kept for the process: starting threads costs more than a small round


def _map(fn: Callable[[int], None], items: range, workers: int) -> None:
    """fn over items on `workers` threads, or in this one; every op on one core either way (a team of
    OpenMP threads per batch-sized op costs more than the op, and much more when the cores are busy)."""
    with torch_threads(1):
        if workers <= 1 or len(items) <= 1:
            for item in items:
                fn(item)
        else:
            pool = _pools.get(workers) or _pools.setdefault(workers, ThreadPoolExecutor(workers, "fedhet-dense"))
            list(pool.map(fn, items))


class _Batches:
    """The mini-batches of a block of clients and what the loss gradient needs of them, for all steps:
    row indices, labels, each row's share of its batch's mean loss, and logits kept for the losses."""

    def __init__(self, data: ClientData, plan: LocalPlan, ids: Tensor, classes: int, seed: int, round_: int) -> None:
        self.steps, lr = plan.steps[ids], plan.lr[ids]
        index, weight = local_batches(
            data.offsets, plan.clients[ids], self.steps, plan.batch_size, seed, round_, plan.stream
        )
        index, weight = index.to(data.x.device), weight.to(data.x.device)
        c, t_max, b = index.shape
        self.index = index.transpose(0, 1).contiguous()  # (T, c, b): a chunk's step is a contiguous view
        self.y = data.y[self.index]
        self.share = (weight / weight.sum(2, keepdim=True).clamp_min(1.0)).transpose(0, 1)  # (T, c, b)
        self.scale = (self.share * lr.view(1, c, 1)).unsqueeze(3)  # η·wt/Σwt: ∂(η · batch loss)/∂logits
        self.minus_target = torch.zeros(t_max, c, b, classes, device=index.device)
        self.minus_target.scatter_(3, self.y.unsqueeze(3), -self.scale)
        self.logits = torch.zeros_like(self.minus_target)

    def losses(self) -> Tensor:
        """Each client's mean over its steps of the weighted mean cross-entropy (nan for 0 steps)."""
        nll = torch.logsumexp(self.logits, 3) - self.logits.gather(3, self.y.unsqueeze(3)).squeeze(3)
        total = (nll * self.share).sum((0, 2))
        steps = self.steps.to(total.device)
        return torch.where(steps > 0, total / steps.clamp_min(1), torch.nan)


@dataclass
class _Weights:
    """One layer's tensors for a chunk of c clients: views into the chunk's flat parameters and the plan's
    correction, and the received model's weights (shared by all clients)."""

    weight: Tensor  # (c, out, in)
    weight_t: Tensor  # (c, in, out), the same memory transposed
    bias: Tensor | None  # (c, 1, out)
    corr_weight: Tensor | None  # (c, out, in)
    corr_bias: Tensor | None  # (c, 1, out)
    start_weight: Tensor  # (1, out, in)
    start_bias: Tensor | None  # (1, 1, out)

    def head(self, n: int) -> _Weights:
        """The first n clients' views."""

        def cut(t: Tensor | None) -> Tensor | None:
            return t[:n] if t is not None else None

        return _Weights(
            self.weight[:n],
            self.weight_t[:n],
            cut(self.bias),
            cut(self.corr_weight),
            cut(self.corr_bias),
            self.start_weight,
            self.start_bias,
        )


def _chunk_weights(layers: list[DenseLayer], flat: Tensor, corr: Tensor | None, w0: Tensor) -> list[_Weights]:
    c = len(flat)
    out = []
    for la in layers:
        w = flat[:, la.weight].view(c, *la.shape)
        b = flat[:, la.bias].view(c, 1, -1) if la.bias is not None else None
        cw = corr[:, la.weight].view(c, *la.shape) if corr is not None else None
        cb = corr[:, la.bias].view(c, 1, -1) if corr is not None and la.bias is not None else None
        sb = w0[la.bias].view(1, 1, -1) if la.bias is not None else None
        out.append(_Weights(w, w.mT, b, cw, cb, w0[la.weight].view(1, *la.shape), sb))
    return out


def _threshold(grad: Tensor, out: Tensor) -> Tensor:
    return torch.ops.aten.threshold_backward(grad, out, 0)


# σ, and the gradient through σ from its output, as autograd computes them
_FORWARD: dict[str, Callable[[Tensor], Tensor]] = {"relu": torch.relu, "tanh": torch.tanh, "sigmoid": torch.sigmoid}
_BACKWARD: dict[str, Callable[[Tensor, Tensor], Tensor]] = {
    "relu": _threshold,
    "tanh": torch.ops.aten.tanh_backward,
    "sigmoid": torch.ops.aten.sigmoid_backward,
}


def _softmax(z: Tensor) -> Tensor:
    """Softmax over the last dimension. Torch's CPU kernel does not vectorise across rows when there are
    fewer classes than SIMD lanes (16 floats): 53 µs against 14 µs here for 330 rows of 10 classes."""
    if z.shape[-1] >= 16 or z.numel() < 40 * z.shape[-1] or z.device.type != "cpu":
        return torch.softmax(z, -1)
    e = z - z.amax(-1, keepdim=True)
    e.exp_()
    return e.div_(e.sum(-1, keepdim=True))


def _train_chunk(
    layers: list[DenseLayer],
    work: Tensor,
    w0: Tensor,
    x_all: Tensor,
    plan: LocalPlan,
    ids: Tensor,
    batches: _Batches,
    part: slice,
    masks: list[list[Tensor | None]] | None,
) -> None:
    """All local steps of one chunk of clients (sorted by decreasing steps, `part` of `batches`); updates
    `work` in place and keeps the logits in `batches`."""
    c = len(ids)
    mu, decay = plan.prox_mu, plan.weight_decay
    whole = _chunk_weights(layers, work, plan.correction[ids] if plan.correction is not None else None, w0)
    rate = plan.lr[ids].view(c, 1, 1)
    shrink = 1 - rate * (mu + decay) if mu or decay else None  # w ← (1 − η(μ+λ)) w + ημ w0 − η c − η ∇F
    decays = bool(mu or decay or plan.correction is not None)
    b = plan.batch_size
    ones = torch.ones(c, 1, b, device=work.device)
    x_buffer = torch.empty(c * b, x_all.shape[1], dtype=x_all.dtype, device=work.device)  # the step's inputs
    remaining = batches.steps[part].tolist()
    n, net = c, whole
    steps = zip(
        batches.index[:, part],
        batches.scale[:, part],
        batches.minus_target[:, part],
        batches.logits[:, part],
        strict=True,
    )
    for t, step in enumerate(steps):
        if t >= remaining[0]:
            break  # the block's other clients take more steps than this chunk's
        if remaining[n - 1] <= t:  # clients are sorted by decreasing steps: those still training are a prefix
            while remaining[n - 1] <= t:
                n -= 1
            net = [w.head(n) for w in whole]
        rows, scale_t, target_t, logits_t = step if n == c else (s[:n] for s in step)
        mask = masks[t] if masks is not None else [None] * len(layers)
        a = torch.index_select(x_all, 0, rows.view(-1), out=x_buffer[: n * b]).view(n, b, -1)  # (n, b, d)
        inputs, acts = [a], []  # each layer's input, and its activation before dropout
        for w, la, m in zip(net, layers, mask, strict=True):
            out = logits_t if la.activation is None else None
            z = (
                torch.baddbmm(w.bias, a, w.weight_t, out=out)
                if w.bias is not None
                else torch.bmm(a, w.weight_t, out=out)
            )
            if la.activation is None:
                break
            a = _FORWARD[la.activation](z)
            acts.append(a)
            inputs.append(a * m if m is not None else a)
            a = inputs[-1]
        grad = torch.addcmul(target_t, _softmax(z), scale_t)  # η (softmax − onehot) wt/Σwt
        for i in range(len(layers) - 1, -1, -1):
            w = net[i]
            back = torch.bmm(grad, w.weight) if i > 0 else None  # with W_i before its update
            if decays:
                sh = shrink[:n] if shrink is not None else None
                _decay(w.weight, w.corr_weight, w.start_weight, rate[:n], sh, mu)
                if w.bias is not None:
                    _decay(w.bias, w.corr_bias, w.start_bias, rate[:n], sh, mu)
            w.weight.baddbmm_(grad.mT, inputs[i], alpha=-1.0)
            if w.bias is not None:
                w.bias.baddbmm_(ones[:n], grad, alpha=-1.0)
            if back is None:
                break
            below, dropped = layers[i - 1], mask[i - 1]
            if dropped is not None:
                back.mul_(dropped)
            grad = _BACKWARD[below.activation or ""](back, acts[i - 1])


def _decay(w: Tensor, corr: Tensor | None, w0: Tensor | None, rate: Tensor, shrink: Tensor | None, mu: float) -> None:
    """The non-gradient part of the step, in place: w ← (1 − η(μ+λ)) w + ημ w0 − η c."""
    if shrink is not None:
        w.mul_(shrink)
    if mu and w0 is not None:
        w.addcmul_(rate * mu, w0)
    if corr is not None:
        w.addcmul_(rate, corr, value=-1.0)


def _dropout_masks(
    layers: list[DenseLayer], plan: LocalPlan, seed: int, round_: int, device: torch.device
) -> list[list[Tensor | None]] | None:
    """Step t's dropout masks (b, out) per layer, drawn on the CPU as `nn.Dropout` draws them after the
    sequential backend's seeding (the same masks for every client, on any device); None without dropout."""
    if not any(la.dropout for la in layers):
        return None
    masks = []
    for t in range(int(plan.steps.max())):
        torch.manual_seed(derive_seed(seed, f"dropout/{plan.stream}", round_, t))
        ones = [torch.ones(plan.batch_size, la.shape[0]) for la in layers]
        masks.append(
            [
                F.dropout(o, la.dropout, training=True).to(device) if la.dropout else None
                for o, la in zip(ones, layers, strict=True)
            ]
        )
    return masks
