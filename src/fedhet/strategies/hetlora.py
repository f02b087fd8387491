"""HetLoRA (Cho, Manoel, Joshi, Sim, Dimitriadis: "Heterogeneous LoRA for Federated Fine-tuning of On-Device
Foundation Models", EMNLP 2024): LoRA adapters of a different rank on every client, aggregated by zero-padding.

The server holds adapters B ∈ R^{out×r_max}, A ∈ R^{r_max×in} on every adapted layer. Distribution (rank
truncation): client k of rank r_k receives B_{:, :r_k} and A_{:r_k, :} (`LocalPlan.masks`, as FlexLoRA's
`fedhet.strategies.flexlora.LoRARanks`). Aggregation (zero-padding, sparsity-weighted): each client's factors are
padded with zeros to r_max and averaged,

    B ← Σ_k p_k [B_k 0],   A ← Σ_k p_k [A_k; 0],   p_k = S_k / Σ_j S_j,   S_k = ‖B_k A_k‖_F,

so a client whose update carries more weight (a denser, larger ΔW_k) counts more, and a rank slot is shrunk by the
clients that did not train it. S_k is computed for every adapted layer on its own (the paper writes one ΔW_k; per
layer is the natural reading for a model of many layers). ``weighting: samples`` (or ``uniform``) uses FedAvg's
p_k instead: with every client at the same rank it is FedAvg of the factors. The server step is
w ← server_step(w, w − w_new), so any server optimiser composes (the base parameters' direction is 0: they stay).

Not implemented: the paper's rank self-pruning (a local regulariser on the last ranks' norms, and the server's
pruning of a client's rank when they shrink).
"""

from __future__ import annotations

from typing import ClassVar, Literal

import torch
from pydantic import Field
from torch import Tensor

from fedhet.engine.functional import FlatModel
from fedhet.engine.plan import LocalResult
from fedhet.models.lora import LORA_A, LORA_B
from fedhet.strategies.base import STRATEGIES
from fedhet.strategies.fedavg import fedavg_weights
from fedhet.strategies.flexlora import LoRARanks


def sparsity_weights(a: Tensor, b: Tensor) -> Tensor:
    """p_k = ‖B_k A_k‖_F / Σ_j ‖B_j A_j‖_F for factors A (m, r, in), B (m, out, r); uniform if every norm is 0."""
    norms = torch.linalg.matrix_norm(b.double() @ a.double())
    total = norms.sum()
    return norms / total if bool(total > 0) else torch.full_like(norms, 1.0 / len(norms))


def hetlora_aggregate(
    model: FlatModel, layers: list[str], global_params: Tensor, params: Tensor, p: Tensor | None
) -> Tensor:
    """The next global model: every adapted layer's factors the p-weighted sum of the clients' zero-padded factors
    (`params` (m, P): each zero beyond its rank), with HetLoRA's sparsity weights per layer when `p` is None; the
    rest kept."""
    out = global_params.clone()
    shapes = dict(zip(model.names, model.shapes, strict=True))
    for layer in layers:
        a_at, b_at = model.slices[f"{layer}.{LORA_A}"], model.slices[f"{layer}.{LORA_B}"]
        a = params[:, a_at].reshape(len(params), *shapes[f"{layer}.{LORA_A}"])
        b = params[:, b_at].reshape(len(params), *shapes[f"{layer}.{LORA_B}"])
        weights = sparsity_weights(a, b) if p is None else p.double()
        out[a_at] = (weights @ params[:, a_at].double()).to(out.dtype)
        out[b_at] = (weights @ params[:, b_at].double()).to(out.dtype)
    return out


@STRATEGIES.register
class HetLoRA(LoRARanks):
    """LoRA adapters of a rank per client, truncated from the global ones; zero-padded, sparsity-weighted average
    (Cho et al. 2024)."""

    name: ClassVar[str] = "hetlora"
    description: ClassVar[str] = "HetLoRA: LoRA of a rank per client, zero-padded sparsity-weighted average (Cho 2024)"
    weighting: Literal["sparsity", "samples", "uniform"] = Field(  # type: ignore[assignment]
        "sparsity", description="p_k: sparsity (‖B_k A_k‖_F, the paper's), samples or uniform (FedAvg's)"
    )

    def aggregate(self, round_: int, global_params: Tensor, result: LocalResult) -> Tensor:
        p = None
        if self.weighting != "sparsity":
            p = fedavg_weights(self.ctx.train_sizes[result.clients], self.weighting)
        new = hetlora_aggregate(self.ctx.engine.model, self._lora, global_params, result.params, p)
        return self.server_step(global_params, global_params - new)
