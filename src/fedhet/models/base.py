"""Model specifications: a named, typed recipe that builds a plain `torch.nn.Module`.

The engine runs models functionally (`torch.func.functional_call` on a flat parameter vector). Buffers a forward
pass updates must be normalisation layers' running statistics (BatchNorm; the engine carries them as model state,
docs/batchnorm.md); other buffers keep their built values. Dropout is allowed: the engine seeds it per local step so
both backends draw the same masks.
"""

from __future__ import annotations

from abc import abstractmethod
from typing import Literal

from pydantic import Field, SerializerFunctionWrapHandler, model_serializer
from torch import nn

from fedhet.registry import Component, Registry


class ModelSpec(Component):
    """Builds a model for inputs of `input_shape` (per sample) and `num_classes` outputs.

    For token inputs (`input_is_tokens`), `input_shape` is the sequence length and `num_classes` the
    vocabulary size.
    """

    @abstractmethod
    def build(self, input_shape: tuple[int, ...], num_classes: int) -> nn.Module: ...

    @model_serializer(mode="wrap")
    def _without_unset_policy(self, handler: SerializerFunctionWrapHandler) -> dict[str, object]:
        """The spec (and a run's identity) as before ``batch_norm`` existed, when the policy is left to the
        algorithm."""
        data: dict[str, object] = handler(self)
        if "batch_norm" in data and data["batch_norm"] is None:
            data.pop("batch_norm")
        return data


MODELS: Registry[ModelSpec] = Registry("model")

Statistics = Literal["aggregate", "local", "recompute"]  # what the server does with running statistics


def batch_norm_field() -> Statistics | None:
    """The ``batch_norm`` field of a model that may have batch norm (docs/batchnorm.md)."""
    return Field(
        None,
        description="running statistics: 'aggregate' (averaged as the parameters are), 'local' (each client's own, "
        "with its BN layers: algorithm fedbn) or 'recompute' (from the training data at evaluation); default: "
        "the algorithm's (fedbn: local, others: aggregate)",
    )
