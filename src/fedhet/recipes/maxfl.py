"""MaxFL's experiments (Cho et al., TMLR §5 and App. D) as recipes.

Paper settings: FMNIST (100 seen + 100 unseen clients, 5 per round, Dirichlet 0.5 or 5 clusters × 2 labels),
MLP [64, 30] with dropout, 60/40 per-client split, 30% of clients label-flipped, ρ_k from 100 solo steps,
200 rounds with appeal-driven opt-in/out after 10 mandatory rounds, 3 seeds. Without the FMNIST files the
recipes run on scikit-learn's digits (20 seen + 20 unseen clients, 100 rounds, opt-out from round 30) and say
so.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from fedhet.experiments.recipes import Recipe, register_recipe

PAPER: dict[str, Any] = {
    "dataset": "fashion_mnist",
    "partition": {"name": "dirichlet", "alpha": 0.5, "min_size": 50},
    "model": {"name": "mlp", "hidden": [64, 30], "dropout": 0.2, "dropout_after": "first"},
    "num_clients": 100,
    "unseen_clients": 100,
    "clients_per_round": 5,
    "test_fraction": 0.4,
    "label_noise": {"fraction": 0.3, "mapping": "reverse"},
    "availability": {"name": "appeal", "mandatory_rounds": 10},
    "requirements": {"steps": 100},
    "metrics": [{"name": "appeal", "finetune_steps": 5}],
    "rounds": 200,
    "local": {"steps": 10, "lr": 0.05, "batch_size": 32},
}
EMBEDDED: dict[str, Any] = {
    "dataset": "digits",
    "partition": {"name": "dirichlet", "alpha": 0.5, "min_size": 20},
    "num_clients": 20,
    "unseen_clients": 20,
    "rounds": 100,
    # At round 10 no digits client finds any model appealing yet (ρ from 100 solo steps on ~60 samples is low),
    # so the pool would empty and training stop for every method; opt-out starts after 30 rounds instead.
    "availability": {"name": "appeal", "mandatory_rounds": 30},
}
QUICK: dict[str, Any] = {"rounds": 40}
SEEN_UNSEEN: dict[str, str] = {
    "test_accuracy": "seen test acc",
    "gm_appeal": "seen GM-appeal",
    "unseen_test_accuracy": "unseen test acc",
    "unseen_gm_appeal": "unseen GM-appeal",
}
METHODS: dict[str, dict[str, Any]] = {
    "FedAvg": {"algorithm": "fedavg"},
    "FedProx": {"algorithm": {"name": "fedprox", "mu": 0.01}},
    "SCAFFOLD": {"algorithm": "scaffold"},
    "Per-FedAvg": {"algorithm": "perfedavg"},
    "pFedMe": {"algorithm": "pfedme"},
    "q-FFL (q=1)": {"algorithm": {"name": "qffl", "q": 1.0}},
    "MW-Fed": {"algorithm": "mwfed"},
    "MaxFL": {"algorithm": "maxfl"},
}


def _methods(names: tuple[str, ...]) -> dict[str, dict[str, Any]]:
    return {name: METHODS[name] for name in names}


@register_recipe
def table1() -> Recipe:
    return Recipe(
        name="maxfl-table1",
        description="MaxFL Table 1: flexible participation, avg test accuracy and GM-appeal, seen and unseen",
        base=PAPER,
        methods=METHODS,
        columns=SEEN_UNSEEN,
        fallback=EMBEDDED,
        quick=QUICK,
        figures={"gm_appeal": "gm_appeal.png", "test_accuracy": "test_accuracy.png"},
    )


@register_recipe
def unseen() -> Recipe:
    return Recipe(
        name="maxfl-unseen",
        description="MaxFL unseen clients (cluster partition): GM-appeal and preferred-model accuracy",
        base={**PAPER, "partition": {"name": "label_clusters", "num_clusters": 5, "labels_per_cluster": 2}},
        methods=_methods(("FedAvg", "FedProx", "SCAFFOLD", "Per-FedAvg", "MW-Fed", "MaxFL")),
        columns={"unseen_gm_appeal": "unseen GM-appeal", "unseen_preferred_accuracy": "unseen preferred acc"},
        fallback={**EMBEDDED, "partition": {"name": "label_clusters", "num_clusters": 5, "labels_per_cluster": 2}},
        quick=QUICK,
        figures={"gm_appeal": "gm_appeal.png", "preferred_accuracy": "preferred_accuracy.png"},
    )


@register_recipe
def finetuning() -> Recipe:
    cluster = {"name": "label_clusters", "num_clusters": 5, "labels_per_cluster": 2}
    return Recipe(
        name="maxfl-finetune",
        description="MaxFL Table 3: GM-appeal after 5 local tuning steps from the final global model",
        base={**PAPER, "partition": cluster},
        methods=_methods(("FedAvg", "FedProx", "SCAFFOLD", "Per-FedAvg", "MW-Fed", "MaxFL")),
        columns={
            "ft_gm_appeal": "seen GM-appeal (tuned)",
            "ft_unseen_gm_appeal": "unseen GM-appeal (tuned)",
            "ft_preferred_accuracy": "seen preferred acc (tuned)",
            "ft_unseen_preferred_accuracy": "unseen preferred acc (tuned)",
        },
        fallback={**EMBEDDED, "partition": cluster},
        quick=QUICK,
    )


def _byzantine(fraction: float) -> dict[str, Any]:
    return {"name": "malicious", "fraction": fraction, "update": "gaussian", "noise_std": 1.0, "loss_bias": 10.0}


@register_recipe
def byzantine() -> Recipe:
    methods = {
        f"{name} (Byz={frac})": {**METHODS[name], "attack": _byzantine(frac)}
        for name in ("MW-Fed", "MaxFL")
        for frac in (0.1, 0.05)
    }
    return Recipe(
        name="maxfl-byzantine",
        description="MaxFL Byzantine table: clients report +10 loss and add N(0, 1) noise to their updates",
        base=PAPER,
        methods=methods,
        columns=SEEN_UNSEEN,
        fallback=EMBEDDED,
        quick=QUICK,
    )


@register_recipe
def local_steps_ablation() -> Recipe:
    cluster = {"name": "label_clusters", "num_clusters": 5, "labels_per_cluster": 2}
    methods = {
        f"{name} τ_l={steps}": {**METHODS[name], "requirements": {"steps": steps}}
        for name in ("FedAvg", "FedProx", "MaxFL")
        for steps in (50, 100, 150)
    }
    return Recipe(
        name="maxfl-tau-ablation",
        description="MaxFL τ_l ablation: GM-appeal and preferred-model accuracy for 50/100/150 solo steps",
        base={**PAPER, "partition": cluster},
        methods=methods,
        columns={"gm_appeal": "GM-appeal", "preferred_accuracy": "preferred acc"},
        fallback={**EMBEDDED, "partition": cluster},
        quick=QUICK,
    )


def _mean_estimation(out: Path, quick: bool, seeds: tuple[int, ...]) -> str:
    from fedhet.report.tables import markdown_table
    from fedhet.studies.mean_estimation import three_client_appeal, two_client_curve
    from fedhet.studies.plots import plot_two_client_curve

    runs = 2000 if quick else 10_000
    curve = two_client_curve(points=11 if quick else 21, runs=runs, seed=seeds[0])
    plot_two_client_curve(curve, out / "mean_estimation_two_clients.png")
    rows = [
        [f"{g:.1f}", f"{a:.3f}", f"{r:.3f}", f"{m:.3f}"]
        for g, a, r, m in zip(curve.gamma_g2, curve.fedavg, curve.maxfl_relu, curve.maxfl, strict=True)
    ]
    table = "### MaxFL mean estimation, two clients: expected GM-appeal against heterogeneity γ_G²\n\n"
    table += markdown_table(["γ_G²", "standard FL", "MaxFL (ReLU)", "MaxFL"], rows)
    three = three_client_appeal(runs=runs, seed=seeds[0])
    table += "\n### Three clients: expected GM-appeal per case\n\n"
    table += markdown_table(
        ["case", "standard FL", "MaxFL (ReLU)", "MaxFL"],
        [[case, *(f"{v[k]:.3f}" for k in ("fedavg", "maxfl_relu", "maxfl"))] for case, v in three.items()],
    )
    return table


@register_recipe
def mean_estimation() -> Recipe:
    return Recipe(
        name="maxfl-mean-estimation",
        description="MaxFL mean estimation (2 and 3 clients): expected GM-appeal of FedAvg, MaxFL (ReLU), MaxFL",
        base={},
        methods={},
        columns={},
        custom=_mean_estimation,
    )
