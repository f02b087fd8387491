"""Local SGD for dense networks with hand-derived gradients: the `dense` backend.

Most of the papers' models are stacks of `nn.Linear` layers with element-wise activations under cross-entropy
(logistic regression, the MLPs). For those, this module runs `LocalPlan`'s update (`fedhet.engine.step`: the
data gradient, plus the objective's parameter terms, through the client optimiser)

    d ← ∇F_k(w; ξ) + Σ_j ∇T_j(w),   w ← optimiser(w, d)   (SGD: w ← w − η_k d)

for a chunk of clients at once with batched matrix products (`torch.baddbmm`), without autograd or vmap:

    forward   Z_l = A_{l−1} W_lᵀ + b_l,  A_l = σ_l(Z_l) (· dropout mask),  A_0 = x
    loss      per-sample cross-entropy, weighted mean over the (padded) mini-batch
    backward  D_L = (softmax(Z_L) − onehot(y)) · wt / Σ wt,   D_{l−1} = (D_l W_l) ⊙ σ'_{l−1}(Z_{l−1})
    gradient  ∇W_l = D_lᵀ A_{l−1},  ∇b_l = Σ_rows D_l

Each client's weights are updated in place inside the (m, P) result (``W.baddbmm_(−η D_lᵀ, A_{l−1})`` for plain
SGD, the terms' gradients added before), so a step allocates only batch-sized temporaries; other optimisers get
the gradient ∇W_l in a buffer and update the layer (and their state) from it. A chunk of clients runs all its
local steps before the next
chunk starts, so that the chunk's weights stay in cache. Clients are processed in order of decreasing step
count, so the clients still training at step t are a prefix of the chunk (a view, not a copy).

Under plain SGD without parameter terms, the first layer runs from its inputs' Gram matrices instead
(`_GramFirstLayer`: its outputs at step t are x_t W₀ᵀ + b₀ − Σ_{s<t} (x_t x_sᵀ + 1) G_s, and its weights are written
once per round), where the steps' T·b rows are few next to the layer (`use_gram_first_layer`).

The mini-batches (`batches.local_batches`) and dropout masks (seeded per round and step, the same for every
client) are those of the sequential and vectorised backends, so all three give the same numbers up to float
rounding (tested). `dense_layers` says whether a model qualifies; other models use the generic backends, and so
do objectives that need autograd (data terms, local rules).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from fedhet.data.dataset import ClientData
from fedhet.engine.batches import local_batches
from fedhet.engine.functional import FlatModel
from fedhet.engine.objective import Aligned, ParameterTerm
from fedhet.engine.plan import LocalPlan
from fedhet.engine.step import Cohort, aligned, leaf_direction, term_gradient
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
    cohort: Cohort,
    seed: int,
    round_: int,
    chunk_size: int = 0,
    workers: int = 0,
) -> tuple[Tensor, Tensor, dict[str, Tensor]]:
    """Run `plan` with hand-derived gradients (see the module docstring). Returns (params (m, P), loss (m,), the
    cohort's optimiser state after the steps).

    On the CPU, chunks run on `workers` threads (default: torch's intra-op thread count), each op on one
    core: chunks are independent, and small ops gain more from running side by side than from splitting each
    one. Elsewhere (CUDA) everything runs on the device of `w0` and `data`, chunks one after another."""
    m, dev = len(plan.clients), w0.device
    losses = torch.full((m,), float("nan"), device=dev)
    opt_state = {k: v.clone() for k, v in cohort.opt_state.items()}
    if m == 0 or int(plan.steps.max()) == 0:
        return w0.unsqueeze(0).repeat(m, 1), losses, opt_state
    order = torch.argsort(plan.steps, descending=True, stable=True)
    in_place = bool((order == torch.arange(m)).all())  # chunks are then slices (views) of the result
    params = torch.empty(m, model.size, device=dev)
    x_all = data.x.reshape(len(data.x), -1)
    masks = _dropout_masks(layers, plan, seed, round_, dev)
    workers = 1 if dev.type != "cpu" else workers or torch.get_num_threads()
    chunk = chunk_size if chunk_size > 0 else default_chunk(model, m, workers)
    block = max(chunk * workers, BLOCK)  # every worker gets chunks of each block
    fold_lr = cohort.optimizer.plain
    for start in range(0, m, block):
        ids = order[start : start + block]
        batches = _Batches(data, plan, ids, layers[-1].shape[0], seed, round_, fold_lr)
        target = params[start : start + block] if in_place else None

        def run(lo: int, ids: Tensor = ids, batches: _Batches = batches, target: Tensor | None = target) -> None:
            part = slice(lo, lo + chunk)
            work = target[part] if target is not None else torch.empty(len(ids[part]), model.size, device=dev)
            state = {k: v[ids[part]] for k, v in opt_state.items()}  # copies: the chunk's own optimiser state
            _train_chunk(layers, work, w0, x_all, plan, cohort.rows(ids[part]), state, ids[part], batches, part, masks)
            if target is None:
                params[ids[part]] = work
            for k, v in state.items():
                opt_state[k][ids[part]] = v

        _map(run, range(0, len(ids), chunk), workers)
        losses[ids] = batches.losses()
    return params, losses, opt_state


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

    def __init__(
        self, data: ClientData, plan: LocalPlan, ids: Tensor, classes: int, seed: int, round_: int, fold_lr: bool
    ) -> None:
        self.steps, lr = plan.steps[ids], plan.lr[ids]
        if not fold_lr:  # the optimiser takes the plain gradient
            lr = torch.ones_like(lr)
        clients = plan.clients[ids]
        index, weight = local_batches(data.offsets, clients, self.steps, plan.batch_size, seed, round_, plan.stream)
        index, weight = index.to(data.x.device), weight.to(data.x.device)
        self.starts = data.offsets[clients].to(data.x.device)  # where each client's samples begin in `data.x`
        self.sizes = (data.offsets[clients + 1] - data.offsets[clients]).to(data.x.device)
        c, t_max, b = index.shape
        self.index = index.transpose(0, 1).contiguous()  # (T, c, b): a chunk's step is a contiguous view
        self.y = data.y[self.index]
        self.share = (weight / weight.sum(2, keepdim=True).clamp_min(1.0)).transpose(0, 1)  # (T, c, b)
        self.scale = (self.share * lr.view(1, c, 1).to(index.device)).unsqueeze(3)  # ∂(η · batch loss)/∂logits
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
class _Leaf:
    """One tensor of a layer (its weight or its bias) for a chunk of c clients: a view into the chunk's flat
    parameters, its parameter terms with their aligned views, and the optimiser's state views."""

    value: Tensor  # (c, out, in) or (c, 1, out)
    terms: list[tuple[ParameterTerm, Aligned]]
    state: dict[str, Tensor]  # "param" states, shaped like `value`

    def head(self, n: int) -> _Leaf:
        """The first n clients' views."""
        terms = [(t, Aligned(a.start, a.server, {k: v[:n] for k, v in a.client.items()})) for t, a in self.terms]
        return _Leaf(self.value[:n], terms, {k: v[:n] for k, v in self.state.items()})


@dataclass
class _Weights:
    """One layer's leaves for a chunk of c clients, and its weight transposed (the same memory)."""

    weight: _Leaf
    weight_t: Tensor  # (c, in, out)
    bias: _Leaf | None

    def head(self, n: int) -> _Weights:
        return _Weights(self.weight.head(n), self.weight_t[:n], self.bias.head(n) if self.bias is not None else None)

    def leaves(self) -> list[_Leaf]:
        return [self.weight] if self.bias is None else [self.weight, self.bias]


def _chunk_weights(
    layers: list[DenseLayer],
    flat: Tensor,
    cohort: Cohort,
    state: dict[str, Tensor],
    w0: Tensor,
    kinds: Mapping[str, str],
) -> list[_Weights]:
    c = len(flat)
    out = []
    for la in layers:
        leaves: list[_Leaf | None] = []
        for where, shape in ((la.weight, la.shape), (la.bias, (1, la.shape[0]))):
            if where is None:
                leaves.append(None)
                continue
            one = lambda v, where=where, shape=shape: v[where].view(1, *shape)  # noqa: E731
            rows = lambda v, where=where, shape=shape: v[:, where].view(len(v), *shape)  # noqa: E731
            leaves.append(
                _Leaf(
                    rows(flat),
                    aligned(cohort.parameter_terms, one(w0), one, rows),
                    {k: rows(v) for k, v in state.items() if kinds[k] == "param"},
                )
            )
        weight, bias = leaves
        assert weight is not None
        out.append(_Weights(weight, weight.value.mT, bias))
    del c
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


GRAM_MAX_ROWS = 512  # a chunk's T·b above this keeps the first layer's weights per step (Gram too large)


class _GramFirstLayer:
    """The first layer under plain SGD without parameter terms, from its inputs alone.

    With w ← w − Gᵀx per step (G: the step's η-scaled gradient at the layer's outputs, x its inputs), after t
    steps W_t = W_0 − Σ_{s<t} G_sᵀ x_s and b_t = b_0 − Σ_{s<t} 1ᵀG_s, so the layer's outputs at step t are

        Z_t = x_t W_0ᵀ + b_0 − Σ_{s<t} (x_t x_sᵀ + 1) G_s

    Written over a set of R input rows X (each step's rows are some of them: `pos`), with D the sum of the G rows
    recorded at each row so far: Z_t = (X W_0ᵀ + b_0)[pos_t] − (X Xᵀ + 1)[pos_t] D, and at the end W_T = W_0 − DᵀX,
    b_T = b_0 − 1ᵀD. X W_0ᵀ for every client is one matrix product with the global model, the Gram matrices X Xᵀ
    one batched product per chunk, and the weights are written once. The per-step work no longer reads and writes
    every client's (out, in) weights, which made this layer memory-bound with small batches. The rows are the
    steps' T·b rows in order, or, where a client's steps see its samples more than once (several epochs: fewer
    samples n than T·b rows), its n samples, each once (`by_sample`). Exact up to float rounding; used where R is
    small next to the layer (`use_gram_first_layer`)."""

    def __init__(
        self, x_all: Tensor, index: Tensor, layer: DenseLayer, w0: Tensor, starts: Tensor, samples: int
    ) -> None:
        """`index` (T, c, b): the steps' rows of `x_all`; `starts` (c,): where each client's samples begin there;
        `samples`: work on each client's first `samples` rows from its start (0: on the steps' rows)."""
        steps, c, b = index.shape
        self.b = b
        self.by_sample = samples > 0
        if self.by_sample:  # X: each client's samples (padded); pos: where each step's rows are in X
            rows = (starts.view(c, 1) + torch.arange(samples, device=starts.device)).clamp_(max=len(x_all) - 1)
            self.pos = (index - starts.view(1, c, 1)).clamp_(0, samples - 1)  # (T, c, b); padding has weight 0
        else:  # X: the steps' rows in order, so that step t's are rows t·b … (t+1)·b − 1
            rows = index.permute(1, 0, 2).reshape(c, steps * b)
        self.x = x_all[rows]  # (c, R, d)
        self.w0 = weight = w0[layer.weight].view(layer.shape)
        bias = w0[layer.bias] if layer.bias is not None else None
        flat = self.x.reshape(-1, self.x.shape[2])
        z0 = torch.addmm(bias, flat, weight.T) if bias is not None else flat @ weight.T
        self.z0 = z0.view(c, -1, layer.shape[0])
        self.gram = torch.bmm(self.x, self.x.mT)  # (c, R, R)
        if bias is not None:
            self.gram.add_(1.0)
        self.grads = torch.zeros_like(self.z0)  # D: rows never recorded (or of clients that stopped) stay zero

    def outputs(self, t: int, n: int) -> Tensor:
        """Z_t of the first n clients (n, b, out)."""
        if self.by_sample:
            pos = self.pos[t, :n].unsqueeze(2)
            z0 = self.z0[:n].gather(1, pos.expand(-1, -1, self.z0.shape[2]))
            if t == 0:
                return z0
            gram = self.gram[:n].gather(1, pos.expand(-1, -1, self.gram.shape[2]))
            return z0.baddbmm_(gram, self.grads[:n], alpha=-1.0)
        rows = slice(t * self.b, (t + 1) * self.b)
        if t == 0:
            return self.z0[:n, rows]
        return torch.baddbmm(
            self.z0[:n, rows], self.gram[:n, rows, : t * self.b], self.grads[:n, : t * self.b], alpha=-1.0
        )

    def record(self, t: int, grad: Tensor) -> None:
        """Step t's G (n, b, out) for the first n clients."""
        n = len(grad)
        if self.by_sample:
            self.grads[:n].scatter_add_(1, self.pos[t, :n].unsqueeze(2).expand_as(grad), grad)
        else:
            self.grads[:n, t * self.b : (t + 1) * self.b] = grad

    def apply(self, weights: _Weights) -> None:
        """W_T = W_0 − DᵀX into the chunk's weights (not written before), b_T = b_0 − 1ᵀD (the bias holds b_0).
        Client by client, so that each one's weights are written once and updated while in cache: the chunk's
        weights do not fit, and reading and writing them once more each made two-thread rounds 8–18% slower."""
        for value, g, x in zip(weights.weight.value, self.grads.mT, self.x, strict=True):
            torch.addmm(self.w0, g, x, alpha=-1.0, out=value)
        if weights.bias is not None:
            weights.bias.value.add_(self.grads.sum(1, keepdim=True), alpha=-1.0)


def use_gram_first_layer(layer: DenseLayer, rows: int, plain: bool, terms: bool) -> bool:
    """Whether `_GramFirstLayer` runs a chunk on `rows` input rows R (T·b, or the samples where fewer): plain SGD,
    no parameter terms, and R·(in + out) ≤ 2·in·out. The Gram path adds about R²·(in + out/2) multiply-adds (the
    Gram matrices and their use) to the per-step path's 2·T·b·in·out, so this bounds its work at about twice
    theirs; its products are large and run near the machine's matmul rate, the per-step ones are skinny and
    memory-bound."""
    n_out, n_in = layer.shape
    return plain and not terms and rows <= GRAM_MAX_ROWS and rows * (n_in + n_out) <= 2 * n_in * n_out


def _train_chunk(
    layers: list[DenseLayer],
    work: Tensor,
    w0: Tensor,
    x_all: Tensor,
    plan: LocalPlan,
    cohort: Cohort,
    state: dict[str, Tensor],
    ids: Tensor,
    batches: _Batches,
    part: slice,
    masks: list[list[Tensor | None]] | None,
) -> None:
    """All local steps of one chunk of clients (sorted by decreasing steps, `part` of `batches`) from `w0`: writes
    the clients' models into `work`, updates the optimiser `state` of the chunk in place and keeps the logits in
    `batches`."""
    c = len(ids)
    optimizer = cohort.optimizer
    kinds = optimizer.state_kinds()
    whole = _chunk_weights(layers, work, cohort, state, w0, kinds)
    counts = {k: v for k, v in state.items() if kinds[k] == "count"}  # (c,): the same for every leaf
    rate = plan.lr[ids].view(c, 1, 1).to(work.device)
    b = plan.batch_size
    ones = torch.ones(c, 1, b, device=work.device)
    x_buffer = torch.empty(c * b, x_all.shape[1], dtype=x_all.dtype, device=work.device)  # the step's inputs
    remaining = batches.steps[part].tolist()
    first_terms = any(leaf.terms for leaf in whole[0].leaves())
    samples = int(batches.sizes[part].max())
    if not 0 < samples < remaining[0] * b:
        samples = 0  # the Gram path works on the steps' rows, unless the steps see fewer samples (several epochs)
    gram = (
        _GramFirstLayer(x_all, batches.index[: remaining[0], part], layers[0], w0, batches.starts[part], samples)
        if remaining[0] > 0
        and use_gram_first_layer(layers[0], samples or remaining[0] * b, optimizer.plain, first_terms)
        else None
    )
    # the weights start as the received model, written just before use so that they start in cache; the Gram
    # path writes its layer's weights itself, at the end
    skip = layers[0].weight if gram is not None else slice(0, 0)
    for keep in (slice(0, skip.start), slice(skip.stop, len(w0))):
        work[:, keep].copy_(w0[keep].expand(c, -1))
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
        a = (
            torch.index_select(x_all, 0, rows.view(-1), out=x_buffer[: n * b]).view(n, b, -1)  # (n, b, d)
            if gram is None
            else x_buffer[:0]  # not needed: the first layer's outputs come from the Gram matrices
        )
        inputs, acts = [a], []  # each layer's input, and its activation before dropout
        for i, (w, la, m) in enumerate(zip(net, layers, mask, strict=True)):
            out = logits_t if la.activation is None else None
            bias = w.bias.value if w.bias is not None else None
            if i == 0 and gram is not None:
                z = gram.outputs(t, n)
                if out is not None:
                    z = out.copy_(z)
            elif bias is not None:
                z = torch.baddbmm(bias, a, w.weight_t, out=out)
            else:
                z = torch.bmm(a, w.weight_t, out=out)
            if la.activation is None:
                break
            a = _FORWARD[la.activation](z)
            acts.append(a)
            inputs.append(a * m if m is not None else a)
            a = inputs[-1]
        grad = torch.addcmul(target_t, _softmax(z), scale_t)  # (softmax − onehot) wt/Σwt, times η for plain SGD
        step_counts = {k: v[:n].view(n, 1, 1) for k, v in counts.items()}
        new_counts: dict[str, Tensor] = {}
        for i in range(len(layers) - 1, -1, -1):
            w = net[i]
            back = torch.bmm(grad, w.weight.value) if i > 0 else None  # with W_i before its update
            if i == 0 and gram is not None:
                gram.record(t, grad)
            elif optimizer.plain:  # w ← w − η Σ_j ∇T_j(w) − η ∇F(w), the data part fused into the products
                for leaf in w.leaves():
                    extra = term_gradient(leaf.value, leaf.terms)  # at w before its update
                    if extra is not None:
                        leaf.value.addcmul_(rate[:n], extra, value=-1.0)
                w.weight.value.baddbmm_(grad.mT, inputs[i], alpha=-1.0)
                if w.bias is not None:
                    w.bias.value.baddbmm_(ones[:n], grad, alpha=-1.0)
            else:
                data_grads = [torch.bmm(grad.mT, inputs[i])]
                if w.bias is not None:
                    data_grads.append(torch.bmm(ones[:n], grad))
                for leaf, g in zip(w.leaves(), data_grads, strict=True):
                    d = leaf_direction(g, leaf.value, leaf.terms)
                    new, after = optimizer.step(leaf.value, d, {**leaf.state, **step_counts}, rate[:n])
                    leaf.value.copy_(new)
                    for k, v in leaf.state.items():
                        v.copy_(after[k])
                    new_counts = {k: after[k] for k in counts}
            if back is None:
                break
            below, dropped = layers[i - 1], mask[i - 1]
            if dropped is not None:
                back.mul_(dropped)
            grad = _BACKWARD[below.activation or ""](back, acts[i - 1])
        for k, v in new_counts.items():
            counts[k][:n] = v.view(n)
    if gram is not None:
        gram.apply(whole[0])


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
