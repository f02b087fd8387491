"""The pfl comparator: a bench workload in Apple's pfl simulator (`pip install pfl`), written as pfl's own
PyTorch benchmarks write it: a `PyTorchModel` around the torch module (with `loss` and `metrics` methods),
`torch.optim.SGD` for the local steps and as the central optimiser (learning rate 1: plain FedAvg),
`FederatedAveraging` with `WeightByDatapoints`, and the `SimulatedBackend` in this process.

Each central iteration trains `clients` users for `steps` SGD steps of `batch` samples: as whole epochs where the
steps pass over a user's data more than once (pfl's `local_num_steps` stops at the end of the data), otherwise as
steps over copies of the user's data (which pfl's evaluation of the trained users then scores too). Timed twice,
after a first iteration: without evaluation (the training time) and with evaluation every iteration (the round:
pfl evaluates the global model on each trained user's data before training and its local model after, and the
global model on every user's test data, the validation population). Only used when `pfl` is importable.
"""

from __future__ import annotations

import importlib.util
import itertools
import logging
import time
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from fedhet.bench.workloads import Workload
from fedhet.data.dataset import FederatedData


def pfl_available() -> bool:
    """Whether pfl can be imported."""
    return importlib.util.find_spec("pfl") is not None


class _PflNet(nn.Module):
    """The workload's module with the `loss` and `metrics` methods pfl's `PyTorchModel` calls."""

    def __init__(self, net: nn.Module) -> None:
        super().__init__()
        self.net = net

    def forward(self, x: Tensor) -> Tensor:
        return self.net(x)  # type: ignore[no-any-return,unused-ignore]

    def loss(self, x: Tensor, y: Tensor, eval: bool = False) -> Tensor:
        self.eval() if eval else self.train()
        return F.cross_entropy(self(x), y)

    @torch.no_grad()
    def metrics(self, x: Tensor, y: Tensor, eval: bool = True) -> dict[str, Any]:
        from pfl.metrics import Weighted

        self.eval() if eval else self.train()
        logits = self(x)
        n = len(y)
        return {
            "loss": Weighted(float(F.cross_entropy(logits, y, reduction="sum")), n),
            "accuracy": Weighted(float((logits.argmax(1) == y).sum()), n),
        }


def _local_length(w: Workload) -> tuple[dict[str, int | None], int]:
    """pfl's way of saying "`w.steps` steps of `w.batch`", and how many copies of each user's training data it needs
    for that: its `local_num_steps` stops at the end of the user's data (50 samples in batches of 10 are 5 steps, not
    10), so whole passes are given as epochs, and other lengths as steps over the data repeated."""
    per_epoch = -(-w.samples // w.batch)
    if w.steps <= per_epoch:
        return {"local_num_steps": w.steps, "local_num_epochs": None}, 1
    if w.steps % per_epoch == 0:
        return {"local_num_steps": None, "local_num_epochs": w.steps // per_epoch}, 1
    return {"local_num_steps": w.steps, "local_num_epochs": None}, -(-w.steps * w.batch // w.samples)


def _iteration_times(w: Workload, data: FederatedData, net: nn.Module, rounds: int, evaluate: bool) -> list[float]:
    from pfl.aggregate.simulate import SimulatedBackend
    from pfl.aggregate.weighting import WeightByDatapoints
    from pfl.algorithm import FederatedAveraging, NNAlgorithmParams
    from pfl.callback.base import TrainingProcessCallback
    from pfl.data.dataset import Dataset
    from pfl.data.federated_dataset import FederatedDataset
    from pfl.data.sampling import get_user_sampler
    from pfl.hyperparam import NNEvalHyperParams, NNTrainHyperParams
    from pfl.metrics import Metrics
    from pfl.model.pytorch import PyTorchModel

    length, copies = _local_length(w)

    def federated(split: Any, users: int, copies: int = 1) -> Any:
        parts = {k: [t.repeat(copies, *[1] * (t.dim() - 1)) for t in split.client(k)] for k in range(users)}
        return FederatedDataset(
            lambda k: Dataset(parts[k], user_id=k), get_user_sampler("minimize_reuse", list(range(users)))
        )

    total = w.clients + w.eval_only
    ends: list[float] = []

    class Stopwatch(TrainingProcessCallback):  # type: ignore[misc,unused-ignore]  # pfl may be untyped
        def after_central_iteration(self, aggregate_metrics: Any, model: Any, *, central_iteration: int) -> Any:
            ends.append(time.perf_counter())
            return False, Metrics()

    model = PyTorchModel(
        model=net,
        local_optimizer_create=torch.optim.SGD,
        central_optimizer=torch.optim.SGD(net.parameters(), 1.0),
    )
    backend = SimulatedBackend(
        training_data=federated(data.train, w.clients, copies),
        val_data=federated(data.test, total),
        postprocessors=[WeightByDatapoints()],
    )
    FederatedAveraging().run(
        algorithm_params=NNAlgorithmParams(
            central_num_iterations=rounds,
            evaluation_frequency=1 if evaluate else rounds + 1,
            train_cohort_size=w.clients,
            val_cohort_size=total,
        ),
        backend=backend,
        model=model,
        model_train_params=NNTrainHyperParams(local_learning_rate=w.lr, local_batch_size=w.batch, **length),
        model_eval_params=NNEvalHyperParams(local_batch_size=None),
        callbacks=[Stopwatch()],
    )
    return [b - a for a, b in itertools.pairwise(ends)]


def pfl_round_times(
    w: Workload, data: FederatedData, net: nn.Module, rounds: int = 5
) -> tuple[list[float], list[float], list[float]]:
    """Seconds of pfl's central iterations 2..`rounds`: whole rounds (with evaluation), training (without),
    and their difference."""
    logging.getLogger("pfl").setLevel(logging.WARNING)  # no metrics table per iteration
    wrapped = _PflNet(net)
    train = _iteration_times(w, data, wrapped, rounds, evaluate=False)
    whole = _iteration_times(w, data, wrapped, rounds, evaluate=True)
    rest = [r - t for r, t in zip(whole, train, strict=True)]
    return whole, train, rest
