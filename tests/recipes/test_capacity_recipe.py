"""The capacity recipes: their cells, the direction checks by hand, a tiny study whose checks are those of its runs,
the figure, the CIFAR-10 version on small files in the real format, and its refusal without them."""

from __future__ import annotations

import csv
import math
from pathlib import Path

import matplotlib.pyplot as plt
import pytest

from fedhet.experiments.config import parse_config
from fedhet.experiments.reproduce import get_recipe
from fedhet.recipes import capacity
from fedhet.recipes.capacity import (
    FULL,
    LEVELS,
    SMALL,
    SMALLEST,
    check_cell,
    checks,
    methods,
    plot_capacity,
    tasks,
)
from helpers.cifar import write_cifar10
from helpers.figures import caption, check_figure, kept_figures
from helpers.hostile import assert_refused


def test_every_cell_is_a_valid_config(tmp_path: Path) -> None:
    cells = tasks(tmp_path, "digits", quick=False, seeds=(0, 1))
    assert len(cells) == 2 * (4 * 2 + 2)  # 4 schemes × fix/dynamic, FedAvg full and all at 1/16
    for task in cells:
        config = parse_config(task.config)
        assert config.rounds == 30 and config.num_clients == 20 and config.dataset == "digits"
        algorithm = task.config["algorithm"]
        if task.meta["method"] == SMALL:
            assert algorithm == {"name": "heterofl", "levels": [SMALLEST], "scaler": False}
        elif task.meta["method"] != FULL:
            assert algorithm["levels"] == list(LEVELS) and task.meta["method"].endswith(f"({algorithm['assignment']})")
    scaled = [m for m, c in methods("cifar10").items() if c["algorithm"]["name"] == "heterofl"]
    assert scaled == ["HeteroFL, no scaler (fix)", "HeteroFL, no scaler (dynamic)", SMALL]  # the scaler diverges
    assert all(parse_config(t.config).model["name"] == "cnn_cifar" for t in tasks(tmp_path, "cifar10", True, (0,)))
    assert get_recipe("capacity").custom is not None and get_recipe("capacity-cifar10").data == {"dataset": "cifar10"}


def found(full: list[float], own_full: list[float], own_small: list[float], small: list[float]) -> dict:
    nan = [math.nan] * len(full)
    return {
        "M (fix)": {1.0: own_full, 0.5: nan, 0.25: nan, 0.125: nan, SMALLEST: own_small},
        FULL: {1.0: full, **{r: nan for r in LEVELS[1:]}},
        SMALL: {**{r: nan for r in LEVELS[:-1]}, SMALLEST: small},
    }


def test_the_direction_checks_by_hand() -> None:
    result = checks(found(full=[0.93, 0.90, 0.9], own_full=[0.90, 0.70, 0.8], own_small=[0.2, 0.6, math.nan],
                          small=[0.5, 0.5, 0.5]))["M (fix)"]  # fmt: skip
    assert result["i"][2] == [True, True, True]  # 0.9, 0.7, 0.8 > 0.5
    assert result["ii"][2] == [True, False, False]  # drops 0.03 ≤ 0.05, 0.20, 0.10
    assert result["iii"][2] == [False, True, None]  # 0.2 < 0.5, 0.6 > 0.5, no value
    assert check_cell("ii", result["ii"]) == "✓ ✗ ✗ (1/3; drop 0.110)"
    assert check_cell("iii", result["iii"]) == "✗ ✓ – (1/3; 0.400 vs 0.500)"


def metrics_rows(folder: Path) -> list[dict[str, str]]:
    with (folder / "metrics.csv").open() as f:
        return list(csv.DictReader(f))


@pytest.mark.slow
def test_a_tiny_study_reads_its_checks_off_its_runs(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """HeteroFL fix and dynamic and the two baselines, 2 rounds: two tables of the five levels, and checks that are
    the runs' own metrics.csv compared."""
    monkeypatch.setattr(capacity, "SCHEMES", {"HeteroFL": {"name": "heterofl"}})
    tiny = {"num_clients": 8, "clients_per_round": 4, "rounds": 2, "eval_every": 1, "local": {"steps": 2}}
    text = capacity.capacity_study(tmp_path, quick=True, seeds=(0, 1), changes=tiny)
    tables = [part for part in text.split("\n\n") if part.startswith("| ")]
    assert len(tables) == 3
    for table in tables[:2]:
        lines = table.splitlines()
        assert lines[0].count("|") == 7 and len(lines) == 2 + len(LEVELS)  # level, parameters, FLOPs, 3 methods
        assert lines[2].startswith("| 1 | 4,810 | 9,546 (100.0%) |") and lines[-1].startswith("| 1/16 | 310 | 606")
    final = {
        (folder.parent.name, folder.name): metrics_rows(folder)[-1]
        for folder in tmp_path.glob("*/seed*")
        if (folder / "metrics.csv").is_file()
    }
    small = [float(final[("FedAvg-all-at-1-16", f"seed{s}")]["test_accuracy_level0.0625"]) for s in (0, 1)]
    full = [float(final[("FedAvg-full-model", f"seed{s}")]["test_accuracy"]) for s in (0, 1)]
    checks_rows = {(r["method"], r["check"], r["seed"]): r for r in csv.DictReader((tmp_path / "checks.csv").open())}
    for method, folder in (("HeteroFL (fix)", "HeteroFL-fix"), ("HeteroFL (dynamic)", "HeteroFL-dynamic")):
        own = [final[(folder, f"seed{s}")] for s in (0, 1)]
        expected = {
            "i": [float(o["test_accuracy_level1"]) > b for o, b in zip(own, small, strict=True)],
            "ii": [b - float(o["test_accuracy_level1"]) <= 0.05 for o, b in zip(own, full, strict=True)],
            "iii": [float(o["test_accuracy_level0.0625"]) > b for o, b in zip(own, small, strict=True)],
        }
        row = next(line for line in tables[2].splitlines() if line.startswith(f"| {method} |"))
        for key, holds in expected.items():
            assert [checks_rows[(method, key, str(s))]["holds"] for s in (0, 1)] == [str(h) for h in holds]
            assert " ".join("✓" if h else "✗" for h in holds) in row
    assert (tmp_path / "accuracy_by_level.png").is_file() and (tmp_path / "accuracy.csv").is_file()


def test_the_figure_reads_well(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    data = {name: {r: [0.5 + 0.3 * r + 0.01 * i, 0.52 + 0.3 * r] for r in LEVELS} for i, name in enumerate(methods())}
    data[FULL] = {r: [0.93, 0.92] if r == 1.0 else [math.nan] * 2 for r in LEVELS}
    data[SMALL] = {r: [0.48, 0.5] if r == SMALLEST else [math.nan] * 2 for r in LEVELS}
    with kept_figures(monkeypatch) as figures:
        plot_capacity(data, tmp_path / "f.png", 2, "a setting")
    [fig] = figures
    check_figure(fig, rounds=False)
    assert "error bars" in caption(fig) and all(
        t.get_text() in ("1", "1/2", "1/4", "1/8", "1/16") for ax in fig.axes for t in ax.get_xticklabels()
    )
    assert (tmp_path / "f.png").is_file()
    plt.close(fig)


@pytest.mark.slow
def test_the_cifar10_version_runs_on_files_in_the_real_format(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("FEDHET_SKIP_CHECKSUMS", "1")  # small files, not the published ones
    write_cifar10(tmp_path / "data")
    tiny = {
        "data_dir": str(tmp_path / "data"),
        "model": {"name": "cnn_cifar", "channels": [4, 8], "hidden": 16},
        "partition": "iid",
        "num_clients": 4,
        "clients_per_round": 4,
        "rounds": 2,
        "eval_every": 1,
        "local": {"steps": 2, "batch_size": 8},
    }
    text = capacity.capacity_study(tmp_path / "out", quick=True, seeds=(0,), dataset="cifar10", changes=tiny)
    assert "on CIFAR-10" in text and "| HeteroFL, no scaler (fix) |" in text and "| HeteroFL (fix) |" not in text
    # the levels slice channels: conv 3→4→8 channels 5×5, fc 8·8·8→16→10; at 1/16 one channel, one unit each
    params = 3 * 25 * 1 + 1 + 1 * 25 * 1 + 1 + 64 * 1 + 1 + 1 * 10 + 10
    assert f"| 1/16 | {params} |" in text
    assert (tmp_path / "out" / "accuracy_by_level.png").is_file()


def test_the_cifar10_version_without_its_files_is_refused_before_anything_is_written(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    assert_refused(["reproduce", "capacity-cifar10", "--out", "out"], "data_batch_1", tmp_path)
    assert_refused(["reproduce", "privacy-leakage-cifar10", "--out", "out"], "cifar-10-python.tar.gz", tmp_path)
    assert_refused(["reproduce", "capacity-cifar10", "--embedded"], "no --embedded version", tmp_path)
