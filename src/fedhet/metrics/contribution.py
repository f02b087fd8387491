"""Contribution evaluation by GSNR (FedGSNR, Definition 4.1 and §5 "Evaluate local contributions with GSNR").

At each evaluated round the plugin measures, for every seen client, the mean and per-coordinate variance of B
per-sample gradients at the round's received model (the global model before the round), forms the global
statistics over all seen clients (eqs. 8–9) and the GSNR r_k(w) = max(0, M_k / √(N_k L − M_k²)). Because r(w)
is a random variable along the trajectory (Appendix C, Fig. 9), the contribution score of a client is the mean
(or median) of its r over the evaluated rounds. It works with any strategy; with FedGSNR and full participation
it sees the same numbers as the strategy (same model, same sample stream).
"""

from __future__ import annotations

from typing import ClassVar, Literal

import torch
from pydantic import Field, PrivateAttr
from torch import Tensor

from fedhet.engine.engine import Engine
from fedhet.engine.local import gradient_statistics
from fedhet.metrics.base import METRIC_PLUGINS, Metric, RoundView
from fedhet.strategies.fedavg import fedavg_weights
from fedhet.strategies.gsnr import client_gsnr


def contribution_scores(history: Tensor, statistic: Literal["mean", "median"] = "mean") -> Tensor:
    """Per-client score from the (rounds, K) history of r (NaN where a client was not measured)."""
    if history.shape[0] == 0:
        return torch.full((history.shape[1],), float("nan"), dtype=torch.float64)
    if statistic == "median":
        return history.nanmedian(0).values
    return history.nanmean(0)


@METRIC_PLUGINS.register
class Contribution(Metric):
    """GSNR r_k per seen client and round (Definition 4.1); clients.csv gets ``contribution`` (the mean or
    median over rounds), ``contribution_median``, ``contribution_last`` and ``contribution_nopt`` (mean
    n₁^opt); the per-round array is kept (see `history`) and saved in checkpoints."""

    name: ClassVar[str] = "contribution"
    description: ClassVar[str] = "FedGSNR contribution score: each client's GSNR r(w), mean or median over rounds"
    samples: int = Field(0, ge=0, description="per-sample gradients per client (0: the local batch size)")
    batch: int = Field(0, ge=0, description="B in L, M, N (0: the local batch size)")
    weighting: Literal["samples", "uniform"] = Field("samples", description="p_k in eqs. (8)–(9)")
    statistic: Literal["mean", "median"] = "mean"

    _seed: int = PrivateAttr(0)
    _rounds: list[float] = PrivateAttr(default_factory=list)
    _scores: list[Tensor] = PrivateAttr(default_factory=list)
    _nopt: list[Tensor] = PrivateAttr(default_factory=list)

    def setup(self, engine: Engine, seed: int) -> None:
        self._seed = seed
        self._rounds, self._scores, self._nopt = [], [], []

    def measure(self, engine: Engine, params: Tensor, round_: int) -> tuple[Tensor, Tensor]:
        """(r, n₁^opt) of every client (K,), NaN for unseen clients, at `params` with round `round_`'s samples."""
        data = engine.data
        clients = data.seen_ids
        local = engine.local
        engine.model.module.eval()
        means, variances = gradient_statistics(
            engine.model, data.train, params, clients, self.samples or local.batch_size, self._seed, round_
        )
        weights = fedavg_weights(data.train.sizes[clients], self.weighting)
        n_opt, r, _ = client_gsnr(means, variances, weights, self.batch or local.batch_size)
        r_all = torch.full((data.num_clients,), float("nan"), dtype=torch.float64)
        n_all = r_all.clone()
        r_all[clients], n_all[clients] = r, n_opt
        return r_all, n_all

    def compute(self, view: RoundView) -> tuple[dict[str, float], dict[str, Tensor]]:
        r, n_opt = self.measure(view.engine, view.previous, view.round - 1)  # the training round's index
        self._rounds.append(float(view.round))
        self._scores.append(r)
        self._nopt.append(n_opt)
        history = self.history()[1]
        columns = {
            "contribution": contribution_scores(history, self.statistic),
            "contribution_median": contribution_scores(history, "median"),
            "contribution_last": r,
            "contribution_nopt": torch.stack(self._nopt).nanmean(0),
        }
        return {"contribution_round_mean": float(r.nanmean())}, columns

    def history(self) -> tuple[Tensor, Tensor]:
        """The evaluated rounds (R,) and the GSNR of every client at each (R, K)."""
        if not self._scores:
            return torch.zeros(0, dtype=torch.float64), torch.zeros(0, 0, dtype=torch.float64)
        return torch.tensor(self._rounds, dtype=torch.float64), torch.stack(self._scores)

    def state_dict(self) -> dict[str, object]:
        rounds, history = self.history()
        nopt = torch.stack(self._nopt) if self._nopt else torch.zeros(0, 0, dtype=torch.float64)
        return {"rounds": rounds, "scores": history, "nopt": nopt}

    def load_state_dict(self, state: dict[str, object]) -> None:
        rounds, scores, nopt = state["rounds"], state["scores"], state["nopt"]
        assert isinstance(rounds, Tensor) and isinstance(scores, Tensor) and isinstance(nopt, Tensor)
        self._rounds = [float(r) for r in rounds]
        self._scores = list(scores.unbind(0))
        self._nopt = list(nopt.unbind(0))
