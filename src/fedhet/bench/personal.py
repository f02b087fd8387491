"""What personal models cost: a Ditto round against a FedAvg round, and personalised evaluation against the global
model's, on the same engine and backend, timed in turns (ratios measured in the same run)."""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass

import torch

from fedhet.bench.workloads import MLP, Workload
from fedhet.catalog import MODELS
from fedhet.engine.engine import Engine
from fedhet.engine.functional import FlatModel
from fedhet.engine.personal import Personal
from fedhet.engine.plan import LocalPlan, LocalSettings
from fedhet.strategies.base import ServerContext, Strategy
from fedhet.strategies.ditto import Ditto
from fedhet.strategies.fedavg import FedAvg


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


def _engine(workload: Workload, backend: str = "dense") -> Engine:
    torch.manual_seed(0)
    model = FlatModel(MODELS.build(workload.model).build(workload.input_shape, workload.num_classes))
    local = LocalSettings(workload.steps, workload.lr, workload.batch)
    return Engine(model, workload.data(), backend=backend, seed=0, local=local)  # type: ignore[arg-type]


def _in_turns(first: Callable[[], object], second: Callable[[], object], reps: int) -> tuple[float, float]:
    """Median seconds of each, the two timed in turns after one untimed call each."""
    times: tuple[list[float], list[float]] = ([], [])
    for rep in range(reps + 1):
        for fn, out in ((first, times[0]), (second, times[1])):
            start = time.perf_counter()
            fn()
            if rep:
                out.append(time.perf_counter() - start)
    return statistics.median(times[0]), statistics.median(times[1])


def _round(strategy: Strategy, engine: Engine, clients: torch.Tensor, counter: list[int]) -> Callable[[], None]:
    def one() -> None:
        t = counter[0] = counter[0] + 1
        w = engine.initial_params()
        result = strategy.local_training(t, clients, w, lambda plan: engine.train(w, plan, t))
        strategy.aggregate(t, w, result)

    return one


def ditto_round(reps: int = 5, backend: str = "dense") -> CostRow:
    """A Ditto round (two models trained per client) against a FedAvg round: the MLP workload, 100 clients × 10
    steps of 10, on one engine and backend."""
    engine = _engine(MLP, backend)
    clients = torch.arange(MLP.clients)
    strategies: list[Strategy] = [FedAvg(), Ditto()]
    for strategy in strategies:
        strategy.setup(ServerContext(engine, engine.local, 0, MLP.clients))
    avg, ditto = (_round(s, engine, clients, [0]) for s in strategies)
    ditto_s, avg_s = _in_turns(ditto, avg, reps)
    return CostRow(f"Ditto round ({backend})", "FedAvg round", ditto_s, avg_s, 2.2)


EVAL = Workload("mlp-1000", "MLP 784-200-10, 1,000 clients", MLP.model, MLP.input_shape, clients=1000, samples=50)


def personal_evaluation(parts: tuple[str, ...] = ("*",), reps: int = 5, backend: str = "dense") -> CostRow:
    """Scoring 1,000 clients' own models (a whole personal model each, as Ditto's, or a personal head, as
    FedPer's) on their own test data, against scoring the global model on the same clients' test data."""
    engine = _engine(EVAL, backend)
    clients = torch.arange(EVAL.clients)
    personal = Personal("own", parts)
    w = engine.initial_params()
    engine.train(w, LocalPlan.uniform(clients, 1, EVAL.lr, EVAL.batch, personal=personal), 0)  # every client's own
    plan = LocalPlan.uniform(clients, 0, EVAL.lr, EVAL.batch, personal=personal)
    own_s, global_s = _in_turns(lambda: engine.personal_scores(w, plan, 1), lambda: engine.scores(w, "test"), reps)
    what = "whole personal models" if parts == ("*",) else f"personal {', '.join(parts)}"
    return CostRow(f"personalised evaluation, 1,000 clients, {what}", "global evaluation", own_s, global_s, 2.0)


def machine_limit(reps: int = 5) -> CostRow:
    """What this machine's matrix products allow a whole-model personalised evaluation: 64 clients' first layers
    as 64 products of (12 × 784)·(784 × 200), against one (768 × 784)·(784 × 200) product of the same FLOPs."""
    x, weights = torch.randn(64, 12, 784), torch.randn(64, 200, 784)
    per_client_s, shared_s = _in_turns(
        lambda: torch.bmm(x, weights.mT), lambda: x.reshape(-1, 784) @ weights[0].T, reps * 4
    )
    return CostRow("machine: 64 per-client products", "one shared product", per_client_s, shared_s, float("nan"))


def main() -> None:  # pragma: no cover - a measurement, run by hand
    torch.set_num_threads(1)
    for row in (ditto_round(), personal_evaluation(), personal_evaluation(("head",)), machine_limit()):
        verdict = "no goal: the limit" if row.goal != row.goal else "met" if row.ratio <= row.goal else "NOT met"
        print(
            f"{row.name}: {1e3 * row.method_s:.0f} ms vs {row.reference} {1e3 * row.reference_s:.0f} ms: "
            f"{row.ratio:.2f}x (goal <= {row.goal:g}x, {verdict})"
        )


if __name__ == "__main__":  # pragma: no cover
    main()
