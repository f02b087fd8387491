"""FedGH (Yi, Yu, Wang, Lv, ACM MM 2023): clients of any architecture share a global header trained on the server
from their class prototypes.

Each client i keeps its feature extractor (the body, `fedhet.engine.personal` ``"body"``; with ``model:
architectures`` each client its own architecture) and receives the global header θ (the head, dim → C, the same
shape for every architecture). In round t it replaces its head by θ^t, trains body and head on its data (cross-
entropy), and sends the local prototype of each class it holds (its mean representation, eq. 4 of FedProto),
computed on its whole training data with its trained body. The server trains θ on the pairs (C_i^{(j)}, j) of the
round's clients by ``header_steps`` full-batch gradient steps of the mean cross-entropy

    θ ← θ − η_h ∇_θ (1/n) Σ_{(i, j)} CE(θ(C_i^{(j)}), j)          (η_h: ``header_lr``)

and sends it to every client (the header of every architecture: the same numbers). A client's model is its body
with the global header (personalised accuracy). The paper's server trains θ with mini-batch SGD over the pairs;
here the steps are full-batch (deterministic, and the same numbers on every run). The first round's clients start
from their architectures' initial heads (the header of the first member after that).
"""

from __future__ import annotations

from typing import ClassVar

import torch
import torch.nn.functional as F
from pydantic import Field, PrivateAttr
from torch import Tensor

from fedhet.engine.personal import Personal
from fedhet.engine.plan import LocalResult
from fedhet.strategies.base import STRATEGIES, ServerContext
from fedhet.strategies.fedproto import SharesPrototypes, architecture_engine

PERSONAL = Personal("fedgh", ("body",))


def prototype_pairs(sums: Tensor, counts: Tensor) -> tuple[Tensor, Tensor]:
    """The local prototypes (n, d) of every (client, class) with samples, and their classes (n,), from the sums
    (m, C, d) and numbers (m, C) of representations per class."""
    held = counts > 0
    prototypes = sums[held] / counts[held].unsqueeze(-1)
    classes = torch.nonzero(held)[:, 1]
    return prototypes, classes


def train_header(
    weight: Tensor, bias: Tensor, prototypes: Tensor, classes: Tensor, lr: float, steps: int
) -> tuple[Tensor, Tensor]:
    """θ = (W, b) after `steps` full-batch gradient steps of the mean cross-entropy of W z + b on the pairs."""
    w, b = weight.clone().requires_grad_(True), bias.clone().requires_grad_(True)
    for _ in range(steps if len(classes) else 0):
        loss = F.cross_entropy(prototypes @ w.T + b, classes)
        gw, gb = torch.autograd.grad(loss, (w, b))
        with torch.no_grad():
            w -= lr * gw
            b -= lr * gb
    return w.detach(), b.detach()


@STRATEGIES.register
class FedGH(SharesPrototypes):
    """Personal bodies of any architecture, one global header trained by the server on their prototypes."""

    name: ClassVar[str] = "fedgh"
    description: ClassVar[str] = "FedGH: a global header trained on the clients' class prototypes (Yi et al. 2023)"
    header_lr: float = Field(0.1, gt=0, description="η_h: the server's learning rate for the global header")
    header_steps: int = Field(100, ge=0, le=100_000, description="the server's gradient steps on the header a round")

    personal: ClassVar[Personal] = PERSONAL
    _heads: list[tuple[slice, slice]] = PrivateAttr(default_factory=list)  # each member's head (weight, bias)

    def setup(self, ctx: ServerContext) -> None:
        super().setup(ctx)
        self._heads = architecture_engine(ctx, self.name).heads

    def header(self, params: Tensor) -> tuple[Tensor, Tensor]:
        """θ = (W (C, d), b (C,)): the first member's head in `params` (every member's, after the first round)."""
        weight, bias = self._heads[0]
        return params[weight].view(len(params[bias]), -1), params[bias]

    def aggregate(self, round_: int, global_params: Tensor, result: LocalResult) -> Tensor:
        """The header trained on the round's prototypes, written into every member's head."""
        prototypes, classes = prototype_pairs(*self.round_prototypes(result))
        weight, bias = train_header(*self.header(global_params), prototypes, classes, self.header_lr, self.header_steps)
        out = global_params.clone()
        for w, b in self._heads:
            out[w], out[b] = weight.reshape(-1), bias
        return out
