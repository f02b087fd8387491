"""Local SGD for dense networks with hand-derived gradients: the `dense` backend.

Most of the papers' models are stacks of `nn.Linear` layers with element-wise activations under cross-entropy
(logistic regression, the MLPs), or under any task's loss (`fedhet.engine.task`: its gradient at the outputs).
For those, this module runs `LocalPlan`'s update (`fedhet.engine.step`: the data gradient, plus the objective's
parameter terms, through the client optimiser)

    d ← ∇F_k(w; ξ) + Σ_j ∇T_j(w),   w ← optimiser(w, d)   (SGD: w ← w − η_k d)

for a chunk of clients at once with batched matrix products (`torch.baddbmm`), without autograd or vmap:

    forward   Z_l = A_{l−1} W_lᵀ + b_l,  A_l = σ_l(Z_l) (· dropout mask),  A_0 = x
    loss      per-sample loss ℓ(Z_L, y) of the task, weighted mean over the (padded) mini-batch
    backward  D_L = ∂ℓ/∂Z_L · wt / Σ wt (cross-entropy: (softmax(Z_L) − onehot(y)) · wt / Σ wt),
              D_{l−1} = (D_l W_l) ⊙ σ'_{l−1}(Z_{l−1})
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

DP-SGD (``plan.dp_sgd``, Abadi et al. 2016) runs without per-sample gradients: the backward pass from the
per-sample loss gradients gives every layer's D_l first, each sample's gradient norm is Σ_l (‖a_{l,i}‖² + 1)‖d_{l,i}‖²
("ghost clipping", `fedhet.engine.ghost`), and each layer is updated from D_l with its rows weighted by the clip
factors, then noised from the clients' own streams (the first layer's noise kept beside the Gram form's D).

The mini-batches (`batches.local_batches`) and dropout masks (seeded per round and step, the same for every
client) are those of the sequential and vectorised backends, so all three give the same numbers up to float
rounding (tested). `dense_layers` says whether a model qualifies; other models use the generic backends, and so
do objectives that need autograd (data terms, local rules).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from fedhet.data.dataset import ClientData
from fedhet.engine.batches import gather_rows, local_batches
from fedhet.engine.functional import FlatModel
from fedhet.engine.ghost import clip_factors, draw_noise, square_norms
from fedhet.engine.memory import fit_chunk, training_bytes
from fedhet.engine.objective import Aligned, ParameterTerm
from fedhet.engine.plan import LocalPlan
from fedhet.engine.privacy import clip_rows, expected_batch, poisson_batches, refuse_with, sgd_noise_key
from fedhet.engine.request import CLIPPED, Trained, TrainRequest
from fedhet.engine.reuse import Reuse, rows_key
from fedhet.engine.step import Cohort, affine_part, aligned, leaf_direction, term_gradient
from fedhet.engine.task import Task
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
    layers each optionally followed by ReLU/Tanh/Sigmoid and Dropout, ending with a Linear layer; a hidden Linear
    layer without an activation feeds the next one directly)."""
    if model.stat_names:
        return None  # running statistics (batch norm): the autograd backends
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
    least `MIN_CHUNK_BYTES` (tiny chunks cost more in threads than they save; docs/performance.md, "Why the
    engine's constants")."""
    weights = 4 * model.size
    share = -(-clients // max(workers, 1))
    return max(1, min(max(share, -(-MIN_CHUNK_BYTES // weights)), CHUNK_BYTES // weights, BLOCK))


def memory_chunk(
    model: FlatModel, layers: list[DenseLayer], clients: int, workers: int, batch: int, device: torch.device
) -> int:
    """`default_chunk` on the CPU (a cache-sized chunk), the whole cohort on a GPU; either way no more clients than
    fit in half the device's free memory (`fit_chunk`: weights, gradients, optimiser state and activations)."""
    widths = layers[0].shape[1] + sum(layer.shape[0] for layer in layers)
    fits = fit_chunk(clients, training_bytes(model.size, batch, widths), device)
    return min(default_chunk(model, clients, workers), fits) if device.type == "cpu" else fits


def train_dense(request: TrainRequest, layers: list[DenseLayer]) -> Trained:
    """Run `request` with hand-derived gradients (see the module docstring). Returns (params (m, P), loss (m,), the
    cohort's optimiser state after the steps; with ``request.clip``, each update clipped to that norm and which were
    under `CLIPPED`).

    On the CPU, chunks run on ``request.workers`` threads (default: torch's intra-op thread count), each op on one
    core: chunks are independent, and small ops gain more from running side by side than from splitting each
    one. Elsewhere (CUDA) everything runs on the device of the request's tensors, chunks one after another."""
    model, data, plan, cohort = request.model, request.data, request.plan, request.cohort
    refuse_with(cohort.dp_sgd, bool(cohort.data_terms), cohort.rule is not None, model.has_dropout)
    m, dev = request.size, request.anchor.device
    losses = torch.full((m,), float("nan"), device=dev)
    opt_state = {k: v.clone() for k, v in cohort.opt_state.items()}
    if m == 0 or int(plan.steps.max()) == 0:
        return request.start(), losses, opt_state
    order = torch.argsort(plan.steps, descending=True, stable=True)
    in_place = bool((order == torch.arange(m)).all())  # chunks are then slices (views) of the result
    params = torch.empty(m, model.size, device=dev)
    x_all = data.x.reshape(len(data.x), -1)
    masks = _dropout_masks(layers, plan, request.seed, request.round_, dev)
    workers = 1 if dev.type != "cpu" else request.workers or torch.get_num_threads()
    chunk = (
        request.chunk_size if request.chunk_size > 0 else memory_chunk(model, layers, m, workers, plan.batch_size, dev)
    )
    block = max(chunk * workers, BLOCK)  # every worker gets chunks of each block
    fold_lr = cohort.optimizer.plain
    clipped = torch.zeros(m, dtype=torch.bool, device=dev) if request.clip is not None else None
    for start in range(0, m, block):
        ids = order[start : start + block]
        batches = _Batches(data, plan, ids, layers[-1].shape[0], request.seed, request.round_, fold_lr, model.task)
        target = params[start : start + block] if in_place else None

        def run(
            lo: int, ids: Tensor = ids, batches: _Batches = batches, target: Tensor | None = target, at: int = start
        ) -> None:
            part = slice(lo, lo + chunk)
            mine = ids[part]
            work = target[part] if target is not None else torch.empty(len(mine), model.size, device=dev)
            state = {k: v[mine] for k, v in opt_state.items()}  # copies: the chunk's own optimiser state
            rows = slice(at + lo, at + lo + len(mine)) if in_place else mine  # the chunk's start points
            chunk_clipped = _Chunk(layers, request, work, x_all, mine, rows, state, batches, part, masks).train()
            if clipped is not None and chunk_clipped is not None:
                clipped[mine] = chunk_clipped
            if target is None:
                params[mine] = work
            for k, v in state.items():
                opt_state[k][mine] = v

        _map(run, range(0, len(ids), chunk), workers)
        losses[ids] = batches.losses()
    if clipped is not None:
        opt_state[CLIPPED] = clipped
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
    row indices, labels, each row's share of its batch's mean loss, what the task's gradient needs of the labels
    (`Task.prepare`; for classification −onehot(y) scaled) and the outputs kept for the losses.

    Under DP-SGD (``plan.dp_sgd``) the batches are its own (Poisson-sampled unless it says ``shuffle``), the loss
    gradient is per sample (scale 1) and `private` (T, c, b) holds each row's weight in the clipped sum, w_i/b_k (× η
    where the optimiser is plain SGD), b_k the client's expected batch size (`fedhet.engine.privacy`)."""

    def __init__(
        self,
        data: ClientData,
        plan: LocalPlan,
        ids: Tensor,
        outputs: int,
        seed: int,
        round_: int,
        fold_lr: bool,
        task: Task,
    ) -> None:
        self.task = task
        self.steps, lr = plan.steps[ids], plan.lr[ids]
        if not fold_lr:  # the optimiser takes the plain gradient
            lr = torch.ones_like(lr)
        clients = plan.clients[ids]
        dp = plan.dp_sgd
        sample = poisson_batches if dp is not None and dp.sampling == "poisson" else local_batches
        index, weight = sample(data.offsets, clients, self.steps, plan.batch_size, seed, round_, plan.stream)
        index, weight = index.to(data.x.device), weight.to(data.x.device)
        self.starts = data.offsets[clients].to(data.x.device)  # where each client's samples begin in `data.x`
        self.sizes = (data.offsets[clients + 1] - data.offsets[clients]).to(data.x.device)
        c, t_max, b = index.shape
        self.index = index.transpose(0, 1).contiguous()  # (T, c, b): a chunk's step is a contiguous view
        self.y = data.y[self.index]
        self.share = (weight / weight.sum(2, keepdim=True).clamp_min(1.0)).transpose(0, 1)  # (T, c, b)
        self.scale = (self.share * lr.view(1, c, 1).to(index.device)).unsqueeze(3)  # ∂(η · batch loss)/∂ℓ
        self.private: Tensor | None = None
        if dp is not None:
            rate = lr / expected_batch(data.offsets.cpu(), clients, plan.batch_size)
            self.private = (weight * rate.view(c, 1, 1).to(weight.device)).transpose(0, 1)
            self.scale = torch.ones_like(self.scale)  # per-sample gradients: weighted after clipping
        self.prepared = task.prepare(self.y, self.scale, outputs)  # (T, c, b, ...)
        self.logits = torch.zeros(t_max, c, b, outputs, device=index.device)

    def losses(self) -> Tensor:
        """Each client's mean over its steps of the weighted mean loss (nan for 0 steps)."""
        values = self.task.loss_value(self.logits, self.y) * self.share  # (T, c, b)
        if values.shape[1] == 1:  # a lone client's column sums in another order than columns of several: padded,
            values = torch.cat([values, torch.zeros_like(values)], 1)  # its loss is the same in any cohort
        total = values.sum((0, 2))[: len(self.steps)]
        steps = self.steps.to(total.device)
        return torch.where(steps > 0, total / steps.clamp_min(1), torch.nan)


@dataclass
class _Leaf:
    """One tensor of a layer (its weight or its bias) for a chunk of c clients: a view into the chunk's flat
    parameters, its parameter terms with their aligned views, and the optimiser's state views."""

    value: Tensor  # (c, out, in) or (c, 1, out)
    terms: list[tuple[ParameterTerm, Aligned]]
    state: dict[str, Tensor]  # "param" states, shaped like `value`
    anchor: Tensor  # (1, out, in) or (1, 1, out): the received model's values

    def head(self, n: int) -> _Leaf:
        """The first n clients' views."""
        terms = [(t, Aligned(a.start, a.server, {k: v[:n] for k, v in a.client.items()})) for t, a in self.terms]
        return _Leaf(self.value[:n], terms, {k: v[:n] for k, v in self.state.items()}, self.anchor)

    def general_terms(self) -> list[tuple[ParameterTerm, Aligned]]:
        """The terms that are not affine (`ParameterTerm.affine`): their gradients are computed as they are."""
        return [(t, a) for t, a in self.terms if t.affine() is None]


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
                    one(w0),
                )
            )
        weight, bias = leaves
        assert weight is not None
        out.append(_Weights(weight, weight.value.mT, bias))
    del c
    return out


def _threshold(grad: Tensor, out: Tensor) -> Tensor:
    return torch.ops.aten.threshold_backward(grad, out, 0)


# σ, and the gradient through σ from its output, as autograd computes them ("": a hidden Linear layer followed
# directly by another, σ the identity)
_FORWARD: dict[str, Callable[[Tensor], Tensor]] = {
    "relu": torch.relu,
    "tanh": torch.tanh,
    "sigmoid": torch.sigmoid,
    "": lambda z: z,
}
_BACKWARD: dict[str, Callable[[Tensor, Tensor], Tensor]] = {
    "relu": _threshold,
    "tanh": torch.ops.aten.tanh_backward,
    "sigmoid": torch.ops.aten.sigmoid_backward,
    "": lambda grad, out: grad,
}


GRAM_MAX_ROWS = 512  # a chunk's T·b above this keeps the first layer's weights per step (Gram too large)


class _GramFirstLayer:
    """The first layer under plain SGD, from its inputs alone.

    With w ← w − Gᵀx per step (G: the step's η-scaled gradient at the layer's outputs, x its inputs), after t
    steps W_t = W_0 − Σ_{s<t} G_sᵀ x_s and b_t = b_0 − Σ_{s<t} 1ᵀG_s, so the layer's outputs at step t are

        Z_t = x_t W_0ᵀ + b_0 − Σ_{s<t} (x_t x_sᵀ + 1) G_s

    Written over a set of R input rows X (each step's rows pos_t are some of them), with D the sum of the G rows
    recorded at each row so far: Z_t = (X W_0ᵀ + b_0)[pos_t] − (X Xᵀ + 1)[pos_t] D, and at the end W_T = W_0 − DᵀX,
    b_T = b_0 − 1ᵀD. X W_0ᵀ for every client is one matrix product with the global model, the Gram matrices X Xᵀ
    one batched product per chunk (both kept for a second training of the round on the same mini-batches,
    `fedhet.engine.reuse`), and the weights are written once. The per-step work no longer reads and writes
    every client's (out, in) weights, which made this layer memory-bound with small batches. The rows are the
    steps' T·b rows in order, or, where a client's steps see its samples more than once (several epochs: fewer
    samples n than T·b rows), its n samples, each once (`by_sample`). Exact up to float rounding; used where R is
    small next to the layer (`use_gram_first_layer`).

    Affine terms (`ParameterTerm.affine`: weight decay, FedProx's proximal term; their gradient is λw − κA, A the
    received model) fold in: each step is w ← ρw + ηκA − Gᵀx with ρ = 1 − ηλ, so W_t = ρ^t W_0 + c_t A −
    Σ_{s<t} ρ^{t−1−s} G_sᵀ x_s with c_t = ηκ(1 + ρ + … + ρ^{t−1}): the outputs are ρ^t (X W_0ᵀ + b_0) + c_t (X Aᵀ + a)
    minus the Gram part, with D decayed by ρ before each step's G joins it."""

    def __init__(
        self,
        x_all: Tensor,
        index: Tensor,
        layer: DenseLayer,
        w0: Tensor,
        starts: Tensor,
        samples: int,
        affine: tuple[Tensor, Tensor, Tensor] | None = None,
        reuse: Reuse | None = None,
        noisy: bool = False,
    ) -> None:
        """`index` (T, c, b): the steps' rows of `x_all`; `w0` the layer's start: the flat model (P,) shared by the
        chunk, or each client's (c, P); `starts` (c,): where each client's samples begin in `x_all`; `samples`:
        work on each client's first `samples` rows from its start (0: on the steps' rows); `affine`: the affine
        terms' ρ = 1 − ηλ and ηκ per client (c, 1, 1), and the received model A (P,); `noisy`: DP-SGD's noise moves
        the layer at every step (`record`)."""
        steps, c, b = index.shape
        self.b = b
        self.by_sample = samples > 0
        if self.by_sample:  # X: each client's samples (padded); pos: where each step's rows are in X
            rows = (starts.view(c, 1) + torch.arange(samples, device=starts.device)).clamp_(max=len(x_all) - 1)
            pos = (index - starts.view(1, c, 1)).clamp_(0, samples - 1)  # (T, c, b); padding has weight 0
            self.flat = pos + samples * torch.arange(c, device=pos.device).view(1, c, 1)  # rows of X as (c·R, d)
        else:  # X: the steps' rows in order, so that step t's are rows t·b … (t+1)·b − 1
            rows = index.permute(1, 0, 2).reshape(c, steps * b)
        self.reuse, self.key = reuse or Reuse(0), rows_key(x_all, rows, layer.bias is not None)
        self.x, self.gram = self.reuse.inputs(self.key, lambda: _inputs(x_all, rows, layer))  # (c, R, d), (c, R, R)
        if w0.dim() == 1:  # X W_0ᵀ + b_0 with one W_0: one matrix product for the chunk
            self.w0 = w0[layer.weight].view(layer.shape)
            self.z0 = self._outputs_of(w0, layer, c)
        else:  # each client's own W_0
            self.w0 = weight = w0[:, layer.weight].view(c, *layer.shape)
            self.z0 = torch.bmm(self.x, weight.mT)
            if layer.bias is not None:
                self.z0.add_(w0[:, layer.bias].unsqueeze(1))
        self.grads = torch.zeros_like(self.z0)  # D: rows never recorded (or of clients that stopped) stay zero
        # N, n: DP-SGD's noise added to the layer's weight and bias so far (decayed by ρ as the weights are)
        self.noise = torch.zeros(c, *layer.shape, device=self.z0.device) if noisy else None
        self.noise_bias = (
            torch.zeros(c, 1, layer.shape[0], device=self.z0.device) if noisy and layer.bias is not None else None
        )
        self.affine = affine
        if affine is not None:
            decay, pull, anchor = affine
            self.anchor = anchor[layer.weight].view(layer.shape)
            self.anchor_bias = anchor[layer.bias] if layer.bias is not None else None
            pulled = bool((pull != 0).any())
            same = w0.dim() == 1 and w0.data_ptr() == anchor.data_ptr()  # every client starts at A: X Aᵀ = X W_0ᵀ
            self.za = (self.z0 if same else self._outputs_of(anchor, layer, c)) if pulled else None  # X Aᵀ + a
            self.scale = torch.ones_like(decay)  # ρ^t, per client
            self.shift = torch.zeros_like(decay)  # c_t, per client

    def _outputs_of(self, flat: Tensor, layer: DenseLayer, c: int) -> Tensor:
        """X Wᵀ + b (c, R, out) for one flat model's first layer W, b: one matrix product for the chunk (or the
        same product kept from an earlier training of the round, `Reuse`; not to be written into)."""
        weight = flat[layer.weight].view(layer.shape)
        bias = flat[layer.bias] if layer.bias is not None else None
        x = self.x.reshape(-1, self.x.shape[2])

        def compute() -> Tensor:
            z = torch.addmm(bias, x, weight.T) if bias is not None else x @ weight.T
            return z.view(c, -1, layer.shape[0])

        return self.reuse.outputs(self.key, weight, bias, compute)

    def _rows(self, z: Tensor, t: int, n: int) -> Tensor:
        """Rows of a (c, R, ·) tensor for step t's inputs of the first n clients (n, b, ·), a view where it can."""
        if self.by_sample:
            return gather_rows(z.view(-1, z.shape[2]), self.flat[t, :n])
        return z[:n, t * self.b : (t + 1) * self.b]

    def outputs(self, t: int, n: int) -> Tensor:
        """Z_t of the first n clients (n, b, out); with DP-SGD's noise, + x_t N_tᵀ + n_t."""
        z = self._data_outputs(t, n)
        if self.noise is None or t == 0:
            return z
        z = z + self.noise_bias[:n] if self.noise_bias is not None else z
        return torch.baddbmm(z, self._rows(self.x, t, n), self.noise[:n].mT)

    def _data_outputs(self, t: int, n: int) -> Tensor:
        """Z_t of the first n clients without DP-SGD's noise (not to be written into)."""
        base = self._rows(self.z0, t, n)
        if self.affine is not None:
            base = base * self.scale[:n]
            if self.za is not None:
                base.addcmul_(self._rows(self.za, t, n), self.shift[:n])
        if t == 0:
            return base
        if self.by_sample:
            gram = self._rows(self.gram, t, n)
            return torch.baddbmm(base, gram, self.grads[:n], alpha=-1.0)
        rows = slice(t * self.b, (t + 1) * self.b)
        return torch.baddbmm(base, self.gram[:n, rows, : t * self.b], self.grads[:n, : t * self.b], alpha=-1.0)

    def record(self, t: int, grad: Tensor, noise: list[Tensor] | None = None, scale: Tensor | None = None) -> None:
        """Step t's G (n, b, out) for the first n clients, and DP-SGD's noise ξ of the weight and bias (n, out, in),
        (n, 1, out) × `scale` (n, 1, 1) into N and n."""
        n = len(grad)
        if self.affine is not None:
            decay, pull, _ = self.affine
            self.grads[:n].mul_(decay[:n])
            self.shift[:n] = self.shift[:n] * decay[:n] + pull[:n]
            self.scale[:n] *= decay[:n]
            for kept in (self.noise, self.noise_bias):
                if kept is not None:
                    kept[:n].mul_(decay[:n])
        if noise is not None and scale is not None:
            for kept, xi in zip((self.noise, self.noise_bias), noise, strict=False):
                if kept is not None:
                    kept[:n].addcmul_(xi, scale)
        if self.by_sample:
            self.grads.view(-1, grad.shape[2]).index_add_(0, self.flat[t, :n].view(-1), grad.reshape(-1, grad.shape[2]))
        else:
            self.grads[:n, t * self.b : (t + 1) * self.b] = grad

    def input_square_norms(self, t: int, n: int) -> Tensor:
        """‖x_i‖² of step t's input rows of the first n clients (n, b): DP-SGD's ghost norms (`fedhet.engine.ghost`)."""
        return self._rows(self.x, t, n).square().sum(-1)

    def update_square_norms(self) -> Tensor:
        """‖W_T − W_0‖² + ‖b_T − b_0‖² of each client (c,) before the weights are written, without affine terms
        (W_T = W_0 − DᵀX, b_T = b_0 − 1ᵀD): ‖DᵀX‖² + ‖1ᵀD‖² = ⟨X Xᵀ + 1, D Dᵀ⟩ = Σ D ⊙ (X Xᵀ + 1) D, from the
        Gram matrices the steps used (`gram` holds the + 1 where the layer has a bias)."""
        assert self.affine is None
        return (torch.bmm(self.grads, self.grads.mT) * self.gram).sum((1, 2)).clamp_min_(0.0)

    def apply(self, weights: _Weights) -> None:
        """W_T = W_0 − DᵀX into the chunk's weights (not written before), b_T = b_0 − 1ᵀD (the bias holds b_0);
        with affine terms ρ^T W_0 + c_T A − DᵀX and ρ^T b_0 + c_T a − 1ᵀD. Client by client, so that each one's
        weights are written once and updated while in cache: the chunk's weights do not fit, and one more pass
        over them is slower (docs/performance.md, "Why the engine's constants")."""
        shared = self.w0.dim() == 2
        for i, (value, g, x) in enumerate(zip(weights.weight.value, self.grads.mT, self.x, strict=True)):
            start = self.w0 if shared else self.w0[i]
            if self.affine is None:
                torch.addmm(start, g, x, alpha=-1.0, out=value)
            else:
                torch.addmm(start, g, x, beta=float(self.scale[i]), alpha=-1.0, out=value)
                if self.za is not None:
                    value.add_(self.anchor, alpha=float(self.shift[i]))
            if self.noise is not None:
                value.add_(self.noise[i])
        bias = weights.bias
        if bias is not None:
            if self.affine is not None:
                bias.value.mul_(self.scale)
                if self.za is not None and self.anchor_bias is not None:
                    bias.value.addcmul_(self.shift, self.anchor_bias.view(1, 1, -1))
            bias.value.add_(self.grads.sum(1, keepdim=True), alpha=-1.0)
            if self.noise_bias is not None:
                bias.value.add_(self.noise_bias)


def _inputs(x_all: Tensor, rows: Tensor, layer: DenseLayer) -> tuple[Tensor, Tensor]:
    """The Gram path's input rows X = x_all[rows] (c, R, d) and X Xᵀ (c, R, R), + 1 where the layer has a bias."""
    x = gather_rows(x_all, rows)
    gram = torch.bmm(x, x.mT)
    if layer.bias is not None:
        gram.add_(1.0)
    return x, gram


def use_gram_first_layer(layer: DenseLayer, rows: int, plain: bool, terms: bool) -> bool:
    """Whether `_GramFirstLayer` runs a chunk on `rows` input rows R (T·b, or the samples where fewer): plain SGD,
    no parameter terms but affine ones (`terms`: some other term), and R·(in + out) ≤ 2·in·out. The Gram path adds
    about R²·(in + out/2) multiply-adds (the Gram matrices and their use) to the per-step path's 2·T·b·in·out, so
    this bounds its work at about twice theirs; its products are large and run near the machine's matmul rate, the
    per-step ones are skinny and memory-bound."""
    n_out, n_in = layer.shape
    return plain and not terms and rows <= GRAM_MAX_ROWS and rows * (n_in + n_out) <= 2 * n_in * n_out


class _Chunk:
    """All local steps of one chunk of clients (sorted by decreasing steps: `part` of `batches`) from their start
    points: the clients' models end in `work`, the chunk's optimiser `state` is updated in place and the logits
    are kept in `batches` (for the losses).

    Each step is a forward pass (`forward`: the layers' inputs and activations, the logits), the loss gradient at
    the logits, and a backward pass (`backward`) that updates each layer once the gradient below it is known:
    with plain SGD the data gradient is fused into the products (`_sgd_update`), other optimisers step from the
    gradient (`_optimizer_update`); the first layer may run from its inputs' Gram matrices (`_GramFirstLayer`).
    Under DP-SGD the backward pass keeps every layer's per-sample output gradient, clips by ghost norms and adds
    the noise (`_private_gradients`, `fedhet.engine.ghost`) before the layers are updated."""

    def __init__(
        self,
        layers: list[DenseLayer],
        request: TrainRequest,
        work: Tensor,
        x_all: Tensor,
        ids: Tensor,
        rows: Tensor | slice,
        state: dict[str, Tensor],
        batches: _Batches,
        part: slice,
        masks: list[list[Tensor | None]] | None,
    ) -> None:
        """`ids`: the chunk's clients (rows of the cohort), `rows` the same as a slice where they are consecutive (the
        start points are then read in place, not copied)."""
        c, dev = len(ids), work.device
        cohort = request.cohort.rows(ids)
        self.layers, self.request, self.work, self.x_all = layers, request, work, x_all
        self.batches, self.part, self.masks = batches, part, masks
        self.optimizer = cohort.optimizer
        kinds = self.optimizer.state_kinds()
        self.whole = _chunk_weights(layers, work, cohort, state, request.anchor, kinds)
        self.counts = {k: v for k, v in state.items() if kinds[k] == "count"}  # (c,): the same for every leaf
        self.frozen = [
            [request.is_frozen(where) for where in (la.weight, la.bias) if where is not None] for la in layers
        ]
        self.rate = request.plan.lr[ids].view(c, 1, 1).to(dev)
        scales = request.plan.scales  # (m, L): each layer's outputs times a factor per client (HeteroFL's scaler)
        self.scales = scales[ids].to(dev).view(c, -1, 1, 1) if scales is not None else None
        # the affine terms (`ParameterTerm.affine`, the same on every leaf): w ← ρw + ηκA with ρ = 1 − ηλ
        first = self.whole[0].weight.terms
        lam, kappa, _ = affine_part(first)
        self.decay = 1 - self.rate * lam if lam else None
        self.pull = self.rate * kappa if kappa else None
        self.general = any(t.affine() is None for t, _ in first)  # terms whose gradient is computed as it is
        self.b = batches.index.shape[2]  # the batch's slots: B, or DP-SGD's largest Poisson batch
        self.dp = cohort.dp_sgd
        self.draws: Tensor | None = None  # DP-SGD's noise of a step (c, P), drawn on the CPU
        if self.dp is not None and self.dp.noise_std > 0:
            plan = request.plan
            self.draws = torch.empty(c, work.shape[1])
            self.clients = plan.clients[ids].tolist()
            self.noise_key = sgd_noise_key(plan.stream, plan.phase)
            sigma = self.dp.noise_std  # the step adds −η σ ξ/b_k (plain SGD), or its gradient σ ξ/b_k
            scale = -sigma * self.rate if self.optimizer.plain else torch.full_like(self.rate, sigma)
            sizes = expected_batch(request.data.offsets.cpu(), plan.clients[ids], plan.batch_size).to(dev)
            self.noise_scale = scale / sizes.view(c, 1, 1)
        self.ones = torch.ones(c, 1, self.b, device=dev)
        self.x_buffer = torch.empty(c * self.b, x_all.shape[1], dtype=x_all.dtype, device=dev)  # a step's inputs
        self.remaining = batches.steps[part].tolist()
        starts = request.starts[rows] if request.starts is not None else None
        self.gram = self._gram(starts)
        self._start_weights(starts)

    def _gram(self, starts: Tensor | None) -> _GramFirstLayer | None:
        """The Gram path for the first layer where it pays (`use_gram_first_layer`) and the layer trains."""
        first, b, part = self.layers[0], self.b, self.part
        steps = self.remaining[0]
        if steps == 0 or any(self.frozen[0]):
            return None
        samples = int(self.batches.sizes[part].max())
        if not 0 < samples < steps * b:
            samples = 0  # the Gram path works on the steps' rows, unless the steps see fewer samples (epochs)
        if not use_gram_first_layer(first, samples or steps * b, self.optimizer.plain, self.general):
            return None
        w0 = starts if starts is not None else self.request.anchor
        index, where = self.batches.index[:steps, part], self.batches.starts[part]
        affine = None
        if self.decay is not None or self.pull is not None:
            ones = torch.ones_like(self.rate)
            pull = self.pull if self.pull is not None else torch.zeros_like(self.rate)
            affine = (self.decay if self.decay is not None else ones, pull, self.request.anchor)
        noisy = self.draws is not None
        return _GramFirstLayer(self.x_all, index, first, w0, where, samples, affine, self.request.reuse, noisy)

    def _start_weights(self, starts: Tensor | None) -> None:
        """The weights start as the clients' start points, written just before use so that they start in cache;
        the Gram path writes its layer's weights itself, at the end."""
        skip = self.layers[0].weight if self.gram is not None else slice(0, 0)
        c = len(self.work)
        for keep in (slice(0, skip.start), slice(skip.stop, self.work.shape[1])):
            source = starts[:, keep] if starts is not None else self.request.anchor[keep].expand(c, -1)
            self.work[:, keep].copy_(source)

    def train(self) -> Tensor | None:
        """Run the chunk's steps; with ``request.clip``, clip each update (`_clip_before_writing` on the Gram path,
        else `clip_rows` on the written models) and return which were clipped (None without)."""
        batches, part = self.batches, self.part
        c, n, net = len(self.work), len(self.work), self.whole
        remaining, task = self.remaining, self.request.model.task
        steps = zip(
            batches.index[:, part],
            batches.scale[:, part],
            batches.prepared[:, part],
            batches.logits[:, part],
            strict=True,
        )
        for t, step in enumerate(steps):
            if t >= remaining[0]:
                break  # the block's other clients take more steps than this chunk's
            if remaining[n - 1] <= t:  # clients are sorted by decreasing steps: those still training are a prefix
                while remaining[n - 1] <= t:
                    n -= 1
                net = [w.head(n) for w in self.whole]
            rows, scale_t, target_t, logits_t = step if n == c else (s[:n] for s in step)
            mask: list[Tensor | None] = self.masks[t] if self.masks is not None else [None] * len(self.layers)
            z, inputs, acts = self.forward(net, t, n, rows, logits_t, mask)
            grad = task.scaled_grad(z, target_t, scale_t)  # ∂ℓ/∂z · wt/Σwt, × η for plain SGD
            self.backward(net, t, n, grad, inputs, acts, mask)
        bound, anchor = self.request.clip, self.request.anchor
        clipped = None
        gram = self.gram
        gram_form = gram is not None and gram.affine is None and gram.noise is None and self.request.starts is None
        if bound is not None and not math.isinf(bound) and gram_form:
            clipped = self._clip_before_writing(bound)
        if self.gram is not None:
            self.gram.apply(self.whole[0])
        if bound is not None and clipped is None:
            clipped = clip_rows(self.work, anchor, bound)
        return clipped

    def _clip_before_writing(self, bound: float) -> Tensor:
        """Client-level DP on the Gram path: each update Δ_k = w_k − w_global clipped to norm ≤ C before the Gram
        layer's weights are written, so that clipping takes no pass over the chunk's models. ‖Δ_k‖² is the Gram
        layer's part (`_GramFirstLayer.update_square_norms`) plus the other coordinates' (a few, already written;
        the Gram layer's bias still holds b_0); a clipped client's D is scaled by s_k = C/‖Δ_k‖ (its Gram layer
        then ends at W_0 − s_k DᵀX) and its other coordinates moved to w_global + s_k (w_k − w_global). Which
        clients were clipped (c,) bool."""
        assert self.gram is not None
        work, anchor, weight = self.work, self.request.anchor, self.layers[0].weight
        rest = [part for part in (slice(0, weight.start), slice(weight.stop, work.shape[1])) if part.stop > part.start]
        square = self.gram.update_square_norms()
        for part in rest:
            square += (work[:, part] - anchor[part]).square_().sum(1)
        norms = square.sqrt_()
        clipped = norms > bound
        if not bool(clipped.any()):
            return clipped
        scale = torch.where(clipped, bound / norms, torch.ones_like(norms))
        self.gram.grads.mul_(scale.view(-1, 1, 1))
        rows = torch.nonzero(clipped).flatten()
        for part in rest:
            work[rows, part] = torch.lerp(anchor[part], work[rows, part], scale[rows].unsqueeze(1))
        return clipped

    def forward(
        self, net: list[_Weights], t: int, n: int, rows: Tensor, logits_t: Tensor, mask: list[Tensor | None]
    ) -> tuple[Tensor, list[Tensor], list[Tensor]]:
        """Step t's logits z of the first n clients (written into `logits_t`), each layer's input (after dropout)
        and each hidden layer's activation (before dropout)."""
        b, gram = self.b, self.gram
        a = (
            torch.index_select(self.x_all, 0, rows.view(-1), out=self.x_buffer[: n * b]).view(n, b, -1)  # (n, b, d)
            if gram is None
            else self.x_buffer[:0]  # not needed: the first layer's outputs come from the Gram matrices
        )
        inputs, acts = [a], list[Tensor]()
        last = len(self.layers) - 1
        for i, (w, la, m) in enumerate(zip(net, self.layers, mask, strict=True)):
            out = logits_t if i == last else None
            bias = w.bias.value if w.bias is not None else None
            if i == 0 and gram is not None:
                z = gram.outputs(t, n)
                if out is not None:
                    z = out.copy_(z)
            elif bias is not None:
                z = torch.baddbmm(bias, a, w.weight_t, out=out)
            else:
                z = torch.bmm(a, w.weight_t, out=out)
            if self.scales is not None:
                z = z.mul_(self.scales[:n, i]) if i == last else z * self.scales[:n, i]
            if i == last:
                return z, inputs, acts
            a = _FORWARD[la.activation or ""](z)
            acts.append(a)
            inputs.append(a * m if m is not None else a)
            a = inputs[-1]
        raise AssertionError("a model without dense layers")  # `dense_layers` gives at least one

    def backward(
        self,
        net: list[_Weights],
        t: int,
        n: int,
        grad: Tensor,
        inputs: list[Tensor],
        acts: list[Tensor],
        mask: list[Tensor | None],
    ) -> None:
        """Step t's backward pass from the loss gradient at the logits, updating each layer of the first n clients
        (with its weights before the update for the gradient below it; under DP-SGD, every layer's clipped gradient
        and noise first: `_private_gradients`)."""
        step_counts = {k: v[:n].view(n, 1, 1) for k, v in self.counts.items()}
        new_counts: dict[str, Tensor] = {}
        private = self._private_gradients(net, t, n, grad, inputs, acts, mask) if self.dp is not None else None
        for i in range(len(self.layers) - 1, -1, -1):
            w = net[i]
            if self.scales is not None and private is None:  # the gradient at the layer's outputs before their factor
                grad = grad * self.scales[:n, i]
            back = torch.bmm(grad, w.weight.value) if i > 0 and private is None else None  # with W_i before its update
            grad, noise = private[i] if private is not None else (grad, None)
            if i == 0 and self.gram is not None:
                self.gram.record(t, grad, noise, self.noise_scale[:n] if noise is not None else None)
            elif self.optimizer.plain:
                self._sgd_update(w, grad, inputs[i], n, self.frozen[i], noise)
            else:
                step = self._optimizer_update(w, grad, inputs[i], n, step_counts, self.frozen[i], noise)
                new_counts = step or new_counts
            if back is not None:
                grad = self._below(i, back, acts, mask)
        for k, v in new_counts.items():
            self.counts[k][:n] = v.view(n)

    def _below(self, i: int, back: Tensor, acts: list[Tensor], mask: list[Tensor | None]) -> Tensor:
        """The gradient at layer i − 1's outputs from `back`, the gradient at its activations (D_i W_i)."""
        dropped = mask[i - 1]
        if dropped is not None:
            back.mul_(dropped)
        return _BACKWARD[self.layers[i - 1].activation or ""](back, acts[i - 1])

    def _private_gradients(
        self,
        net: list[_Weights],
        t: int,
        n: int,
        grad: Tensor,
        inputs: list[Tensor],
        acts: list[Tensor],
        mask: list[Tensor | None],
    ) -> list[tuple[Tensor, list[Tensor] | None]]:
        """DP-SGD's step t for the first n clients, layer by layer (`fedhet.engine.ghost`): each layer's output
        gradient weighted by its rows' clip factors and batch weights, c_i w_i/b_k (× η for plain SGD), from the
        per-sample gradient D_L = ∂ℓ_i/∂z_i (`grad`) and the D_l below it (one backward pass, before any update);
        and each leaf's standard normal noise ξ (n, ...) (None without noise; × `noise_scale` as it is added)."""
        assert self.dp is not None and self.batches.private is not None
        deltas = [grad]
        for i in range(len(self.layers) - 1, 0, -1):
            deltas.insert(0, self._below(i, torch.bmm(deltas[0], net[i].weight.value), acts, mask))
        a_sq = [
            self.gram.input_square_norms(t, n) if i == 0 and self.gram is not None else a.square().sum(-1)
            for i, a in enumerate(inputs)
        ]
        trained = [(not f[0], len(f) > 1 and not f[1]) for f in self.frozen]
        factor = clip_factors(square_norms(a_sq, deltas, trained), self.dp.clip)
        factor.mul_(self.batches.private[t, self.part][:n]).unsqueeze_(2)
        noise = self._noise(t, n)
        return [(d.mul_(factor), noise[i] if noise is not None else None) for i, d in enumerate(deltas)]

    def _noise(self, t: int, n: int) -> list[list[Tensor]] | None:
        """Step t's standard normal noise ξ of the first n clients (`ghost.draw_noise`) as each layer's leaves' views
        (n, out, in) and (n, 1, out) (× `noise_scale` as it is added); None without noise."""
        if self.draws is None:
            return None
        flat = draw_noise(self.clients[:n], self.request.seed, self.request.round_, self.noise_key, t, self.draws[:n])
        flat = flat.to(self.work.device)
        parts = [((la.weight, la.shape), (la.bias, (1, la.shape[0]))) for la in self.layers]
        return [[flat[:, where].view(n, *shape) for where, shape in leaves if where is not None] for leaves in parts]

    def _sgd_update(
        self, w: _Weights, grad: Tensor, a: Tensor, n: int, frozen: list[bool], noise: list[Tensor] | None = None
    ) -> None:
        """w ← w − η Σ_j ∇T_j(w) − η ∇F(w) for each trained leaf, the data part fused into the products and the
        affine terms' part into two in-place passes, w ← ρw + ηκA; DP-SGD's `noise` ξ adds −η σ ξ/b_k."""
        for leaf, still in zip(w.leaves(), frozen, strict=True):
            if still:
                continue
            extra = term_gradient(leaf.value, leaf.general_terms()) if self.general else None  # at w before
            if self.decay is not None:
                leaf.value.mul_(self.decay[:n])
            if self.pull is not None:
                leaf.value.addcmul_(self.pull[:n], leaf.anchor)
            if extra is not None:
                leaf.value.addcmul_(self.rate[:n], extra, value=-1.0)
        if not frozen[0]:
            w.weight.value.baddbmm_(grad.mT, a, alpha=-1.0)
        if w.bias is not None and not frozen[1]:
            w.bias.value.baddbmm_(self.ones[:n], grad, alpha=-1.0)
        if noise is not None:
            for leaf, xi, still in zip(w.leaves(), noise, frozen, strict=True):
                if not still:
                    leaf.value.addcmul_(xi, self.noise_scale[:n])

    def _optimizer_update(
        self,
        w: _Weights,
        grad: Tensor,
        a: Tensor,
        n: int,
        counts: dict[str, Tensor],
        frozen: list[bool],
        noise: list[Tensor] | None = None,
    ) -> dict[str, Tensor]:
        """The client optimiser's step on each trained leaf from its data gradient (with DP-SGD's `noise` ξ:
        + σ ξ/b_k); the new counts (empty when every leaf is frozen)."""
        data_grads = [torch.bmm(grad.mT, a)]
        if w.bias is not None:
            data_grads.append(torch.bmm(self.ones[:n], grad))
        if noise is not None:
            data_grads = [g.addcmul_(xi, self.noise_scale[:n]) for g, xi in zip(data_grads, noise, strict=True)]
        new_counts: dict[str, Tensor] = {}
        for leaf, g, still in zip(w.leaves(), data_grads, frozen, strict=True):
            if still:
                continue
            d = leaf_direction(g, leaf.value, leaf.terms)
            new, after = self.optimizer.step(leaf.value, d, {**leaf.state, **counts}, self.rate[:n])
            leaf.value.copy_(new)
            for k, v in leaf.state.items():
                v.copy_(after[k])
            new_counts = {k: after[k] for k in counts}
        return new_counts


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
