"""What personal models cost: a Ditto round against a FedAvg round, and personalised evaluation against the global
model's, on the same engine and backend, timed in turns (ratios measured in the same run)."""

from __future__ import annotations

import torch

from fedhet.bench.pairs import CostRow, in_turns, print_rows, round_runners, workload_engine
from fedhet.bench.workloads import MLP, Workload
from fedhet.engine.personal import Personal
from fedhet.engine.plan import LocalPlan
from fedhet.strategies.base import ServerContext, Strategy
from fedhet.strategies.ditto import Ditto
from fedhet.strategies.fedavg import FedAvg


def ditto_round(reps: int = 5, backend: str = "dense") -> CostRow:
    """A Ditto round (two models trained per client) against a FedAvg round: the MLP workload, 100 clients × 10
    steps of 10, on one engine and backend."""
    engine = workload_engine(MLP, backend)
    clients = torch.arange(MLP.clients)
    strategies: list[Strategy] = [FedAvg(), Ditto()]
    for strategy in strategies:
        strategy.setup(ServerContext(engine, engine.local, 0, MLP.clients))
    avg, ditto = round_runners(strategies, engine, clients)
    ditto_s, avg_s = in_turns(ditto, avg, reps)
    return CostRow(f"Ditto round ({backend})", "FedAvg round", ditto_s, avg_s, 2.2)


EVAL = Workload("mlp-1000", "MLP 784-200-10, 1,000 clients", MLP.model, MLP.input_shape, clients=1000, samples=50)


def personal_evaluation(parts: tuple[str, ...] = ("*",), reps: int = 5, backend: str = "dense") -> CostRow:
    """Scoring 1,000 clients' own models (a whole personal model each, as Ditto's, or a personal head, as
    FedPer's) on their own test data, against scoring the global model on the same clients' test data."""
    engine = workload_engine(EVAL, backend)
    clients = torch.arange(EVAL.clients)
    personal = Personal("own", parts)
    w = engine.initial_params()
    engine.train(w, LocalPlan.uniform(clients, 1, EVAL.lr, EVAL.batch, personal=personal), 0)  # every client's own
    plan = LocalPlan.uniform(clients, 0, EVAL.lr, EVAL.batch, personal=personal)
    own_s, global_s = in_turns(lambda: engine.personal_scores(w, plan, 1), lambda: engine.scores(w, "test"), reps)
    what = "whole personal models" if parts == ("*",) else f"personal {', '.join(parts)}"
    return CostRow(f"personalised evaluation, 1,000 clients, {what}", "global evaluation", own_s, global_s, 2.0)


def machine_limit(reps: int = 5) -> CostRow:
    """What this machine's matrix products allow a whole-model personalised evaluation: 64 clients' first layers
    as 64 products of (12 × 784)·(784 × 200), against one (768 × 784)·(784 × 200) product of the same FLOPs."""
    x, weights = torch.randn(64, 12, 784), torch.randn(64, 200, 784)
    per_client_s, shared_s = in_turns(
        lambda: torch.bmm(x, weights.mT), lambda: x.reshape(-1, 784) @ weights[0].T, reps * 4
    )
    return CostRow("machine: 64 per-client products", "one shared product", per_client_s, shared_s, float("nan"))


def main() -> None:  # pragma: no cover - a measurement, run by hand
    torch.set_num_threads(1)
    print_rows((ditto_round(), personal_evaluation(), personal_evaluation(("head",)), machine_limit()), "the limit")


if __name__ == "__main__":  # pragma: no cover
    main()
