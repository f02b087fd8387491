"""Contribution evaluation by GSNR (FedGSNR, Definition 4.1 and §5 "Evaluate local contributions with GSNR").

At each evaluated round the plugin measures, for every seen client, the mean and per-coordinate variance of B
per-sample gradients at the round's received model (the global model before the round), forms the global
statistics over all seen clients (eqs. 8–9) and the GSNR r_k(w) = max(0, M_k / √(N_k L − M_k²)). Because r(w)
is a random variable along the trajectory (Appendix C, Fig. 9), the contribution score of a client is the mean
(or median) of its r over the evaluated rounds. It works with any strategy; with FedGSNR and full participation
it sees the same numbers as the strategy (same model, same sample stream).

The run folder gets ``contribution.csv`` (one row per evaluated round and client: round, client, gsnr, n_opt)
and ``contribution.png`` (each client's score with its spread over rounds, above its label histogram, Fig. 5b).
"""

from __future__ import annotations

import csv
from pathlib import Path
from typing import Any, ClassVar, Literal

import numpy as np
import torch
from pydantic import Field, PrivateAttr
from torch import Tensor

from fedhet.engine.protocol import EngineProtocol
from fedhet.methods.fedgsnr.strategy import client_gsnr
from fedhet.metrics.base import METRIC_PLUGINS, Metric, RoundView
from fedhet.strategies.fedavg import fedavg_weights

CSV, FIGURE = "contribution.csv", "contribution.png"


def contribution_scores(history: Tensor, statistic: Literal["mean", "median"] = "mean") -> Tensor:
    """Per-client score from the (rounds, K) history of r (NaN where a client was not measured)."""
    if history.shape[0] == 0:
        return torch.full((history.shape[1],), float("nan"), dtype=torch.float64)
    if statistic == "median":
        return history.nanmedian(0).values
    return history.nanmean(0)


def label_counts(engine: EngineProtocol) -> Tensor:
    """(K, C) number of training samples of each class per client (the engine's, wherever the data is)."""
    return engine.label_counts()


def contribution_rows(rounds: Tensor, history: Tensor, n_opt: Tensor) -> list[dict[str, int | float]]:
    """Long-format rows {round, client, gsnr, n_opt} of the (R, K) histories (measured clients only)."""
    rows: list[dict[str, int | float]] = []
    for i, r in enumerate(rounds.tolist()):
        for k in torch.nonzero(~history[i].isnan()).flatten().tolist():
            rows.append({"round": int(r), "client": k, "gsnr": float(history[i, k]), "n_opt": float(n_opt[i, k])})
    return rows


@METRIC_PLUGINS.register
class Contribution(Metric):
    """GSNR r_k per seen client and round (Definition 4.1); clients.csv gets ``contribution`` (the mean or
    median over rounds), ``contribution_median``, ``contribution_last`` and ``contribution_nopt`` (mean
    n₁^opt); the run folder gets ``contribution.csv`` (every round) and ``contribution.png``."""

    name: ClassVar[str] = "contribution"
    description: ClassVar[str] = "FedGSNR contribution score: each client's GSNR r(w), mean or median over rounds"
    samples: int = Field(0, ge=0, description="per-sample gradients per client (0: the local batch size)")
    batch: int = Field(0, ge=0, description="B in L, M, N (0: the local batch size)")
    weighting: Literal["samples", "uniform"] = Field("samples", description="p_k in eqs. (8)–(9)")
    statistic: Literal["mean", "median"] = "mean"
    needs_all_clients: ClassVar[bool] = False  # measures every seen client itself, not from the round's scores

    _rounds: list[float] = PrivateAttr(default_factory=list)
    _scores: list[Tensor] = PrivateAttr(default_factory=list)
    _nopt: list[Tensor] = PrivateAttr(default_factory=list)
    _labels: Tensor | None = PrivateAttr(None)
    _local_batch: int = PrivateAttr(0)
    _corrupted: Tensor | None = PrivateAttr(None)

    def derived(self) -> dict[str, Any]:
        return {key: self._local_batch for key in ("samples", "batch") if not getattr(self, key)}

    def columns(self) -> tuple[str, ...]:
        return ("contribution_round_mean",)

    def client_columns(self) -> tuple[str, ...]:
        return ("contribution", "contribution_median", "contribution_last", "contribution_nopt")

    def setup(self, engine: EngineProtocol, seed: int) -> None:
        super().setup(engine, seed)
        self._local_batch = engine.local.batch_size
        self._rounds, self._scores, self._nopt = [], [], []
        self._labels = label_counts(engine)
        corrupted = engine.data.info.get("corrupted")
        self._corrupted = corrupted if isinstance(corrupted, Tensor) else None

    def measure(self, engine: EngineProtocol, params: Tensor, round_: int) -> tuple[Tensor, Tensor]:
        """(r, n₁^opt) of every client (K,), NaN for unseen clients, at `params` with round `round_`'s samples."""
        data = engine.data
        clients = data.seen_ids
        local = engine.local
        means, variances = engine.gradient_statistics(params, clients, self.samples or local.batch_size, round_)
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

    def save(self, out: Path) -> None:
        rounds, history = self.history()
        if len(rounds) == 0:
            return
        with (out / CSV).open("w", newline="") as f:
            writer = csv.DictWriter(f, fieldnames=["round", "client", "gsnr", "n_opt"])
            writer.writeheader()
            writer.writerows(contribution_rows(rounds, history, torch.stack(self._nopt)))
        assert self._labels is not None
        title = f"GSNR contribution per client ({self.statistic} over {len(rounds)} rounds)"
        plot_contribution(history, self._labels, self._corrupted, out / FIGURE, title, self.statistic)

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


def plot_contribution(
    history: Tensor,
    labels: Tensor,
    corrupted: Tensor | None,
    out: Path,
    title: str,
    statistic: Literal["mean", "median"] = "mean",
) -> Path:
    """FedGSNR Figs. 5b / 6: each client's GSNR score (bar, with the 25–75% range over rounds) with corrupted
    clients in red, above each client's training-label histogram (one colour per class)."""
    import matplotlib.pyplot as plt

    from fedhet.report.plots import save_figure

    k = history.shape[1]
    score = contribution_scores(history, statistic).numpy()
    arr = history.numpy()
    measured = ~np.isnan(arr).all(0)
    low, high = np.full(k, np.nan), np.full(k, np.nan)
    if measured.any():
        low[measured], high[measured] = np.nanpercentile(arr[:, measured], [25, 75], axis=0)
    bad = corrupted.numpy().astype(bool) if corrupted is not None else np.zeros(k, dtype=bool)
    fig, (top, bottom) = plt.subplots(2, 1, figsize=(7.0, 5.0), dpi=120, sharex=True, height_ratios=(2, 1))
    err = np.vstack([np.maximum(score - low, 0), np.maximum(high - score, 0)])
    top.bar(range(k), score, yerr=np.nan_to_num(err), color=["tab:red" if b else "tab:blue" for b in bad], capsize=2)
    top.set_ylabel(f"GSNR r ({statistic} over rounds)")
    top.set_title(title + (" — red: corrupted labels" if bad.any() else ""), fontsize=9)
    top.grid(alpha=0.3)
    counts = labels.numpy()
    base = np.zeros(k)
    cmap = plt.get_cmap("tab10" if counts.shape[1] <= 10 else "tab20")
    for c in range(counts.shape[1]):
        bottom.bar(range(k), counts[:, c], bottom=base, color=cmap(c % cmap.N), width=0.8)
        base += counts[:, c]
    bottom.set_xlabel("client")
    bottom.set_ylabel("training labels")
    return save_figure(fig, bottom, out, legend=False)
