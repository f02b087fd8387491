"""FedMGDA+'s recipes on the embedded data: configs as the paper sets them, and the paper's two qualitative
claims on small runs (improved users per round; robustness to the bias attack), checked on every seed."""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
import torch

from fedhet.engine.threads import torch_threads
from fedhet.experiments.config import parse_config
from fedhet.experiments.reproduce import run_recipe
from fedhet.experiments.runner import run
from fedhet.recipes import get_recipe
from fedhet.recipes.fedmgda import ALONE, accuracy_violins, log_loss_curves

NAMES = (
    "fedmgda-interpolation",
    "fedmgda-interpolation-iid",
    "fedmgda-fairness",
    "fedmgda-improved",
    "fedmgda-bias-attack",
    "fedmgda-scaling-attack",
)


@pytest.mark.parametrize("name", NAMES)
def test_every_method_parses_on_paper_and_embedded_data(name: str) -> None:
    recipe = get_recipe(name)
    for method in recipe.methods:
        for quick in (False, True):
            for embedded in (False, True):
                parse_config(recipe.config(method, 1, quick, embedded))


def test_q_fedavg_keeps_the_papers_lipschitz_constant() -> None:
    """fedhet's default L is 1/η_l (Li et al.); FedMGDA+'s q-FedAvg rows give the L of their paper: 1 (Fig. 3 left
    and the authors' Figure 4 scripts; Table 7 and Fig. 2 right leave it to the code's default, 1)."""
    seen = 0
    for name in NAMES:
        recipe = get_recipe(name)
        for method in recipe.methods:
            algorithm = recipe.config(method, 1, quick=False)["algorithm"]
            if algorithm["name"] == "qffl":
                assert algorithm["lipschitz"] == 1.0 and algorithm["loss"] == "batch_sum", (name, method)
                seen += 1
    assert seen == 1 + 1 + 12 + 4  # fairness, improved, bias attack, scaling attack (with and without attack)


def test_figure_3_and_7_hooks() -> None:
    assert get_recipe("fedmgda-fairness").extra_figures is accuracy_violins
    assert get_recipe("fedmgda-interpolation-iid").extra_figures is log_loss_curves


def test_global_step_decays_by_the_same_total_factor_on_shorter_runs() -> None:
    recipe = get_recipe("fedmgda-fairness")
    method = "FedMGDA+ (η=1.5, decay 0.1)"
    paper = recipe.config(method, 1, quick=False)["algorithm"]
    assert paper["decay_every"] == 100 and paper["lr_decay"] == pytest.approx(0.8913, abs=1e-4)  # β = 0.1^(100/2000)
    for quick in (False, True):
        cfg = recipe.config(method, 1, quick, embedded=True)
        rounds, algorithm = cfg["rounds"], cfg["algorithm"]
        decays = (rounds - 1) // algorithm["decay_every"]  # decays taken by the last round
        paper_decays = (2000 - 1) // 100
        assert decays == paper_decays
        assert algorithm["lr_decay"] ** (rounds / algorithm["decay_every"]) == pytest.approx(0.1)
    assert "total_decay" not in recipe.config("FedMGDA", 1, quick=False)["algorithm"]


def test_bias_attack_rows_and_the_attacker_alone() -> None:
    recipe = get_recipe("fedmgda-bias-attack")
    cfg = recipe.config("q-FedAvg q=5, bias 10000", 1, quick=False)
    assert cfg["attack"] == {"name": "malicious", "clients": [1], "loss_bias": 10000.0}  # the PhD domain
    assert cfg["algorithm"]["loss"] == "batch_sum"
    for embedded in (False, True):
        alone = recipe.config(ALONE, 1, quick=True, embedded=embedded)
        assert alone["clients_per_round"] == 1 and alone["attack"]["always_participate"]


def small(name: str, methods: tuple[str, ...], rounds: int) -> object:
    """The recipe restricted to `methods` and `rounds` (its quick, embedded protocol otherwise)."""
    recipe = get_recipe(name)
    quick = {**recipe.quick, "rounds": rounds}
    return dataclasses.replace(recipe, methods={m: recipe.methods[m] for m in methods}, quick=quick)


@pytest.fixture(autouse=True)
def one_thread() -> Iterator[None]:
    with torch_threads(1):  # small models: extra threads only contend
        yield


@pytest.mark.slow
def test_fedmgda_plus_improves_more_participants_than_fedavg(tmp_path: Path) -> None:
    """Fig. 4: the share of participants whose training loss did not increase in the round is higher for
    FedMGDA+ (common descent direction) than for FedAvg, on every seed; and the recipe writes its table and
    figures."""
    methods = ("FedAvg", "FedMGDA+ (η=1, decay 0.1)")
    recipe = small("fedmgda-improved", methods, rounds=20)
    result = run_recipe(recipe, tmp_path, quick=True, seeds=(1, 2, 3), embedded=True, say=lambda _: None)  # type: ignore[arg-type]
    fedavg = np.asarray(result.values["FedAvg"]["improved_users_mean"])
    mgda = np.asarray(result.values["FedMGDA+ (η=1, decay 0.1)"]["improved_users_mean"])
    assert np.all(mgda > fedavg), (mgda, fedavg)
    assert mgda.mean() > 0.95
    assert "improved (mean over rounds)" in result.table and "digits" in result.table
    assert (tmp_path / "improved_users.png").stat().st_size > 10_000


@pytest.mark.slow
def test_bias_attack_hurts_afl_and_qfedavg_but_not_fedmgda_plus() -> None:
    """Table 7: a bias added to the attacker's reported loss pulls AFL's and q-FedAvg's weights to it and costs
    them accuracy; FedMGDA+ never reads the losses, so its model is exactly the unattacked one."""
    recipe = get_recipe("fedmgda-bias-attack")
    pairs = {
        "AFL": ("AFL, bias 0", "AFL, bias 1"),
        "q-FedAvg": ("q-FedAvg q=5, bias 0", "q-FedAvg q=5, bias 1000"),
        "FedMGDA+": ("FedMGDA+, bias 0", "FedMGDA+, bias 10000"),
    }
    for seed in (1, 2):
        drop = {}
        for label, (clean, attacked) in pairs.items():
            states = [
                run(parse_config({**recipe.config(m, seed, True, True), "rounds": 20})) for m in (clean, attacked)
            ]
            drop[label] = states[0].final["test_accuracy"] - states[1].final["test_accuracy"]
            if label == "FedMGDA+":
                assert torch.equal(states[0].params, states[1].params)
        assert drop["FedMGDA+"] == 0.0
        assert drop["AFL"] > 0.05 and drop["q-FedAvg"] > 0.05, drop
