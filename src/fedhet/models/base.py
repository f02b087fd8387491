"""Model specifications: a named, typed recipe that builds a plain `torch.nn.Module`.

The engine runs models functionally (`torch.func.functional_call` on a flat parameter vector), so models must
not update buffers in forward (no BatchNorm running statistics). Dropout is allowed: the engine seeds it per
local step so both backends draw the same masks.
"""

from __future__ import annotations

from abc import abstractmethod

from torch import nn

from fedhet.registry import Component, Registry


class ModelSpec(Component):
    """Builds a model for inputs of `input_shape` (per sample) and `num_classes` outputs.

    For token inputs (`input_is_tokens`), `input_shape` is the sequence length and `num_classes` the
    vocabulary size.
    """

    @abstractmethod
    def build(self, input_shape: tuple[int, ...], num_classes: int) -> nn.Module: ...


MODELS: Registry[ModelSpec] = Registry("model")
