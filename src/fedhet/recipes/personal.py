"""Personalised federated learning: each method's global model, its clients' personalised models, and their appeal.

Two label skews, each a recipe: every client holds 2 classes (``label_k``, the pathological split of the
personalised-FL papers: FedRep, Ditto, APFL) and Dirichlet(0.1). The methods: FedAvg (its global model, which every
client also takes as its own), FedAvg + 5 fine-tuning steps, local training alone, Ditto, FedPer, FedRep, APFL,
Per-FedAvg, pFedMe and MaxFL + fine-tuning, each at the paper's defaults (docs/personalization.md). For each: the
global model's mean test accuracy, the personalised models' mean and worst-10% test accuracy over the clients (each
on its own test data), and the personalised appeal (the share of clients whose personalised model beats the model
they would train alone, MaxFL's appeal).

The paper-scale setting is CIFAR-10 with LeNet-5 (100 clients, 10 a round); without its files the recipes run on
scikit-learn's digits with the MLP (20 clients, 10 a round), the setting of the docs' table.
"""

from __future__ import annotations

from typing import Any

from fedhet.experiments.reproduce import Recipe, register_recipe

CIFAR: dict[str, Any] = {
    "dataset": "cifar10",
    "model": "lenet_cifar",
    "num_clients": 100,
    "clients_per_round": 10,
    "rounds": 200,
    "eval_every": 10,
    "local": {"steps": 50, "lr": 0.05, "batch_size": 10},
    "requirements": {"steps": 100},
}
DIGITS: dict[str, Any] = {
    "dataset": "digits",
    "model": "mlp",
    "num_clients": 20,
    "clients_per_round": 10,
    "rounds": 100,
    "eval_every": 5,
    "local": {"steps": 10, "lr": 0.05, "batch_size": 10},
}
METHODS: dict[str, dict[str, Any]] = {
    "FedAvg": {"algorithm": "fedavg", "personal_eval": {"enabled": True}},
    "FedAvg + FT": {"algorithm": "fedavg_ft"},
    "Local only": {"algorithm": "local_only"},
    "Ditto": {"algorithm": "ditto"},
    "FedPer": {"algorithm": "fedper"},
    "FedRep": {"algorithm": "fedrep"},
    "APFL": {"algorithm": "apfl"},
    "Per-FedAvg": {"algorithm": "perfedavg"},
    "pFedMe": {"algorithm": "pfedme"},
    "MaxFL + FT": {"algorithm": {"name": "maxfl", "finetune_steps": 5}},
}
COLUMNS: dict[str, str] = {
    "test_accuracy": "global model acc",
    "personal_test_accuracy": "personalised acc",
    "personal_test_accuracy_worst10": "personalised acc, worst 10%",
    "personal_appeal": "personalised appeal",
}
FIGURES = {"personal_test_accuracy": "personal_accuracy.png", "test_accuracy": "global_accuracy.png"}
QUICK: dict[str, Any] = {"rounds": 20}
PARTITIONS: dict[str, dict[str, Any]] = {
    "labels": {"name": "label_k", "labels_per_client": 2},
    "dirichlet": {"name": "dirichlet", "alpha": 0.1, "min_size": 20},
}


def _recipe(partition: str, description: str) -> Recipe:
    split = {"partition": PARTITIONS[partition]}
    return Recipe(
        name=f"personal-{partition}",
        description=description,
        base={**CIFAR, **split},
        methods=METHODS,
        columns=COLUMNS,
        fallback={**DIGITS, **split},
        quick=QUICK,
        figures=FIGURES,
    )


@register_recipe
def labels() -> Recipe:
    return _recipe("labels", "personalised FL, 2 classes per client: global and personalised accuracy, appeal")


@register_recipe
def dirichlet() -> Recipe:
    return _recipe("dirichlet", "personalised FL, Dirichlet(0.1) label skew: global and personalised accuracy, appeal")
