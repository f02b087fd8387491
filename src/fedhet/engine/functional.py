"""A model seen as a function of one flat parameter vector, so clients' models stack into one (m, P) tensor."""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor, nn
from torch.func import functional_call

from fedhet.engine.task import CLASSIFICATION, Task


@dataclass(frozen=True)
class VmapProbe:
    """What vmap made of a model (`fedhet.engine.vmap_probe.probe_vmap`): an error (it cannot run it), or a slow
    per-sample fallback for an operation it has no batching rule for (it runs, with the same numbers, but no faster
    than a loop)."""

    failure: str | None = None
    slow: str | None = None


class FlatModel:
    """Wraps an `nn.Module`; parameters live outside it as a flat float32 vector of length `size`. `task` says what
    its outputs mean (the loss at the outputs, how predictions are scored: `fedhet.engine.task`)."""

    def __init__(self, module: nn.Module, task: Task = CLASSIFICATION) -> None:
        self.module = module
        self.task = task
        named = list(module.named_parameters())
        self.names = [n for n, _ in named]
        self.shapes = [p.shape for _, p in named]
        self.numels = [p.numel() for _, p in named]
        self.size = sum(self.numels)
        ends = torch.tensor(self.numels).cumsum(0).tolist() if self.numels else []
        self.slices = {n: slice(end - k, end) for n, k, end in zip(self.names, self.numels, ends, strict=True)}
        dropout = nn.modules.dropout._DropoutNd  # Dropout, Dropout1d/2d/3d, AlphaDropout, ...
        self.has_dropout = any(isinstance(m, dropout) and m.p > 0 for m in module.modules())
        with torch.no_grad():
            self._initial = torch.cat([p.detach().reshape(-1) for p in module.parameters()]).clone()
        self._bound: tuple[Tensor, Tensor] | None = None
        self.vmap_probe: VmapProbe | None = None  # what torch.func.vmap makes of the model (the engine probes it)

    def bound_buffers(self) -> tuple[Tensor, Tensor]:
        """Flat (params, grads) buffers that the module's own parameters and gradients are views of.

        Writing into the params buffer changes the module in place, and ``loss.backward()`` accumulates
        straight into the grads buffer: the sequential backend trains with plain autograd and no copies.
        """
        if self._bound is None:
            flat, grads = self.initial_params(), torch.zeros(self.size)
            for p, view, gview in zip(
                self.module.parameters(), self.unflatten(flat).values(), self.unflatten(grads).values(), strict=True
            ):
                p.data = view
                p.grad = gview
            self._bound = (flat, grads)
        return self._bound

    def initial_params(self) -> Tensor:
        """The module's parameters at construction (its initialisation) as a new flat vector."""
        return self._initial.clone()

    def unflatten(self, flat: Tensor) -> dict[str, Tensor]:
        """Views of `flat` shaped like the module's parameters (works under vmap)."""
        chunks = torch.split(flat, self.numels)
        return {n: c.view(s) for n, c, s in zip(self.names, chunks, self.shapes, strict=True)}

    def forward(self, params: dict[str, Tensor], x: Tensor) -> Tensor:
        """The model's outputs with the parameters of a dictionary (works under vmap)."""
        return functional_call(self.module, params, (x,))

    def logits(self, flat: Tensor, x: Tensor) -> Tensor:
        return functional_call(self.module, self.unflatten(flat), (x,))

    def sample_losses(self, flat: Tensor, x: Tensor, y: Tensor) -> Tensor:
        """Per-sample losses (the task's: cross-entropy for classification)."""
        return self.task.loss(self.logits(flat, x), y)

    def module_batch_loss(self, x: Tensor, y: Tensor, weight: Tensor) -> Tensor:
        """`batch_loss` with the module's own (bound) parameters, for plain autograd."""
        losses = self.task.loss(self.module(x), y)
        return (losses * weight).sum() / weight.sum().clamp_min(1.0)

    def batch_loss(self, flat: Tensor, x: Tensor, y: Tensor, weight: Tensor) -> Tensor:
        """Weighted mean loss of a (possibly padded) mini-batch; padded rows have weight 0."""
        return (self.sample_losses(flat, x, y) * weight).sum() / weight.sum().clamp_min(1.0)
