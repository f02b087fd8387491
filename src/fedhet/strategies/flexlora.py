"""FlexLoRA (Bai, Chen, Li, Ding, Fan, Li: "Federated Fine-tuning of Large Language Models under Heterogeneous Tasks
and Client Resources", NeurIPS 2024): LoRA adapters of a different rank on every client.

Client k of rank r_k fine-tunes adapters B_k ∈ R^{out×r_k}, A_k ∈ R^{r_k×in} on every adapted layer (the base
model frozen; `fedhet.models.lora`). The server forms each client's full-size LoRA weight and averages them with
data-size weights (the paper's aggregation, §3.2):

    W_g = Σ_k p_k B_k A_k,   p_k = n_k / Σ_j n_j  (over the round's cohort),

and gives client k the rank-r_k truncation of its SVD (the paper's redistribution): with W_g = U Σ Vᵀ,

    B_k = U_{:, :r_k} Σ_{:r_k}^{1/2},   A_k = Σ_{:r_k}^{1/2} V_{:, :r_k}ᵀ   (B_k A_k: the best rank-r_k approximation).

Here one model holds adapters of the largest rank r_max = ``model.lora.rank``, and a client of level ℓ trains the
first r_k = ⌈ℓ · r_max⌉ rows of A and columns of B (the others held at zero: `LocalPlan.masks`); since the
singular values are sorted, the first r_k components of the rank-r_max truncation *are* the rank-r_k truncation,
so the global model stores the rank-r_max truncation of W_g and every client reads its own from it. How Σ is split
between B and A is not fixed by the paper's equations (only the product is); it is split evenly (Σ^{1/2} each).

Reductions: with every client at the same rank r, the round's W_g is FedAvg of the adapters' products
Σ_k p_k B_k A_k (not of the factors), followed by its best rank-r approximation; if r ≥ min(out, in) that
approximation is exact and FlexLoRA *is* FedAvg of the products. The evaluated global model is the rank-r_max
truncation (each level's score, ``test_accuracy_level<ℓ>``, its rank-r_k truncation). The base parameters (and
anything else outside the adapters) keep their values exactly.

Levels, proportions and assignment (``fix``, ``dynamic``, ``system``) are those of the sub-model methods
(`fedhet.strategies.submodels`, docs/capacity.md).
"""

from __future__ import annotations

from collections.abc import Callable, Hashable
from typing import ClassVar

import torch
from pydantic import PrivateAttr
from torch import Tensor

from fedhet.engine.functional import FlatModel
from fedhet.engine.plan import LocalResult
from fedhet.errors import ConfigError
from fedhet.models.lora import LORA_A, LORA_B
from fedhet.strategies.base import STRATEGIES, ServerContext
from fedhet.strategies.fedavg import fedavg_weights
from fedhet.strategies.server import ServerSGD
from fedhet.strategies.submodels import SubModels, kept


def product_average(a: Tensor, b: Tensor, p: Tensor) -> Tensor:
    """W_g = Σ_k p_k B_k A_k for factors A (m, r, in), B (m, out, r) and weights p (m,), in float64."""
    return torch.einsum("k,kor,kri->oi", p.double(), b.double(), a.double())


def truncate(w: Tensor, rank: int) -> tuple[Tensor, Tensor]:
    """(B (out, rank), A (rank, in)) with B A the best rank-`rank` approximation of `w` (SVD, Σ^{1/2} on each
    side); components beyond the rank of `w` are zero."""
    u, s, vh = torch.linalg.svd(w, full_matrices=False)
    k = min(rank, len(s))
    root = s[:k].sqrt()
    b = torch.zeros(w.shape[0], rank, dtype=w.dtype, device=w.device)
    a = torch.zeros(rank, w.shape[1], dtype=w.dtype, device=w.device)
    b[:, :k] = u[:, :k] * root
    a[:k] = root[:, None] * vh[:k]
    return b, a


def lora_layers(model: FlatModel) -> list[str]:
    """The adapted layers (their name prefixes), in the model's order."""
    return [n[: -len(LORA_A) - 1] for n in model.names if n.endswith(f".{LORA_A}")]


def rank_mask(model: FlatModel, layers: list[str], rank: int) -> Tensor:
    """(P,) bool: every coordinate but the adapters' rows of A and columns of B beyond `rank`."""
    mask = torch.ones(model.size, dtype=torch.bool)
    shapes = dict(zip(model.names, model.shapes, strict=True))
    for layer in layers:
        a_name, b_name = f"{layer}.{LORA_A}", f"{layer}.{LORA_B}"
        a = torch.arange(shapes[a_name][0]).unsqueeze(1).expand(shapes[a_name]) < rank
        b = torch.arange(shapes[b_name][1]).unsqueeze(0).expand(shapes[b_name]) < rank
        mask[model.slices[a_name]] = a.flatten()
        mask[model.slices[b_name]] = b.flatten()
    return mask


def flexlora_aggregate(model: FlatModel, layers: list[str], global_params: Tensor, params: Tensor, p: Tensor) -> Tensor:
    """The next global model: every adapted layer's factors replaced by the rank-r_max truncation of
    Σ_k p_k B_k A_k (`params` (m, P): the cohort's models, each zero beyond its rank), the rest kept."""
    out = global_params.clone()
    for layer in layers:
        a_at, b_at = model.slices[f"{layer}.{LORA_A}"], model.slices[f"{layer}.{LORA_B}"]
        shapes = dict(zip(model.names, model.shapes, strict=True))
        a = params[:, a_at].reshape(len(params), *shapes[f"{layer}.{LORA_A}"])
        b = params[:, b_at].reshape(len(params), *shapes[f"{layer}.{LORA_B}"])
        new_b, new_a = truncate(product_average(a, b, p), a.shape[1])
        out[a_at] = new_a.flatten().to(out.dtype)
        out[b_at] = new_b.flatten().to(out.dtype)
    return out


class LoRARanks(SubModels):
    """Clients of a LoRA rank each: a client of level ℓ trains the first ⌈ℓ · r_max⌉ rows of every A and columns of
    every B (the rest held at zero), the global model is scored at every level's rank; the aggregation is the
    method's (FlexLoRA, HetLoRA)."""

    _lora: list[str] = PrivateAttr(default_factory=list)

    def level_masks(self, what: str) -> dict[float, Tensor]:
        """The rank-⌈ℓ · r_max⌉ adapters of every level ℓ (every other coordinate whole)."""
        model = self.ctx.engine.model
        self._lora = lora_layers(model)
        if not self._lora:
            raise ConfigError(
                f"{what} fine-tunes LoRA adapters, and this model has none: give it some "
                "(model: {name: transformer, lora: {rank: 16}})"
            )
        r_max = int(dict(zip(model.names, model.shapes, strict=True))[f"{self._lora[0]}.{LORA_A}"][0])
        return {level: rank_mask(model, self._lora, kept(r_max, level)) for level in self.levels}

    def sub_model(self, round_: int, client: int, level: float) -> tuple[Hashable, Callable[[], Tensor]]:
        """A client of level ℓ trains the rank-⌈ℓ · r_max⌉ adapters (its level's mask, whatever the round)."""
        return level, lambda: self._prefix[level]


@STRATEGIES.register
class FlexLoRA(LoRARanks):
    """LoRA adapters of a rank per client; the server averages the full-size products and gives each client the
    SVD truncation to its rank (Bai et al. 2024)."""

    name: ClassVar[str] = "flexlora"
    description: ClassVar[str] = "FlexLoRA: LoRA of a rank per client, SVD of the averaged products (Bai et al. 2024)"

    def setup(self, ctx: ServerContext) -> None:
        plain = isinstance(self.server_optimizer, ServerSGD) and self.server_optimizer == ServerSGD()
        if not plain or self.server_lr != 1 or ctx.server_schedule is not None:
            raise ConfigError(
                f"algorithm '{self.name}' replaces the adapters by the SVD of the averaged products (their factors "
                "change basis every round): it takes no server optimiser, server_lr or server schedule"
            )
        super().setup(ctx)

    def aggregate(self, round_: int, global_params: Tensor, result: LocalResult) -> Tensor:
        p = fedavg_weights(self.ctx.train_sizes[result.clients], self.weighting)
        return flexlora_aggregate(self.ctx.engine.model, self._lora, global_params, result.params, p)
