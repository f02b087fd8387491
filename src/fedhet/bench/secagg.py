"""What secure aggregation costs in time: a SecAgg+ round (quantised updates, pairwise and self masks over the
default k-regular graph, no dropouts) against a FedAvg round on the MLP workload, 100 clients × 10 steps of 10,
timed in turns (`python -m fedhet.bench.secagg` with one torch thread; the issue's goal: at most 1.5×)."""

from __future__ import annotations

import torch

from fedhet.bench.pairs import CostRow, in_turns, print_rows, round_runners, workload_engine
from fedhet.bench.workloads import MLP
from fedhet.privacy.secagg import SecAgg
from fedhet.strategies.base import ServerContext, Strategy
from fedhet.strategies.fedavg import FedAvg


def secagg_round(reps: int = 3, backend: str = "dense", **settings: object) -> CostRow:
    """A SecAgg+ round (`settings` change the wrapper's, e.g. ``rounding="deterministic"``) against a FedAvg round
    of the MLP workload on one engine and backend."""
    engine = workload_engine(MLP, backend)
    strategies: list[Strategy] = [FedAvg(), SecAgg(**settings)]
    for strategy in strategies:
        strategy.setup(ServerContext(engine, engine.local, 0, MLP.clients))
    avg, secure = round_runners(strategies, engine, torch.arange(MLP.clients))
    secure_s, avg_s = in_turns(secure, avg, reps)
    what = ", ".join(f"{k}={v}" for k, v in settings.items())
    return CostRow(f"SecAgg+ round ({what or 'defaults'}; {backend})", "FedAvg round", secure_s, avg_s, 1.5)


def main() -> None:
    torch.set_num_threads(1)
    print_rows([secagg_round(), secagg_round(rounding="deterministic"), secagg_round(masks="all")], "no goal")


if __name__ == "__main__":  # pragma: no cover
    main()
