"""What sub-models cost: a HeteroFL round with the five levels {1, 1/2, 1/4, 1/8, 1/16} spread evenly over the
clients against the FLOP-weighted share of a full-width FedAvg round (the FedAvg round's time times the mean share
of the model's weights the clients train), on one engine and backend, timed in turns (the ratio measured in one
run; `python -m fedhet.bench.submodels`, one torch thread). Goal: at most 1.3×, which needs the sub-models trained
as the smaller networks (`fedhet.engine.sliced`), not as masked full ones (each costing the full model). Beside it,
the machine's limit: the share of the FedAvg round's training FLOPs at the rate of a 2048² float32 product."""

from __future__ import annotations

import torch

from fedhet.bench.pairs import CostRow, in_turns, print_rows, round_runners, workload_engine
from fedhet.bench.run import matmul_flop_rate, workload_flops
from fedhet.bench.workloads import MLP, Workload
from fedhet.engine.threads import torch_threads
from fedhet.strategies.base import ServerContext, Strategy
from fedhet.strategies.fedavg import FedAvg
from fedhet.strategies.heterofl import HeteroFL

LEVELS = [1.0, 0.5, 0.25, 0.125, 0.0625]


def heterofl_round(reps: int = 15, backend: str = "dense", workload: Workload = MLP) -> tuple[CostRow, float]:
    """A HeteroFL round (the scaler on, levels in equal shares) against a FedAvg round scaled by the FLOP share:
    the MLP workload, 100 clients × 10 steps of 10. Returns the row (its reference: the FedAvg round's seconds
    times the share) and the share."""
    engine = workload_engine(workload, backend)
    clients = torch.arange(workload.clients)
    heterofl = HeteroFL(levels=LEVELS)
    strategies: list[Strategy] = [FedAvg(), heterofl]
    for strategy in strategies:
        strategy.setup(ServerContext(engine, engine.local, 0, workload.clients))
    share = float(heterofl.masks(0, clients).double().mean())  # training FLOPs ∝ the weights each client trains
    avg, hetero = round_runners(strategies, engine, clients)
    hetero_s, avg_s = in_turns(hetero, avg, reps)
    name = f"HeteroFL round, 5 levels ({backend})"
    return CostRow(name, f"{share:.3f} × FedAvg round ({1e3 * avg_s:.0f} ms)", hetero_s, avg_s * share, 1.3), share


def matmul_limit_s(share: float, workload: Workload = MLP) -> float:
    """The machine's limit for the HeteroFL round's training: `share` of the FedAvg round's training FLOPs (exact,
    `fedhet.bench.run.workload_flops`) at the rate of a 2048² float32 matrix product (this thread count)."""
    model = workload_engine(workload).model.module
    return share * workload_flops(workload, model)[0] / matmul_flop_rate()


def main() -> None:  # pragma: no cover - a measurement, run by hand
    with torch_threads(1):
        row, share = heterofl_round()
        limit = matmul_limit_s(share)
    print_rows([row], "no goal")
    hetero, avg = row.method_s / limit, row.reference_s / limit  # the FedAvg round against its own limit
    print(
        f"the machine's limit: {1e3 * limit:.0f} ms ({share:.3f} of FedAvg's training FLOPs at a 2048² product's "
        f"rate); the HeteroFL round is {hetero:.2f}x it, the FedAvg round {avg:.2f}x its own"
    )


if __name__ == "__main__":  # pragma: no cover
    main()
