"""The executor, in this process: task order, what a monitor is told, reusing finished run folders, a run's
result function, and its one-line errors."""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Any

import pytest
import torch

from fedhet.errors import ConfigError, FedhetError
from fedhet.experiments.executor import Executor, Monitor, Outcome, Task, raise_failures, reuse
from fedhet.experiments.runner import RunState
from helpers.sweeps import TINY


class Recorder(Monitor):
    def __init__(self) -> None:
        self.events: list[tuple[Any, ...]] = []

    def start(self, stage: str, tasks: Any, done: int, where: str) -> None:
        self.events.append(("start", stage, len(tasks), done, where))

    def started(self, key: int) -> None:
        self.events.append(("started", key))

    def rounds(self, key: int, done: int, total: int) -> None:
        self.events.append(("rounds", key, done, total))

    def finished(self, key: int, outcome: Outcome) -> None:
        self.events.append(("finished", key, outcome.status))

    def stop(self) -> None:
        self.events.append(("stop",))


def tasks(root: Path, lrs: tuple[float, ...] = (0.05, 0.1), rounds: int = 2) -> list[Task]:
    return [
        Task({**TINY, "rounds": rounds, "local": {**TINY["local"], "lr": lr}}, root / f"lr{lr}", f"lr {lr}")
        for lr in lrs
    ]


def client_accuracy(state: RunState) -> list[float]:
    return state.client_columns["test_accuracy"].double().tolist()


def test_serial_runs_in_order_and_tells_the_monitor(tmp_path: Path) -> None:
    monitor = Recorder()
    outcomes = Executor(1, monitor=monitor).run(tasks(tmp_path), stage="grid")
    assert [o.task.label for o in outcomes] == ["lr 0.05", "lr 0.1"] and all(o.ok for o in outcomes)
    assert [o.rounds for o in outcomes] == [2, 2] and outcomes[0].final == outcomes[0].history[-1]
    assert monitor.events[0] == ("start", "grid", 2, 0, "this process")
    assert monitor.events[1:5] == [("started", 0), ("rounds", 0, 0, 2), ("rounds", 0, 1, 2), ("rounds", 0, 2, 2)]
    assert monitor.events[5] == ("finished", 0, "finished") and monitor.events[-1] == ("stop",)


def test_overrides_set_keys_of_every_tasks_config(tmp_path: Path) -> None:
    """`fedhet reproduce --device` sets `device` this way; any top-level key works alike."""
    outcomes = Executor(1, overrides={"rounds": 1, "device": "cpu"}).run(tasks(tmp_path, rounds=3))
    assert [o.rounds for o in outcomes] == [1, 1]
    assert all(o.task.config["device"] == "cpu" and o.task.config["local"]["lr"] for o in outcomes)
    assert "rounds: 1" in (tmp_path / "lr0.05" / "config.yaml").read_text()


def test_finished_folders_are_reused_and_a_result_function_sees_the_run(tmp_path: Path) -> None:
    first = Executor(1).run(tasks(tmp_path), post=client_accuracy)
    assert reuse(tasks(tmp_path)[0]) is not None
    assert reuse(tasks(tmp_path, rounds=3)[0]) is None  # another config: not this run
    monitor = Recorder()
    again = Executor(1, monitor=monitor).run(tasks(tmp_path))
    assert all(o.reused and o.attempts == 0 for o in again) and monitor.events[0][3] == 2
    assert [o.history for o in again] == [o.history for o in first]  # metrics.csv holds the same numbers
    loaded = Executor(1).run(tasks(tmp_path), post=client_accuracy)  # a result function: the run is loaded
    assert not loaded[0].reused and [o.result for o in loaded] == [o.result for o in first]
    assert len(first[0].result) == 6 and isinstance(first[0].result[0], float)


def test_a_finished_folder_whose_config_records_derived_values_is_reused(tmp_path: Path) -> None:
    """config.yaml's `derived` section (q-FFL's L here) is not part of the config a sweep compares."""
    task = Task({**TINY, "algorithm": "qffl", "rounds": 1}, tmp_path / "qffl", "qffl")
    assert Executor(1).run([task])[0].ok and "derived:" in (tmp_path / "qffl" / "config.yaml").read_text()
    assert reuse(task) is not None
    assert reuse(Task({**task.config, "algorithm": {"name": "qffl", "q": 2.0}}, task.out, "q2")) is None


def test_errors_are_recorded_and_raised_as_one_line(tmp_path: Path) -> None:
    bad = Task({**TINY, "partition": {"name": "dirichlet", "alpha": 0.5, "min_size": 1000}}, tmp_path / "bad", "bad")
    outcomes = Executor(1).run([*tasks(tmp_path, (0.05,)), bad])
    assert [o.status for o in outcomes] == ["finished", "failed"] and "\n" not in outcomes[1].error
    with pytest.raises(FedhetError, match=r"1 of 2 runs failed, the first: bad: ") as err:
        raise_failures(outcomes)
    assert "\n" not in str(err.value)


def test_a_bug_is_recorded_with_its_traceback(tmp_path: Path) -> None:
    def broken(state: RunState) -> None:
        raise ValueError("oops\nsecond line")

    [outcome] = Executor(1).run(tasks(tmp_path, (0.05,)), post=broken)
    assert outcome.status == "failed" and outcome.error == "ValueError: oops"
    assert "Traceback" in outcome.detail and "broken" in outcome.detail


def test_two_tasks_cannot_share_a_folder(tmp_path: Path) -> None:
    twice = [*tasks(tmp_path, (0.05,)), *tasks(tmp_path, (0.05,))]
    with pytest.raises(ConfigError, match="two runs would share the run folder"):
        Executor(1).run(twice)


def test_what_worker_processes_cannot_be_given_is_a_one_line_error(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="cannot be sent to worker processes") as err:
        Executor(2, callbacks=lambda task: []).run(tasks(tmp_path))
    assert "\n" not in str(err.value)
    with pytest.raises(ConfigError, match="--threads 0"):
        Executor(1, threads=0)


def test_ray_missing_names_the_extra(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "ray", None)  # import ray fails as if it were not installed
    with pytest.raises(FedhetError, match=r"--ray needs Ray: pip install 'fedhet\[ray\]'"):
        Executor(ray="auto").run(tasks(tmp_path))


def test_runs_use_the_threads_they_are_given(tmp_path: Path) -> None:
    before = torch.get_num_threads()
    [outcome] = Executor(1, threads=1).run(tasks(tmp_path, (0.05,)), post=lambda state: torch.get_num_threads())
    assert outcome.result == 1 and torch.get_num_threads() == before


def test_every_run_gets_one_torch_thread_by_default() -> None:
    """A run's numbers depend on its thread count (the backend and the dense backend's chunks): runs made here one
    after another get the one thread a worker process gives them, not this process's setting."""
    assert Executor(1, threads=None).threads == 1
    assert Executor(3, threads=None).threads == 1
    assert Executor(1, threads=4).threads == 4


def test_linked_run_folders_are_refused_below_the_root_only(tmp_path: Path) -> None:
    """A sweep's or recipe's run folder, the folders between it and the sweep's own, and the run's files must not be
    links; what lies above the sweep folder is the user's choice (a --out that is a link is fine)."""
    from fedhet.atomic import LinkError
    from fedhet.experiments.executor import refuse_linked_folders

    (tmp_path / "real").mkdir()
    (tmp_path / "out").symlink_to(tmp_path / "real")
    root = tmp_path / "out"
    task = Task({}, root / "point" / "seed0")
    refuse_linked_folders(root, [task])  # nothing there yet
    (tmp_path / "yours").mkdir()
    (root / "point").symlink_to(tmp_path / "yours")
    with pytest.raises(LinkError, match="point' is a symbolic link"):
        refuse_linked_folders(root, [task])
    (root / "point").unlink()
    (root / "point" / "seed0").mkdir(parents=True)
    (tmp_path / "yours" / "summary.json").write_text("{}")
    os.link(tmp_path / "yours" / "summary.json", root / "point" / "seed0" / "summary.json")
    with pytest.raises(LinkError, match=r"summary\.json' is a hard link"):
        refuse_linked_folders(root, [task])
