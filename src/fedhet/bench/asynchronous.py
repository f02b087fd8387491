"""How fast an asynchronous run trains its clients: FedBuff against a synchronous FedAvg round on the same engine and
backend, in clients trained per second (timed in turns; the ratio is measured in the same run)."""

from __future__ import annotations

import statistics
import time
from dataclasses import dataclass
from functools import partial

import torch

from fedhet.bench.pairs import workload_engine
from fedhet.bench.workloads import MLP, Workload
from fedhet.engine.engine import Engine
from fedhet.experiments.asynchronous import AsyncQueue, AsyncRunner
from fedhet.strategies.base import ServerContext
from fedhet.strategies.fedavg import FedAvg
from fedhet.strategies.fedbuff import FedBuff
from fedhet.systems.base import LogNormal
from fedhet.systems.clock import SimulatedTime

WORKLOAD = Workload(
    "mlp-1000", "MLP 784-200-10, 1,000 clients", MLP.model, MLP.input_shape, clients=1000, samples=50, steps=10
)


@dataclass(frozen=True)
class Throughput:
    """Clients trained per second by FedBuff and by synchronous FedAvg rounds, each the median of its turns."""

    asynchronous: float
    synchronous: float
    versions_per_turn: int
    clients_per_call: float  # FedBuff's mean engine call size

    @property
    def ratio(self) -> float:
        return self.asynchronous / self.synchronous


def _counting(engine: Engine, sizes: list[int]) -> None:
    train = engine.train

    def counted(params: torch.Tensor, plan: object, round_: int) -> object:
        sizes.append(len(plan.clients))  # type: ignore[attr-defined]
        return train(params, plan, round_)  # type: ignore[arg-type]

    engine.train = counted  # type: ignore[method-assign,assignment]


def fedbuff_throughput(turns: int = 5, concurrency: int = 100, buffer: int = 10, backend: str = "dense") -> Throughput:
    """FedBuff (C, K) on 1,000 MLP clients of log-normal speeds against FedAvg rounds of C clients: each turn runs
    C/K server versions of FedBuff (C client updates) and one FedAvg round (C clients)."""
    engine = workload_engine(WORKLOAD, backend)
    k = WORKLOAD.clients
    context = ServerContext(engine, engine.local, 0, concurrency)
    sync, buff = FedAvg(), FedBuff(concurrency=concurrency, buffer_size=buffer)
    sync.setup(context)
    buff.setup(ServerContext(engine, engine.local, 0, concurrency))
    system = LogNormal()
    system.setup(k, 0)
    sizes: list[int] = []
    _counting(engine, sizes)
    runner = AsyncRunner(
        buff, engine, system.profiles, torch.ones(k, dtype=torch.bool), engine.data.train.sizes, 0, AsyncQueue(),
        SimulatedTime(),
    )  # fmt: skip
    w_async = w_sync = engine.initial_params()
    everyone = torch.ones(k, dtype=torch.bool)
    version = 0
    per_turn = max(1, concurrency // buffer)
    async_rates, sync_rates = [], []
    for turn in range(turns + 1):
        before = len(sizes)
        start = time.perf_counter()
        for _ in range(per_turn):
            w_async, _ = runner.step(version, w_async, everyone)
            version += 1
        elapsed = time.perf_counter() - start
        trained = sum(sizes[before:])
        start = time.perf_counter()
        clients = sync.select(turn, everyone)
        result = sync.local_training(turn, clients, w_sync, partial(engine.train, w_sync, round_=turn))
        w_sync = sync.aggregate(turn, w_sync, result)
        sync_elapsed = time.perf_counter() - start
        if turn:  # the first turn warms both up
            async_rates.append(trained / elapsed)
            sync_rates.append(len(clients) / sync_elapsed)
    calls = [s for s in sizes if s != concurrency]  # FedBuff's calls after its first (C clients at once)
    return Throughput(
        statistics.median(async_rates),
        statistics.median(sync_rates),
        per_turn,
        statistics.mean(calls) if calls else float(concurrency),
    )


def main() -> None:  # pragma: no cover - a measurement, run by hand
    torch.set_num_threads(1)
    row = fedbuff_throughput()
    verdict = "met" if row.ratio >= 0.5 else "NOT met"
    print(
        f"FedBuff (C=100, K=10) {row.asynchronous:.0f} clients/s vs FedAvg rounds of 100 {row.synchronous:.0f}: "
        f"{row.ratio:.2f}x (goal >= 0.5x, {verdict}); FedBuff trains {row.clients_per_call:.1f} clients a call"
    )


if __name__ == "__main__":  # pragma: no cover
    main()
