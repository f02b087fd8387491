"""FedMGDA+'s experiments (Hu, Shaloudegi, Zhang, Yu, §6 and Appendix B) as recipes.

- ``fedmgda-interpolation`` and ``fedmgda-interpolation-iid`` (Figs 1, 5–7): FedMGDA with ε ∈ {0, 0.05, 0.1,
  0.5, 1} on raw updates, η_g = 1, on the non-iid shards and on the iid split; average user accuracy and training
  loss against rounds, and the participants' training loss on a log scale (Fig. 7, ``local_loss_log.png``).
- ``fedmgda-fairness`` (Fig. 3 left, Table 8): the final per-user test accuracy of FedMGDA, FedMGDA+, MGDA-Prox,
  FedAvg, FedAvg-n, FedProx and q-FedAvg: mean, std, the paper's 5th/95th percentiles, worst/best 10%, and Fig. 3's
  violins of it (``user_accuracy_violins.png``).
- ``fedmgda-improved`` (Fig. 4 left): the share of participants whose training loss did not increase per round.
- ``fedmgda-bias-attack`` (Table 7, Fig. 2 left): one client adds a constant to the loss it reports; AFL and
  q-FedAvg use the losses, FedMGDA+ does not. A last row trains on the attacked client alone (Baseline_PhD).
- ``fedmgda-scaling-attack`` (Fig. 2 right): one client, present in every round, trains on and reports s × its
  loss (s = 10, our choice: the paper does not state it); every method with and without the attacker.
- FEMNIST (Tables 6, 12, 13) and Shakespeare (Table 14): `fedhet.recipes.fedmgda_leaf`.

Paper settings (CIFAR-10 with the paper's CNN; Adult for the bias attack) are the base configs; without those
files the recipes run on scikit-learn's digits with the same protocol scaled down, and say so. Choices, where
the paper or the framework forced one (see also the module docs of the strategies):

- One local epoch (k = 1) is ``local.steps`` = ⌈n_train / b⌉ steps, the same for every client (the engine has fixed
  step counts): CIFAR-10 users hold 400 training images (``test_fraction`` 1/3 of the 600 images a user gets
  from all 60,000: the paper's 400 train and a 200-image test part standing for its 50 val + 50 test); on Adult
  the two domains differ 70×, so both take 50 steps of b = 10 (the PhD domain's epoch) instead of one epoch each.
- Local SGD has no momentum (the paper says SGD; the authors' code hard-codes momentum 0.5, which the engine lacks).
- The total decay "decay = 1/10 over T rounds" becomes β = decay^(100/T), applied every 100 rounds (``total_decay``
  in a method's algorithm block is turned into ``lr_decay`` and ``decay_every`` by `FedMGDARecipe.config`); a run
  of T' < T rounds (embedded, quick) decays every 100 T'/T rounds, so it decays as often and by the same total.
- AFL's weight step γ_w is 1 (the paper's grid is {0.01, 0.1}, for clients that run a whole epoch, about 3,200
  steps on Adult's non-PhD domain; with our 15–50 local steps γ_w = 0.1 leaves AFL far from converged: 79.7%
  against 93.9% on the embedded bias-attack run without attack, two seeds). γ_λ = 0.5 as in Fig. 2.
- FedProx and MGDA-Prox: the authors' code adds μ‖w − w_t‖² (no ½); the engine's term is (μ/2)‖·‖², so the
  paper's μ is passed as 2μ.
- q-FedAvg uses F_k = mean loss × number of local mini-batches (``loss: batch_sum``), the authors' convention on
  which its q, L and the bias levels 1000–10000 were chosen; AFL uses the mean loss (bias 0.01–1).
- q-FedAvg's L is always given: L = 1 where the paper states it (Fig. 3 left's caption; the authors' Figure 4
  scripts), and L = 1 where it does not (Table 7, Fig. 2 right), the authors' code default
  (``--Lipschitz_constant 1.0``). fedhet's own default, Li et al.'s L = 1/η_l, would be 20 on the embedded data.
- The box centre λ0 is uniform over the sampled clients (authors' code); FedAvg is uniform-weighted to match.
"""

from __future__ import annotations

import csv
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch

from fedhet.experiments.executor import Outcome
from fedhet.experiments.reproduce import Recipe, deep_merge, mean_curves, register_recipe
from fedhet.experiments.runner import CLIENTS
from fedhet.experiments.state import RunState
from fedhet.methods.fedmgda.strategy import beta_for_decay

CIFAR: dict[str, Any] = {
    "dataset": "cifar10",
    "partition": {"name": "shards", "shards_per_client": 5},
    "model": "cnn_cifar_lrn",  # Table 2
    "num_clients": 100,
    "clients_per_round": 10,
    "test_fraction": 1 / 3,
    "rounds": 2000,
    "local": {"steps": 40, "lr": 0.01, "batch_size": 10},
    "eval_every": 10,
}
DIGITS: dict[str, Any] = {
    "dataset": "digits",
    "model": {"name": "mlp", "hidden": [64]},
    "num_clients": 30,
    "clients_per_round": 6,
    "test_fraction": 0.2,
    "rounds": 300,
    "local": {"steps": 5, "lr": 0.05, "batch_size": 10},
    "eval_every": 5,
}
QUICK: dict[str, Any] = {"rounds": 40, "eval_every": 5}

FEDAVG = {"name": "fedavg", "weighting": "uniform"}


def mgda_plus(server_lr: float, decay: float, prox: float = 0.0) -> dict[str, Any]:
    """FedMGDA+ (ε = 1, normalised) with global step η_g and total decay; MGDA-Prox when `prox` > 0."""
    spec: dict[str, Any] = {"name": "fedmgda_plus", "server_lr": server_lr, "total_decay": decay}
    if prox:
        spec["prox_mu"] = 2 * prox
    return spec


def fedavg_n(server_lr: float, decay: float) -> dict[str, Any]:
    return {"name": "fedavg_n", "server_lr": server_lr, "total_decay": decay}


def fedprox(mu: float) -> dict[str, Any]:
    return {"name": "fedprox", "mu": 2 * mu, "weighting": "uniform"}


def qfedavg(q: float, lipschitz: float) -> dict[str, Any]:
    """q-FedAvg on the authors' "non-averaged total" loss, with the paper's L (explicit: fedhet's default is 1/η_l)."""
    return {"name": "qffl", "q": q, "lipschitz": lipschitz, "loss": "batch_sum"}


def afl(lambda_lr: float, weight_lr: float) -> dict[str, Any]:
    """AFL with γ_λ = `lambda_lr` and γ_w = `weight_lr`; it reports the average of its iterates."""
    return {"name": "afl", "lambda_lr": lambda_lr, "server_lr": weight_lr}


@dataclass
class FedMGDARecipe(Recipe):
    """A recipe whose methods may give the global step's decay as a total factor over the run (``total_decay``).

    The paper decays every 100 rounds of its T rounds by β = decay^(100/T). A run of T' rounds (embedded, quick)
    keeps the same schedule scaled in time: a decay every 100 T'/T rounds, by the same total factor.
    ``pinned`` holds per-method changes applied after the embedded fallback and --quick (settings that make the
    method what it is, such as a cohort of one).
    """

    pinned: dict[str, dict[str, Any]] = field(default_factory=dict)

    def config(self, method: str, seed: int, quick: bool, embedded: bool = False) -> dict[str, Any]:
        raw = deep_merge(super().config(method, seed, quick, embedded), self.pinned.get(method, {}))
        algorithm = raw.get("algorithm")
        if isinstance(algorithm, dict) and "total_decay" in algorithm:
            algorithm = dict(algorithm)
            rounds = int(raw.get("rounds", 20))
            every = max(1, round(100 * rounds / int(self.base.get("rounds", rounds))))
            algorithm["lr_decay"] = beta_for_decay(float(algorithm.pop("total_decay")), rounds, every)
            algorithm["decay_every"] = every
            raw["algorithm"] = algorithm
        return raw


@dataclass(frozen=True)
class MeanOverRounds:
    """A `summarise` hook: the mean of `metric` over the evaluated rounds (and over the last half); a class, not a
    closure, so that runs in worker processes can be given it."""

    metric: str

    def __call__(self, state: RunState) -> dict[str, float]:
        values = np.asarray([row.get(self.metric, np.nan) for row in state.history], dtype=float)
        if len(values) == 0:
            return {}
        return {
            f"{self.metric}_mean": float(np.nanmean(values)),
            f"{self.metric}_late": float(np.nanmean(values[len(values) // 2 :])),
        }


def user_accuracies(runs: list[Outcome]) -> list[float]:
    """The final model's test accuracy on every seen client, over all seeds (from each run's clients.csv)."""
    values: list[float] = []
    for run in runs:
        if (run.task.out / CLIENTS).is_file():
            with (run.task.out / CLIENTS).open(newline="") as f:
                values += [float(r["test_accuracy"]) for r in csv.DictReader(f) if float(r.get("seen", 1)) > 0]
    return values


def accuracy_violins(recipe: Recipe, runs: dict[str, list[Outcome]], out: Path) -> None:
    """Fig. 3: violins of the final per-user test accuracy, one per method, σ over users in the labels."""
    from fedhet.report.plots import plot_violins

    groups = {method: user_accuracies(states) for method, states in runs.items()}
    seeds = max((len(states) for states in runs.values()), default=0)
    plot_violins(
        groups,
        out / "user_accuracy_violins.png",
        title="Per-user test accuracy of the final model (FedMGDA+ Fig. 3)",
        ylabel="test accuracy of a user (final model)",
        caption=f"Users of all {seeds} seeds pooled. {recipe.name}: {recipe.description}.",
    )


def log_loss_curves(recipe: Recipe, runs: dict[str, list[Outcome]], out: Path) -> None:
    """Fig. 7: the uniformly averaged training loss of the participants (``local_loss``) on a log scale."""
    from fedhet.report.plots import plot_mean_curves

    curves, rounds = mean_curves(runs, "local_loss")
    plot_mean_curves(
        curves,
        rounds,
        "local_loss",
        out / "local_loss_log.png",
        title="Participants' training loss, uniformly averaged (FedMGDA+ Fig. 7)",
        context=f"{recipe.name}: {recipe.description}.",
        yscale="log",
    )


# ------------------------------------------------------------------------------------------- interpolation


EPSILONS = (0.0, 0.05, 0.1, 0.5, 1.0)  # the authors' Figure 1 scripts


def interpolation_recipe(iid: bool) -> Recipe:
    """FedMGDA with ε ∈ `EPSILONS` on raw updates, η_g = 1, on the non-iid shards or the iid split."""
    label = "iid" if iid else "non-iid"
    methods = {
        f"ε={eps:g}" + (" (FedAvg)" if eps == 0 else " (MGDA)" if eps == 1 else ""): {
            "algorithm": {"name": "fedmgda", "epsilon": eps}
        }
        for eps in EPSILONS
    }
    partition: dict[str, Any] = {"name": "iid"} if iid else {"name": "shards", "shards_per_client": 5}
    return FedMGDARecipe(
        name="fedmgda-interpolation" + ("-iid" if iid else ""),
        description=f"FedMGDA+ Fig. 1 ({label}): FedMGDA, ε from 0 (FedAvg) to 1 (MGDA), η_g = 1",
        base={**CIFAR, "partition": partition},
        methods=methods,
        columns={
            "test_accuracy": "avg user acc",
            "train_loss": "train loss (all users)",
            "local_loss": "local train loss (participants)",
            "test_accuracy_std": "std user acc",
        },
        seeds=(1, 2, 3, 4, 5),
        quick=QUICK,
        figures={"test_accuracy": "accuracy.png", "local_loss": "local_loss.png", "train_loss": "train_loss.png"},
        fallback=DIGITS,
        extra_figures=log_loss_curves,
    )


@register_recipe
def interpolation() -> Recipe:
    return interpolation_recipe(iid=False)


@register_recipe
def interpolation_iid() -> Recipe:
    return interpolation_recipe(iid=True)


# ------------------------------------------------------------------------------------------------ fairness

FAIRNESS_METHODS: dict[str, dict[str, Any]] = {
    "FedMGDA": {"algorithm": {"name": "fedmgda"}},
    "FedMGDA+ (η=1.5, decay 0.1)": {"algorithm": mgda_plus(1.5, 0.1)},
    "MGDA-Prox (η=1, decay 0.1, μ=0.1)": {"algorithm": mgda_plus(1.0, 0.1, prox=0.1)},
    "FedAvg": {"algorithm": FEDAVG},
    "FedAvg-n (η=1.5, decay 0.1)": {"algorithm": fedavg_n(1.5, 0.1)},
    "FedProx (μ=0.01)": {"algorithm": fedprox(0.01)},
    "q-FedAvg (q=0.5, L=1)": {"algorithm": qfedavg(0.5, 1.0)},  # Fig. 3 left's caption: q = 0.5, L = 1.0
}


@register_recipe
def fairness() -> Recipe:
    return FedMGDARecipe(
        name="fedmgda-fairness",
        description="FedMGDA+ Fig. 3 / Table 8: per-user test accuracy of the final model (b = 10, p = 0.1)",
        base={**CIFAR, "metrics": ["accuracy_percentiles"]},
        methods=FAIRNESS_METHODS,
        columns={
            "test_accuracy": "Average",
            "test_accuracy_std": "Std.",
            "test_accuracy_p5": "Worst 5% (p5)",
            "test_accuracy_p95": "Best 5% (p95)",
            "test_accuracy_worst10": "worst-10% mean",
            "test_accuracy_best10": "best-10% mean",
        },
        seeds=(1, 5000, 6000, 9000),
        quick=QUICK,
        figures={"test_accuracy": "accuracy.png", "test_accuracy_std": "accuracy_std.png"},
        fallback=DIGITS,
        extra_figures=accuracy_violins,
    )


# ------------------------------------------------------------------------------------------ improved users


@register_recipe
def improved() -> Recipe:
    methods = {
        "FedAvg": {"algorithm": FEDAVG},
        "FedAvg-n (η=1, decay 0.1)": {"algorithm": fedavg_n(1.0, 0.1)},
        "FedMGDA+ (η=1, decay 0.1)": {"algorithm": mgda_plus(1.0, 0.1)},
        "FedProx (μ=0.1)": {"algorithm": fedprox(0.1)},
        "MGDA-Prox (η=1, decay 0.1, μ=0.1)": {"algorithm": mgda_plus(1.0, 0.1, prox=0.1)},
        "q-FedAvg (q=0.5, L=1)": {"algorithm": qfedavg(0.5, 1.0)},  # the authors' Figure 4 scripts
    }
    every_round = {"eval_every": 1, "metrics": [{"name": "improved_users", "span": 50}]}
    return FedMGDARecipe(
        name="fedmgda-improved",
        description="FedMGDA+ Fig. 4: share of participants whose training loss did not increase in the round",
        base={**CIFAR, **every_round},
        methods=methods,
        columns={
            "improved_users_mean": "improved (mean over rounds)",
            "improved_users_late": "improved (second half)",
            "test_accuracy": "avg user acc",
        },
        seeds=(1, 5000, 6000, 9000),
        quick={**QUICK, "eval_every": 1},
        figures={"improved_users_ewm": "improved_users.png", "test_accuracy": "accuracy.png"},
        summarise=MeanOverRounds("improved_users"),
        fallback={**DIGITS, "eval_every": 1},
    )


# -------------------------------------------------------------------------------------------- bias attack

ADULT: dict[str, Any] = {
    "dataset": "adult",
    "partition": "natural",  # client 0: non-PhD, client 1: PhD (the dataset's users are the PhD flag)
    "model": "logistic",
    "num_clients": 2,
    "clients_per_round": 2,
    "test_fraction": 0.2,
    "rounds": 500,
    "local": {"steps": 50, "lr": 0.01, "batch_size": 10},
    "eval_every": 10,
}
ATTACKED = 1  # the PhD domain
DIGITS_ATTACK: dict[str, Any] = {
    "dataset": "digits",
    "partition": {"name": "shards", "shards_per_client": 2},
    "model": "logistic",
    "num_clients": 10,
    "clients_per_round": 10,
    "test_fraction": 0.2,
    "rounds": 200,
    "local": {"steps": 15, "lr": 0.01, "batch_size": 10},
    "eval_every": 10,
}


def bias(value: float) -> dict[str, Any]:
    return {"name": "malicious", "clients": [ATTACKED], "loss_bias": value}


ALONE = "attacked client alone"  # FedAvg over a cohort of one that the attacker always takes
AFL_BIAS = (0.0, 0.01, 0.1, 1.0)  # on the mean loss (Table 7)
QFFL_BIAS = (0.0, 1000.0, 5000.0, 10000.0)  # on the mean loss × mini-batches (Table 7)
QFFL_L = 1.0  # Table 7 and Fig. 2 right do not state L: the authors' code default (--Lipschitz_constant 1.0)


def bias_methods() -> dict[str, dict[str, Any]]:
    """Table 7's rows; the last one trains on the attacked client alone (the paper's Baseline_PhD)."""
    methods: dict[str, dict[str, Any]] = {}
    for value in AFL_BIAS:
        methods[f"AFL, bias {value:g}"] = {"algorithm": afl(0.5, 1.0), "attack": bias(value)}
    for q in (5.0, 2.0, 0.1):
        for value in QFFL_BIAS:
            methods[f"q-FedAvg q={q:g}, bias {value:g}"] = {"algorithm": qfedavg(q, QFFL_L), "attack": bias(value)}
    for value in (0.0, 10000.0):
        methods[f"FedMGDA+, bias {value:g}"] = {"algorithm": mgda_plus(1.0, 1 / 3), "attack": bias(value)}
    methods[ALONE] = {"algorithm": FEDAVG, "attack": {**bias(0.0), "always_participate": True}}
    return methods


def attack_summary(state: RunState) -> dict[str, float]:
    """Test accuracy of the attacker's client and the mean over the honest ones (PhD / non-PhD on Adult)."""
    acc = state.client_columns.get("test_accuracy")
    if acc is None:
        return {}
    bad = state.experiment.strategy.ctx.attack.malicious
    if len(bad) != len(acc):
        bad = torch.zeros(len(acc), dtype=torch.bool)
    honest = acc[~bad].double()
    return {
        "attacker_accuracy": float(acc[bad].double().mean()) if bool(bad.any()) else math.nan,
        "honest_accuracy": float(honest.mean()) if len(honest) else math.nan,
    }


@register_recipe
def bias_attack() -> Recipe:
    return FedMGDARecipe(
        name="fedmgda-bias-attack",
        description="FedMGDA+ Table 7: one client (Adult's PhD domain) adds a constant to the loss it reports",
        base=ADULT,
        methods=bias_methods(),
        columns={
            "test_accuracy_pooled": "Uniform (pooled)",
            "attacker_accuracy": "attacked client (PhD)",
            "honest_accuracy": "other clients (non-PhD)",
            "test_accuracy": "avg user acc",
        },
        seeds=(0, 1, 2, 3, 4),
        quick={"rounds": 40, "eval_every": 10},
        summarise=attack_summary,
        fallback=DIGITS_ATTACK,
        pinned={ALONE: {"clients_per_round": 1}},
    )


# ----------------------------------------------------------------------------------------- scaling attack

SCALE = 10.0  # the paper does not give s (only its figure does); 10 is our choice


def scaled(spec: dict[str, Any]) -> dict[str, Any]:
    """`spec` with client 0 minimising s·f_0 and reporting s·F_0 in every round (FedMGDA+ §6.2.2)."""
    return {
        **spec,
        "attack": {"name": "malicious", "clients": [0], "loss_scale": SCALE, "always_participate": True},
    }


def scaling_methods() -> dict[str, dict[str, Any]]:
    """Fig. 2 right: each method with and without the attacker."""
    plain = {
        "FedAvg": {"algorithm": FEDAVG},
        "FedProx (μ=0.01)": {"algorithm": fedprox(0.01)},
        "q-FedAvg (q=0.5, L=1)": {"algorithm": qfedavg(0.5, QFFL_L)},
        "q-FedAvg (q=2, L=1)": {"algorithm": qfedavg(2.0, QFFL_L)},
        "FedMGDA+ (η=1, decay 0.1)": {"algorithm": mgda_plus(1.0, 0.1)},
        "FedAvg-n (η=1, decay 0.1)": {"algorithm": fedavg_n(1.0, 0.1)},
        "MGDA-Prox (η=1, decay 0.1, μ=0.1)": {"algorithm": mgda_plus(1.0, 0.1, prox=0.1)},
    }
    methods: dict[str, dict[str, Any]] = {}
    for name, spec in plain.items():
        methods[name] = spec
        methods[f"{name}, attacked ×{SCALE:g}"] = scaled(spec)
    return methods


@register_recipe
def scaling_attack() -> Recipe:
    return FedMGDARecipe(
        name="fedmgda-scaling-attack",
        description="FedMGDA+ Fig. 2 right: one client, in every round, trains on and reports s × its loss (p = 0.2)",
        base={**CIFAR, "clients_per_round": 20, "rounds": 1500},
        methods=scaling_methods(),
        columns={
            "test_accuracy": "avg user acc",
            "test_accuracy_pooled": "pooled test acc",
            "honest_accuracy": "honest clients' acc",
            "attacker_accuracy": "attacker's acc",
        },
        seeds=(1, 2, 3),
        quick=QUICK,
        summarise=attack_summary,
        fallback=DIGITS,
    )
