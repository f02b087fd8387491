"""Local SGD for convolutional networks with hand-written backward passes: the `conv` backend.

The papers' image models (LeNet-5, the FedAvg CNNs, FedMGDA+'s CNNs, VGG-16) are chains of Conv2d, pooling,
element-wise activations, local response or group normalisation, dropout, a flatten and Linear layers under
cross-entropy. For those, `batched_loss_grad` computes every client's gradient of its weighted mean mini-batch
loss (`functional.FlatModel.batch_loss`) for a chunk of clients at once, layer by layer, without autograd:

    forward   a_l = f_l(a_{l−1}; w_l) for every layer (saving what its backward needs), logits z = a_L
    loss      ℓ_k = Σ_r wt_r ℓ(z_r, y_r) / max(Σ_r wt_r, 1)  (ℓ: the task's loss, cross-entropy for classification)
    backward  g_L = ∂ℓ/∂z · wt / max(Σ wt, 1) (cross-entropy: softmax(z) − onehot(y)),  g_{l−1} = (∂f_l/∂a_{l−1})ᵀ g_l,
              ∇w_l = (∂f_l/∂w_l)ᵀ g_l  (handed to a `Sink`: a gradient buffer, or an SGD step in place)

Convolutions run per client with torch's own kernels (`aten.convolution` and `aten.convolution_backward`,
oneDNN on a CPU: 20–50 GFLOP/s on one core for LeNet-5's 6- and 16-channel layers, 115–125 for the FedAvg
CNN's 64-channel one, at a batch of 10); grouped convolutions over the clients, unfold + batched products
and the transposed convolution were measured as fast or slower (docs/performance.md). The backward pass of a
convolution of one input channel (the first layer of the MNIST-shaped CNNs) runs on torch's direct kernel
(im2col and one matrix product), 2–4× faster there (`Conv.direct_backward`). Linear layers are
batched matrix products over the chunk's clients, as in the dense backend; pooling, activations and dropout
run once for the whole chunk; local response and group normalisation use the vector-Jacobian product of
torch's own functions. Every backward formula is the one autograd uses, so the numbers equal the other
backends' up to float rounding (tested on every CNN of the zoo).

`train_conv` runs a `LocalPlan` (the step of `fedhet.engine.step`: the data gradient plus the objective's
parameter terms, through the client optimiser) chunk by chunk on worker threads of one core each (like the
dense backend: a chunk runs all its steps while its weights are in cache), on the mini-batches of
`batches.local_batches` and with dropout masks seeded per (round, step) as the other backends seed them. With
plain SGD each layer's weights are updated as soon as the backward pass is done with them (`sgd_step_`); other
optimisers step the flat weights from a gradient buffer. Data terms and local rules need autograd: the
engine's `auto` then picks another backend, and `backend: conv` refuses them.
"""

from __future__ import annotations

import math
import weakref
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from typing import Any, Protocol

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from fedhet.engine.batches import gather_rows, local_batches
from fedhet.engine.dense import _map
from fedhet.engine.functional import FlatModel
from fedhet.engine.memory import fit_chunk, training_bytes
from fedhet.engine.objective import Aligned, ParameterTerm
from fedhet.engine.request import Trained, TrainRequest
from fedhet.engine.step import aligned, leaf_direction, term_gradient
from fedhet.engine.task import CLASSIFICATION, Task
from fedhet.models.fedmgda import ChannelDropout
from fedhet.models.zoo import ConvClassifier, Flatten, ToImage
from fedhet.seeding import derive_seed

aten = torch.ops.aten
CHUNK_BYTES = 24 << 20  # a chunk's weights and activations (see `default_chunk`)
LARGE_LINEAR = 1 << 18  # Linear layers of this many weights and more run client by client
# A local step's activations (and gradients) per client above which `auto` trains a CNN on `sequential` instead.
# Measured on 2 cores (docs/performance.md), seconds per round of 4 clients, conv vs sequential: the FEMNIST CNN
# (1.17 MB a sample) 0.92 vs 1.11 at a batch of 100, 2.46 vs 2.84 at 300, 3.43 vs 2.90 at 600, 6.83 vs 4.31 at
# 1000 (the full batch of FedMGDA+'s FEMNIST table); VGG-16 (6.9 MB a sample) at 64: 19.3 vs 19.7.
MAX_STEP_BYTES = 512 << 20

Ctx = Any  # what a layer's forward keeps for its backward


class Layer(Protocol):
    """One layer of a `ConvSpec`: forward on a chunk's activations (n, b, *shape), backward to its input."""

    def forward(self, a: Tensor, params: Tensor, mask: Tensor | None) -> tuple[Tensor, Ctx]: ...

    def backward(self, g: Tensor, ctx: Ctx, params: Tensor, sink: Sink, need_input: bool) -> Tensor | None: ...


class Sink:
    """Where a backward pass puts the parameter gradients: into a (c, P) buffer `grad`, or (`grad` None) straight
    into the weights as an SGD step, w ← w − e − g, where the backward then carries η·∇ and `e` (c, P) is η_k
    times the parameter terms' gradient Σ_j ∇T_j(w) at the step's starting weights (None without terms).
    Layers hand each gradient over after their last use of the weights it changes."""

    def __init__(
        self,
        params: Tensor,
        grad: Tensor | None = None,
        extra: Tensor | None = None,
        frozen: Callable[[slice], bool] | None = None,
    ) -> None:
        self.params, self.grad, self.extra = params, grad, extra
        self.frozen = frozen  # an SGD step leaves the parameters at the slices it says are frozen

    def _skip(self, where: slice) -> bool:
        return self.grad is None and self.frozen is not None and self.frozen(where)

    def rows(self, where: slice, value: Tensor) -> None:
        """The gradient (n, …) of one parameter of every client."""
        if self._skip(where):
            return
        value = value.reshape(len(value), -1)
        if self.grad is not None:
            self.grad[:, where].copy_(value)
            return
        w = self.params[:, where]
        if self.extra is not None:
            w.sub_(self.extra[:, where])
        w.sub_(value)

    def row(self, i: int, where: slice, value: Tensor) -> None:
        """The gradient of one parameter of client i."""
        if self._skip(where):
            return
        if self.grad is not None:
            self.grad[i, where].copy_(value.reshape(-1))
            return
        w = self.params[i, where]
        if self.extra is not None:
            w.sub_(self.extra[i, where])
        w.sub_(value.reshape(-1))

    def outer_row(self, i: int, where: slice, shape: tuple[int, int], d_t: Tensor, a: Tensor) -> None:
        """Client i's Linear weight gradient d_t (out, b) · a (b, in), in place."""
        if self._skip(where):
            return
        if self.grad is not None:
            torch.mm(d_t, a, out=self.grad[i, where].view(shape))
            return
        w = self.params[i, where].view(shape)
        if self.extra is not None:
            w.sub_(self.extra[i, where].view(shape))
        w.addmm_(d_t, a, alpha=-1.0)

    def outer(self, where: slice, shape: tuple[int, int], d_t: Tensor, a: Tensor) -> None:
        """A Linear weight's gradient d_tᵀ-style batched product d_t (n, out, b) · a (n, b, in), in place."""
        n = len(a)
        if self._skip(where):
            return
        if self.grad is not None:
            self.grad[:, where].view(n, *shape).baddbmm_(d_t, a, beta=0.0)
            return
        w = self.params[:, where].view(n, *shape)
        if self.extra is not None:
            w.sub_(self.extra[:, where].view(n, *shape))
        w.baddbmm_(d_t, a, alpha=-1.0)


def _pair(v: int | tuple[int, ...] | str) -> tuple[int, int]:
    if isinstance(v, str):
        raise TypeError("string padding")
    return (v, v) if isinstance(v, int) else (int(v[0]), int(v[-1]))


def _merge(a: Tensor) -> Tensor:
    """(n, b, C, H, W) as (n·b, C, H, W) (a view)."""
    return a.reshape(a.shape[0] * a.shape[1], *a.shape[2:])


@dataclass(frozen=True)
class Conv:
    """`nn.Conv2d` (zero padding): each client's convolution with its own weights, torch's kernels."""

    weight: slice
    bias: slice | None
    shape: tuple[int, int, int, int]  # (out, in / groups, kh, kw)
    stride: tuple[int, int]
    padding: tuple[int, int]
    dilation: tuple[int, int]
    groups: int

    def _w(self, params: Tensor, i: int) -> tuple[Tensor, Tensor | None]:
        w = params[i, self.weight].view(self.shape)
        return w, params[i, self.bias] if self.bias is not None else None

    def forward(self, a: Tensor, params: Tensor, mask: Tensor | None) -> tuple[Tensor, Ctx]:
        outs = []
        for i in range(len(a)):
            w, b = self._w(params, i)
            outs.append(
                aten.convolution(a[i], w, b, self.stride, self.padding, self.dilation, False, (0, 0), self.groups)
            )
        return torch.stack(outs), a

    def direct_backward(self, a: Tensor) -> bool:
        """Whether the backward pass runs on torch's direct kernel (im2col and one matrix product) instead of
        oneDNN: for a convolution of one input channel on a CPU, where oneDNN's weight gradient is slow; layers of
        more input channels are as fast or faster on oneDNN (`benchmarks/conv_kernels.py`; the measurements:
        docs/performance.md, "Why the engine's constants")."""
        return (
            self.shape[1] == 1
            and self.groups == 1
            and self.dilation == (1, 1)
            and a.device.type == "cpu"
            and a.dtype == torch.float32
        )

    def backward(self, g: Tensor, ctx: Ctx, params: Tensor, sink: Sink, need_input: bool) -> Tensor | None:
        a: Tensor = ctx
        inputs = []
        bias = [self.shape[0]] if self.bias is not None else None
        mask = (need_input, True, self.bias is not None)
        direct = self.direct_backward(a)
        for i in range(len(a)):
            w, _ = self._w(params, i)
            if direct:
                gi, gw, gb = aten._slow_conv2d_backward(g[i], a[i], w, self.shape[2:], self.stride, self.padding, mask)
            else:
                gi, gw, gb = aten.convolution_backward(
                    g[i], a[i], w, bias, self.stride, self.padding, self.dilation, False, (0, 0), self.groups, mask
                )
            sink.row(i, self.weight, gw)
            if self.bias is not None:
                sink.row(i, self.bias, gb)
            inputs.append(gi)
        return torch.stack(inputs) if need_input else None


@dataclass(frozen=True)
class Linear:
    """`nn.Linear` on (n, b, in): batched matrix products over the chunk's clients, or client by client with
    2-D products for large weights (where a single-client `bmm` or an in-place `baddbmm_` is slower than `addmm`
    / `addmm_`: docs/performance.md, "Why the engine's constants")."""

    weight: slice
    bias: slice | None
    shape: tuple[int, int]  # (out, in)

    @property
    def per_client(self) -> bool:
        return self.shape[0] * self.shape[1] >= LARGE_LINEAR

    def forward(self, a: Tensor, params: Tensor, mask: Tensor | None) -> tuple[Tensor, Ctx]:
        n = len(a)
        w = params[:, self.weight].view(n, *self.shape)
        bias = params[:, self.bias].view(n, 1, -1) if self.bias is not None else None
        if self.per_client:
            out = a.new_empty(n, a.shape[1], self.shape[0])
            for i in range(n):
                if bias is None:
                    torch.mm(a[i], w[i].T, out=out[i])
                else:
                    torch.addmm(bias[i], a[i], w[i].T, out=out[i])
            return out, a
        return (torch.bmm(a, w.mT) if bias is None else torch.baddbmm(bias, a, w.mT)), a

    def backward(self, g: Tensor, ctx: Ctx, params: Tensor, sink: Sink, need_input: bool) -> Tensor | None:
        a: Tensor = ctx
        n = len(a)
        w = params[:, self.weight].view(n, *self.shape)
        out = None
        if need_input:
            out = torch.stack([g[i] @ w[i] for i in range(n)]) if self.per_client else torch.bmm(g, w)
        if self.per_client:
            for i in range(n):
                sink.outer_row(i, self.weight, self.shape, g[i].T, a[i])
        else:
            sink.outer(self.weight, self.shape, g.mT, a)
        if self.bias is not None:
            sink.rows(self.bias, g.sum(1))
        return out


def _relu_backward(g: Tensor, out: Tensor) -> Tensor:
    return aten.threshold_backward(g, out, 0)


_FORWARD: dict[str, Callable[[Tensor], Tensor]] = {"relu": torch.relu, "tanh": torch.tanh, "sigmoid": torch.sigmoid}
_BACKWARD: dict[str, Callable[[Tensor, Tensor], Tensor]] = {
    "relu": _relu_backward,
    "tanh": aten.tanh_backward,
    "sigmoid": aten.sigmoid_backward,
}


@dataclass(frozen=True)
class Activation:
    """ReLU, Tanh or Sigmoid; the backward from the output, as autograd computes it."""

    kind: str

    def forward(self, a: Tensor, params: Tensor, mask: Tensor | None) -> tuple[Tensor, Ctx]:
        out = _FORWARD[self.kind](a)
        return out, out

    def backward(self, g: Tensor, ctx: Ctx, params: Tensor, sink: Sink, need_input: bool) -> Tensor | None:
        return _BACKWARD[self.kind](g, ctx)


@dataclass(frozen=True)
class MaxPool:
    """`nn.MaxPool2d`; the gradient goes to the first maximum of each window, as torch's backward sends it.

    Windows of 2×2 with stride 2 on even-sized maps (every pooling layer of the zoo) are two element-wise
    maxima of strided views, over pairs of columns and then of rows: the first maximum of a window in torch's
    row-major order is the first of its row pair's maxima, taken in the first row that holds it (torch's forward
    kernel does not vectorise; docs/performance.md, "Why the engine's constants"). Other windows use torch's
    kernel."""

    kernel: tuple[int, int]
    stride: tuple[int, int]
    padding: tuple[int, int]
    dilation: tuple[int, int]
    ceil_mode: bool

    def _pairs(self, a: Tensor) -> bool:
        simple = self.padding == (0, 0) and self.dilation == (1, 1) and not self.ceil_mode
        even = a.shape[-1] % 2 == 0 and a.shape[-2] % 2 == 0
        return simple and self.kernel == (2, 2) and self.stride == (2, 2) and even

    def forward(self, a: Tensor, params: Tensor, mask: Tensor | None) -> tuple[Tensor, Ctx]:
        if self._pairs(a):
            cols = torch.maximum(a[..., 0::2], a[..., 1::2])  # (…, H, W/2)
            return torch.maximum(cols[..., 0::2, :], cols[..., 1::2, :]), (a, cols)
        out, index = aten.max_pool2d_with_indices(
            _merge(a), self.kernel, self.stride, self.padding, self.dilation, self.ceil_mode
        )
        return out.view(*a.shape[:2], *out.shape[1:]), (a, index)

    def backward(self, g: Tensor, ctx: Ctx, params: Tensor, sink: Sink, need_input: bool) -> Tensor | None:
        a, saved = ctx
        if self._pairs(a):  # masks as floats: 1 where the first of a pair is the (first) maximum
            cols: Tensor = saved
            first_row = torch.ge(cols[..., 0::2, :], cols[..., 1::2, :]).float()
            g_cols = g.new_empty(*g.shape[:-1], 2, g.shape[-1])  # (…, H/2, 2, W/2)
            torch.mul(g, first_row, out=g_cols[..., 0, :])
            torch.sub(g, g_cols[..., 0, :], out=g_cols[..., 1, :])
            g_cols = g_cols.view(cols.shape)
            first_col = torch.ge(a[..., 0::2], a[..., 1::2]).float()
            out = g.new_empty(*cols.shape, 2)  # (…, H, W/2, 2)
            torch.mul(g_cols, first_col, out=out[..., 0])
            torch.sub(g_cols, out[..., 0], out=out[..., 1])
            return out.view(a.shape)
        out = aten.max_pool2d_with_indices_backward(
            _merge(g), _merge(a), self.kernel, self.stride, self.padding, self.dilation, self.ceil_mode, saved
        )
        return out.view(a.shape)


@dataclass(frozen=True)
class AvgPool:
    """`nn.AvgPool2d`: torch's kernel and its backward."""

    kernel: tuple[int, int]
    stride: tuple[int, int]
    padding: tuple[int, int]
    ceil_mode: bool
    count_include_pad: bool
    divisor: int | None

    def _args(self) -> tuple[Any, ...]:
        return (self.kernel, self.stride, self.padding, self.ceil_mode, self.count_include_pad, self.divisor)

    def forward(self, a: Tensor, params: Tensor, mask: Tensor | None) -> tuple[Tensor, Ctx]:
        out = aten.avg_pool2d(_merge(a), *self._args())
        return out.view(*a.shape[:2], *out.shape[1:]), a

    def backward(self, g: Tensor, ctx: Ctx, params: Tensor, sink: Sink, need_input: bool) -> Tensor | None:
        a: Tensor = ctx
        return aten.avg_pool2d_backward(_merge(g), _merge(a), *self._args()).view(a.shape)


@dataclass(frozen=True)
class LocalResponseNorm:
    """`nn.LocalResponseNorm` over each sample's channels; the backward is the vector-Jacobian product of
    torch's own function."""

    size: int
    alpha: float
    beta: float
    k: float

    def forward(self, a: Tensor, params: Tensor, mask: Tensor | None) -> tuple[Tensor, Ctx]:
        def fn(x: Tensor) -> Tensor:
            return F.local_response_norm(x, self.size, self.alpha, self.beta, self.k)

        out, vjp = torch.func.vjp(fn, _merge(a))[:2]
        return out.view(a.shape), vjp

    def backward(self, g: Tensor, ctx: Ctx, params: Tensor, sink: Sink, need_input: bool) -> Tensor | None:
        (out,) = ctx(_merge(g))
        return out.view(g.shape)


@dataclass(frozen=True)
class GroupNorm:
    """`nn.GroupNorm`: torch's normalisation of each sample, then each client's own scale and shift."""

    groups: int
    eps: float
    weight: slice | None
    bias: slice | None

    def forward(self, a: Tensor, params: Tensor, mask: Tensor | None) -> tuple[Tensor, Ctx]:
        def fn(x: Tensor) -> Tensor:
            return F.group_norm(x, self.groups, None, None, self.eps)

        normed, vjp = torch.func.vjp(fn, _merge(a))[:2]
        normed = normed.view(a.shape)
        n, channels = len(a), a.shape[2]
        lead = (n, 1, channels) + (1,) * (a.dim() - 3)
        out = normed
        if self.weight is not None:
            out = out * params[:, self.weight].view(lead)
        if self.bias is not None:
            out = out + params[:, self.bias].view(lead)
        return out, (normed, vjp, lead)

    def backward(self, g: Tensor, ctx: Ctx, params: Tensor, sink: Sink, need_input: bool) -> Tensor | None:
        normed, vjp, lead = ctx
        dims = (1, *range(3, g.dim()))
        g_normed = g * params[:, self.weight].view(lead) if self.weight is not None else g
        if self.bias is not None:
            sink.rows(self.bias, g.sum(dims))
        if self.weight is not None:
            sink.rows(self.weight, (g * normed).sum(dims))
        if not need_input:
            return None
        (out,) = vjp(_merge(g_normed))
        return out.view(g.shape)


@dataclass(frozen=True)
class Dropout:
    """`nn.Dropout` (element-wise) or fedhet's `ChannelDropout` (whole channels): multiplies by the step's
    mask, the same for every client (drawn by `dropout_masks`)."""

    p: float
    channels: bool

    def forward(self, a: Tensor, params: Tensor, mask: Tensor | None) -> tuple[Tensor, Ctx]:
        if mask is None:
            return a, None
        m = mask.view(*mask.shape, *(1,) * (a.dim() - 1 - mask.dim())) if self.channels else mask
        return a * m, m

    def backward(self, g: Tensor, ctx: Ctx, params: Tensor, sink: Sink, need_input: bool) -> Tensor | None:
        return g if ctx is None else g * ctx


@dataclass(frozen=True)
class Reshape:
    """A reshape of every sample (the image view of flat inputs, a flatten before the head)."""

    shape: tuple[int, ...]

    def forward(self, a: Tensor, params: Tensor, mask: Tensor | None) -> tuple[Tensor, Ctx]:
        return a.reshape(*a.shape[:2], *self.shape), a.shape

    def backward(self, g: Tensor, ctx: Ctx, params: Tensor, sink: Sink, need_input: bool) -> Tensor | None:
        return g.reshape(ctx)


@dataclass(frozen=True)
class ConvSpec:
    """A model as a chain of layers, with each layer's per-sample output shape (to draw dropout masks)."""

    layers: tuple[Layer, ...]
    shapes: tuple[tuple[int, ...], ...]  # per-sample output shape of each layer
    input_shape: tuple[int, ...]
    size: int  # P, the number of parameters
    task: Task = CLASSIFICATION  # the loss at the outputs (`fedhet.engine.task`)

    @property
    def has_dropout(self) -> bool:
        return any(isinstance(la, Dropout) and la.p > 0 for la in self.layers)


def _leaves(module: nn.Module) -> list[nn.Module]:
    if isinstance(module, ConvClassifier):
        return [module.to_image, *_leaves(module.features), Flatten(), *_leaves(module.head)]
    if isinstance(module, nn.Sequential):
        return [leaf for child in module for leaf in _leaves(child)]
    return [module]


def _layer(leaf: nn.Module, where: dict[int, slice], used: list[slice]) -> Layer | None:
    """The layer for one leaf module (None when not supported); the slices of its parameters go to `used`."""

    def at(p: Tensor | None) -> slice | None:
        if p is None:
            return None
        used.append(where[id(p)])
        return where[id(p)]

    if isinstance(leaf, nn.Conv2d):
        if leaf.padding_mode != "zeros" or isinstance(leaf.padding, str):
            return None
        w = at(leaf.weight)
        assert w is not None
        shape = tuple(leaf.weight.shape)
        return Conv(w, at(leaf.bias), shape, _pair(leaf.stride), _pair(leaf.padding), _pair(leaf.dilation), leaf.groups)  # type: ignore[arg-type]
    if isinstance(leaf, nn.Linear):
        w = at(leaf.weight)
        assert w is not None
        return Linear(w, at(leaf.bias), (leaf.out_features, leaf.in_features))
    if isinstance(leaf, nn.ReLU | nn.Tanh | nn.Sigmoid):
        return Activation(type(leaf).__name__.lower())
    if isinstance(leaf, nn.MaxPool2d):
        if leaf.return_indices:
            return None
        stride = leaf.stride if leaf.stride is not None else leaf.kernel_size
        return MaxPool(
            _pair(leaf.kernel_size), _pair(stride), _pair(leaf.padding), _pair(leaf.dilation), bool(leaf.ceil_mode)
        )
    if isinstance(leaf, nn.AvgPool2d):
        stride = leaf.stride if leaf.stride is not None else leaf.kernel_size
        return AvgPool(
            _pair(leaf.kernel_size),
            _pair(stride),
            _pair(leaf.padding),
            bool(leaf.ceil_mode),
            bool(leaf.count_include_pad),
            leaf.divisor_override,
        )
    if isinstance(leaf, nn.LocalResponseNorm):
        return LocalResponseNorm(leaf.size, leaf.alpha, leaf.beta, leaf.k)
    if isinstance(leaf, nn.GroupNorm):
        return GroupNorm(leaf.num_groups, leaf.eps, at(leaf.weight), at(leaf.bias))
    if isinstance(leaf, ChannelDropout):
        return Dropout(float(leaf.dropout.p), channels=True)
    if type(leaf) is nn.Dropout:
        return Dropout(float(leaf.p), channels=False)
    return None


_SPECS: weakref.WeakKeyDictionary[nn.Module, dict[tuple[int, ...] | None, ConvSpec | None]]
_SPECS = weakref.WeakKeyDictionary()  # a model's spec, found once (resolving the backend asks every round)


def conv_layers(model: FlatModel, input_shape: Sequence[int] | None = None) -> ConvSpec | None:
    """`model` as a `ConvSpec`, or None when the conv backend cannot run it.

    Qualify: `fedhet.models.zoo.ConvClassifier` networks and `nn.Sequential` chains of Conv2d (zero padding),
    MaxPool2d, AvgPool2d, ReLU/Tanh/Sigmoid, LocalResponseNorm, GroupNorm, Dropout, `ChannelDropout`, Flatten
    and Linear, with at least one convolution. A model that does not start with `ToImage` needs
    `input_shape` (one sample's shape)."""
    key = tuple(input_shape) if input_shape is not None else None
    known = _SPECS.setdefault(model.module, {})
    if key not in known:
        known[key] = _find_spec(model, input_shape)
    spec = known[key]
    return spec if spec is None or spec.task == model.task else replace(spec, task=model.task)


def _find_spec(model: FlatModel, input_shape: Sequence[int] | None) -> ConvSpec | None:
    module = model.module
    if model.stat_names:
        return None  # running statistics (batch norm): the autograd backends
    where: dict[int, slice] = {}
    start = 0
    for p, n in zip(module.parameters(), model.numels, strict=True):
        where[id(p)] = slice(start, start + n)
        start += n
    leaves = _leaves(module)
    used: list[slice] = []
    if leaves and isinstance(leaves[0], ToImage):
        shape: tuple[int, ...] = tuple(leaves[0].shape)
        layers: list[Layer] = [Reshape(shape)]
        leaves = leaves[1:]
    elif input_shape is not None:
        shape, layers = tuple(input_shape), []
    else:
        return None
    shapes: list[tuple[int, ...]] = [shape] * len(layers)
    x = torch.zeros(1, *shape)
    training = module.training
    try:  # a dry run on one sample gives each layer's output shape
        for leaf in leaves:
            if isinstance(leaf, Flatten | nn.Flatten):
                if isinstance(leaf, nn.Flatten) and (leaf.start_dim != 1 or leaf.end_dim != -1):
                    return None
                layer: Layer | None = Reshape((x[0].numel(),))
            else:
                layer = _layer(leaf, where, used)
            if layer is None:
                return None
            with torch.no_grad():
                x = leaf.eval()(x) if not isinstance(layer, Reshape) else x.reshape(1, *layer.shape)
            layers.append(layer)
            shapes.append(tuple(x.shape[1:]))
    except RuntimeError:
        return None
    finally:
        module.train(training)
    covered = sum(sl.stop - sl.start for sl in used)
    if covered != model.size or not any(isinstance(la, Conv) for la in layers) or len(shapes[-1]) != 1:
        return None
    return ConvSpec(tuple(layers), tuple(shapes), shape, model.size, model.task)


def dropout_masks(spec: ConvSpec, batch: int, seed: int, round_: int, step: int, stream: str) -> list[Tensor | None]:
    """Step `step`'s dropout mask of every layer (None for the others), drawn as the sequential backend's
    modules draw them after its seeding: the same for every client."""
    if not spec.has_dropout:
        return [None] * len(spec.layers)
    torch.manual_seed(derive_seed(seed, f"dropout/{stream}", round_, step))
    masks: list[Tensor | None] = []
    for i, la in enumerate(spec.layers):
        if isinstance(la, Dropout) and la.p > 0:
            shape = spec.shapes[i][:1] if la.channels else spec.shapes[i]
            masks.append(F.dropout(torch.ones(batch, *shape), la.p, training=True))
        else:
            masks.append(None)
    return masks


def _logit_grad(task: Task, z: Tensor, y: Tensor, wt: Tensor) -> tuple[Tensor, Tensor]:
    """Per-client weighted mean loss of outputs z (n, b, out) and its gradient with respect to z."""
    share = wt / wt.sum(1, keepdim=True).clamp_min(1.0)
    losses, g = task.loss_grad(z, y, share)
    return g, (losses * share).sum(1)


def _step(
    spec: ConvSpec,
    params: Tensor,
    x: Tensor,
    y: Tensor,
    wt: Tensor,
    sink: Sink,
    masks: Sequence[Tensor | None] | None,
    rate: Tensor | None = None,
    scales: Tensor | None = None,
) -> Tensor:
    """Forward, loss and backward of a chunk; gradients (times `rate` (n,) when given) go to `sink`. `scales`
    (n, L): the outputs of the L Conv/Linear layers times a factor per client (`LocalPlan.scales`)."""
    n, b = wt.shape
    a = x.reshape(n, b, *spec.input_shape)
    masks = masks if masks is not None else [None] * len(spec.layers)
    saved, factors = [], list[Tensor | None]()
    for layer, mask in zip(spec.layers, masks, strict=True):
        a, ctx = layer.forward(a, params, mask)
        saved.append(ctx)
        factor = None
        if scales is not None and isinstance(layer, Conv | Linear):
            factor = scales[:, sum(f is not None for f in factors)].view(n, *(1,) * (a.dim() - 1))
            a = a * factor
        factors.append(factor)
    g, loss = _logit_grad(spec.task, a, y, wt)
    if rate is not None:
        g.mul_(rate.view(n, 1, 1))
    first = next(i for i, la in enumerate(spec.layers) if isinstance(la, Conv | Linear | GroupNorm))
    for i in range(len(spec.layers) - 1, first - 1, -1):
        factor = factors[i]
        if factor is not None:  # the gradient at the layer's outputs before their factor
            g = g * factor
        out = spec.layers[i].backward(g, saved[i], params, sink, need_input=i > first)
        if out is not None:
            g = out
    return loss


def loss_grad_into(
    spec: ConvSpec,
    params: Tensor,
    x: Tensor,
    y: Tensor,
    wt: Tensor,
    grad: Tensor,
    masks: Sequence[Tensor | None] | None = None,
    scales: Tensor | None = None,
) -> Tensor:
    """`batched_loss_grad` on one thread, writing the gradient into `grad` (c, P); returns the losses (c,)."""
    return _step(spec, params, x, y, wt, Sink(params, grad), masks, scales=scales)


def sgd_step_(
    spec: ConvSpec,
    params: Tensor,
    x: Tensor,
    y: Tensor,
    wt: Tensor,
    lr: Tensor,
    extra: Tensor | None = None,
    masks: Sequence[Tensor | None] | None = None,
    frozen: Callable[[slice], bool] | None = None,
    scales: Tensor | None = None,
) -> Tensor:
    """One plain SGD step in place, w ← w − η_k Σ_j ∇T_j(w) − η_k ∇ℓ_k(w) (`extra`: η_k Σ_j ∇T_j(w) (c, P) at the
    weights before the step, or None), each layer's weights updated as soon as the backward pass is done with
    them (no gradient buffer: half the memory traffic of the large layers), except the parameters `frozen` says
    are frozen. Returns the losses ℓ_k(w) before the step (c,)."""
    return _step(spec, params, x, y, wt, Sink(params, None, extra, frozen), masks, rate=lr, scales=scales)


def batched_loss_grad(
    spec: ConvSpec,
    params: Tensor,
    x: Tensor,
    y: Tensor,
    wt: Tensor,
    masks: Sequence[Tensor | None] | None = None,
    workers: int = 1,
) -> tuple[Tensor, Tensor]:
    """∇ and value of each client's weighted mean cross-entropy on its mini-batch:
    ℓ_k(w_k) = Σ_r wt_kr ce(f(w_k; x_kr), y_kr) / max(Σ_r wt_kr, 1) (padded rows have weight 0).

    params (c, P), x (c, b, *sample shape), y (c, b), wt (c, b); `masks` from `dropout_masks` (None: no
    dropout, as in evaluation). Returns (grad (c, P), loss (c,)). With `workers` > 1 (on a CPU) the clients are
    split among that many threads of one core each."""
    c = len(params)
    grad = torch.empty_like(params)
    loss = torch.empty(c, device=params.device)
    workers = max(1, min(workers, c)) if params.device.type == "cpu" else 1
    part = -(-c // workers) if c else 1

    def run(lo: int) -> None:
        sl = slice(lo, lo + part)
        loss[sl] = loss_grad_into(spec, params[sl], x[sl], y[sl], wt[sl], grad[sl], masks)

    _map(run, range(0, c, part), workers)
    return grad, loss


def step_bytes(spec: ConvSpec, batch: int) -> int:
    """A client's activations and their gradients in one local step of `batch` samples, in bytes."""
    return 4 * 2 * batch * sum(math.prod(shape) for shape in spec.shapes)


def conv_is_faster(spec: ConvSpec, batch: int) -> bool:
    """Whether `conv` beats `sequential` at this batch size on a CPU: clients side by side on one core each win
    while a step's activations are small; past `MAX_STEP_BYTES` two clients' activations at once lose to one
    client on every core (`sequential`)."""
    return step_bytes(spec, batch) <= MAX_STEP_BYTES


def default_chunk(spec: ConvSpec, clients: int, workers: int, batch: int) -> int:
    """Clients per chunk: an equal share of the cohort per worker, but at most `CHUNK_BYTES` of weights and
    activations. Larger chunks share each batched op's Python and dispatch cost among more clients; past one or
    two clients of a large model they stop paying (its convolutions and large Linear layers run per client
    anyway (`benchmarks/conv_chunks.py`; docs/performance.md, "Why the engine's constants")."""
    share = -(-clients // max(workers, 1))
    return max(1, min(share, CHUNK_BYTES // (4 * spec.size + step_bytes(spec, batch))))


def train_conv(request: TrainRequest, spec: ConvSpec) -> Trained:
    """Run the request's local steps, d ← ∇F_k(w; ξ) + Σ_j ∇T_j(w), w ← optimiser(w, d) (`fedhet.engine.step`),
    for its clients, each with its own number of steps and learning rate. Returns (params (m, P), mean loss over
    the steps taken (m,), nan for 0, the cohort's optimiser state after the steps).

    Plain SGD runs fused (`sgd_step_`: the terms' gradient at the step's starting weights, then each layer
    updated during the backward pass); other optimisers get the gradient in a buffer and step the flat
    weights. Objectives that need autograd (`Cohort.autograd_only`) are not for this backend. Frozen parameters
    (``request.frozen``) are skipped by the fused step and kept by the optimiser's.

    Clients run in order of decreasing steps (those still training at step t are a prefix of their chunk);
    chunks of ``request.chunk_size`` clients (default `default_chunk`) run all their steps on ``request.workers``
    threads (default: torch's intra-op thread count) of one core each; elsewhere than on a CPU, one chunk at a
    time."""
    data, plan, cohort, seed, round_ = request.data, request.plan, request.cohort, request.seed, request.round_
    if cohort.autograd_only:
        raise ValueError("the conv backend cannot run data terms or local rules (they need autograd)")
    m, dev = request.size, request.anchor.device
    losses = torch.full((m,), float("nan"), device=dev)
    opt_state = {k: v.clone() for k, v in cohort.opt_state.items()}
    if m == 0 or int(plan.steps.max()) == 0:
        return request.start(), losses, opt_state
    order = torch.argsort(plan.steps, descending=True, stable=True)
    steps = plan.steps[order]
    index, weight = local_batches(data.offsets, plan.clients[order], steps, plan.batch_size, seed, round_, plan.stream)
    index, weight = index.to(dev), weight.to(dev)
    drawn = [dropout_masks(spec, plan.batch_size, seed, round_, t, plan.stream) for t in range(int(steps[0]))]
    masks = [[mk.to(dev) if mk is not None else None for mk in step] for step in drawn]
    lr = plan.lr[order].to(dev)
    scales = plan.scales[order].to(dev) if plan.scales is not None else None
    workers = 1 if dev.type != "cpu" else request.workers or torch.get_num_threads()
    if request.chunk_size > 0:
        chunk = request.chunk_size
    else:  # cache-sized on the CPU, the whole cohort on a GPU; never more than half the free memory holds
        per_client = training_bytes(spec.size, plan.batch_size, sum(math.prod(shape) for shape in spec.shapes))
        chunk = fit_chunk(m, per_client, dev)
        chunk = min(chunk, default_chunk(spec, m, workers, plan.batch_size)) if dev.type == "cpu" else chunk
    work = torch.empty(m, len(request.anchor), device=dev)  # the clients' weights in training order
    totals = torch.zeros(m, device=dev)
    remaining = steps.tolist()
    dev_order = order.to(dev)
    skip = request.is_frozen if request.frozen is not None else None

    def run(lo: int) -> None:
        hi = min(lo + chunk, m)
        ids = dev_order[lo:hi]
        w = request.start_into(work[lo:hi], ids)
        mine = cohort.rows(ids)
        terms = aligned(mine.parameter_terms, request.anchor, lambda v: v, lambda v: v)
        state = {k: v[ids] for k, v in opt_state.items()}  # copies: the chunk's own optimiser state
        grad = None if cohort.optimizer.plain else torch.empty_like(w)
        for t in range(remaining[lo]):
            k = next((j for j in range(lo, hi) if remaining[j] <= t), hi) - lo  # clients still training
            rows = index[lo : lo + k, t]
            x = gather_rows(data.x, rows)
            rate = lr[lo : lo + k]
            factors = scales[lo : lo + k] if scales is not None else None
            now = _head(terms, k)
            if grad is None:
                extra = term_gradient(w[:k], now)  # at the weights before the step (may be a term's own tensor)
                if extra is not None:
                    extra = extra * rate.view(k, 1)
                wt = weight[lo : lo + k, t]
                loss = sgd_step_(spec, w[:k], x, data.y[rows], wt, rate, extra, masks[t], skip, factors)
            else:
                wt = weight[lo : lo + k, t]
                loss = loss_grad_into(spec, w[:k], x, data.y[rows], wt, grad[:k], masks[t], factors)
                _optimizer_step(request, w[:k], leaf_direction(grad[:k], w[:k], now), state, rate)
            totals[lo : lo + k] += loss
        for name, v in state.items():
            opt_state[name][ids] = v

    _map(run, range(0, m, chunk), workers)
    if bool((order == torch.arange(m)).all()):
        params = work  # already in the plan's order (equal steps): no second (m, P) tensor
    else:
        params = torch.empty_like(work)
        params[dev_order] = work
    tau = steps.to(dev)
    losses[dev_order] = torch.where(tau > 0, totals / tau.clamp_min(1), torch.nan)
    return params, losses, opt_state


def _head(terms: list[tuple[ParameterTerm, Aligned]], k: int) -> list[tuple[ParameterTerm, Aligned]]:
    """The terms' aligned tensors of a chunk's first k clients (client rows (c, P) cut to (k, P))."""
    return [(t, Aligned(a.start, a.server, {n: v[:k] for n, v in a.client.items()})) for t, a in terms]


def _optimizer_step(request: TrainRequest, w: Tensor, d: Tensor, state: dict[str, Tensor], rate: Tensor) -> None:
    """The client optimiser's step on the flat weights w (k, P) of a chunk's first k clients, in place, with
    their rows of the chunk's optimiser `state` ("count" states (c,) broadcast as (k, 1)); frozen coordinates keep
    their weights and state."""
    k = len(w)
    optimizer = request.cohort.optimizer
    kinds = optimizer.state_kinds()
    now = {n: v[:k] if kinds[n] == "param" else v[:k].view(k, 1) for n, v in state.items()}
    new, after = optimizer.step(w, d, now, rate.view(k, 1))
    w.copy_(request.keep_frozen(new, w))
    for n, v in after.items():
        kept = request.keep_frozen(v, now[n]) if kinds[n] == "param" else v
        state[n][:k] = kept.reshape(state[n][:k].shape)
