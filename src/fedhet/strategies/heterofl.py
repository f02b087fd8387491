"""HeteroFL (Diao, Ding, Tarokh, ICLR 2021): clients of different capacities train width slices of one global model.

A client of capacity level r ∈ (0, 1] trains the sub-model made of the first ⌈r·d⌉ units of every hidden layer of
width d (the input and output layers whole; §3.1's static slices), as a masked full model
(`fedhet.strategies.submodels`). Levels are fixed per client (``assignment: fix``) or redrawn for every client each
round (``dynamic``), from ``proportions`` over ``levels`` or an explicit per-client list (``capacities``), seeded.

Aggregation (HeteroFL Eq. 2, with FedAvg's weights p_k): each coordinate j is averaged over the clients whose
sub-model contains it, d_j = Σ_k p_k m_kj (w_j − w_kj) / Σ_k p_k m_kj, and w ← server_step(w, d); a coordinate no
client trained keeps its value (d_j = 0). With every client at level 1 this is FedAvg.

The scaler (§3.2, ``scaler: true``): in training, the output of every sliced layer but the last (its weights and
bias applied, before the activation and before a batch norm: the paper's placement) is divided by the client's
level r, as the paper's code's ``Scaler`` module (``input / rate`` in training mode, the identity in evaluation mode,
for the full model and every level alike): `LocalPlan.scales` carries 1/r per client and layer to the backends.
Where a batch norm follows every scaled layer (the ResNets), the scaler only changes that norm's eps to eps·r² in
training (BN(x/r) normalises by the batch's statistics); without one the factors compound from layer to layer.

Static batch norm (§3.2, sBN): on a model with batch norm the run's statistics policy defaults to ``recompute``
(`fedhet.strategies.fedbn.check_statistics`): training normalises by each batch's statistics, and every level r is
scored with statistics worked out afresh at level r (its masked model's forward pass over every client's training
data, `fedhet.engine.engine.Engine.evaluated`), the global model with the full level's.

Models: MLPs (``model: mlp``), CNNs with or without batch norm (the zoo's, or a sequence of layers; convolutions
sliced by channels) and the zoo's ResNets (``resnet8``, ``resnet18``), not group norm.
"""

from __future__ import annotations

from typing import ClassVar

from pydantic import Field
from torch import Tensor

from fedhet.strategies.base import STRATEGIES
from fedhet.strategies.submodels import (
    SubModels,
    level_name,
    masked_average,
    sliced_layers,
    width_mask,
)

__all__ = ["HeteroFL", "level_name", "masked_average", "scaler_factors", "sliced_layers", "width_mask"]


def scaler_factors(levels: Tensor, layers: int) -> Tensor:
    """(m, L) HeteroFL's scaler: 1/r_k on the outputs of the first L − 1 sliced layers, 1 on the last (the logits)."""
    factors = (1.0 / levels.double()).float().unsqueeze(1).repeat(1, layers)
    factors[:, -1] = 1.0
    return factors


@STRATEGIES.register
class HeteroFL(SubModels):
    """FedAvg of width sub-models: client k trains the slice of its capacity level, each coordinate is averaged
    over the clients that trained it."""

    name: ClassVar[str] = "heterofl"
    description: ClassVar[str] = "HeteroFL: width sub-models by client capacity (Diao et al. 2021), MLPs, CNNs, ResNets"
    scaler: bool = Field(
        True, description="the paper's scaler: hidden layers' outputs divided by the client's level r in training"
    )

    def scales(self, levels: Tensor) -> Tensor | None:
        """1/r on the hidden layers' outputs with the scaler (None without, or where every level is 1)."""
        if not self.scaler or bool((levels == 1).all()):
            return None
        return scaler_factors(levels, len(self._layers))
