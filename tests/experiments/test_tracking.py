"""Experiment trackers: what TensorBoard, MLflow and W&B (offline) record, read back with each library's own reader,
equals metrics.csv; a resumed run continues the same record without repeating rounds; a sweep's runs are grouped.

The tests skip when a tracker's library is not installed, unless FEDHET_TRACKER_TESTS is set (CI sets it, so there a
missing library fails the test instead)."""

from __future__ import annotations

import csv
import importlib.util
import json
import math
import multiprocessing
import os
import subprocess
import sys
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path
from typing import Any

import pytest

from fedhet.config_keys import flatten
from fedhet.errors import ConfigError
from fedhet.experiments.callbacks import Callback
from fedhet.experiments.config import parse_config
from fedhet.experiments.runner import RunState, resume, run
from fedhet.experiments.tracking import (
    TRACKERS,
    prepare_tracking,
    read_state,
    trackers_for,
    tracking_callbacks,
)
from helpers.tracking_worker import sweep_point

TINY: dict[str, Any] = {
    "dataset": "digits",
    "num_clients": 4,
    "clients_per_round": 2,
    "rounds": 3,
    "model": {"name": "mlp", "hidden": [8]},
    "local": {"steps": 2},
}


def need(module: str) -> None:
    if importlib.util.find_spec(module) is None and not os.environ.get("FEDHET_TRACKER_TESTS"):
        pytest.skip(f"{module} is not installed")


@pytest.fixture(autouse=True)
def offline_wandb(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """W&B without an account or network, its own files in tmp; MLflow without a user-wide tracking URI."""
    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_DIR", str(tmp_path / "wandb-home"))
    monkeypatch.setenv("WANDB_CONFIG_DIR", str(tmp_path / "wandb-config"))
    monkeypatch.setenv("WANDB_CACHE_DIR", str(tmp_path / "wandb-cache"))
    monkeypatch.setenv("WANDB_SILENT", "true")
    monkeypatch.delenv("WANDB_API_KEY", raising=False)
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)


@pytest.fixture(scope="module")
def mlflow_uri(tmp_path_factory: pytest.TempPathFactory) -> str:
    """One SQLite store for the module's MLflow tests (creating one takes seconds)."""
    need("mlflow")
    path = tmp_path_factory.mktemp("mlflow") / "mlflow.db"
    return f"sqlite:///{path}"


def metrics_csv(out: Path) -> list[dict[str, float]]:
    with (out / "metrics.csv").open() as f:
        return [{k: float(v) for k, v in row.items() if v != ""} for row in csv.DictReader(f)]


def assert_matches(records: dict[str, dict[int, float]], rows: list[dict[str, float]], rel: float) -> None:
    """Every metric of every row of metrics.csv is in `records` (metric → step → value) at step = round, within
    `rel`; no step is recorded that metrics.csv lacks."""
    rounds = {int(row["round"]) for row in rows}
    columns = {k for row in rows for k in row if k != "round"}
    assert columns <= set(records), columns - set(records)
    for column in columns:
        assert set(records[column]) == rounds, (column, sorted(records[column]))
        for row in rows:
            want, got = row[column], records[column][int(row["round"])]
            assert (math.isnan(want) and math.isnan(got)) or got == pytest.approx(want, rel=rel, abs=1e-7), column


# ------------------------------------------------------------------------------------------------------- readers


def tensorboard_scalars(log_dir: Path) -> tuple[dict[str, dict[int, float]], dict[str, Any], list[str]]:
    """Scalars (tag → step → value), hparams and the hparams' metric tags, read by TensorBoard's EventAccumulator."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
    from tensorboard.plugins.hparams.plugin_data_pb2 import HParamsPluginData

    acc = EventAccumulator(str(log_dir))
    acc.Reload()
    scalars: dict[str, dict[int, float]] = {}
    for tag in acc.Tags()["scalars"]:
        events = acc.Scalars(tag)
        assert len({e.step for e in events}) == len(events), f"{tag}: a step is recorded twice"
        scalars[tag] = {e.step: e.value for e in events}
    try:
        content = acc.PluginTagToContent("hparams")
    except KeyError:  # no hparams written
        content = {}
    hparams: dict[str, Any] = {}
    metrics: list[str] = []
    if content:
        start = HParamsPluginData.FromString(content["_hparams_/session_start_info"]).session_start_info
        for key, value in start.hparams.items():
            hparams[key] = value.string_value if value.HasField("string_value") else value.number_value
        experiment = HParamsPluginData.FromString(content["_hparams_/experiment"]).experiment
        metrics = [m.name.tag for m in experiment.metric_infos]
    return scalars, hparams, metrics


def mlflow_records(uri: str, run_id: str) -> tuple[dict[str, dict[int, float]], Any]:
    """Metric histories (key → step → value) and the run, read by MLflow's client."""
    from mlflow.tracking import MlflowClient

    client = MlflowClient(tracking_uri=uri)
    found = client.get_run(run_id)
    history: dict[str, dict[int, float]] = {}
    for key in found.data.metrics:
        points = client.get_metric_history(run_id, key)
        assert len({p.step for p in points}) == len(points), f"{key}: a step is recorded twice"
        history[key] = {p.step: p.value for p in points}
    return history, found


def wandb_records(folder: Path) -> tuple[dict[str, dict[int, float]], list[dict[str, Any]]]:
    """History (key → step → value) and run records of every offline run under `folder`/wandb, read by wandb's own
    reader of its transaction logs (``wandb leet inspect --json``)."""
    history: dict[str, dict[int, float]] = {}
    runs: list[dict[str, Any]] = []
    for run_dir in sorted((folder / "wandb").glob("offline-run-*")):
        out = subprocess.run(
            [sys.executable, "-m", "wandb", "leet", "inspect", "--json", str(run_dir)],
            capture_output=True,
            text=True,
            check=True,
            timeout=120,
        ).stdout
        for line in out.splitlines():
            record = json.loads(line)
            if record["type"] == "run":
                runs.append(record["run"])
            if record["type"] == "history":
                step = int(record["history"]["step"]["num"])
                for key, value in record["history"]["item"].items():
                    if key.startswith("_"):
                        continue
                    assert step not in history.get(key, {}), f"{key}: step {step} is recorded twice"
                    history.setdefault(key, {})[step] = float(value)  # "NaN" → nan
    return history, runs


# --------------------------------------------------------------------------------------------------------- runs


def test_tensorboard_records_the_rounds_and_the_config(tmp_path: Path) -> None:
    need("tensorboard")
    out = tmp_path / "run"
    state = run(parse_config({**TINY, "track": ["tensorboard"]}), out)
    scalars, hparams, metric_tags = tensorboard_scalars(out / "tensorboard")
    assert_matches(scalars, metrics_csv(out), rel=1e-6)  # float32 events
    assert hparams["algorithm.name"] == "fedavg" and hparams["rounds"] == 3 and hparams["local.steps"] == 2
    assert hparams["model.hidden"] == "[8]" and "track" not in hparams
    assert set(metric_tags) == set(state.final) - {"round"}  # the final metrics: the last value of each tag
    assert read_state(out)["tensorboard"]["last_round"] == 3


def test_mlflow_records_params_metrics_and_status(tmp_path: Path, mlflow_uri: str) -> None:
    out = tmp_path / "run"
    run(parse_config({**TINY, "track": [{"name": "mlflow", "uri": mlflow_uri, "experiment": "tests"}]}), out)
    saved = read_state(out)["mlflow"]
    history, found = mlflow_records(mlflow_uri, saved["run_id"])
    assert_matches(history, metrics_csv(out), rel=1e-12)
    params = found.data.params
    assert params["algorithm.name"] == "fedavg" and params["local.lr"] == "0.05" and params["seed"] == "0"
    assert found.info.status == "FINISHED" and found.data.tags["fedhet.status"] == "finished"
    assert found.info.run_name == "run"


def test_mlflow_default_store_is_a_database_in_the_run_folder(tmp_path: Path) -> None:
    need("mlflow")
    out = tmp_path / "run"
    run(parse_config({**TINY, "rounds": 2, "track": ["mlflow"]}), out)
    assert (out / "mlflow.db").is_file()
    history, found = mlflow_records(f"sqlite:///{out / 'mlflow.db'}", read_state(out)["mlflow"]["run_id"])
    assert_matches(history, metrics_csv(out), rel=1e-12)
    assert found.info.experiment_id and found.data.tags["fedhet.algorithm"] == "fedavg"


def test_wandb_offline_records_history_config_and_summary(tmp_path: Path) -> None:
    need("wandb")
    out = tmp_path / "run"
    run(parse_config({**TINY, "track": [{"name": "wandb", "project": "fedhet-tests"}]}), out)
    history, runs = wandb_records(out)
    assert_matches(history, metrics_csv(out), rel=1e-12)
    assert len(runs) == 1 and runs[0]["project"] == "fedhet-tests" and runs[0]["display_name"] == "run"
    assert runs[0]["run_id"] == read_state(out)["wandb"]["run_id"]
    config = runs[0]["config"]["update"]
    assert config["algorithm"]["name"] == "fedavg" and config["rounds"] == 3


class Interrupt(Callback):
    """Stops the process (as Ctrl-C would) after round `at`."""

    def __init__(self, at: int) -> None:
        self.at = at

    def on_round_end(self, state: RunState, metrics: dict[str, float] | None) -> bool:
        if state.round == self.at:
            raise KeyboardInterrupt
        return False


@pytest.mark.slow
def test_a_resumed_run_continues_each_record_without_repeating_rounds(tmp_path: Path, mlflow_uri: str) -> None:
    """Checkpoints every 2 rounds, interrupted after round 3: the trackers logged round 3, the resume recomputes it
    from the round-2 checkpoint; each record ends with rounds 1-5 once, equal to metrics.csv."""
    need("tensorboard")
    need("wandb")
    track = ["tensorboard", {"name": "mlflow", "uri": mlflow_uri}, "wandb"]
    out = tmp_path / "run"
    cfg = parse_config({**TINY, "rounds": 5, "checkpoint_every": 2, "track": track})
    with pytest.raises(KeyboardInterrupt):  # the trackers given here, before the interrupt: they log round 3
        run(cfg, out, [*tracking_callbacks(cfg, out), Interrupt(3)])
    assert read_state(out)["mlflow"]["last_round"] == 3
    first_ids = {key: read_state(out)[key].get("run_id") for key in ("mlflow", "wandb")}
    state = resume(out)
    assert state.status == "finished" and state.round == 5
    rows = metrics_csv(out)
    assert [int(r["round"]) for r in rows] == [1, 2, 3, 4, 5]
    assert {key: read_state(out)[key].get("run_id") for key in ("mlflow", "wandb")} == first_ids
    scalars, hparams, _ = tensorboard_scalars(out / "tensorboard")
    assert_matches(scalars, rows, rel=1e-6)
    assert hparams["rounds"] == 5
    history, found = mlflow_records(mlflow_uri, first_ids["mlflow"])
    assert_matches(history, rows, rel=1e-12)
    assert found.info.status == "FINISHED"
    wb_history, runs = wandb_records(out)
    assert_matches(wb_history, rows, rel=1e-12)
    assert {r["run_id"] for r in runs} == {first_ids["wandb"]} and len(runs) == 2  # one run, two sessions


def test_resuming_a_finished_run_logs_nothing_more(tmp_path: Path) -> None:
    need("tensorboard")
    out = tmp_path / "run"
    run(parse_config({**TINY, "track": ["tensorboard"]}), out)
    files = sorted((out / "tensorboard").iterdir())
    resume(out)
    assert sorted((out / "tensorboard").iterdir()) == files  # no new event file
    scalars, _, _ = tensorboard_scalars(out / "tensorboard")
    assert_matches(scalars, metrics_csv(out), rel=1e-6)


def test_trackers_change_no_number(tmp_path: Path) -> None:
    need("tensorboard")
    run(parse_config(TINY), tmp_path / "plain")
    run(parse_config({**TINY, "track": ["tensorboard"]}), tmp_path / "tracked")
    assert (tmp_path / "plain/metrics.csv").read_bytes() == (tmp_path / "tracked/metrics.csv").read_bytes()
    plain = json.loads((tmp_path / "plain/summary.json").read_text())
    tracked = json.loads((tmp_path / "tracked/summary.json").read_text())
    assert plain["final"] == tracked["final"]
    assert "track" not in (tmp_path / "plain/config.yaml").read_text()  # config.yaml as before trackers existed
    assert "track:\n- tensorboard" in (tmp_path / "tracked/config.yaml").read_text()


# ------------------------------------------------------------------------------------------------------- sweeps


def sweep(tmp_path: Path, track: list[Any], processes: int) -> tuple[Path, dict[str, Path]]:
    root = tmp_path / "sweep"
    points = {f"lr={lr} seed0": root / f"lr-{lr}" / "seed0" for lr in (0.05, 0.1)}
    raws = {name: {**TINY, "local": {"steps": 2, "lr": float(name[3:].split()[0])}, "track": track} for name in points}
    prepare_tracking(parse_config(next(iter(raws.values()))), root, "lr-sweep")
    jobs = [(raws[name], str(out), str(root), "lr-sweep", name) for name, out in points.items()]
    if processes > 1:  # a broken worker raises here (a multiprocessing.Pool would wait for ever)
        with ProcessPoolExecutor(processes, mp_context=multiprocessing.get_context("spawn")) as pool:
            list(pool.map(sweep_point, jobs, timeout=600))
    else:
        for job in jobs:
            sweep_point(job)
    return root, points


def check_sweep(root: Path, points: dict[str, Path]) -> None:
    """One record per point, grouped under the sweep's name, each equal to its metrics.csv."""
    from mlflow.tracking import MlflowClient

    uri = f"sqlite:///{root / 'mlflow.db'}"
    client = MlflowClient(tracking_uri=uri)
    experiment = client.get_experiment_by_name("lr-sweep")
    assert experiment is not None
    found = client.search_runs([experiment.experiment_id])
    assert sorted(r.info.run_name for r in found) == sorted(points)
    for name, out in points.items():
        rows = metrics_csv(out)
        run_id = read_state(out)["mlflow"]["run_id"]
        history, record = mlflow_records(uri, run_id)
        assert record.info.run_name == name and record.data.tags["fedhet.group"] == "lr-sweep"
        assert_matches(history, rows, rel=1e-12)
        wb_history, runs = wandb_records(out)
        assert [(r["run_group"], r["display_name"]) for r in runs] == [("lr-sweep", name)]
        assert_matches(wb_history, rows, rel=1e-12)
        scalars, hparams, _ = tensorboard_scalars(out / "tensorboard")
        assert_matches(scalars, rows, rel=1e-6)
        assert hparams["local.lr"] == pytest.approx(float(name[3:].split()[0]))
    assert metrics_csv(points["lr=0.05 seed0"]) != metrics_csv(points["lr=0.1 seed0"])


def test_a_sweep_logs_one_record_per_point_grouped(tmp_path: Path) -> None:
    need("tensorboard")
    need("mlflow")
    need("wandb")
    root, points = sweep(tmp_path, ["tensorboard", "mlflow", "wandb"], processes=1)
    check_sweep(root, points)


@pytest.mark.slow
def test_a_sweep_in_worker_processes_logs_the_same(tmp_path: Path) -> None:
    need("tensorboard")
    need("mlflow")
    need("wandb")
    root, points = sweep(tmp_path, ["tensorboard", "mlflow", "wandb"], processes=2)
    check_sweep(root, points)


# ------------------------------------------------------------------------------------------------ configuration


@pytest.mark.parametrize(
    ("track", "message"),
    [
        (["tensorbord"], "unknown tracker 'tensorbord' (did you mean 'tensorboard'?)"),
        ([{"name": "wandb", "mode": "cloud"}], "invalid value for 'track[0].mode'"),
        ([{"name": "mlflow", "url": "x"}], "unknown key 'track[0].url' (did you mean 'uri'?)"),
        (["tensorboard", {"name": "tensorboard"}], "track lists tensorboard more than once"),
    ],
)
def test_bad_track_entries_are_one_line_errors(track: list[Any], message: str) -> None:
    with pytest.raises(ConfigError, match=None) as err:
        parse_config({"track": track})
    assert message in str(err.value) and "\n" not in str(err.value)


@pytest.mark.parametrize(("name", "extra"), [("tensorboard", "tensorboard"), ("mlflow", "mlflow"), ("wandb", "wandb")])
def test_a_missing_library_names_the_extra(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, name: str, extra: str
) -> None:
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda module, *a: None if module == name else real(module, *a))
    with pytest.raises(ConfigError) as err:
        trackers_for([name], tmp_path)
    assert f"pip install 'fedhet[{extra}]'" in str(err.value) and "\n" not in str(err.value)


def test_registry_and_flatten() -> None:
    assert TRACKERS.names() == ["mlflow", "tensorboard", "wandb"]
    flat = flatten({"local": {"lr": 0.1, "steps": 2}, "metrics": [{"name": "appeal"}], "track": ["tensorboard"]})
    assert flat == {"local.lr": 0.1, "local.steps": 2, "metrics": [{"name": "appeal"}]}


def test_a_tracker_added_on_resume_first_logs_the_rounds_already_run(tmp_path: Path) -> None:
    need("tensorboard")
    out = tmp_path / "run"
    with pytest.raises(KeyboardInterrupt):
        run(parse_config({**TINY, "rounds": 5}), out, [Interrupt(3)])
    assert not (out / "tensorboard").exists()
    resume(out, trackers_for(["tensorboard"], out))  # what fedhet run --resume DIR --track tensorboard passes
    scalars, _, _ = tensorboard_scalars(out / "tensorboard")
    assert_matches(scalars, metrics_csv(out), rel=1e-6)
    assert sorted(scalars["test_accuracy"]) == [1, 2, 3, 4, 5]


@pytest.mark.parametrize("content", [b"{garbled", b"[1, 2]", b'{"mlflow": 3}', b"\xff\xfe", b"[" * 100_000])
def test_a_damaged_tracking_json_is_one_line(tmp_path: Path, content: bytes) -> None:
    from fedhet.errors import ConfigError
    from fedhet.experiments.tracking import read_state

    (tmp_path / "tracking.json").write_bytes(content)
    with pytest.raises(ConfigError, match=r"^'.*tracking.json' is damaged .*; delete it"):
        read_state(tmp_path)
