"""What secure aggregation costs in time: a SecAgg+ round (quantised updates, pairwise and self masks over the
default k-regular graph, no dropouts) against a FedAvg round on the MLP workload, 100 clients × 10 steps of 10,
timed in turns (`python -m fedhet.bench.secagg` with one torch thread; the issue's goal: at most 1.5×), and the
machine's limit beside it: the time of drawing the random numbers the protocol needs and nothing else."""

from __future__ import annotations

import time

import numpy as np
import torch

from fedhet.bench.pairs import CostRow, in_turns, print_rows, round_runners, workload_engine
from fedhet.bench.workloads import MLP
from fedhet.privacy.secagg import SecAgg, client_bytes, default_degree, prg_sum, uniform
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


def limits(reps: int = 3, bits: int = 32) -> tuple[float, float]:
    """Seconds (best of `reps`) of the random numbers a round of the workload cannot do without: the n self-masks
    of P numbers of b bits (`prg_sum`, SFC64's raw output, the fastest of NumPy's generators here) and the
    stochastic rounding's n·P uniform numbers (`uniform`: from SFC64's raw bits too)."""
    size, n = workload_engine(MLP).initial_params().numel(), MLP.clients
    noise = np.empty((n, size))

    def best(fn: object) -> float:
        times = []
        for _ in range(reps):
            start = time.perf_counter()
            fn()  # type: ignore[operator]
            times.append(time.perf_counter() - start)
        return min(times)

    masks = best(lambda: prg_sum(np.arange(n).tolist(), size, bits))
    rounding = best(lambda: uniform(np.random.SFC64(0), noise.shape, noise))
    return masks, rounding


def main() -> None:
    torch.set_num_threads(1)
    rows = [secagg_round(), secagg_round(rounding="deterministic"), secagg_round(masks="all")]
    print_rows(rows, "no goal")
    masks, rounding = limits()
    avg = rows[0].reference_s
    print(
        f"limit: the self-masks' bits alone {1e3 * masks:.0f} ms, the stochastic rounding's U alone "
        f"{1e3 * rounding:.0f} ms: no SecAgg+ round can cost less than {1 + masks / avg:.2f}x "
        f"({1 + (masks + rounding) / avg:.2f}x with stochastic rounding) a FedAvg round of {1e3 * avg:.0f} ms"
    )
    size = workload_engine(MLP).initial_params().numel()
    sent = client_bytes(size, 32, default_degree(MLP.clients))
    print(
        f"on the simulated clock (with a system model), not in the wall times: a client sends and receives "
        f"{sent:,} bytes a SecAgg+ round (secagg_client_bytes) against the update's {4 * size:,}"
    )


if __name__ == "__main__":  # pragma: no cover
    main()
