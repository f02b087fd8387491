"""Multi-exit models: a classifier (an *exit*) after each block of a network (DepthFL, Kim et al., ICLR 2023).

A `MultiExit` module runs its D blocks in order and applies exit i to the output of block i. Called as usual it
returns the *ensemble* of its exits, the mean of their logits (DepthFL's inference, §3.4), so every evaluation,
metric and strategy sees a model with one output of the usual shape; called with ``exits=True`` it returns the
exits' outputs stacked, (D, B, C), and which exits it holds, (D,). The engine trains a multi-exit model on the sum
of the task's loss at each exit it holds (`exit_losses`; `fedhet.engine.functional.FlatModel`).

An exit whose (last Linear layer's) weight matrix is all zero is *absent*: it is left out of the ensemble and of
the loss. That is how a sub-model without it is written (a mask that zeroes the deeper blocks and their exits:
`fedhet.strategies.depthfl`), and how one exit is scored alone (every other exit zeroed). A trained exit is never
exactly zero.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import ClassVar, cast

import torch
from pydantic import Field
from torch import Tensor, nn

from fedhet.models.base import MODELS, ModelSpec
from fedhet.models.zoo import _ACTIVATIONS, Activation, Flatten, PositiveInt, ToImage, _features, image_shape


def ensemble(z: Tensor, held: Tensor) -> Tensor:
    """(B, C) the mean of the held exits' outputs z (D, B, C), `held` (D,) 1 or 0 (zeros if none is held)."""
    total = torch.tensordot(held.to(z.dtype), z, dims=1)
    return total / held.sum().clamp_min(1.0)


def exit_losses(loss: Callable[[Tensor, Tensor], Tensor], z: Tensor, held: Tensor, y: Tensor) -> Tensor:
    """(B,) Σ_i held_i ℓ(z_i, y) per sample: the task's per-sample loss ℓ summed over the held exits (DepthFL's
    Σ_i L_ce(y, ŷ_i))."""
    per_exit = torch.stack([loss(z[i], y) for i in range(z.shape[0])])  # (D, B)
    return torch.tensordot(held.to(per_exit.dtype), per_exit, dims=1)


def exit_weight(head: nn.Module) -> Tensor:
    """The weight matrix of an exit's last Linear layer: all zero where the exit is absent."""
    return cast(Tensor, [m for m in head.modules() if isinstance(m, nn.Linear)][-1].weight)


class MultiExit(nn.Module):
    """A network of `blocks` with a classifier in `heads` after each (see the module docstring). Subclasses set
    ``stem`` (applied to the input first, e.g. a flattening) and the two lists, of the same length."""

    stem: nn.Module
    blocks: nn.ModuleList
    heads: nn.ModuleList

    @property
    def num_exits(self) -> int:
        return len(self.heads)

    def exit_outputs(self, x: Tensor) -> tuple[Tensor, Tensor]:
        """(D, B, C) every exit's outputs and (D,) 1.0 where the exit is held (its weight is not all zero); runs
        under `torch.func` (no Python value is read from a tensor)."""
        h = self.stem(x)
        outputs = []
        for block, head in zip(self.blocks, self.heads, strict=True):
            h = block(h)
            outputs.append(head(h))
        z = torch.stack(outputs)
        held = torch.stack([torch.ne(exit_weight(head), 0).any() for head in self.heads]).to(z.dtype)
        return z, held

    def forward(self, x: Tensor, exits: bool = False) -> Tensor | tuple[Tensor, Tensor]:
        z, held = self.exit_outputs(x)
        return (z, held) if exits else ensemble(z, held)


class ExitsMLP(MultiExit):
    """An MLP whose hidden layers are the blocks (Linear + activation), each followed by a Linear exit."""

    def __init__(self, features: int, hidden: list[int], classes: int, activation: type[nn.Module]) -> None:
        super().__init__()
        self.stem = Flatten()
        inputs = [features, *hidden[:-1]]
        blocks = (nn.Sequential(nn.Linear(a, b), activation()) for a, b in zip(inputs, hidden, strict=True))
        self.blocks = nn.ModuleList(blocks)
        self.heads = nn.ModuleList(nn.Linear(h, classes) for h in hidden)


@MODELS.register
class MLPExits(ModelSpec):
    """A multi-exit MLP (DepthFL's depth-scalable model, as an MLP): block i is hidden layer i (Linear and the
    activation), exit i a Linear layer from it to the outputs. Its parameters: every block's, then every exit's
    (with one hidden layer it is ``mlp``'s network, parameter for parameter)."""

    name: ClassVar[str] = "mlp_exits"
    description: ClassVar[str] = "Multi-exit MLP: an exit (Linear classifier) after every hidden layer (DepthFL)."

    hidden: list[PositiveInt] = Field(default_factory=lambda: [64, 64, 64, 64], min_length=1)
    activation: Activation = "relu"

    def build(self, input_shape: tuple[int, ...], num_classes: int) -> nn.Module:
        return ExitsMLP(_features(input_shape), list(self.hidden), num_classes, _ACTIVATIONS[self.activation])


class ExitsCNN(MultiExit):
    """A CNN whose blocks are 3×3 convolutions (same padding) with the activation, each followed by a 2×2 max-pool
    while the image is at least 2 pixels wide; exit i averages block i's channels over the image and applies a
    Linear layer to the outputs."""

    def __init__(
        self, shape: tuple[int, int, int], channels: list[int], classes: int, activation: type[nn.Module]
    ) -> None:
        super().__init__()
        self.stem = ToImage(shape)
        side, inputs, blocks = min(shape[1:]), [shape[0], *channels[:-1]], []
        for a, b in zip(inputs, channels, strict=True):
            layers: list[nn.Module] = [nn.Conv2d(a, b, 3, padding=1), activation()]
            if side >= 2:
                layers.append(nn.MaxPool2d(2))
                side //= 2
            blocks.append(nn.Sequential(*layers))
        self.blocks = nn.ModuleList(blocks)
        self.heads = nn.ModuleList(
            nn.Sequential(nn.AdaptiveAvgPool2d(1), Flatten(), nn.Linear(c, classes)) for c in channels
        )


@MODELS.register
class CNNExits(ModelSpec):
    """A multi-exit CNN (DepthFL's depth-scalable model, small): block i a 3×3 convolution of ``channels[i]``
    channels, the activation and a 2×2 max-pool (while the image is 2 pixels wide or more), exit i a global average
    pool and a Linear layer to the outputs. Images (C, H, W), (H, W) or flat square images."""

    name: ClassVar[str] = "cnn_exits"
    description: ClassVar[str] = "Multi-exit CNN: 3x3 conv blocks, an exit (avg-pool + Linear) after each (DepthFL)."

    channels: list[PositiveInt] = Field(default_factory=lambda: [16, 16, 32, 32], min_length=1)
    activation: Activation = "relu"

    def build(self, input_shape: tuple[int, ...], num_classes: int) -> nn.Module:
        shape = image_shape(input_shape, self.name)
        return ExitsCNN(shape, list(self.channels), num_classes, _ACTIVATIONS[self.activation])
