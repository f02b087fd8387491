"""Metrics of CA-Fed's experiments (Rodio et al. 2023, Sec. V-B, Table I, Figs. 1–3).

* ``alpha_accuracy`` plugin: the α-weighted test accuracy Σ_k α_k acc_k over all clients (α_k ∝ samples), and
  the Table I summaries up to each round: maximum, time average, and standard deviation over the second
  half of the rounds so far (variability over time, not across clients).
* `ParticipationWriter` callback (every run with a folder has it): writes ``availability.npz`` into the run
  folder when there is something to write, the per round × client arrays
  the server saw and decided (active, selected, applied weights, π̂, λ̂, α) and the availability process's true
  π, λ and client classes, for Figs. 1 and 2.
* `importance`, `cumulative_importance`: the share of aggregation weight each client received over a run, and up
  to each round (Fig. 2); `excluded_share`: how often each client was excluded when active (Fig. 1).
"""

from __future__ import annotations

from typing import ClassVar, Literal

import numpy as np
from pydantic import Field
from torch import Tensor

from fedhet.metrics.base import METRIC_PLUGINS, Metric, RoundView


def weighted_mean(values: Tensor, weights: np.ndarray) -> float:
    """Σ_k w_k v_k / Σ_k w_k."""
    v = values.double().numpy()
    return float(np.dot(weights, v) / weights.sum())


def time_average(values: list[float] | np.ndarray) -> np.ndarray:
    """The running mean (1/t) Σ_{s≤t} a_s of a per-round series (Fig. 3's y-axis)."""
    arr = np.asarray(values, dtype=np.float64)
    return np.cumsum(arr) / np.arange(1, len(arr) + 1) if len(arr) else arr


def second_half_std(rounds: list[float] | np.ndarray, values: list[float] | np.ndarray, total: float) -> float:
    """Population std of `values` at the rounds after total/2 (Table I's "standard deviation")."""
    r, v = np.asarray(rounds, dtype=np.float64), np.asarray(values, dtype=np.float64)
    late = v[r > total / 2]
    return float(late.std()) if len(late) else float("nan")


def importance(weights: np.ndarray) -> np.ndarray:
    """p_k = Σ_t w_k^(t) / Σ_{t,h} w_h^(t): each client's share of the aggregation weight over a run (Fig. 2);
    `weights` is rounds × clients with w_k^(t) = q_k 1{k ∈ S_t}."""
    total = np.asarray(weights, dtype=np.float64).sum(axis=0)
    return total / total.sum() if total.sum() > 0 else total


def cumulative_importance(weights: np.ndarray) -> np.ndarray:
    """p^(t)_k = Σ_{s≤t} w_k^(s) / Σ_{s≤t,h} w_h^(s) for every round t (rounds × clients): the importance each
    client has received up to round t (rows with no weight yet are zeros)."""
    running = np.cumsum(np.asarray(weights, dtype=np.float64), axis=0)
    total = running.sum(axis=1, keepdims=True)
    return np.divide(running, total, out=np.zeros_like(running), where=total > 0)


def excluded_share(active: np.ndarray, selected: np.ndarray) -> np.ndarray:
    """Per client, the share of its active rounds in which it was excluded (active, not selected); nan if it was
    never active."""
    active, selected = np.asarray(active, dtype=bool), np.asarray(selected, dtype=bool)
    rounds = active.sum(axis=0).astype(np.float64)
    excluded = (active & ~selected).sum(axis=0)
    return np.divide(excluded, rounds, out=np.full(len(rounds), np.nan), where=rounds > 0)


VALIDATION = ("val_alpha_accuracy", "val_time_avg_accuracy")


@METRIC_PLUGINS.register
class AlphaAccuracy(Metric):
    """``alpha_test_accuracy`` = Σ_k α_k acc_k (all clients, CA-Fed's logged metric), with ``alpha_test_loss``,
    ``alpha_train_loss``; and up to each round its maximum (``max_accuracy``), time average
    (``time_avg_accuracy``) and second-half standard deviation (``second_half_std``). With a validation split, the
    same accuracy and time average on the validation data (``val_alpha_accuracy``, ``val_time_avg_accuracy``: what
    the tuning of cafed-table1 selects by)."""

    name: ClassVar[str] = "alpha_accuracy"
    description: ClassVar[str] = "alpha-weighted accuracy and its max, time average and second-half std"
    weighting: Literal["samples", "uniform"] = Field("samples", description="α_k ∝ train samples, or uniform")

    def columns(self) -> tuple[str, ...]:
        accuracy = ("alpha_test_accuracy", "alpha_test_loss", "alpha_train_loss")
        return (*accuracy, "max_accuracy", "time_avg_accuracy", "second_half_std", *VALIDATION)

    def compute(self, view: RoundView) -> tuple[dict[str, float], dict[str, Tensor]]:
        data = view.engine.data
        alpha = data.train.sizes.double().numpy() if self.weighting == "samples" else np.ones(data.num_clients)
        acc = weighted_mean(view.test.accuracy, alpha)
        rows = [r for r in view.history if "alpha_test_accuracy" in r]
        rounds = [r["round"] for r in rows] + [float(view.round)]
        series = [r["alpha_test_accuracy"] for r in rows] + [acc]
        out = {
            "alpha_test_accuracy": acc,
            "alpha_test_loss": weighted_mean(view.test.loss, alpha),
            "alpha_train_loss": weighted_mean(view.train.loss, alpha),
            "max_accuracy": float(np.max(series)),
            "time_avg_accuracy": float(time_average(series)[-1]),
            "second_half_std": second_half_std(rounds, series, float(view.round)),
        }
        if view.val is not None:
            val = weighted_mean(view.val.accuracy, alpha)
            earlier = [r[VALIDATION[0]] for r in view.history if VALIDATION[0] in r]
            out.update(dict(zip(VALIDATION, (val, float(time_average([*earlier, val])[-1])), strict=True)))
        return out, {}
