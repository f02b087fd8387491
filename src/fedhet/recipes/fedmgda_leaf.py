"""FedMGDA+'s LEAF experiments (Hu, Shaloudegi, Zhang, Yu, §6.1.2–6.1.3, Tables 6 and 12–14) as recipes.

- ``fedmgda-femnist`` (Table 6): Federated EMNIST, full batch, the best setting of each method from Table 13;
  mean, std, 5th and 95th percentile of the final per-user test accuracy, and Fig. 3's violins for FEMNIST.
- ``fedmgda-femnist-b20`` (Table 12) and ``fedmgda-femnist-full-batch`` (Table 13): every row of those tables.
- ``fedmgda-shakespeare`` (Table 14): 31 roles, full participation, b = 10; client- and data-averaged accuracy.

They read LEAF's JSON files (``<data_dir>/femnist/``, ``<data_dir>/shakespeare/``: LEAF's ``train/`` and
``test/`` folders as its ``preprocess.sh`` writes them; fedhet merges a user's two parts and splits them again
with the recipe's ``test_fraction``). Without the FEMNIST files the FEMNIST recipes run on scikit-learn's digits
(Dirichlet(0.5) users, the MLP of the other FedMGDA+ fallbacks) and say so; Shakespeare has no embedded
stand-in (a next-character task needs the text), so its recipe needs the files.

Settings (paper: §6.1.2, §6.1.3, Tables 1, 4, 5, 12–14) and the choices the engine forced:

- FEMNIST: 3,406 writers, 10 per round, η_l = 0.1, 1,500 rounds, 4 seeds, the Table 4 CNN (``cnn_femnist``); a
  user's test part is 10% (Table 1: 709,385 train and 80,011 test samples). One local epoch (k = 1) is a fixed
  number of steps for every client (the engine's step counts are per run): b = 20 takes 10 steps, the mean
  epoch (709,385 / 3,406 / 20 ≈ 10.4); "full batch" is one step with b = 1000, the whole local training set of
  every writer (LEAF's FEMNIST writers hold 227 ± 89 samples; a writer above 1000 would take a 1000-sample
  mini-batch).
- Shakespeare: 31 roles (a random subset when the files hold more), all in every round, b = 10, 200 rounds,
  4 seeds, ``char_lstm`` (8-d embedding, two LSTM layers of 256, a dense read-out); 300 local steps, the mean
  epoch (92,959 / 31 / 10 ≈ 300); a user's test part is 20% (Table 1: 23,255 of 116,214 samples).
- Table 14's FedAvg and FedProx rows are (η_l, local momentum) pairs: (0.25, 0.5), (0.5, 0.5), (0.8, 0),
  (0.8, 0.5), (1, 0.5). The momentum is the clients' SGD momentum (``local.optimizer: {name: sgd, momentum:
  0.5}``), reset every round as in the authors' code, which builds a new local optimiser each round (their
  Shakespeare code is not released). FedMGDA+ and FedAvg-n rows do not state η_l or a momentum: they use 0.8 and
  plain SGD (q-FFL's Shakespeare setting, which FedMGDA+ follows for this data set).
- Table 12 prints its fourth FedMGDA+ row as (η = 1, decay 1/2), a repeat of the second; the other blocks of the
  table have (1, 1/5) there, which is used.
- "decay" is the total factor over the run (β = decay^(100/T) every 100 rounds; 0 and 1: none), FedProx's μ is
  passed as 2μ and q-FedAvg uses the non-averaged total loss with its stated L: as in `fedhet.recipes.fedmgda`.
"""

from __future__ import annotations

from typing import Any

from fedhet.experiments.reproduce import Recipe, deep_merge, register_recipe
from fedhet.recipes.fedmgda import (
    DIGITS,
    FEDAVG,
    QUICK,
    FedMGDARecipe,
    accuracy_violins,
    fedavg_n,
    fedprox,
    mgda_plus,
    qfedavg,
)

SEEDS = (1, 5000, 6000, 9000)  # 4 seeds, as the authors' CIFAR scripts
FULL_BATCH = 1000  # ≥ every FEMNIST writer's training samples: one step is one full-batch epoch
FEMNIST: dict[str, Any] = {
    "dataset": "femnist",
    "partition": "natural",
    "model": "cnn_femnist",  # Table 4
    "num_clients": 3406,
    "clients_per_round": 10,
    "test_fraction": 0.1,
    "rounds": 1500,
    "local": {"steps": 1, "lr": 0.1, "batch_size": FULL_BATCH},
    "eval_every": 50,
    "metrics": ["accuracy_percentiles"],
}
B20: dict[str, Any] = deep_merge(FEMNIST, {"local": {"steps": 10, "batch_size": 20}})
DIGITS_FEMNIST: dict[str, Any] = {
    **DIGITS,
    "partition": {"name": "dirichlet", "alpha": 0.5, "min_size": 20},
    "local": {"steps": 1, "lr": 0.1, "batch_size": 400},  # full batch: every digits client holds < 400
    "metrics": ["accuracy_percentiles"],
}
DIGITS_B20: dict[str, Any] = {**DIGITS_FEMNIST, "local": {"steps": 3, "lr": 0.1, "batch_size": 20}}
COLUMNS: dict[str, str] = {
    "test_accuracy": "Average",
    "test_accuracy_std": "Std.",
    "test_accuracy_p5": "Worst 5% (p5)",
    "test_accuracy_p95": "Best 5% (p95)",
}
# Tables 12 and 13: (η_g, total decay) of the FedMGDA+, MGDA-Prox and FedAvg-n rows; 0 is "no decay"
GRID = ((1.0, 0.0), (1.0, 0.5), (2.0, 0.5), (1.0, 0.2), (2.0, 0.2))
PROX = 0.1  # MGDA-Prox's μ (Table 5)


def femnist_methods() -> dict[str, dict[str, Any]]:
    """Every row of Tables 12 and 13, in the paper's order."""
    methods: dict[str, dict[str, Any]] = {"FedMGDA": {"algorithm": {"name": "fedmgda"}}}
    for lr, decay in GRID:
        methods[f"FedMGDA+ (η={lr:g}, decay {decay:g})"] = {"algorithm": mgda_plus(lr, decay)}
    for lr, decay in GRID:
        methods[f"MGDA-Prox (η={lr:g}, decay {decay:g}, μ={PROX:g})"] = {"algorithm": mgda_plus(lr, decay, PROX)}
    methods["FedAvg"] = {"algorithm": FEDAVG}
    for lr, decay in GRID:
        methods[f"FedAvg-n (η={lr:g}, decay {decay:g})"] = {"algorithm": fedavg_n(lr, decay)}
    for mu in (0.01, 0.1, 0.5):
        methods[f"FedProx (μ={mu:g})"] = {"algorithm": fedprox(mu)}
    for lipschitz in (0.1, 1.0):
        for q in (0.1, 0.5, 1.0):
            methods[f"q-FedAvg (q={q:g}, L={lipschitz:g})"] = {"algorithm": qfedavg(q, lipschitz)}
    return methods


TABLE6 = (  # the best row of each method in Table 13
    "FedMGDA",
    "FedMGDA+ (η=2, decay 0.2)",
    "MGDA-Prox (η=2, decay 0.2, μ=0.1)",
    "FedAvg",
    "FedAvg-n (η=2, decay 0.2)",
    "FedProx (μ=0.5)",
    "q-FedAvg (q=0.1, L=0.1)",
)


@register_recipe
def femnist() -> Recipe:
    every = femnist_methods()
    return FedMGDARecipe(
        name="fedmgda-femnist",
        description="FedMGDA+ Table 6: Federated EMNIST, full batch, per-user test accuracy of the final model",
        base=FEMNIST,
        methods={name: every[name] for name in TABLE6},
        columns=COLUMNS,
        seeds=SEEDS,
        quick=QUICK,
        figures={"test_accuracy": "accuracy.png"},
        fallback=DIGITS_FEMNIST,
        extra_figures=accuracy_violins,
    )


@register_recipe
def femnist_b20() -> Recipe:
    return FedMGDARecipe(
        name="fedmgda-femnist-b20",
        description="FedMGDA+ Table 12: Federated EMNIST, b = 20, every setting of every method",
        base=B20,
        methods=femnist_methods(),
        columns=COLUMNS,
        seeds=SEEDS,
        quick=QUICK,
        fallback=DIGITS_B20,
    )


@register_recipe
def femnist_full_batch() -> Recipe:
    return FedMGDARecipe(
        name="fedmgda-femnist-full-batch",
        description="FedMGDA+ Table 13: Federated EMNIST, full batch, every setting of every method",
        base=FEMNIST,
        methods=femnist_methods(),
        columns=COLUMNS,
        seeds=SEEDS,
        quick=QUICK,
        fallback=DIGITS_FEMNIST,
    )


SHAKESPEARE: dict[str, Any] = {
    "dataset": "shakespeare",
    "partition": "natural",
    "model": "char_lstm",
    "num_clients": 31,
    "clients_per_round": 31,
    "test_fraction": 0.2,
    "rounds": 200,
    "local": {"steps": 300, "lr": 0.8, "batch_size": 10},
    "eval_every": 10,
    "metrics": ["accuracy_percentiles"],
}
FEDPROX_SHAKESPEARE = 0.001  # Table 14's caption


SHAKESPEARE_LOCAL = ((0.25, 0.5), (0.5, 0.5), (0.8, 0.0), (0.8, 0.5), (1.0, 0.5))  # Table 14: (η_l, momentum)


def local_sgd(lr: float, momentum: float) -> dict[str, Any]:
    """The ``local`` changes of a Table 14 row: η_l and the clients' SGD momentum (reset every round)."""
    return {"lr": lr, "optimizer": {"name": "sgd", "momentum": momentum}}


def shakespeare_methods() -> dict[str, dict[str, Any]]:
    """Table 14's rows, in the paper's order."""
    methods: dict[str, dict[str, Any]] = {}
    for lr, momentum in SHAKESPEARE_LOCAL:
        methods[f"FedAvg (η_l={lr:g}, momentum {momentum:g})"] = {"algorithm": FEDAVG, "local": local_sgd(lr, momentum)}
    for lr, momentum in SHAKESPEARE_LOCAL:
        methods[f"FedProx (η_l={lr:g}, momentum {momentum:g}, μ={FEDPROX_SHAKESPEARE:g})"] = {
            "algorithm": fedprox(FEDPROX_SHAKESPEARE),
            "local": local_sgd(lr, momentum),
        }
    for lr, decay in ((10.0, 1.0), (12.5, 1.0), (20.0, 0.8), (20.0, 1.0)):
        methods[f"FedMGDA+ (η={lr:g}, decay {decay:g})"] = {"algorithm": mgda_plus(lr, decay)}
    for lr, decay in ((2.0, 1.0), (2.5, 1.0), (5.0, 0.8), (10.0, 0.8)):
        methods[f"FedAvg-n (η={lr:g}, decay {decay:g})"] = {"algorithm": fedavg_n(lr, decay)}
    return methods


@register_recipe
def shakespeare() -> Recipe:
    return FedMGDARecipe(
        name="fedmgda-shakespeare",
        description="FedMGDA+ Table 14: Shakespeare, 31 roles in every round, b = 10, next-character accuracy",
        base=SHAKESPEARE,
        methods=shakespeare_methods(),
        columns={
            "test_accuracy": "Avg (client)",
            "test_accuracy_pooled": "Avg (data)",
            "test_accuracy_std": "Std.",
            "test_accuracy_p5": "Worst 5% (p5)",
            "test_accuracy_p95": "Best 5% (p95)",
        },
        seeds=SEEDS,
        quick={"rounds": 20, "local": {"steps": 30}},
        figures={"test_accuracy": "accuracy.png"},
        extra_figures=accuracy_violins,
    )
