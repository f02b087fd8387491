"""Benchmark workloads: the settings of our four papers, on generated data of the right shapes."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch

from fedhet.data.dataset import ClientData, FederatedData
from fedhet.seeding import torch_gen


@dataclass(frozen=True)
class Workload:
    """One round: `clients` train `steps` SGD steps of `batch` samples; `clients + eval_only` are evaluated."""

    name: str
    description: str
    model: dict[str, Any]
    input_shape: tuple[int, ...]
    num_classes: int = 10
    clients: int = 100
    eval_only: int = 0
    samples: int = 50
    steps: int = 10
    batch: int = 10
    lr: float = 0.05
    comparators: tuple[str, ...] = ("plain", "vmap", "naive", "pfl", "flower")
    tags: dict[str, float] = field(default_factory=dict)

    def data(self, seed: int = 0) -> FederatedData:
        """Random inputs with labels from a random linear teacher (so training is not trivial)."""
        gen = torch_gen(seed, "bench-data", self.clients, self.samples)
        total = self.clients + self.eval_only
        test_samples = max(1, self.samples // 4)
        dim = 1
        for d in self.input_shape:
            dim *= d
        teacher = torch.randn(dim, self.num_classes, generator=gen)

        def part(n: int) -> ClientData:
            x = torch.randn(total * n, *self.input_shape, generator=gen)
            y = (x.reshape(len(x), -1) @ teacher).argmax(1)
            return ClientData(x, y, torch.arange(0, total * n + 1, n))

        seen = torch.zeros(total, dtype=torch.bool)
        seen[: self.clients] = True
        return FederatedData(self.name, part(self.samples), part(test_samples), self.num_classes, seen)


LOGREG = Workload("logreg", "logistic regression 784→10, 100 clients × 10 steps of 10", {"name": "logistic"}, (784,))
MLP = Workload("mlp", "MLP 784-200-10, 100 clients × 10 steps of 10", {"name": "mlp", "hidden": [200]}, (784,))
MAXFL = Workload(
    "maxfl",
    "MaxFL setting: MLP [64, 30], 100 seen + 100 unseen clients evaluated each round",
    {"name": "mlp", "hidden": [64, 30]},
    (784,),
    eval_only=100,
    samples=200,
    batch=32,
)
CAFED = Workload(
    "cafed",
    "CA-Fed setting: 24 clients, linear model on 2-class synthetic data",
    {"name": "logistic"},
    (10,),
    num_classes=2,
    clients=24,
    samples=100,
    batch=32,
)
LENET = Workload(
    "lenet",
    "LeNet-5 (FedGSNR's CIFAR-10 model, 62k parameters) on 3×32×32, 30 clients × 10 steps of 10",
    {"name": "lenet_cifar"},
    (3, 32, 32),
    clients=30,
)
FEDAVG_CNN = Workload(
    "fedavg-cnn",
    "FedAvg's MNIST CNN (1.66M parameters) on 1×28×28, 20 clients × 10 steps of 10",
    {"name": "cnn_mnist"},
    (1, 28, 28),
    clients=20,
)
CORE = (LOGREG, MLP, MAXFL, CAFED, LENET, FEDAVG_CNN)


def cohort_sweep(sizes: tuple[int, ...]) -> list[Workload]:
    """Logistic regression on 60-dim synthetic data with a growing cohort (memory should grow linearly)."""
    return [
        Workload(
            f"cohort-{n}",
            f"{n} clients, logistic 60→10",
            {"name": "logistic"},
            (60,),
            clients=n,
            comparators=(),
            tags={"clients": n},
        )
        for n in sizes
    ]


def model_sweep(widths: tuple[int, ...]) -> list[Workload]:
    """MLP 784-h-10 with growing width h at 100 clients."""
    return [
        Workload(
            f"mlp-{h}",
            f"MLP 784-{h}-10, 100 clients",
            {"name": "mlp", "hidden": [h]},
            (784,),
            comparators=("plain", "naive"),
            tags={"hidden": h},
        )
        for h in widths
    ]
