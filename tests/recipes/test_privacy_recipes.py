"""The dp-digits recipe: its cells, a tiny run of the whole study, and its figure read well."""

from __future__ import annotations

import math
from pathlib import Path

import matplotlib.pyplot as plt
import pytest

from fedhet.experiments.config import parse_config
from fedhet.experiments.reproduce import get_recipe
from fedhet.recipes.privacy import BASES, CLIP_ONLY, NON_PRIVATE, levels, plot_accuracy_against_epsilon, tasks
from helpers.figures import caption, check_figure, kept_figures, legend_texts


def test_every_cell_is_a_valid_config_at_its_privacy_level(tmp_path: Path) -> None:
    cells = tasks(tmp_path, quick=False, seeds=(0,))
    assert len(cells) == len(BASES) * 8
    for task in cells:
        config = parse_config(task.config)
        level, algorithm = task.meta["level"], config.spec("algorithm")
        assert algorithm["name"] == "dp" and algorithm["sampling"] == "poisson"
        if level == NON_PRIVATE:
            assert math.isinf(algorithm["clip"]) and algorithm["noise_multiplier"] == 0
        elif level == CLIP_ONLY:
            assert algorithm["clip"] == 0.5 and algorithm["noise_multiplier"] == 0
        else:
            assert config.privacy.target_epsilon == float(level.split("=")[1])
    assert get_recipe("dp-digits").custom is not None


def test_the_figure_reads_well(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    labels = list(levels(quick=True))
    found = {
        (method, label): {"test_accuracy": [0.9 - 0.05 * i - 0.01 * j, 0.88 - 0.05 * i], "test_accuracy_worst10": [0.3]}
        for j, method in enumerate(BASES)
        for i, label in enumerate(labels)
    }
    with kept_figures(monkeypatch) as figures:
        plot_accuracy_against_epsilon(found, labels, tmp_path / "f.png", 2)
    [fig] = figures
    check_figure(fig, rounds=False)
    assert "error bars" in caption(fig) and "FedAvg, no DP" in legend_texts(fig)
    assert (tmp_path / "f.png").is_file()
    plt.close(fig)


@pytest.mark.slow
def test_a_tiny_study_writes_its_tables_and_figure(tmp_path: Path) -> None:
    from fedhet.recipes.privacy import privacy_study

    tiny = {"num_clients": 12, "clients_per_round": 4, "rounds": 3, "eval_every": 1, "requirements": {"steps": 3}}
    text = privacy_study(tmp_path, quick=True, seeds=(0,), changes=tiny)
    for title in ("test accuracy", "worst 10%", "smallest clients (size q1)", "often-clipped clients"):
        assert f"#### {title}" in text
    assert "| ε = 8 |" in text and "| no DP |" in text
    assert (tmp_path / "accuracy_vs_epsilon.png").is_file()
    assert (tmp_path / "FedAvg").is_dir()
