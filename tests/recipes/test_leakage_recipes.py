"""The privacy-leakage recipe: its cells, the attack's noise is the run's, a tiny study, its figure."""

from __future__ import annotations

import math
from pathlib import Path

import matplotlib.pyplot as plt
import pytest

from fedhet.experiments.config import parse_config
from fedhet.experiments.reproduce import get_recipe
from fedhet.experiments.runner import run
from fedhet.recipes import leakage
from fedhet.recipes.leakage import CLIP, EPSILONS, SETTING, methods, noise_multiplier, plot_leakage, tasks
from helpers.cifar import write_cifar10
from helpers.figures import caption, check_figure, kept_figures


def test_every_cell_is_a_valid_config(tmp_path: Path) -> None:
    cells = tasks(tmp_path, quick=False, seeds=(0, 1))
    assert len(cells) == 2 * (4 + len(EPSILONS))
    for task in cells:
        config = parse_config(task.config)
        attacks = {m["name"]: m for m in task.config["metrics"]}
        method = task.meta["method"]
        if method.startswith("DP-FedAvg, ε = ") and not method.endswith("(clipping)"):
            target = float(method.split("=")[1])
            assert config.privacy.target_epsilon == target
            assert attacks["dlg"]["clip"] == CLIP and attacks["dlg"]["noise_multiplier"] > 0
        if method == "SecAgg+":
            assert "dlg" not in attacks  # no single update to invert
        if method == "Ditto":
            assert attacks["mia"]["target"] == "both"
    assert get_recipe("privacy-leakage").custom is not None


def test_the_attack_noise_is_the_noise_the_run_sets() -> None:
    """z that the recipe gives the attack equals the z the run's accounting sets for the same target ε."""
    one_round = {**SETTING, "rounds": 1, "metrics": [], "seed": 0}
    cell = methods(quick=False)[f"DP-FedAvg, ε = {EPSILONS[1]:g}"]
    state = run(parse_config({**one_round, "algorithm": cell["algorithm"], "privacy": cell["privacy"]}))
    expected = noise_multiplier(EPSILONS[1], quick=False, rounds=1)
    assert state.history[-1]["dp_noise_multiplier"] == pytest.approx(expected, rel=1e-6)


def test_the_figure_reads_well(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    names = list(methods(quick=True))
    found = {
        name: {
            "test_accuracy": [0.9 - 0.05 * i, 0.88 - 0.05 * i],
            "dlg_psnr": [math.nan] if name == "SecAgg+" else [25.0 - i],
            "mia_auc": [0.52],
            "mia_personal_auc": [0.74 if name == "Ditto" else math.nan],
        }
        for i, name in enumerate(names)
    }
    with kept_figures(monkeypatch) as figures:
        plot_leakage(found, tmp_path / "f.png", 2)
    [fig] = figures
    check_figure(fig, rounds=False)
    assert "error bars" in caption(fig) and "SecAgg+" in caption(fig)
    assert (tmp_path / "f.png").is_file()
    plt.close(fig)


@pytest.mark.slow
def test_a_tiny_study_writes_its_table_and_figure(tmp_path: Path) -> None:
    from fedhet.recipes.leakage import leakage_study

    tiny = {"num_clients": 12, "clients_per_round": 4, "rounds": 2, "eval_every": 1}
    text = leakage_study(tmp_path, quick=True, seeds=(0,), changes=tiny)
    assert "| SecAgg+ |" in text and "the server sees only the sum" in text
    assert "| DP-FedAvg, ε = 8 |" in text
    assert (tmp_path / "privacy_utility_leakage.png").is_file()


def test_the_cifar10_cells_read_cifar10_with_lenet(tmp_path: Path) -> None:
    cells = tasks(tmp_path, quick=False, seeds=(0,), dataset="cifar10")
    assert len(cells) == 4 + len(EPSILONS)
    for task in cells:
        config = parse_config(task.config)
        assert config.dataset == "cifar10" and config.model == {"name": "lenet_cifar"}
        # the digits study's clients, sampling and rounds: the attack's z for a target ε is the same
        assert (config.num_clients, config.clients_per_round, config.rounds) == (100, 20, 60)
    assert get_recipe("privacy-leakage-cifar10").data == {"dataset": "cifar10"}


@pytest.mark.slow
def test_a_tiny_cifar10_study_on_files_in_the_real_format(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from fedhet.recipes.leakage import leakage_study

    monkeypatch.setenv("FEDHET_SKIP_CHECKSUMS", "1")  # small files, not the published ones
    monkeypatch.setitem(leakage.DLG, "iterations", 20)
    write_cifar10(tmp_path / "data")
    tiny = {
        "data_dir": str(tmp_path / "data"),
        "partition": "iid",
        "num_clients": 4,
        "clients_per_round": 2,
        "rounds": 2,
        "eval_every": 1,
        "local": {"steps": 2, "batch_size": 8},
    }
    text = leakage_study(tmp_path / "out", quick=True, seeds=(0,), changes=tiny, dataset="cifar10")
    assert "on CIFAR-10 (LeNet-5)" in text and "| SecAgg+ |" in text
    cells = next(line for line in text.splitlines() if line.startswith("| FedAvg |")).split(" | ")
    assert all(math.isfinite(float(cell)) for cell in cells[1:5])  # accuracy, worst 10%, inversion PSNR, MIA AUC
    assert (tmp_path / "out" / "privacy_utility_leakage.png").is_file()
