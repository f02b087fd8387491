"""Sweeps: grids from flags and YAML, point names, the summary and the best point, and whole sweeps (serial
against worker processes, failures, interruptions)."""

from __future__ import annotations

import csv
import json
import math
from pathlib import Path
from typing import Any

import pytest

from fedhet.errors import ConfigError
from fedhet.experiments.executor import Executor
from fedhet.experiments.sweep import (
    PointResult,
    Sweep,
    best_point,
    default_mode,
    finish_sweep,
    grid_points,
    make_sweep,
    mean_std,
    parse_grid,
    read_results,
    run_sweep,
    summary_markdown,
)
from helpers.sweeps import TINY, Probe, assert_same_run_folders, log_lines


def test_grid_values_are_yaml() -> None:
    grid = parse_grid(
        [
            "local.lr=0.01, 0.05",
            "algorithm=fedavg,{name: fedprox, mu: 0.1}",
            "model.hidden=[64],[64, 32]",
            "local.steps=5",
        ]
    )
    assert grid == {
        "local.lr": [0.01, 0.05],
        "algorithm": ["fedavg", {"name": "fedprox", "mu": 0.1}],
        "model.hidden": [[64], [64, 32]],
        "local.steps": [5],
    }


@pytest.mark.parametrize(
    ("entry", "message"),
    [
        ("local.lr", "must look like key=value1,value2"),
        ("local.lr=", "give a list of values"),
        ("=0.1,0.2", "empty key"),
        ("local..lr=0.1", "empty key"),
        ("seed=0,1", "use --seeds N"),
        ("local.lr=0.1,0.1", "the value 0.1 is listed twice"),
        ("model.hidden=[64", "not a comma-separated list"),
    ],
)
def test_bad_grids_say_what_is_wrong(entry: str, message: str) -> None:
    with pytest.raises(ConfigError, match=message) as err:
        parse_grid([entry])
    assert "\n" not in str(err.value)


def test_a_key_given_twice_is_refused() -> None:
    with pytest.raises(ConfigError, match="given twice"):
        parse_grid(["local.lr=0.1", "local.lr=0.2"])


def test_the_sweep_section_of_a_config_and_the_flags_that_replace_it() -> None:
    raw = {
        **TINY,
        "seed": 5,
        "sweep": {"grid": {"local.lr": [0.01, 0.05], "algorithm": ["fedavg"]}, "seeds": 3, "metric": "test_loss"},
    }
    sweep = make_sweep(raw)
    assert sweep.base == {**TINY, "seed": 5} and "sweep" in raw  # the section is not part of any run's config
    assert sweep.grid == {"local.lr": [0.01, 0.05], "algorithm": ["fedavg"]}
    assert sweep.seeds == (5, 6, 7) and (sweep.metric, sweep.mode) == ("test_loss", "min")
    flags = make_sweep(raw, grid=["local.lr=0.1"], seeds=1, metric="test_accuracy", show=["test_loss"])
    assert flags.grid == {"local.lr": [0.1], "algorithm": ["fedavg"]} and flags.seeds == (5,)
    assert (flags.mode, flags.show) == ("max", ("test_loss",))
    assert make_sweep(TINY).grid == {} and make_sweep(TINY).seeds == (0,)


@pytest.mark.parametrize(
    ("raw", "seeds", "message"),
    [
        ({"sweep": {"grids": {}}}, None, "sweep.grids is not a sweep key .did you mean 'grid'"),
        ({"sweep": {"grid": {"local.lr": 0.1}}}, None, "give a list of values"),
        ({"sweep": {"grid": ["local.lr"]}}, None, "must map dotted keys to lists"),
        ({"sweep": {"seeds": 0}}, None, "sweep.seeds 0: give the number of seeds, at least 1"),
        ({}, 0, "--seeds 0: give the number of seeds, at least 1"),
        ({"sweep": {"mode": "best"}}, None, "choose max or min"),
    ],
)
def test_bad_sweep_sections_and_seeds(raw: dict[str, Any], seeds: int | None, message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        make_sweep({**TINY, **raw}, seeds=seeds)


def test_default_mode() -> None:
    assert [default_mode(m) for m in ("test_accuracy", "test_loss", "test_accuracy_std", "rounds_to_target")] == [
        "max",
        "min",
        "min",
        "min",
    ]


def test_points_are_every_combination_with_shell_safe_names() -> None:
    points = grid_points({"local.lr": [0.01, 0.1], "algorithm": ["fedavg", {"name": "fedprox", "mu": 0.1}]})
    assert [p.name for p in points] == [
        "lr-0.01_algorithm-fedavg",
        "lr-0.01_algorithm-fedprox-mu-0.1",
        "lr-0.1_algorithm-fedavg",
        "lr-0.1_algorithm-fedprox-mu-0.1",
    ]
    assert points[1].label == "local.lr=0.01, algorithm={name: fedprox, mu: 0.1}"
    assert points[1].values == {"local.lr": 0.01, "algorithm": {"name": "fedprox", "mu": 0.1}}
    same_last = grid_points({"local.lr": [0.1], "algorithm.lr": [1]})
    assert same_last[0].name == "local.lr-0.1_algorithm.lr-1"
    assert [p.name for p in grid_points({})] == ["base"]
    with pytest.raises(ConfigError, match="would share the folder"):
        grid_points({"local.lr": [0.1, "0.1"]})
    long = grid_points({"model.hidden": [list(range(40)), [*range(39), 99]]})
    assert len({p.name for p in long}) == 2 and all(len(p.name) <= 100 for p in long)


def test_point_configs_set_dotted_keys_without_touching_the_base() -> None:
    sweep = make_sweep({**TINY, "algorithm": "fedprox"}, grid=["algorithm.mu=0.1,1", "local.lr=0.2"], seeds=2)
    configs = [task.config for task in sweep.tasks(Path("out"))]
    assert len(configs) == 4 and sweep.base["algorithm"] == "fedprox"
    assert configs[3]["algorithm"] == {"name": "fedprox", "mu": 1} and configs[3]["local"]["lr"] == 0.2
    assert [c["seed"] for c in configs] == [0, 1, 0, 1] and configs[0]["local"]["steps"] == 2
    bad = make_sweep(TINY, grid=["algorithm=fedavg", "algorithm.mu=0.1"])
    with pytest.raises(ConfigError, match=r"grid point algorithm=fedavg, algorithm.mu=0.1: .*mu"):
        bad.tasks(Path("out"))


def test_summary_and_best_point_from_run_folders(tmp_path: Path) -> None:
    sweep = Sweep(TINY, {"local.lr": [0.01, 0.1, 1.0]}, seeds=(0, 1), metric="test_accuracy")
    finals = {
        ("lr-0.01", 0): ("finished", 0.5),
        ("lr-0.01", 1): ("finished", 0.7),
        ("lr-0.1", 0): ("finished", 0.8),
        ("lr-0.1", 1): ("diverged", 0.9),  # not counted
        ("lr-1.0", 0): ("stopped early", 0.2),
    }  # lr-1.0 seed 1: no folder at all
    for (point, seed), (status, acc) in finals.items():
        folder = tmp_path / point / f"seed{seed}"
        folder.mkdir(parents=True)
        summary = {"status": status, "final": {"round": 4.0, "test_accuracy": acc, "test_loss": 1 - acc}}
        (folder / "summary.json").write_text(json.dumps(summary))
    results = read_results(sweep, tmp_path)
    assert [r.statuses for r in results] == [["finished"] * 2, ["finished", "diverged"], ["stopped early", "missing"]]
    assert [r.ok for r in results] == [2, 1, 1]
    assert results[0].values["test_accuracy"] == [0.5, 0.7]
    assert math.isnan(results[1].values["test_accuracy"][1])
    best = best_point(results, "test_accuracy", "max")
    assert best is results[1] and best_point(results, "test_loss", "min") is results[1]
    assert best_point(results, "test_accuracy", "min") is results[2]
    assert best_point(results, "nothing", "max") is None
    table = summary_markdown(sweep, results, best)
    assert "| local.lr=0.01 | 0.6000 ± 0.1414 | 2/2 | lr-0.01 |" in table
    assert "| **local.lr=0.1** | 0.8000 (1 of 2 missing) | 1/2 | lr-0.1 |" in table
    assert "best by test_accuracy (max): local.lr=0.1: 0.8000 (1 of 2 missing)" in table


def test_best_point_takes_the_first_of_equals() -> None:
    points = grid_points({"x": [1, 2]})
    results = [PointResult(p, ["finished"], {"m": [0.5]}) for p in points]
    assert best_point(results, "m", "max") is results[0]
    assert mean_std([0.5, 0.7]) == "0.6000 ± 0.1414"


def test_a_personalised_sweep_picks_its_best_point_by_personal_accuracy(tmp_path: Path) -> None:
    sweep = make_sweep({"seed": 0}, grid=["algorithm=fedavg,ditto"])
    assert not sweep.chosen and sweep.metric == "test_accuracy"
    for point, seed, (acc, personal) in (("fedavg", 0, (0.9, 0.9)), ("ditto", 0, (0.8, 0.97))):
        folder = tmp_path / f"algorithm-{point}" / f"seed{seed}"
        folder.mkdir(parents=True)
        final = {"round": 4.0, "test_accuracy": acc, "personal_test_accuracy": personal}
        (folder / "summary.json").write_text(json.dumps({"status": "finished", "final": final}))
    result = finish_sweep(sweep, tmp_path, [])
    assert result.best is not None and result.best.point.label == "algorithm=ditto"  # 0.97 > 0.9, not 0.8 < 0.9
    header = next(line for line in result.table.splitlines() if line.startswith("| point"))
    assert header == "| point | personal_test_accuracy | test_accuracy | runs finished | folder |"
    assert "ranked by their personalised models' accuracy" in result.table
    chosen = make_sweep({"seed": 0}, grid=["algorithm=fedavg,ditto"], metric="test_accuracy")
    result = finish_sweep(chosen, tmp_path, [])  # --metric test_accuracy: the global model's, personal shown too
    assert result.best is not None and result.best.point.label == "algorithm=fedavg"
    assert "| point | test_accuracy | personal_test_accuracy |" in result.table


def small_sweep(**changes: Any) -> Sweep:
    return make_sweep({**TINY, **changes}, grid=["local.lr=0.02,0.1", "algorithm=fedavg,fedprox"], seeds=2)


@pytest.mark.slow
def test_worker_processes_give_the_serial_run_folders(tmp_path: Path) -> None:
    sweep = small_sweep()
    with Executor(1) as serial:
        first = run_sweep(sweep, tmp_path / "serial", serial)
    with Executor(2) as pool:
        second = run_sweep(sweep, tmp_path / "pool", pool)
    assert len(first.outcomes) == 8 and all(o.ok and o.attempts == 1 for o in second.outcomes)
    assert_same_run_folders(tmp_path / "serial", tmp_path / "pool")
    assert (tmp_path / "serial" / "summary.md").read_text() == (tmp_path / "pool" / "summary.md").read_text()
    assert (tmp_path / "serial" / "summary.csv").read_text() == (tmp_path / "pool" / "summary.csv").read_text()
    point = json.loads((tmp_path / "pool" / "lr-0.1_algorithm-fedprox" / "point.json").read_text())
    assert point["label"] == "local.lr=0.1, algorithm=fedprox"
    index = json.loads((tmp_path / "pool" / "runs.json").read_text())
    label, folder = "local.lr=0.02, algorithm=fedavg, seed 0", "lr-0.02_algorithm-fedavg/seed0"
    assert index[0] == {"label": label, "folder": folder, "status": "finished"}


def test_failing_and_diverging_runs_do_not_stop_the_others(tmp_path: Path) -> None:
    grid = ["local.lr=0.05,1e6", "partition.min_size=20,1000"]
    sweep = make_sweep({**TINY, "max_loss": 50.0, "rounds": 2}, grid=grid)
    with Executor(1) as serial:  # the same run_task as in a worker process
        result = run_sweep(sweep, tmp_path, serial)
    status = {o.task.meta["point"]: o.status for o in result.outcomes}
    assert status == {
        "lr-0.05_min_size-20": "finished",
        "lr-0.05_min_size-1000": "failed",  # no partition gives every client 1000 samples
        "lr-1e6_min_size-20": "diverged",  # YAML 1.1 reads 1e6 as text; the config takes it
        "lr-1e6_min_size-1000": "failed",
    }
    failed = next(o for o in result.outcomes if o.status == "failed")
    assert failed.error and "\n" not in failed.error
    assert [r.ok for r in result.results] == [1, 0, 0, 0] and result.best is result.results[0]
    assert "n/a (1 of 1 missing)" in result.table
    index = json.loads((tmp_path / "runs.json").read_text())
    assert [row["status"] for row in index] == ["finished", "failed", "diverged", "failed"]
    assert "training diverged" in index[2]["error"]


def test_an_interrupted_sweep_reruns_only_what_is_missing(tmp_path: Path) -> None:
    """Serially, the third run is interrupted after round 2: a second sweep reuses the two finished runs, resumes
    the third from its checkpoint and runs the fourth; the folders equal those of an uninterrupted sweep."""
    sweep = make_sweep(TINY, grid=["local.lr=0.02,0.1"], seeds=2)
    with Executor(1) as reference:
        run_sweep(sweep, tmp_path / "reference", reference)
    log = tmp_path / "log.txt"
    cut = "local.lr=0.1, seed 0"
    with pytest.raises(KeyboardInterrupt), Executor(1, callbacks=Probe(log, cut, interrupt_at=2)) as first:
        run_sweep(sweep, tmp_path / "sweep", first)
    folder = tmp_path / "sweep" / "lr-0.02" / "seed0"
    stamp = (folder / "checkpoint.pt").stat().st_mtime_ns
    assert not (tmp_path / "sweep" / "lr-0.1" / "seed1").exists()
    log.unlink()
    with Executor(1, callbacks=Probe(log)) as second:
        result = run_sweep(sweep, tmp_path / "sweep", second)
    assert [o.reused for o in result.outcomes] == [True, True, False, False]
    assert [(label, event, r) for label, _, event, r in log_lines(log) if event == "start"] == [
        (cut, "start", 2),  # resumed after its second round
        ("local.lr=0.1, seed 1", "start", 0),
    ]
    assert (folder / "checkpoint.pt").stat().st_mtime_ns == stamp
    assert_same_run_folders(tmp_path / "reference", tmp_path / "sweep")


@pytest.mark.slow
def test_a_killed_worker_process_is_replaced_and_its_run_resumed(tmp_path: Path) -> None:
    sweep = make_sweep(TINY, grid=["local.lr=0.02,0.1"], seeds=2)
    with Executor(1) as reference:
        run_sweep(sweep, tmp_path / "reference", reference)
    log = tmp_path / "log.txt"
    target = "local.lr=0.02, seed 1"
    with Executor(2, callbacks=Probe(log, target, kill_at=2)) as pool:
        result = run_sweep(sweep, tmp_path / "sweep", pool)
    assert all(o.ok for o in result.outcomes)
    assert next(o for o in result.outcomes if o.task.label == target).attempts == 2
    starts = [r for label, _, event, r in log_lines(log) if label == target and event == "start"]
    assert starts[0] == 0 and starts[-1] >= 2  # resumed from a checkpoint, not started over
    assert_same_run_folders(tmp_path / "reference", tmp_path / "sweep")


def test_a_sweep_folder_keeps_its_base_config(tmp_path: Path) -> None:
    with Executor(1) as serial:
        run_sweep(make_sweep({**TINY, "rounds": 1}), tmp_path, serial)
        with pytest.raises(ConfigError, match="holds a sweep of another base config"):
            run_sweep(make_sweep({**TINY, "rounds": 2}), tmp_path, serial)
        more = run_sweep(make_sweep({**TINY, "rounds": 1}, seeds=2), tmp_path, serial)  # more seeds: fine
    assert [o.reused for o in more.outcomes] == [True, False]


def test_a_metric_no_run_reports_is_an_error_after_the_runs(tmp_path: Path) -> None:
    with Executor(1) as serial, pytest.raises(ConfigError, match=r"no run reports 'test_acc' .did you mean"):
        run_sweep(make_sweep({**TINY, "rounds": 1}, metric="test_acc"), tmp_path, serial)
    assert (tmp_path / "base" / "seed0" / "metrics.csv").is_file() and (tmp_path / "summary.md").is_file()


def test_a_sweep_chooses_on_validation_and_reports_test_at_each_runs_selected_round(tmp_path: Path) -> None:
    """With a validation split the sweep ranks points by val_loss at each run's best round (by val_loss) and reports
    the test accuracy of that same round; the summary says which rule chose."""
    base = {**TINY, "val_fraction": 0.2, "rounds": 5}
    sweep = make_sweep(base, ["local.lr=0.005,0.3"], seeds=2)
    assert (sweep.metric, sweep.mode, sweep.show) == ("val_loss", "min", ("test_accuracy", "test_loss"))
    result = run_sweep(sweep, tmp_path, Executor(1))
    expected: dict[str, dict[str, list[float]]] = {}
    for point in sweep.points():
        for seed in sweep.seeds:
            with (tmp_path / point.name / f"seed{seed}" / "metrics.csv").open() as f:
                rows = [{k: float(v) for k, v in row.items()} for row in csv.DictReader(f)]
            best = min(rows, key=lambda row: row["val_loss"])  # the run's selected round, computed by hand
            for metric in ("val_loss", "test_accuracy"):
                expected.setdefault(point.name, {}).setdefault(metric, []).append(best[metric])
    for r in result.results:
        assert r.values["val_loss"] == expected[r.point.name]["val_loss"]
        assert r.values["test_accuracy"] == expected[r.point.name]["test_accuracy"]
    means = {name: sum(v["val_loss"]) / 2 for name, v in expected.items()}
    assert result.best is not None and result.best.point.name == min(means, key=lambda n: means[n])
    text = (tmp_path / "summary.md").read_text()
    assert "best round by val_loss (selection)" in text and "mean ± std over seeds" in text
    assert f"best by val_loss (min): {result.best.point.label}" in text and "test_accuracy" in text


@pytest.mark.slow
def test_a_serial_sweep_gives_the_numbers_of_worker_processes_whatever_this_process_threads(
    tmp_path: Path,
) -> None:
    """With 4 torch threads in this process, a sweep run here used them (test_loss differed in the 8th digit from
    the workers' one thread); now both make each run on one thread unless told otherwise."""
    import torch

    sweep = make_sweep(
        {"dataset": "digits", "rounds": 1, "num_clients": 20, "clients_per_round": 20}, ["local.lr=0.02,0.05"]
    )
    before = torch.get_num_threads()
    torch.set_num_threads(4)
    try:
        with Executor(1, threads=None) as serial:
            run_sweep(sweep, tmp_path / "serial", serial)
        with Executor(2, threads=None) as pool:
            run_sweep(sweep, tmp_path / "pool", pool)
    finally:
        torch.set_num_threads(before)
    for point in ("lr-0.02", "lr-0.05"):
        serial_csv = (tmp_path / "serial" / point / "seed0" / "metrics.csv").read_bytes()
        assert serial_csv == (tmp_path / "pool" / point / "seed0" / "metrics.csv").read_bytes()
