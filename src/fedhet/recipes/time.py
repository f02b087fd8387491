"""Clients in time: accuracy against the simulated clock when clients differ in speed (`fedhet.systems`).

Digits (embedded) split among 50 clients by Dirichlet(0.5), the MLP, 10 local steps of 10 samples, clients whose
compute time per sample and bandwidths follow log-normal laws with σ = 1 (`LogNormal`: the slowest 5% are 5× slower
than the median, a 27× range). Every synchronous method takes 10 clients a round; the deadline is 2 s, about
1.5 times a median client's round (1.0 s of compute at 10 ms a sample, and the model both ways). The methods:

* FedAvg waiting for its slowest client; FedAvg with the deadline, dropping the late clients or taking their
  partial work; FedNova with partial work (it normalises unequal step counts); FedGSNR (per-client steps from the
  gradient signal-to-noise ratio), waiting;
* Power-of-Choice (the 10 of 20 candidates with the highest loss) and TiFL (5 speed tiers), waiting;
* FedBuff (C = 20 clients training at once, a server step every K = 10 updates) and FedAsync (C = 10, polynomial
  staleness, α = 0.6): a step of FedBuff takes as many updates as a FedAvg round, FedAsync's one, so FedAsync runs
  ten times as many (shorter) steps.

Every run gets the same budget of client updates (1,000: 100 rounds of 10); the figure puts the mean test accuracy
over seeds against the simulated time (each seed's curve held between its evaluations), the table gives the final
accuracy, the time each method first reached 80% test accuracy, its simulated duration and its traffic.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import numpy as np

from fedhet.experiments.executor import Outcome
from fedhet.experiments.reproduce import Recipe, register_recipe
from fedhet.experiments.state import RunState

TARGET = 0.8
BASE: dict[str, Any] = {
    "dataset": "digits",
    "partition": {"name": "dirichlet", "alpha": 0.5, "min_size": 10},
    "model": "mlp",
    "num_clients": 50,
    "clients_per_round": 10,
    "rounds": 100,
    "eval_every": 5,
    "local": {"steps": 10, "lr": 0.05, "batch_size": 10},
    "system": {"name": "lognormal", "sample_ms": 10.0, "compute_sigma": 1.0, "network_sigma": 1.0},
}
DEADLINE = 2.0
METHODS: dict[str, dict[str, Any]] = {
    "FedAvg (wait)": {"algorithm": "fedavg"},
    "FedAvg (deadline, drop)": {"algorithm": "fedavg", "deadline": {"seconds": DEADLINE, "policy": "drop"}},
    "FedAvg (deadline, partial)": {"algorithm": "fedavg", "deadline": {"seconds": DEADLINE, "policy": "partial"}},
    "FedNova (deadline, partial)": {"algorithm": "fednova", "deadline": {"seconds": DEADLINE, "policy": "partial"}},
    "FedGSNR": {"algorithm": {"name": "gsnr", "base": "fedavg"}},
    "Power-of-Choice": {"algorithm": {"name": "poc", "d": 20}},
    "TiFL": {"algorithm": {"name": "tifl", "tiers": 5}},
    "FedBuff": {"algorithm": {"name": "fedbuff", "concurrency": 20, "buffer_size": 10}},
    "FedAsync": {"algorithm": {"name": "fedasync", "concurrency": 10}, "rounds": 1000, "eval_every": 50},
}
COLUMNS = {
    "test_accuracy": "final test acc",
    f"time_to_{int(100 * TARGET)}": f"time to {TARGET:.0%} (s)",
    "time_s": "simulated duration (s)",
    "megabytes_up": "uploaded (MB)",
}


def time_to_target(state: RunState) -> dict[str, float]:
    """A `summarise` hook: the simulated time at which test accuracy first reached `TARGET` (NaN: never), and
    the upload in MB (module-level, so that worker processes can be given it)."""
    reached = next((row["time_s"] for row in state.history if row.get("test_accuracy", 0.0) >= TARGET), math.nan)
    return {f"time_to_{int(100 * TARGET)}": reached, "megabytes_up": state.final.get("bytes_up", math.nan) / 1e6}


def accuracy_over_time(recipe: Recipe, runs: dict[str, list[Outcome]], out: Path) -> None:
    """Mean (and std) over seeds of test accuracy on a common time grid: each seed's value at time t is its last
    evaluation at or before t (seeds' clocks differ, so their evaluations fall at different times)."""
    from fedhet.report.plots import plot_mean_curves

    ends = [min(row["time_s"] for row in [s.history[-1] for s in seeds]) for seeds in runs.values() if seeds]
    if not ends:
        return
    grid = np.linspace(0.0, max(ends), 200)
    curves: dict[str, list[list[float]]] = {}
    times: dict[str, list[float]] = {}
    for method, seeds in runs.items():
        end = min(s.history[-1]["time_s"] for s in seeds)
        upto = grid[grid <= end]
        per_seed = []
        for s in seeds:
            t = np.asarray([row["time_s"] for row in s.history])
            acc = np.asarray([row["test_accuracy"] for row in s.history])
            at = np.searchsorted(t, upto, side="right") - 1
            per_seed.append(np.where(at >= 0, acc[np.clip(at, 0, None)], np.nan).tolist())
        curves[method], times[method] = per_seed, upto.tolist()
    plot_mean_curves(
        curves,
        times,
        "test_accuracy",
        out / "accuracy_over_time.png",
        title="Test accuracy against simulated time, clients of log-normal speeds",
        context=f"{recipe.name}: {recipe.description}. Each seed's curve holds its last evaluation.",
        x="time",
    )


@register_recipe
def time_to_accuracy() -> Recipe:
    return Recipe(
        name="time-to-accuracy",
        description="time-to-accuracy on digits with log-normal client speeds: synchronous, deadlines, asynchronous",
        base=BASE,
        methods=METHODS,
        columns=COLUMNS,
        quick={"rounds": 20, "eval_every": 2},
        summarise=time_to_target,
        extra_figures=accuracy_over_time,
    )
