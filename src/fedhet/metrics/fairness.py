"""Fairness during and after training (FedMGDA+, Hu et al. §6 and footnote 5).

- ``improved_users``: the share of the round's participants whose training loss did not increase,
  Σ_{i∈I_t} 𝕀{f_i(w_{t+1}) ≤ f_i(w_t)} / |I_t| (Figs 4, 8, 9), with f_i the loss of the global model on client i's
  whole training data, before (w_t) and after (w_{t+1}) the server step. The losses are the true ones, not what a
  malicious client reports. ``improved_users_ewm`` smooths it over the evaluated rounds with an exponentially
  weighted mean of span ``span`` (the paper's figures: pandas ``ewm(span=50)``, adjust=True; use eval_every = 1).
- ``accuracy_percentiles``: the paper's "Worst 5%" / "Best 5%" columns (Tables 6, 8–14), which are the 5th and
  95th *percentiles* of per-client test accuracy (``np.percentile``, linear interpolation) over the seen clients —
  not the tail means that ``test_accuracy_worst10``/``best10`` report.
"""

from __future__ import annotations

import math
from typing import ClassVar

import numpy as np
from pydantic import Field, PrivateAttr
from torch import Tensor

from fedhet.metrics.base import METRIC_PLUGINS, Metric, RoundView

__all__ = ["AccuracyPercentiles", "ImprovedUsers", "improved_share"]


def improved_share(before: Tensor, after: Tensor) -> float:
    """Share of entries with after ≤ before (nan for an empty cohort)."""
    if len(before) == 0:
        return float("nan")
    return float((after.double() <= before.double()).double().mean())


@METRIC_PLUGINS.register
class ImprovedUsers(Metric):
    """Share of participants whose full training loss did not increase over the round (FedMGDA+ footnote 5)."""

    name: ClassVar[str] = "improved_users"
    description: ClassVar[str] = "share of the round's participants whose training loss did not increase"
    span: int = Field(50, ge=1, description="span of the exponentially weighted mean improved_users_ewm")
    needs_all_clients: ClassVar[bool] = False  # the cohort's own losses, not the round's scores

    _num: float = PrivateAttr(0.0)
    _den: float = PrivateAttr(0.0)

    def columns(self) -> tuple[str, ...]:
        return ("improved_users", "improved_users_ewm")

    def compute(self, view: RoundView) -> tuple[dict[str, float], dict[str, Tensor]]:
        if view.result is None or len(view.result.clients) == 0:
            share = float("nan")
        else:
            clients = view.result.clients
            before = view.engine.losses_at(view.previous, clients, "train")
            after = view.engine.losses_at(view.params, clients, "train")
            share = improved_share(before, after)
        if not math.isnan(share):
            keep = 1.0 - 2.0 / (self.span + 1)
            self._num, self._den = share + keep * self._num, 1.0 + keep * self._den
        smooth = self._num / self._den if self._den > 0 else float("nan")
        return {"improved_users": share, "improved_users_ewm": smooth}, {}

    def state_dict(self) -> dict[str, object]:
        return {"num": self._num, "den": self._den}

    def load_state_dict(self, state: dict[str, object]) -> None:
        self._num, self._den = float(state["num"]), float(state["den"])  # type: ignore[arg-type]


@METRIC_PLUGINS.register
class AccuracyPercentiles(Metric):
    """Low and high percentiles of per-client test accuracy over the seen clients (the paper's Worst/Best 5%)."""

    name: ClassVar[str] = "accuracy_percentiles"
    description: ClassVar[str] = "low/high percentiles of per-client test accuracy (FedMGDA+ 'Worst/Best 5%')"
    low: float = Field(5.0, ge=0, le=100)
    high: float = Field(95.0, ge=0, le=100)

    def columns(self) -> tuple[str, ...]:
        return (f"test_accuracy_p{self.low:g}", f"test_accuracy_p{self.high:g}")

    def compute(self, view: RoundView) -> tuple[dict[str, float], dict[str, Tensor]]:
        acc = view.test.accuracy[view.engine.data.seen].double().numpy()
        if len(acc) == 0:
            return {}, {}
        return {
            f"test_accuracy_p{self.low:g}": float(np.percentile(acc, self.low)),
            f"test_accuracy_p{self.high:g}": float(np.percentile(acc, self.high)),
        }, {}
