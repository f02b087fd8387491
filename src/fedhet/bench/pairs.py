"""Two systems timed in turns on one engine (ratios measured in the same run): the rows of the cost benchmarks
(`fedhet.bench.personal`, `.privacy`, `.asynchronous`) and the helpers that time them."""

from __future__ import annotations

import itertools
import statistics
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass

import torch

from fedhet.bench.workloads import Workload
from fedhet.catalog import MODELS
from fedhet.engine.engine import Engine
from fedhet.engine.functional import FlatModel
from fedhet.engine.plan import LocalSettings
from fedhet.strategies.base import Strategy


@dataclass(frozen=True)
class CostRow:
    """One comparison: the method's median seconds against the reference's, timed in turns."""

    name: str
    reference: str
    method_s: float
    reference_s: float
    goal: float  # the method may cost at most this many times the reference

    @property
    def ratio(self) -> float:
        return self.method_s / self.reference_s


def workload_engine(workload: Workload, backend: str = "dense") -> Engine:
    torch.manual_seed(0)
    model = FlatModel(MODELS.build(workload.model).build(workload.input_shape, workload.num_classes))
    local = LocalSettings(workload.steps, workload.lr, workload.batch)
    return Engine(model, workload.data(), backend=backend, seed=0, local=local)  # type: ignore[arg-type]


def in_turns(first: Callable[[], object], second: Callable[[], object], reps: int) -> tuple[float, float]:
    """Median seconds of each, the two timed in turns after one untimed call each."""
    times: tuple[list[float], list[float]] = ([], [])
    for rep in range(reps + 1):
        for fn, out in ((first, times[0]), (second, times[1])):
            start = time.perf_counter()
            fn()
            if rep:
                out.append(time.perf_counter() - start)
    return statistics.median(times[0]), statistics.median(times[1])


def round_runners(strategies: Sequence[Strategy], engine: Engine, clients: torch.Tensor) -> list[Callable[[], None]]:
    """For each strategy, one round of it from the initial model, the rounds of all of them numbered by one count:
    no two rounds share a number, so none finds what another computed (`engine.reuse` keeps a round's products)."""
    count = itertools.count(1)

    def runner(strategy: Strategy) -> Callable[[], None]:
        def one() -> None:
            t = next(count)
            w = engine.initial_params()
            result = strategy.local_training(t, clients, w, lambda plan: engine.train(w, plan, t))
            strategy.aggregate(t, w, result)

        return one

    return [runner(s) for s in strategies]


def print_rows(rows: Iterable[CostRow], no_goal: str) -> None:
    """One line per row: both times, the ratio and whether it meets its goal (`no_goal` where it has none)."""
    for row in rows:
        verdict = no_goal if row.goal != row.goal else "met" if row.ratio <= row.goal else "NOT met"
        print(
            f"{row.name}: {1e3 * row.method_s:.0f} ms vs {row.reference} {1e3 * row.reference_s:.0f} ms: "
            f"{row.ratio:.2f}x (goal <= {row.goal:g}x, {verdict})"
        )
