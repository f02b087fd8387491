"""What the bench times: one FedAvg round of a workload, split into local training and the rest (aggregation
and evaluation of every client), on each of fedhet's backends and on the plain and vmap loops (the naive
reference and the other frameworks are in the source checkout's benchmarks/comparators)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

from fedhet.bench.plain import PlainLoop, VmapLoop
from fedhet.bench.workloads import Workload
from fedhet.catalog import MODELS
from fedhet.data.dataset import FederatedData
from fedhet.engine.conv import conv_layers
from fedhet.engine.dense import dense_layers
from fedhet.engine.engine import Engine
from fedhet.engine.functional import FlatModel
from fedhet.engine.plan import LocalPlan, LocalResult, LocalSettings
from fedhet.experiments.evaluation import evaluate_global
from fedhet.strategies.base import ServerContext
from fedhet.strategies.fedavg import FedAvg

BACKENDS = ("sequential", "vectorised", "dense", "conv")


@dataclass
class System:
    """A round in two parts: `train(round)` returns the local models, `finish(them)` aggregates and evaluates."""

    name: str
    train: Callable[[int], Any]
    finish: Callable[[Any], object]
    note: str = ""


def build_module(w: Workload) -> torch.nn.Module:
    """The workload's model, initialised from torch seed 0 (every system starts from the same weights)."""
    torch.manual_seed(0)
    return MODELS.build(w.model).build(w.input_shape, w.num_classes)


def fedhet_backends(w: Workload) -> list[str]:
    """fedhet's backends that can run the workload's model."""
    model = FlatModel(build_module(w))
    out = ["sequential", "vectorised"]
    if dense_layers(model) is not None:
        out.append("dense")
    if conv_layers(model) is not None:
        out.append("conv")
    return out


def fedhet_system(w: Workload, data: FederatedData, backend: str, chunk_size: int = 0) -> System:
    """A whole FedAvg round on fedhet's engine: `Engine.train`, `FedAvg.aggregate`, `evaluate_global`."""
    model = FlatModel(build_module(w))
    engine = Engine(model, data, backend=backend, chunk_size=chunk_size)  # type: ignore[arg-type]
    strategy = FedAvg()
    strategy.setup(ServerContext(engine, LocalSettings(w.steps, w.lr, w.batch), 0, w.clients))
    clients = torch.arange(w.clients)
    state = {"params": engine.initial_params()}

    def train(round_: int) -> LocalResult:
        return engine.train(state["params"], LocalPlan.uniform(clients, w.steps, w.lr, w.batch), round_)

    def finish(result: LocalResult) -> None:
        state["params"] = strategy.aggregate(0, state["params"], result)
        evaluate_global(engine, state["params"])

    return System(backend, train, finish)


def plain_system(w: Workload, data: FederatedData) -> System:
    loop = PlainLoop(build_module(w), data, w.clients, w.steps, w.lr, w.batch)
    return System("plain loop", lambda _: loop.train(), loop.scores, "one module, weights copied in, manual SGD")


def vmap_system(w: Workload, data: FederatedData) -> System:
    loop = VmapLoop(build_module(w), data, w.clients, w.steps, w.lr, w.batch)
    return System("vmap loop", lambda _: loop.train(), loop.scores, "torch.func vmap(grad) over stacked weights")
