"""A model seen as a function of one flat parameter vector, so clients' models stack into one (m, P) tensor.

The vector holds the parameters and, after them, the running statistics of normalisation layers that keep them
(BatchNorm, InstanceNorm with ``track_running_stats=True``: ``running_mean``, ``running_var`` and
``num_batches_tracked``, the last as a float): they are model state that training changes (in the forward pass,
not by gradient steps) and the server treats by the run's statistics policy (docs/batchnorm.md). Every strategy,
checkpoint and personal part sees them as coordinates of the vector.
"""

from __future__ import annotations

import functools
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor, nn
from torch.func import functional_call

from fedhet.engine.task import CLASSIFICATION, Task
from fedhet.models.base import Statistics
from fedhet.models.exits import MultiExit, ensemble, exit_losses

_STAT_BUFFERS = ("running_mean", "running_var", "num_batches_tracked")


_NormBase = nn.modules.batchnorm._NormBase


def tracking_norms(module: nn.Module) -> list[tuple[str, _NormBase]]:
    """The normalisation layers of `module` that keep running statistics (BatchNorm, SyncBatchNorm, InstanceNorm
    with ``track_running_stats=True``), by name."""
    return [(n, m) for n, m in module.named_modules() if isinstance(m, _NormBase) and m.track_running_stats]


def _statistics(module: nn.Module) -> list[tuple[str, Tensor]]:
    """The running-statistics buffers of `module`, by name (in the order of the modules)."""
    out = []
    for prefix, norm in tracking_norms(module):
        for leaf in _STAT_BUFFERS:
            buffer = norm._buffers.get(leaf)
            if buffer is not None:
                out.append((f"{prefix}.{leaf}" if prefix else leaf, buffer))
    return out


@dataclass(frozen=True)
class VmapProbe:
    """What vmap made of a model (`fedhet.engine.vmap_probe.probe_vmap`): an error (it cannot run it), or a slow
    per-sample fallback for an operation it has no batching rule for (it runs, with the same numbers, but no faster
    than a loop)."""

    failure: str | None = None
    slow: str | None = None


def masked_batch_norm(m: nn.modules.batchnorm._BatchNorm, holder: list[Tensor | None], x: Tensor) -> Tensor:
    """`m`'s training forward pass on a batch whose rows have the weights ``holder[0]`` (1: a sample, 0: padding):
    normalised by the mean and (biased) variance of the weight-1 rows, over the batch and spatial dimensions, and
    the running statistics updated with them (the variance unbiased), as `torch.nn.functional.batch_norm` does on
    the weight-1 rows alone. Works under vmap and `torch.func.grad` (no Python numbers from tensors)."""
    weight = holder[0]
    if not m.training or weight is None:
        return type(m).forward(m, x)
    dims = [0, *range(2, x.dim())]
    shape = [1, -1] + [1] * (x.dim() - 2)
    rows = weight.to(x.dtype).reshape(-1, *[1] * (x.dim() - 1))
    count = (weight.sum() * x[0, 0].numel()).clamp_min(1.0)  # a client without samples: zeros, not NaN
    mean = (x * rows).sum(dims) / count
    centred = x - mean.reshape(shape)
    var = (centred.square() * rows).sum(dims) / count
    y = centred * torch.rsqrt(var.reshape(shape) + m.eps)
    if m.affine:
        y = y * m.weight.reshape(shape) + m.bias.reshape(shape)
    if m.track_running_stats and m.running_mean is not None and m.running_var is not None:
        assert m.num_batches_tracked is not None
        m.num_batches_tracked.add_(1)
        factor = 1.0 / m.num_batches_tracked if m.momentum is None else m.momentum
        unbiased = var * count / (count - 1).clamp_min(1.0)
        m.running_mean.mul_(1 - factor).add_(factor * mean.detach())
        m.running_var.mul_(1 - factor).add_(factor * unbiased.detach())
    return y


class FlatModel:
    """Wraps an `nn.Module`; parameters live outside it as a flat float32 vector of length `size`. `task` says what
    its outputs mean (the loss at the outputs, how predictions are scored: `fedhet.engine.task`).

    ``names``, ``shapes``, ``numels`` and ``slices`` cover the whole vector: the parameters (the first
    ``num_params`` coordinates), then the running statistics (``stat_names``, the slice ``stats``). `statistics`
    is the run's policy for them (docs/batchnorm.md): the engine reads it for ``"recompute"`` (statistics worked
    out from the training data before the global model is scored)."""

    def __init__(self, module: nn.Module, task: Task = CLASSIFICATION, statistics: Statistics = "aggregate") -> None:
        self.module = module
        self.task = task
        self.statistics: Statistics = statistics
        self.exits = module.num_exits if isinstance(module, MultiExit) else 0
        named = list(module.named_parameters())
        buffers = _statistics(module)
        self.num_params = sum(p.numel() for _, p in named)
        # parameters the module freezes (``requires_grad = False``: a LoRA model's base): never trained
        self.frozen = tuple(n for n, p in named if not p.requires_grad)
        self.stat_names = [n for n, _ in buffers]
        self._norms = [m for _, m in tracking_norms(module)]
        self.names = [n for n, _ in named] + self.stat_names
        self.shapes = [p.shape for _, p in named] + [b.shape for _, b in buffers]
        self.numels = [p.numel() for _, p in named] + [b.numel() for _, b in buffers]
        self.size = sum(self.numels)
        self.stats = slice(self.num_params, self.size)
        if self.stat_names:
            module.eval()  # scored with its statistics unless a backend trains it (which sets training mode)
        ends = torch.tensor(self.numels).cumsum(0).tolist() if self.numels else []
        self.slices = {n: slice(end - k, end) for n, k, end in zip(self.names, self.numels, ends, strict=True)}
        dropout = nn.modules.dropout._DropoutNd  # Dropout, Dropout1d/2d/3d, AlphaDropout, ...
        self.has_dropout = any(isinstance(m, dropout) and m.p > 0 for m in module.modules())
        with torch.no_grad():
            values = [p.detach().reshape(-1) for p in module.parameters()]
            values += [b.detach().reshape(-1).float() for _, b in buffers]
            self._initial = torch.cat(values).clone() if values else torch.zeros(0)
        self._bound: tuple[Tensor, Tensor] | None = None
        self._bound_stats: list[Tensor] = []  # the bound module's statistics buffers (`bound_buffers`)
        self._weight: list[Tensor | None] = [None]  # the batch's row weights (`batch_weights`)
        self.vmap_probe: VmapProbe | None = None  # what torch.func.vmap makes of the model (the engine probes it)

    def bound_buffers(self) -> tuple[Tensor, Tensor]:
        """Flat (params, grads) buffers that the module's own parameters and gradients are views of.

        Writing into the params buffer changes the module in place, and ``loss.backward()`` accumulates
        straight into the grads buffer: the sequential backend trains with plain autograd and no copies. The
        running statistics are buffers of their own (`bound_statistics`): a forward pass updates them in place,
        which must not change the version of a tensor autograd saved.
        """
        if self._bound is None:
            flat, grads = self.initial_params(), torch.zeros(self.size)
            for p, view, gview in zip(
                self.module.parameters(), self.unflatten(flat).values(), self.unflatten(grads).values(), strict=False
            ):
                p.data = view
                p.grad = gview
            views = self.unflatten(flat)
            for name in self.stat_names:
                owner, _, leaf = name.rpartition(".")
                buffer = views[name].clone()  # its own memory: one layer's update must not touch another's
                self.module.get_submodule(owner)._buffers[leaf] = buffer
                self._bound_stats.append(buffer)
            self._bound = (flat, grads)
        return self._bound

    def bound_statistics(self) -> Tensor:
        """The bound module's running statistics (`bound_buffers`) as a new flat vector (the ``stats`` coordinates)."""
        self.bound_buffers()
        return torch.cat([b.reshape(-1).float() for b in self._bound_stats]) if self._bound_stats else torch.zeros(0)

    def bind_statistics(self, values: Tensor) -> None:
        """Set the bound module's running statistics from `values` (the vector's ``stats`` coordinates)."""
        self.bound_buffers()
        sizes = [b.numel() for b in self._bound_stats]
        for buffer, value in zip(self._bound_stats, torch.split(values, sizes), strict=True):
            buffer.copy_(value.view(buffer.shape))

    def initial_params(self) -> Tensor:
        """The module's parameters at construction (its initialisation) as a new flat vector."""
        return self._initial.clone()

    def unflatten(self, flat: Tensor) -> dict[str, Tensor]:
        """Views of `flat` shaped like the module's parameters (works under vmap)."""
        chunks = torch.split(flat, self.numels)
        return {n: c.view(s) for n, c, s in zip(self.names, chunks, self.shapes, strict=True)}

    @contextmanager
    def untracked(self) -> Iterator[None]:
        """In training mode, normalisation layers normalise by the batch's statistics and leave their running
        statistics as they are (evaluation mode reads them, as always)."""
        norms = self._norms if self.module.training else []
        for m in norms:
            m.track_running_stats = False
        try:
            yield
        finally:
            for m in norms:
                m.track_running_stats = True

    def forward(self, params: dict[str, Tensor], x: Tensor) -> Tensor:
        """The model's outputs with the parameters (and statistics) of a dictionary, updating no running statistics
        (works under vmap)."""
        with self.untracked():
            return functional_call(self.module, params, (x,))

    def forward_tracked(
        self,
        params: dict[str, Tensor],
        stats: dict[str, Tensor],
        x: Tensor,
        weight: Tensor | None = None,
        exits: bool = False,
    ) -> tuple[Any, dict[str, Tensor]]:
        """The outputs, and the running statistics `stats` (by name) after this batch: new tensors, as a training
        forward pass of the module updates them (works under vmap and `torch.func.grad`). Within `padded_batches`,
        `weight` (the batch's row weights) leaves the padding rows out of batch norm's statistics. With `exits` (a
        multi-exit model) the outputs are the exits' (outputs, held) for `training_losses`."""
        new = {n: t.clone() for n, t in stats.items()}
        with self.batch_weights(weight):
            kwargs = {"exits": True} if exits else None
            return functional_call(self.module, {**params, **new}, (x,), kwargs), new

    def training_losses(self, out: Any, y: Tensor) -> tuple[Tensor, Tensor]:
        """The logits and the per-sample training losses of a training forward pass's outputs `out`: the task's
        loss; for a multi-exit model (`out`: its exits' (outputs, held)) the ensemble and the sum of the task's
        loss over the held exits (`fedhet.models.exits.exit_losses`)."""
        if not self.exits:
            return out, self.task.loss(out, y)
        z, held = out
        return ensemble(z, held), exit_losses(self.task.loss, z, held, y)

    @contextmanager
    def padded_batches(self, padded: bool = True) -> Iterator[None]:
        """While training on mini-batches padded with weight-0 rows (clients with fewer samples than the batch
        size): BatchNorm layers normalise by, and track, the statistics of the rows of weight 1 only
        (`masked_batch_norm`), as a plain loop on the client's unpadded batch does."""
        norms = [m for m in self._norms if isinstance(m, nn.modules.batchnorm._BatchNorm)] if padded else []
        for m in norms:
            m.forward = functools.partial(masked_batch_norm, m, self._weight)  # type: ignore[method-assign]
        try:
            yield
        finally:
            for m in norms:
                del m.forward

    @contextmanager
    def batch_weights(self, weight: Tensor | None) -> Iterator[None]:
        """The row weights `padded_batches` reads in the forward passes within."""
        self._weight[0] = weight
        try:
            yield
        finally:
            self._weight[0] = None

    @property
    def has_representation(self) -> bool:
        """Whether the module gives a representation (``forward(x, representation=True)``: a member of
        ``model: architectures``, `fedhet.models.architectures.Member`)."""
        return bool(getattr(self.module, "gives_representation", False))

    def representation(self, params: dict[str, Tensor], x: Tensor) -> Tensor:
        """The representation z = f(x) before the head, for a module that gives one (works under vmap)."""
        with self.untracked():
            return functional_call(self.module, params, (x,), {"representation": True})

    def logits(self, flat: Tensor, x: Tensor) -> Tensor:
        return self.forward(self.unflatten(flat), x)

    def recompute_statistics(self, flat: Tensor, x: Tensor, batch: int = 1000) -> Tensor:
        """`flat` (P,) with its running statistics worked out afresh from the samples `x`: each normalisation layer's
        cumulative average over batches of `batch` samples of the model's inputs (momentum None, as HeteroFL's
        static batch norm, Diao et al. 2021, §3.2); a new vector. Other layers run in evaluation mode (no dropout)."""
        out = flat.clone()
        if not self.stat_names or len(x) == 0:
            return out
        views = self.unflatten(flat)
        stats = {n: torch.zeros_like(views[n]) for n in self.stat_names}  # replaced by the first batch's
        params = {n: v for n, v in views.items() if n not in stats}
        was_training, momenta = self.module.training, [m.momentum for m in self._norms]
        self.module.eval()
        try:
            for m in self._norms:
                m.train()
                m.momentum = None
            with torch.no_grad():
                for lo in range(0, len(x), batch):
                    functional_call(self.module, {**params, **stats}, (x[lo : lo + batch],))
        finally:
            for m, momentum in zip(self._norms, momenta, strict=True):
                m.momentum = momentum
            self.module.train(was_training)
        out[self.stats] = torch.cat([stats[n].reshape(-1).float() for n in self.stat_names])
        return out

    def sample_losses(self, flat: Tensor, x: Tensor, y: Tensor) -> Tensor:
        """Per-sample losses (the task's: cross-entropy for classification)."""
        return self.task.loss(self.logits(flat, x), y)

    def module_batch_loss(self, x: Tensor, y: Tensor, weight: Tensor) -> Tensor:
        """`batch_loss` with the module's own (bound) parameters, for plain autograd."""
        with self.batch_weights(weight):
            out = self.module(x, exits=True) if self.exits else self.module(x)
        losses = self.training_losses(out, y)[1]
        return (losses * weight).sum() / weight.sum().clamp_min(1.0)

    def batch_loss(self, flat: Tensor, x: Tensor, y: Tensor, weight: Tensor) -> Tensor:
        """Weighted mean loss of a (possibly padded) mini-batch; padded rows have weight 0."""
        return (self.sample_losses(flat, x, y) * weight).sum() / weight.sum().clamp_min(1.0)


def state_dict_of(model: FlatModel, params: Tensor) -> dict[str, Tensor]:
    """The model with flat parameters `params` as a state dict (tied parameters under each of their names, like
    `nn.Module.state_dict`; batch norm's running statistics from `params`, ``num_batches_tracked`` rounded to an
    integer count; other buffers as built)."""
    flat = model.unflatten(params.detach().cpu())
    module = model.module
    canonical = {id(p): n for n, p in module.named_parameters()}
    every = dict(module.named_parameters(remove_duplicate=False))
    out: dict[str, Tensor] = {}
    for key, tensor in module.state_dict(keep_vars=True).items():
        source = flat[canonical[id(every[key])]] if key in every else flat.get(key, tensor)
        if key.endswith("num_batches_tracked") and key in flat:
            source = source.round().long()
        out[key] = source.detach().cpu().clone()
    return out
