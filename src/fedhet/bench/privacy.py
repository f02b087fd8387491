"""What differential privacy costs in time: a client-level DP round (updates clipped on the clients, central noise)
against a FedAvg round, and DP-SGD's local training against plain SGD's, on the same engine and backend, timed in
turns (ratios measured in the same run; `python -m fedhet.bench.privacy` with one torch thread). The dense
backend's DP-SGD (ghost clipping, `fedhet.engine.ghost`) is timed against its plain SGD round by round, beside the
machine's matmul limit for the round's products and the time its noise draws take alone."""

from __future__ import annotations

import itertools
import sys
from collections.abc import Callable
from dataclasses import replace
from typing import Literal

import torch

from fedhet.bench.pairs import CostRow, in_turns, print_rows, round_runners, workload_engine
from fedhet.bench.run import matmul_flop_rate, workload_flops
from fedhet.bench.workloads import MLP, Workload
from fedhet.engine.engine import Engine
from fedhet.engine.ghost import draw_noise
from fedhet.engine.plan import LocalPlan
from fedhet.engine.privacy import ExampleDP, update_norms
from fedhet.privacy.strategy import DP
from fedhet.strategies.base import ServerContext, Strategy
from fedhet.strategies.fedavg import FedAvg

DP_SGD = Workload("mlp-dpsgd", "MLP 784-200-10, 20 clients × 10 steps of 10", MLP.model, MLP.input_shape, clients=20)


def dp_round(reps: int = 21, backend: str = "dense", **dp: object) -> CostRow:
    """A DP-FedAvg round (each client's update clipped by the engine, Gaussian noise on the aggregate; `dp` changes
    the wrapper's settings, e.g. ``noise="local"``) against a FedAvg round: the MLP workload, 100 clients × 10
    steps of 10, on one engine and backend. The bound is the median norm of a round's updates unless `dp` gives
    one (half the updates clipped: the regime adaptive clipping aims at, Andrew et al. 2021). The difference is a
    few percent, so the medians take 21 rounds of each: with 5 a busy machine's noise hid it."""
    engine = workload_engine(MLP, backend)
    clients = torch.arange(MLP.clients)
    if "clip" not in dp:
        w = engine.initial_params()
        dp = {"clip": float(update_norms(engine.train(w, engine.local.plan(clients), 0).params, w).median()), **dp}
    settings: dict[str, object] = {"base": "fedavg", "noise_multiplier": 1.0, **dp}
    strategies: list[Strategy] = [FedAvg(), DP(**settings)]
    for strategy in strategies:
        strategy.setup(ServerContext(engine, engine.local, 0, MLP.clients))
    avg, private = round_runners(strategies, engine, clients)
    private_s, avg_s = in_turns(private, avg, reps)
    what = ", ".join(f"{k}={v:.3g}" if isinstance(v, float) else f"{k}={v}" for k, v in dp.items())
    return CostRow(f"client-level DP round ({what}; {backend})", "FedAvg round", private_s, avg_s, 1.10)


def _training(engine: Engine, plan: LocalPlan) -> Callable[[], object]:
    w = engine.initial_params()
    return lambda: engine.train(w, plan, 0)


def dp_sgd_training(reps: int = 3, reference_backend: str = "vectorised") -> CostRow:
    """DP-SGD's local training (per-sample gradients by vmap, clipped, noised; Poisson batches) against plain SGD's
    on `reference_backend` (vectorised: the same autograd backend; dense: what the run would use without DP-SGD):
    20 clients × 10 steps of 10 of the MLP, 10 clients a chunk."""
    private = Engine(workload_engine(DP_SGD).model, DP_SGD.data(), backend="vectorised", seed=0, chunk_size=10)
    plain = Engine(private.model, private.data, backend=reference_backend, seed=0, chunk_size=10)  # type: ignore[arg-type]
    plan = LocalPlan.uniform(torch.arange(DP_SGD.clients), DP_SGD.steps, DP_SGD.lr, DP_SGD.batch)
    dp_sgd = replace(plan, dp_sgd=ExampleDP(1.0, 1.0, "poisson"))
    private_s, plain_s = in_turns(_training(private, dp_sgd), _training(plain, plan), reps)
    return CostRow(
        "DP-SGD local training (vectorised)", f"plain SGD ({reference_backend})", private_s, plain_s, float("nan")
    )


def dense_dp_sgd_training(
    reps: int = 7, noise_multiplier: float = 1.0, clip: float = 1.0, sampling: Literal["poisson", "shuffle"] = "poisson"
) -> CostRow:
    """DP-SGD's local training on the dense backend (per-sample norms by ghost clipping) against plain SGD's on the
    same engine: the `DP_SGD` workload (20 clients × 10 steps of 10 of the MLP), the two alternating round by round,
    each round a new round number (no products kept from another round). Poisson batches are padded to the
    largest drawn (about 18 rows for 10 expected here), ``shuffle`` ones are plain SGD's; z > 0 adds the noise draws
    (`noise_draws`). The goal: at most 2× (issue 46)."""
    engine = workload_engine(DP_SGD)
    plan = LocalPlan.uniform(torch.arange(DP_SGD.clients), DP_SGD.steps, DP_SGD.lr, DP_SGD.batch)
    private = replace(plan, dp_sgd=ExampleDP(clip, noise_multiplier, sampling))
    w, count = engine.initial_params(), itertools.count(1)
    private_s, plain_s = in_turns(
        lambda: engine.train(w, private, next(count)), lambda: engine.train(w, plan, next(count)), reps
    )
    return CostRow(
        f"DP-SGD local training (dense, ghost clipping, C={clip:g}, z={noise_multiplier:g}, {sampling} batches)",
        "plain SGD (dense)",
        private_s,
        plain_s,
        2.0,
    )


def dp_sgd_backends(reps: int = 3) -> CostRow:
    """DP-SGD's local training (z = 1, Poisson batches) on the dense backend against the vectorised backend's (the
    same numbers): the `DP_SGD` workload, 10 clients a chunk on the vectorised backend as in `dp_sgd_training`."""
    dense = workload_engine(DP_SGD)
    vectorised = Engine(dense.model, dense.data, backend="vectorised", seed=0, chunk_size=10)
    plan = LocalPlan.uniform(torch.arange(DP_SGD.clients), DP_SGD.steps, DP_SGD.lr, DP_SGD.batch)
    private = replace(plan, dp_sgd=ExampleDP(1.0, 1.0, "poisson"))
    w, count = dense.initial_params(), itertools.count(1)
    dense_s, vectorised_s = in_turns(
        lambda: dense.train(w, private, next(count)), lambda: vectorised.train(w, private, next(count)), reps
    )
    return CostRow("DP-SGD local training (dense)", "DP-SGD (vectorised)", dense_s, vectorised_s, float("nan"))


def noise_draws(reps: int = 7) -> CostRow:
    """DP-SGD's noise draws alone (each client's P normal numbers per step from its own stream, as both backends
    draw them: `fedhet.engine.ghost.draw_noise`) against plain SGD's local training on the dense backend."""
    engine = workload_engine(DP_SGD)
    plan = LocalPlan.uniform(torch.arange(DP_SGD.clients), DP_SGD.steps, DP_SGD.lr, DP_SGD.batch)
    w, count = engine.initial_params(), itertools.count(1)
    buffer = torch.empty(DP_SGD.clients, engine.model.size)
    clients = list(range(DP_SGD.clients))

    def draws() -> None:
        round_ = next(count)
        for t in range(DP_SGD.steps):
            draw_noise(clients, 0, round_, "dp-sgd/train/0", t, buffer)

    noise_s, plain_s = in_turns(draws, lambda: engine.train(w, plan, next(count)), reps)
    size = engine.model.size
    what = f"{DP_SGD.clients} clients × {DP_SGD.steps} steps × {size // 1000}k normal draws"
    return CostRow(f"DP-SGD's noise draws alone ({what})", "plain SGD (dense)", noise_s, plain_s, float("nan"))


def matmul_limit_s() -> float:
    """Seconds the `DP_SGD` workload's local training products (forward and backward, exact FLOPs) take at the
    machine's matmul rate (`fedhet.bench.run.matmul_flop_rate`): a floor for both sides of the DP-SGD rows."""
    model = workload_engine(DP_SGD).model.module
    return workload_flops(DP_SGD, model)[0] / matmul_flop_rate()


def main() -> None:  # pragma: no cover - a measurement, run by hand
    torch.set_num_threads(1)
    rows = (
        dp_round(),  # half the updates clipped, central noise
        dp_round(clip=1e-3),  # every update clipped
        dp_round(clipping="adaptive", noise_multiplier=0.5),
        dp_round(noise="local"),
        dp_sgd_training(),
        dp_sgd_training(reference_backend="dense"),
    )
    print_rows(rows, "no goal: stated")
    dense_main()


def dense_main() -> None:  # pragma: no cover - a measurement, run by hand
    """The dense backend's DP-SGD rows alone (``python -m fedhet.bench.privacy dense``, one torch thread)."""
    torch.set_num_threads(1)
    rows = (
        dense_dp_sgd_training(noise_multiplier=0.0, sampling="shuffle"),
        dense_dp_sgd_training(noise_multiplier=0.0),
        dense_dp_sgd_training(),
        noise_draws(),
        dp_sgd_backends(),
    )
    print_rows(rows, "no goal: stated")
    print(f"matmul limit of the round's products (one thread): {1e3 * matmul_limit_s():.1f} ms")


if __name__ == "__main__":  # pragma: no cover
    dense_main() if sys.argv[1:] == ["dense"] else main()
