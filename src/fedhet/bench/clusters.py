"""What clustering costs: an IFCA round with k cluster models against the work it cannot avoid, a FedAvg round plus
the k loss evaluations each client's cluster choice needs (F_m(θ_j) on its training data, j = 1..k), on the same
engine and backend, timed in turns (ratios measured in the same run)."""

from __future__ import annotations

import torch

from fedhet.bench.pairs import CostRow, in_turns, print_rows, round_runners, workload_engine
from fedhet.bench.workloads import MLP
from fedhet.strategies.base import ServerContext, Strategy
from fedhet.strategies.fedavg import FedAvg
from fedhet.strategies.ifca import IFCA

GOAL = 1.5  # an IFCA round may cost at most this many times FedAvg's plus its k loss evaluations


def ifca_round(k: int = 4, reps: int = 5, backend: str = "dense") -> CostRow:
    """An IFCA round (k losses per client, then training from each client's cluster model, k averages) against a
    FedAvg round plus k evaluations of the clients' training losses: the MLP workload, 100 clients × 10 steps."""
    engine = workload_engine(MLP, backend)
    clients = torch.arange(MLP.clients)
    ifca = IFCA(k=k)
    strategies: list[Strategy] = [ifca, FedAvg()]
    for strategy in strategies:
        strategy.setup(ServerContext(engine, engine.local, 0, MLP.clients))
    clustered, plain = round_runners(strategies, engine, clients)

    def reference() -> None:
        plain()
        for theta in ifca.models:
            engine.losses_at(theta, clients, "train")

    ifca_s, reference_s = in_turns(clustered, reference, reps)
    return CostRow(f"IFCA round, k={k} ({backend})", f"FedAvg round + {k} loss evaluations", ifca_s, reference_s, GOAL)


def main() -> None:  # pragma: no cover - a measurement, run by hand
    torch.set_num_threads(1)
    print_rows((ifca_round(),), "no goal")


if __name__ == "__main__":  # pragma: no cover
    main()
