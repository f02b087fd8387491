"""FedMGDA+'s LEAF recipes (Tables 6, 12, 13 on FEMNIST, Table 14 on Shakespeare): the paper's rows and settings,
runs on small files in LEAF's JSON format, and the figures they write (Fig. 3's violins, Fig. 7's log scale)."""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import numpy as np
import pytest
import torch
from matplotlib.axes import Axes
from matplotlib.collections import PathCollection, PolyCollection

import fedhet.report.plots
from fedhet.engine.threads import torch_threads
from fedhet.experiments.config import parse_config
from fedhet.experiments.reproduce import deep_merge, run_recipe
from fedhet.experiments.runner import resume
from fedhet.recipes import get_recipe
from fedhet.recipes.fedmgda import log_loss_curves
from fedhet.recipes.fedmgda_leaf import TABLE6
from fedhet.report.labels import metric_info

LEAF = ("fedmgda-femnist", "fedmgda-femnist-b20", "fedmgda-femnist-full-batch", "fedmgda-shakespeare")


@pytest.fixture(autouse=True)
def one_thread() -> Iterator[None]:
    with torch_threads(1):
        yield


@pytest.mark.parametrize("name", LEAF)
def test_every_method_parses_and_gives_q_fedavg_its_stated_lipschitz(name: str) -> None:
    recipe = get_recipe(name)
    for method in recipe.methods:
        for quick in (False, True):
            for embedded in (False, True):
                raw = recipe.config(method, 1, quick, embedded)
                parse_config(raw)
                if raw["algorithm"]["name"] == "qffl":
                    assert "lipschitz" in raw["algorithm"] and f"L={raw['algorithm']['lipschitz']:g}" in method


def test_femnist_tables_hold_the_papers_rows_and_settings() -> None:
    b20, full, table6 = (
        get_recipe(n) for n in ("fedmgda-femnist-b20", "fedmgda-femnist-full-batch", "fedmgda-femnist")
    )
    assert list(b20.methods) == list(full.methods) and len(full.methods) == 26  # Tables 12 and 13
    assert tuple(table6.methods) == TABLE6 and set(TABLE6) <= set(full.methods)
    paper = full.config("FedMGDA+ (η=2, decay 0.2)", 1, quick=False)
    assert paper["dataset"] == "femnist" and paper["partition"] == "natural" and paper["model"] == "cnn_femnist"
    assert (paper["num_clients"], paper["clients_per_round"], paper["rounds"]) == (3406, 10, 1500)
    assert paper["local"] == {"steps": 1, "lr": 0.1, "batch_size": 1000}  # one full-batch step
    assert paper["algorithm"]["lr_decay"] == pytest.approx(0.2 ** (100 / 1500))
    assert b20.config("FedAvg", 1, quick=False)["local"] == {"steps": 10, "lr": 0.1, "batch_size": 20}
    prox = full.config("MGDA-Prox (η=1, decay 0, μ=0.1)", 1, quick=False)["algorithm"]
    assert prox["prox_mu"] == pytest.approx(0.2) and prox["lr_decay"] == 1.0  # 2μ (authors' μ‖·‖²); no decay
    assert full.seeds == (1, 5000, 6000, 9000)
    fallback = full.config("FedAvg", 1, quick=False, embedded=True)
    assert fallback["dataset"] == "digits" and fallback["partition"]["name"] == "dirichlet"


def test_shakespeare_table_settings() -> None:
    recipe = get_recipe("fedmgda-shakespeare")
    assert recipe.fallback is None  # the text is needed
    cfg = recipe.config("FedProx (η_l=0.5, momentum 0.5, μ=0.001)", 1, quick=False)
    assert (cfg["num_clients"], cfg["clients_per_round"], cfg["rounds"]) == (31, 31, 200)
    assert cfg["model"] == "char_lstm"
    assert cfg["local"] == {"steps": 300, "lr": 0.5, "batch_size": 10, "optimizer": {"name": "sgd", "momentum": 0.5}}
    assert cfg["algorithm"]["mu"] == pytest.approx(0.002)
    assert recipe.config("FedMGDA+ (η=20, decay 0.8)", 1, quick=False)["algorithm"]["server_lr"] == 20.0
    assert {"Avg (client)", "Avg (data)", "Worst 5% (p5)"} <= set(recipe.columns.values())
    # Table 14's (η_l, local momentum) pairs of FedAvg and FedProx, in the paper's order; the normalised
    # methods run plain SGD
    pairs = [(0.25, 0.5), (0.5, 0.5), (0.8, 0.0), (0.8, 0.5), (1.0, 0.5)]
    for name in ("FedAvg", "FedProx"):
        rows = [m for m in recipe.methods if m.startswith(f"{name} (")]
        local = [parse_config(recipe.config(m, 1, quick=False)).local for m in rows]
        assert [(c.lr, dict(c.optimizer)["momentum"]) for c in local] == pairs  # type: ignore[arg-type]
    for method in recipe.methods:
        if method.startswith(("FedMGDA+", "FedAvg-n")):
            assert parse_config(recipe.config(method, 1, quick=False)).local.optimizer == "sgd"
    assert len(recipe.methods) == 18


def leaf_files(folder: Path, users: dict[str, tuple[list[Any], list[Any]]]) -> None:
    """LEAF's layout: train/ and test/ JSON files, each user's samples split 80/20 between them."""
    for part in ("train", "test"):
        chosen = {}
        for user, (x, y) in users.items():
            cut = int(0.8 * len(x))
            chosen[user] = (x[:cut], y[:cut]) if part == "train" else (x[cut:], y[cut:])
        payload = {
            "users": list(chosen),
            "num_samples": [len(v[1]) for v in chosen.values()],
            "user_data": {u: {"x": x, "y": y} for u, (x, y) in chosen.items()},
        }
        (folder / part).mkdir(parents=True, exist_ok=True)
        (folder / part / f"all_data_niid_0_keep_0_{part}_9.json").write_text(json.dumps(payload))


class Captured:
    """The axes of every figure a plotting function saves (matplotlib state, not pixels)."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.axes: dict[str, Axes] = {}
        real = fedhet.report.plots.save_figure

        def save(fig: Any, ax: Axes, out: Path, legend: bool = True, caption: str = "") -> Path:
            self.axes[out.name] = ax
            return real(fig, ax, out, legend, caption)

        monkeypatch.setattr(fedhet.report.plots, "save_figure", save)


def small(name: str, methods: tuple[str, ...], changes: dict[str, Any]) -> Any:
    recipe = get_recipe(name)
    return dataclasses.replace(
        recipe, base=deep_merge(recipe.base, changes), methods={m: recipe.methods[m] for m in methods}
    )


@pytest.mark.slow
def test_femnist_recipe_reads_leaf_json_and_writes_table_and_violins(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    rng = np.random.default_rng(0)
    users = {
        f"f{i:04d}_{i % 3}": (rng.uniform(0, 1, (15, 784)).round(3).tolist(), rng.integers(0, 62, 15).tolist())
        for i in range(6)
    }
    leaf_files(tmp_path / "data" / "femnist", users)
    methods = ("FedAvg", "FedMGDA+ (η=2, decay 0.2)")
    changes = {
        "data_dir": str(tmp_path / "data"),
        "num_clients": 6,
        "clients_per_round": 3,
        "rounds": 1,
        "local": {"batch_size": 16},  # still the full batch: 15 samples per writer, 12 of them for training
    }
    recipe = small("fedmgda-femnist", methods, changes)
    captured = Captured(monkeypatch)
    notes: list[str] = []
    result = run_recipe(recipe, tmp_path / "out", seeds=(1, 2), say=notes.append)
    assert not notes and "embedded" not in result.table  # the LEAF files were read
    assert "| Average | Std. | Worst 5% (p5) | Best 5% (p95) |" in result.table
    state = resume(result.runs["FedAvg"][0].task.out)  # the finished run, loaded from its folder
    assert state.config.spec("dataset")["name"] == "femnist" and state.experiment.data.num_clients == 6
    violins = captured.axes["user_accuracy_violins.png"]
    bodies = [c for c in violins.collections if isinstance(c, PolyCollection)]
    assert len(bodies) == len(methods)  # one violin per method
    labels = [t.get_text() for t in violins.get_xticklabels()]
    assert labels[0].startswith("FedAvg\nσ = ") and labels[1].startswith("FedMGDA+ (η=2, decay 0.2)\nσ = ")
    assert violins.get_ylabel() == "test accuracy of a user (final model)" and "Fig. 3" in violins.get_title()
    points = [c for c in violins.collections if isinstance(c, PathCollection)]  # the scattered users
    assert sum(len(p.get_offsets()) for p in points) == len(methods) * 2 * 6  # every user of every seed
    assert (tmp_path / "out" / "user_accuracy_violins.png").stat().st_size > 10_000
    run_recipe(recipe, tmp_path / "out", seeds=(1, 2), say=notes.append)  # finished runs are loaded: clients.csv
    again = [c for c in captured.axes["user_accuracy_violins.png"].collections if isinstance(c, PathCollection)]
    assert sum(len(p.get_offsets()) for p in again) == len(methods) * 2 * 6


def test_shakespeare_recipe_reads_leaf_json(tmp_path: Path) -> None:
    text = "To be, or not to be, that is the question: Whether 'tis nobler in the mind to suffer " * 3
    users = {}
    for r, role in enumerate(("THE_TEMPEST_PROSPERO", "HAMLET_HAMLET", "HAMLET_OPHELIA", "KING_LEAR_LEAR")):
        starts = range(r, r + 10)
        users[role] = ([text[s : s + 80] for s in starts], [text[s + 80] for s in starts])
    leaf_files(tmp_path / "data" / "shakespeare", users)
    changes = {
        "data_dir": str(tmp_path / "data"),
        "num_clients": 4,
        "clients_per_round": 4,
        "rounds": 2,
        "eval_every": 1,
        "local": {"steps": 2},
        "model": {"name": "char_lstm", "hidden": 16},  # the paper's 256 works the same, only slower
    }
    methods = (
        "FedAvg (η_l=0.8, momentum 0)",
        "FedAvg (η_l=0.8, momentum 0.5)",
        "FedProx (η_l=0.25, momentum 0.5, μ=0.001)",
        "FedAvg-n (η=2, decay 1)",
    )
    recipe = small("fedmgda-shakespeare", methods, changes)
    result = run_recipe(recipe, tmp_path / "out", seeds=(1,), say=lambda _: None)
    for method in recipe.methods:
        state = resume(result.runs[method][0].task.out)  # the finished run, loaded from its folder
        final = state.final
        assert 0.0 <= final["test_accuracy"] <= 1.0 and 0.0 <= final["test_accuracy_pooled"] <= 1.0
        assert final["participants"] == 4.0  # every role in every round
        # the row's local momentum reaches the plan the clients train with, fresh every round
        plan = state.experiment.strategy.configure(2, torch.arange(4), state.params)
        momentum = 0.5 if "momentum 0.5" in method else 0.0
        assert getattr(plan.optimizer, "momentum", None) == momentum and not plan.optimizer.persistent
        assert plan.lr.flatten()[0].item() == pytest.approx(0.25 if "η_l=0.25" in method else 0.8)
    plain, heavy = (resume(result.runs[m][0].task.out).params for m in methods[:2])
    assert not torch.allclose(plain, heavy)  # the momentum changed the training
    assert "| Avg (client) | Avg (data) |" in result.table
    assert (tmp_path / "out" / "user_accuracy_violins.png").is_file()


def test_log_scale_training_loss_figure(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """Fig. 7: the interpolation recipes also draw the participants' training loss on a log scale (mean over
    seeds per method); the figure is checked on hand-made histories."""
    for name in ("fedmgda-interpolation", "fedmgda-interpolation-iid"):
        assert get_recipe(name).extra_figures is log_loss_curves
    recipe = get_recipe("fedmgda-interpolation")
    history = [{"round": float(t), "local_loss": 10.0**-t} for t in range(1, 5)]
    other = [{**row, "local_loss": 2 * row["local_loss"]} for row in history]
    runs = {"ε=0 (FedAvg)": [SimpleNamespace(history=history)] * 2, "ε=1 (MGDA)": [SimpleNamespace(history=other)]}
    captured = Captured(monkeypatch)
    log_loss_curves(recipe, runs, tmp_path)  # type: ignore[arg-type]
    ax = captured.axes["local_loss_log.png"]
    assert (
        ax.get_yscale() == "log"
        and ax.get_ylabel() == f"{metric_info('local_loss').label} (log scale)"
        and ax.get_xlabel() == "communication round"
    )
    assert "Fig. 7" in ax.get_title()
    assert [line.get_label() for line in ax.get_lines()] == list(runs)
    np.testing.assert_allclose(ax.get_lines()[0].get_ydata(), [0.1, 0.01, 0.001, 0.0001])
    assert (tmp_path / "local_loss_log.png").stat().st_size > 10_000
