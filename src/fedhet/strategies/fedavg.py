"""FedAvg (McMahan et al., AISTATS 2017, Algorithm 1), with a server learning rate (Reddi et al. 2021)."""

from __future__ import annotations

from typing import ClassVar, Literal

from torch import Tensor

from fedhet.engine.plan import LocalResult
from fedhet.strategies.base import STRATEGIES, Strategy, weighted_update


def fedavg_weights(sizes: Tensor, weighting: Literal["samples", "uniform"]) -> Tensor:
    """p_k = n_k / Σ n_j over the cohort ("samples") or 1/m ("uniform")."""
    w = sizes.double() if weighting == "samples" else sizes.new_ones(sizes.shape).double()
    return (w / w.sum()).float()


@STRATEGIES.register
class FedAvg(Strategy):
    """w ← w − η_g Σ_k p_k (w − w_k), with p_k by sample count or uniform."""

    name: ClassVar[str] = "fedavg"
    description: ClassVar[str] = "federated averaging (McMahan et al. 2017), sample- or uniform-weighted"
    weighting: Literal["samples", "uniform"] = "samples"

    def aggregate(self, round_: int, global_params: Tensor, result: LocalResult) -> Tensor:
        p = self.aggregation_weights(round_, result)
        return self.server_step(global_params, weighted_update(result.updates(global_params), p))

    def aggregation_weights(self, round_: int, result: LocalResult) -> Tensor:
        return fedavg_weights(self.ctx.train_sizes[result.clients], self.weighting)
