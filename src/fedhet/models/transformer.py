"""A small decoder-only transformer for next-token prediction, with optional low-rank adapters (`fedhet.models.lora`).

Tokens ``(B, L)`` → token embedding + learned position embedding → `layers` pre-norm blocks (causal multi-head
self-attention, then a GELU MLP of width ``4·d_model``, each with a residual connection; Vaswani et al. 2017,
in GPT-2's pre-norm arrangement) → layer norm → a linear read-out of the last position's logits. Attention is
written with plain tensor operations (Linear layers ``q``, ``k``, ``v``, ``o``, then ``fc1``, ``fc2`` in the MLP,
``out`` for the read-out), so it runs on the sequential and vectorised backends alike and LoRA can adapt any of
them by name.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Annotated, ClassVar

import torch
import torch.nn.functional as F
from pydantic import Field, field_validator, model_validator
from torch import Tensor, nn

from fedhet.errors import ConfigError
from fedhet.models.base import MODELS, ModelSpec
from fedhet.models.lora import LoRA, add_lora, load_base

PositiveInt = Annotated[int, Field(gt=0)]


class Block(nn.Module):
    """x + attention(LN(x)), then x + MLP(LN(x)); causal attention of `heads` heads."""

    def __init__(self, d: int, heads: int) -> None:
        super().__init__()
        self.heads = heads
        self.ln1, self.ln2 = nn.LayerNorm(d), nn.LayerNorm(d)
        self.q, self.k, self.v, self.o = (nn.Linear(d, d) for _ in range(4))
        self.fc1, self.fc2 = nn.Linear(d, 4 * d), nn.Linear(4 * d, d)

    def attention(self, x: Tensor) -> Tensor:
        b, n, d = x.shape
        h = self.heads

        def split(t: Tensor) -> Tensor:
            return t.reshape(b, n, h, d // h).transpose(1, 2)  # (B, h, L, d/h)

        q, k, v = split(self.q(x)), split(self.k(x)), split(self.v(x))
        scores = q @ k.transpose(-1, -2) / math.sqrt(d // h)
        causal = torch.ones(n, n, dtype=torch.bool, device=x.device).tril()
        weights = torch.softmax(scores.masked_fill(~causal, float("-inf")), dim=-1)
        return self.o((weights @ v).transpose(1, 2).reshape(b, n, d))

    def forward(self, x: Tensor) -> Tensor:
        x = x + self.attention(self.ln1(x))
        return x + self.fc2(F.gelu(self.fc1(self.ln2(x))))


class TransformerNet(nn.Module):
    """Embeddings → blocks → layer norm → read-out of the last position (module doc)."""

    def __init__(self, vocab: int, length: int, d: int, layers: int, heads: int) -> None:
        super().__init__()
        self.embedding = nn.Embedding(vocab, d)
        self.position = nn.Parameter(torch.zeros(length, d))
        nn.init.normal_(self.position, std=0.02)
        self.blocks = nn.Sequential(*(Block(d, heads) for _ in range(layers)))
        self.norm = nn.LayerNorm(d)
        self.out = nn.Linear(d, vocab)

    def forward(self, x: Tensor) -> Tensor:
        z = self.embedding(x) + self.position[: x.shape[1]]
        return self.out(self.norm(self.blocks(z))[:, -1])


@MODELS.register
class Transformer(ModelSpec):
    """A small causal transformer for next-token prediction (tokens ``(B, L)``, logits of the next token), with
    optional LoRA adapters (``lora: {rank, alpha, targets}``: the base weights frozen, only the adapters trained)
    and optional base weights (``base``: a state dict file of the same transformer without adapters)."""

    name: ClassVar[str] = "transformer"
    description: ClassVar[str] = "small causal transformer for next-token prediction; optional LoRA adapters"

    d_model: PositiveInt = Field(48, le=4096, description="width of the embeddings and of every block")
    layers: PositiveInt = Field(2, le=64, description="transformer blocks")
    heads: PositiveInt = Field(4, le=64, description="attention heads (must divide d_model)")
    lora: LoRA | None = Field(None, description="low-rank adapters: {rank, alpha, targets}; the base frozen")
    base: str | None = Field(None, description="a .pt state dict of this transformer without adapters to start from")

    @field_validator("base")
    @classmethod
    def _absolute(cls, value: str | None) -> str | None:
        """An existing file as an absolute path (a run folder's config.yaml then works from anywhere)."""
        if value is not None and Path(value).expanduser().is_file():
            return str(Path(value).expanduser().resolve())
        return value

    @model_validator(mode="after")
    def _heads_divide(self) -> Transformer:
        if self.d_model % self.heads:
            raise ValueError(f"heads ({self.heads}) must divide d_model ({self.d_model})")
        return self

    def build(self, input_shape: tuple[int, ...], num_classes: int) -> nn.Module:
        if len(input_shape) != 1:
            raise ConfigError(f"model '{self.name}' needs token sequences (L,); got input shape {input_shape}")
        module = TransformerNet(num_classes, input_shape[0], self.d_model, self.layers, self.heads)
        what = f"model '{self.name}'"
        if self.base is not None:
            load_base(module, self.base, what)
        if self.lora is not None:
            add_lora(module, self.lora, what)
        return module
