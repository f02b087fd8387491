"""Clustered clients: does a method find the groups, and does its clients' accuracy gain from it?

Scikit-learn's digits with the MLP, 20 clients with IID labels, every client in every round (IFCA's and CFL's
setting), each client in one of 4 ground-truth groups (``shift``, docs/clusters.md): two recipes, one a covariate
shift (``clusters-rotation``: group g's images rotated by g·90°) and one a concept shift (``clusters-labels``: group
g's labels permuted by π_g). The methods: FedAvg (one model for all), IFCA with k = 4 (the number of groups given),
CFL (clusters found by splitting; ε1 = 0.3, ε2 = 0.4 for this model and local training, as its update norms show),
Ditto and local training alone; and FedBN (each client's batch-norm layers kept local) beside FedAvg on a ResNet-8
with batch norm, since the MLP has none. For each: the mean and worst-10% test accuracy of the clients'
personalised models (FedAvg's: its global model), the adjusted Rand index of the clusters against the groups (IFCA,
CFL), and the global model's accuracy.
"""

from __future__ import annotations

from typing import Any

from fedhet.experiments.reproduce import Recipe, register_recipe

BASE: dict[str, Any] = {
    "dataset": "digits",
    "model": "mlp",
    "partition": "iid",
    "num_clients": 20,
    "clients_per_round": 20,
    "rounds": 30,
    "eval_every": 5,
    "local": {"steps": 10, "lr": 0.05, "batch_size": 10},
}
RESNET: dict[str, Any] = {"name": "resnet8", "width": 8}  # batch norm after every convolution
METHODS: dict[str, dict[str, Any]] = {
    "FedAvg": {"algorithm": "fedavg", "personal_eval": {"enabled": True}},
    "IFCA (k=4)": {"algorithm": {"name": "ifca", "k": 4}},
    "CFL": {"algorithm": {"name": "cfl", "eps1": 0.3, "eps2": 0.4}},
    "Ditto": {"algorithm": "ditto"},
    "Local only": {"algorithm": "local_only"},
    # FedBN needs batch norm: a ResNet-8 (width 8), beside FedAvg on the same model for a fair comparison
    "FedAvg (ResNet-8)": {"algorithm": "fedavg", "model": RESNET, "personal_eval": {"enabled": True}},
    "FedBN (ResNet-8)": {"algorithm": "fedbn", "model": RESNET},
}
COLUMNS: dict[str, str] = {
    "personal_test_accuracy": "accuracy (personalised)",
    "personal_test_accuracy_worst10": "worst 10% (personalised)",
    "ari": "ARI",
    "test_accuracy": "global model acc",
}
FIGURES = {"personal_test_accuracy": "personal_accuracy.png"}
QUICK: dict[str, Any] = {"rounds": 10}
SHIFTS: dict[str, dict[str, Any]] = {
    "rotation": {"name": "rotation", "groups": 4},
    "labels": {"name": "labels", "groups": 4},
}


def _recipe(shift: str, description: str) -> Recipe:
    return Recipe(
        name=f"clusters-{shift}",
        description=description,
        base={**BASE, "shift": SHIFTS[shift]},
        methods=METHODS,
        columns=COLUMNS,
        quick=QUICK,
        figures=FIGURES,
    )


@register_recipe
def rotation() -> Recipe:
    return _recipe("rotation", "digits in 4 rotation groups: cluster recovery (ARI) and personalised accuracy")


@register_recipe
def labels() -> Recipe:
    return _recipe("labels", "digits in 4 label-permutation groups: cluster recovery (ARI) and personalised accuracy")
