"""Every recipe figure, built from small synthetic run data, reads as the issue asks (tests/helpers/figures.py): a title
naming its quantity, axes in words, legends beside the data, integer round ticks, explained bands, equal curves
named."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import matplotlib.pyplot as plt
import numpy as np
import pytest
import torch

from fedhet.experiments.reproduce import RECIPES, _figures
from fedhet.recipes import cafed, fedgsnr
from fedhet.report.labels import metric_info
from helpers.figures import ROUND, caption, check_figure, kept_figures, legend_texts, marked

FIGURE_RECIPES = sorted(name for name, factory in RECIPES.items() if factory().figures)


@pytest.fixture(autouse=True)
def close_figures() -> Iterator[None]:
    yield
    plt.close("all")


def fake_states(methods: list[str], metric: str, seeds: int = 2, rounds: int = 12) -> dict[str, list[Any]]:
    """Run states with a history of `metric` (only what `_figures` reads); the second method repeats the first."""
    rng = np.random.default_rng(0)
    info = metric_info(metric)
    high = 15.0 if info.count else 1.0
    states: dict[str, list[Any]] = {}
    for i, method in enumerate(methods):
        source = methods[0] if i == 1 else method
        runs = []
        for seed in range(seeds):
            gen = np.random.default_rng(hash((source, seed)) % 2**32)
            values = np.clip(np.linspace(0.2, 0.9, rounds) * high + gen.normal(0, 0.1 * high, rounds), 0, high)
            if info.count:
                values = np.round(values)
            history = [{"round": float(5 * (r + 1)), metric: float(v)} for r, v in enumerate(values)]
            runs.append(SimpleNamespace(history=history))
        states[method] = runs
    del rng
    return states


@pytest.mark.slow
@pytest.mark.parametrize("name", FIGURE_RECIPES)
def test_recipe_figures_read_well(name: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    recipe = RECIPES[name]()
    methods = list(recipe.methods)
    titles = []
    for metric in recipe.figures:
        with kept_figures(monkeypatch) as figures:
            _figures(
                type(recipe)(**{**recipe.__dict__, "figures": {metric: "f.png"}}),  # one figure at a time
                fake_states(methods, metric),  # type: ignore[arg-type]
                tmp_path,
            )
        (fig,) = figures
        check_figure(fig)
        ax = fig.axes[0]
        titles.append(ax.get_title())
        assert ax.get_title() == metric_info(metric).title and recipe.description not in ax.get_title()
        assert ax.get_ylabel() == metric_info(metric).label
        assert recipe.name in caption(fig) and "2 seeds" in caption(fig)
        assert marked(fig, methods[1], methods[0])
        assert len(legend_texts(fig)) == len(methods)  # every method listed, none hidden
    assert len(set(titles)) == len(titles)  # one title per plotted quantity


EXTRA_RECIPES = sorted(name for name, factory in RECIPES.items() if factory().extra_figures is not None)


@pytest.mark.parametrize("name", EXTRA_RECIPES)
def test_recipe_extra_figures_read_well(name: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Violins and log-scale curves (FedMGDA+ Figs. 3 and 7) from synthetic runs."""
    recipe = RECIPES[name]()
    methods = list(recipe.methods)
    states = fake_states(methods, "local_loss")
    rng = np.random.default_rng(2)
    for m, runs in enumerate(states.values()):
        for i, state in enumerate(runs):
            folder = tmp_path / "runs" / f"{m}-{i}"  # clients.csv of the run, as the violins read it
            folder.mkdir(parents=True)
            rows = "".join(f"{k},{v:.4f},1\n" for k, v in enumerate(rng.random(10)))
            (folder / "clients.csv").write_text("client,test_accuracy,seen\n" + rows)
            state.task = SimpleNamespace(out=folder)
            for row in state.history:
                row["local_loss"] = 2.0 * float(np.exp(-row["round"] / 20)) + 0.01
                row["test_accuracy"] = 1.0 - 0.5 * float(np.exp(-row["round"] / 20))
                row["time_s"] = row["round"] * (1.5 + 0.25 * m + 0.1 * i)  # a simulated clock, each run its own
    assert recipe.extra_figures is not None
    with kept_figures(monkeypatch) as figures:
        recipe.extra_figures(recipe, states, tmp_path)  # type: ignore[arg-type]
    assert figures
    for fig in figures:
        ax = fig.axes[0]
        check_figure(fig, rounds=ax.get_xlabel() == ROUND)
        assert recipe.description not in ax.get_title() and recipe.name in caption(fig)
        if ax.get_yscale() == "log":
            assert "log scale" in ax.get_ylabel()
        elif "time" in ax.get_xlabel():  # curves against the simulated clock: how seeds' clocks are put together
            assert ax.get_xlabel() == "simulated time (s)" and "holds its last evaluation" in caption(fig)
        else:  # violins: what a violin is, said under the figure
            assert "Each violin" in caption(fig)


def cafed_arrays(rounds: int = 10, clients: int = 8, seed: int = 0) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    active = rng.random((rounds, clients)) < 0.6
    selected = active & (rng.random((rounds, clients)) < 0.7)
    weights = np.where(selected, rng.random((rounds, clients)), 0.0)
    return {
        "active": active,
        "selected": selected,
        "weights": weights,
        "alpha": np.full(clients, 1 / clients),
        "pi": np.repeat([0.9, 0.1], clients // 2),
        "lambda": np.tile([0.9, 0.0], clients // 2),
        "group": np.repeat([0, 1], clients // 2),
    }


@pytest.mark.slow
def test_cafed_figures_read_well(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from fedhet.methods.cafed.availability_aware import tv_distance
    from fedhet.methods.cafed.metrics import cumulative_importance, importance

    arrays = cafed_arrays()
    result = cafed.Table1Result()
    for name in ("Synthetic", "MNIST"):
        base = list(np.linspace(0.5, 0.75, 10))
        result.curves[name] = {
            "Unbiased": [base, [v + 0.01 for v in base]],
            "F3AST": [base, [v + 0.01 for v in base]],
            "CA-Fed": [[v + 0.02 for v in base], [v + 0.01 for v in base]],
        }
    imp = {m: importance(arrays["weights"]) for m in ("Unbiased", "CA-Fed")}
    tv = {m: np.array([tv_distance(arrays["alpha"], p) for p in cumulative_importance(arrays["weights"])]) for m in imp}
    with kept_figures(monkeypatch) as figures:
        cafed.plot_time_average(result, tmp_path / "fig3.png")
        cafed.plot_availability({"CA-Fed": arrays, "CA-Fed (code)": arrays}, tmp_path / "fig1.png", "Synthetic, seed 0")
        cafed.plot_importance(imp, tv, arrays, tmp_path / "fig2.png", seeds=2)
    time_average, availability, weights = figures
    for fig in figures:
        check_figure(fig)
    assert "Time-average test accuracy" in time_average._suptitle.get_text()  # type: ignore[union-attr]
    assert "[0, 100]" in caption(time_average) and marked(time_average, "F3AST", "Unbiased")
    heat = availability.axes[0]
    assert heat.get_xlabel() == ROUND and heat.get_xlim() == (0.5, 10.5)  # x is the 1-based round
    assert {"inactive", "active, excluded (q_k = 0)", "selected"} <= set(legend_texts(availability))
    assert marked(weights, "CA-Fed", "Unbiased")  # equal d_TV curves named
    assert "mean over 2 seeds" in caption(weights)


def summary(entropy: list[float], scores: np.ndarray, corrupted: int | None = None) -> fedgsnr.RunSummary:
    history = [
        {"round": float(r + 1), "gsnr_entropy": e, fedgsnr.ACCURACY: 0.5 + 0.01 * r} for r, e in enumerate(entropy)
    ]
    k = scores.shape[1]
    bad = torch.zeros(k, dtype=torch.bool)
    if corrupted is not None:
        bad[corrupted] = True
    return fedgsnr.RunSummary(
        history=history,
        final=history[-1],
        contribution=torch.as_tensor(scores, dtype=torch.float32),
        corrupted=bad,
        label_counts=torch.ones(k, 3, dtype=torch.long),
    )


@pytest.mark.slow
def test_fedgsnr_figures_read_well(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    rng = np.random.default_rng(1)
    runs = {
        p: [summary(list(np.linspace(1.5, 2.2, 8) + 0.01 * s), rng.random((8, 6))) for s in range(2)]
        for p in ("IID", "Pareto")
    }
    results = {(row, "Pareto"): runs["Pareto"] for row in ("FedAvg", "FedGSNR with FedAvg")}
    with kept_figures(monkeypatch) as figures:
        fedgsnr.plot_entropy(runs, float(np.log(6)), tmp_path / "entropy.png")
        fedgsnr.plot_partition_gsnr(runs, tmp_path / "gsnr.png")
        fedgsnr.accuracy_figures(tmp_path, results, ["FedAvg", "FedGSNR with FedAvg"], "Pareto")
        fedgsnr.plot_summary_contribution(
            summary([1.0] * 8, rng.random((8, 6)), corrupted=2), tmp_path / "c.png", "GSNR per client, Pareto"
        )
    entropy, boxes, accuracy, contribution = figures
    check_figure(entropy)
    assert "log N = 1.79" in caption(entropy) and "band" in caption(entropy)
    check_figure(boxes, rounds=False)
    assert "Box" in caption(boxes) and boxes.axes[0].get_xlabel().startswith("partition")
    check_figure(accuracy)
    assert accuracy.axes[0].get_title() == "Test accuracy of the global model, partition Pareto"
    assert marked(accuracy, "FedGSNR with FedAvg", "FedAvg")
    check_figure(contribution, rounds=False)
    assert "whiskers 25–75%" in contribution.axes[0].get_title()
