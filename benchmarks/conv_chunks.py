"""How many clients a chunk of the conv backend should hold: one round of local training (10 steps of 10 samples,
50 samples a client) of the zoo's CNNs at several byte budgets for a chunk's weights and activations
(`fedhet.engine.conv.CHUNK_BYTES`), the budgets taking turns; medians of the repetitions after the first.

Run (about 3 minutes on 2 quiet cores):  python benchmarks/conv_chunks.py [--threads 2] [--budgets-mb 4,24] [--reps 4]
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch
from torch import Tensor

from fedhet.bench.systems import build_module
from fedhet.bench.workloads import Workload
from fedhet.data.dataset import ClientData
from fedhet.engine import conv
from fedhet.engine.functional import FlatModel
from fedhet.engine.memory import keep_freed_memory
from fedhet.engine.plan import LocalPlan
from fedhet.engine.request import TrainRequest
from fedhet.engine.step import fresh_cohort

MODELS_AND_COHORTS = {  # input shape, classes, clients
    "lenet_cifar": ((3, 32, 32), 10, 30),
    "cnn_mnist": ((1, 28, 28), 10, 20),
    "cnn_fmnist": ((1, 28, 28), 10, 30),
    "cnn_cifar": ((3, 32, 32), 10, 30),
    "cnn_cifar_lrn": ((3, 32, 32), 10, 30),
    "cnn_femnist": ((1, 28, 28), 62, 10),
}


def conv_round(name: str) -> tuple[Workload, FlatModel, conv.ConvSpec, ClientData, Tensor, LocalPlan]:
    """What `conv.train_conv` needs for one round of the zoo CNN `name` on the bench's generated data: its
    workload (`MODELS_AND_COHORTS`), the model in training mode, its spec, the training data, the initial weights
    and the plan (every client, the workload's steps of its batch)."""
    shape, classes, clients = MODELS_AND_COHORTS[name]
    w = Workload(name, "", {"name": name}, shape, num_classes=classes, clients=clients)
    model = FlatModel(build_module(w))
    spec = conv.conv_layers(model)
    assert spec is not None
    model.module.train()
    plan = LocalPlan.uniform(torch.arange(clients), w.steps, w.lr, w.batch)
    return w, model, spec, w.data().train, model.initial_params(), plan


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--budgets-mb", default="4,24")
    parser.add_argument("--reps", type=int, default=4)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    keep_freed_memory()  # as the engine does
    budgets = [int(b) << 20 for b in args.budgets_mb.split(",")]
    for name in MODELS_AND_COHORTS:
        w, model, spec, data, w0, plan = conv_round(name)
        times: dict[int, list[float]] = {b: [] for b in budgets}
        chunks = {}
        for rep in range(args.reps):
            for budget in budgets:
                conv.CHUNK_BYTES = budget
                chunks[budget] = conv.default_chunk(spec, w.clients, args.threads, w.batch)
                start = time.perf_counter()
                conv.train_conv(TrainRequest(model, data, w0, plan, fresh_cohort(plan, w0), 0, rep), spec)
                if rep:
                    times[budget].append(time.perf_counter() - start)
        cells = [f"{b >> 20} MB: {chunks[b]} a chunk, {1e3 * statistics.median(t):.0f} ms" for b, t in times.items()]
        print(f"{name} ({w.clients} clients): " + "; ".join(cells), flush=True)


if __name__ == "__main__":
    main()
