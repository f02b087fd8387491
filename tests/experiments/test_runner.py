"""The round loop: run folders, determinism, resume after an interruption, divergence."""

from __future__ import annotations

import csv
import json
import math
import shutil
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
import torch

from fedhet.atomic import LinkError
from fedhet.errors import ConfigError, DivergenceError
from fedhet.experiments.callbacks import Callback, EarlyStopping
from fedhet.experiments.checkpoint import CheckpointError
from fedhet.experiments.config import parse_config
from fedhet.experiments.runner import RunState, _check_divergence, resume, run, run_or_resume

SMALL = {
    "dataset": "digits",
    "partition": {"name": "dirichlet", "alpha": 0.5, "min_size": 20},
    "model": {"name": "mlp", "hidden": [16], "dropout": 0.1},
    "num_clients": 10,
    "clients_per_round": 4,
    "rounds": 6,
    "local": {"steps": 3, "lr": 0.1, "batch_size": 8},
    "seed": 2,
}


def small(**changes: object) -> dict:
    return {**SMALL, **changes}


class Interrupt(Callback):
    def __init__(self, at: int) -> None:
        self.at = at

    def on_round_end(self, state: RunState, metrics: dict[str, float] | None) -> bool:
        if state.round == self.at:
            raise KeyboardInterrupt
        return False


def test_run_folder_files(tmp_path: Path) -> None:
    state = run(parse_config(small()), tmp_path / "r")
    out = tmp_path / "r"
    for name in ("config.yaml", "metrics.csv", "clients.csv", "summary.json", "checkpoint.pt"):
        assert (out / name).is_file(), name
    summary = json.loads((out / "summary.json").read_text())
    assert summary["algorithm"] == "fedavg" and summary["dataset"] == "digits" and summary["rounds"] == 6
    assert summary["status"] == "finished" and summary["wall_time_s"] > 0
    assert summary["final"]["test_accuracy"] == pytest.approx(state.final["test_accuracy"])
    header = (out / "metrics.csv").read_text().splitlines()[0].split(",")
    for column in (
        "round",
        "test_accuracy",
        "test_loss",
        "train_loss",
        "test_accuracy_std",
        "test_accuracy_worst10",
        "test_accuracy_best10",
    ):
        assert column in header
    assert len((out / "metrics.csv").read_text().splitlines()) == 7
    assert len((out / "clients.csv").read_text().splitlines()) == 11
    assert "hidden:\n  - 16" in (out / "config.yaml").read_text()  # resolved component params


def test_same_seed_same_metrics_and_backends_agree(tmp_path: Path) -> None:
    run(parse_config(small()), tmp_path / "a")
    run(parse_config(small()), tmp_path / "b")
    assert (tmp_path / "a/metrics.csv").read_text() == (tmp_path / "b/metrics.csv").read_text()
    seq = run(parse_config(small(backend="sequential")))
    vec = run(parse_config(small(backend="vectorised")))
    torch.testing.assert_close(seq.params, vec.params, atol=1e-5, rtol=1e-5)
    for a, b in zip(seq.history, vec.history, strict=True):
        assert a.keys() == b.keys()
        for key in a:
            assert a[key] == pytest.approx(b[key], abs=1e-5), key


@pytest.mark.parametrize("algorithm", ["fedavg", "scaffold", "ditto", "fedrep", "apfl"])
def test_resume_after_interruption_matches_uninterrupted(tmp_path: Path, algorithm: str) -> None:
    """Byte-identical files, the personalised methods' models (kept by the engine, in the checkpoint) included."""
    cfg = parse_config(small(algorithm=algorithm, availability={"name": "bernoulli", "p": 0.7}))
    run(cfg, tmp_path / "full")
    with pytest.raises(KeyboardInterrupt):
        run(cfg, tmp_path / "cut", callbacks=[Interrupt(at=3)])
    summary = json.loads((tmp_path / "cut/summary.json").read_text())
    assert summary["status"] == "interrupted" and summary["rounds"] == 3
    resumed = resume(tmp_path / "cut")
    assert resumed.round == 6
    assert (tmp_path / "cut/metrics.csv").read_text() == (tmp_path / "full/metrics.csv").read_text()
    assert (tmp_path / "cut/clients.csv").read_text() == (tmp_path / "full/clients.csv").read_text()
    if algorithm in ("ditto", "fedrep", "apfl"):
        assert "personal_test_accuracy" in (tmp_path / "full/metrics.csv").read_text()


@pytest.mark.parametrize(
    ("algorithm", "batch_norm"),
    [
        ("fedbn", None),
        pytest.param("fedavg", "aggregate", marks=pytest.mark.slow),
        pytest.param("fedavg", "recompute", marks=pytest.mark.slow),
    ],
)
def test_a_resumed_run_with_batch_norm_matches_uninterrupted(tmp_path: Path, algorithm: str, batch_norm: str) -> None:
    """Batch norm's running statistics are model state: the checkpoint holds them (the global model's, each client's
    own under fedbn), so a resumed run writes the same files."""
    model = {"name": "resnet8", "width": 2, "batch_norm": batch_norm}
    changes = {"dataset": {"name": "digits", "image": True}, "model": model, "algorithm": algorithm, "rounds": 4}
    cfg = parse_config(small(**changes, personal_eval={"appeal": False}, eval_every=2))
    full = run(cfg, tmp_path / "full")
    with pytest.raises(KeyboardInterrupt):
        run(cfg, tmp_path / "cut", callbacks=[Interrupt(at=2)])
    resumed = resume(tmp_path / "cut")
    assert (tmp_path / "cut/metrics.csv").read_text() == (tmp_path / "full/metrics.csv").read_text()
    assert (tmp_path / "cut/clients.csv").read_text() == (tmp_path / "full/clients.csv").read_text()
    assert torch.equal(resumed.params, full.params)
    stats = full.experiment.engine.model.stats
    assert not torch.equal(full.params[stats], full.experiment.engine.initial_params()[stats]) or algorithm == "fedbn"


def _divergence_state(initial: list[float], max_loss: float = 100.0, scaled: bool = True) -> Any:
    """What `_check_divergence` reads of a run: clients whose initial model has training losses `initial`."""
    calls: list[int] = []

    def losses_at(params: torch.Tensor, clients: torch.Tensor, split: str) -> torch.Tensor:
        calls.append(len(clients))
        return torch.tensor(initial)

    engine = SimpleNamespace(losses_at=losses_at, initial_params=lambda: torch.zeros(3))
    train = SimpleNamespace(y=torch.tensor([25.0, 346.0]))
    data = SimpleNamespace(train=train, target_scale=object() if scaled else None, seen_ids=torch.arange(len(initial)))
    config = SimpleNamespace(max_loss=max_loss, local=SimpleNamespace(lr=0.003))
    experiment = SimpleNamespace(engine=engine, data=data)
    return SimpleNamespace(
        config=config, experiment=experiment, params=torch.zeros(3), round=0, initial_loss=None, calls=calls
    )


def test_divergence_is_a_loss_above_max_loss_and_a_hundred_times_the_initial_one() -> None:
    state = _divergence_state([2.0, 5.0])  # the initial model's largest loss: 5, so the bound is max(100, 500)
    _check_divergence(state, torch.tensor([1.0, 99.0]))  # below max_loss: the initial loss is not even computed
    assert state.calls == []
    _check_divergence(state, torch.tensor([3.0, 500.0]))  # above max_loss, not 100 times the start
    _check_divergence(state, torch.tensor([499.0]))
    assert state.calls == [2] and state.initial_loss == 5.0  # computed once, over the training clients
    with pytest.raises(DivergenceError, match=r"^round 1: .*local loss 600 is above max_loss 100 and 120 times the "
                       r"initial model's 5\): .*lower local.lr \(now 0.003\) or algorithm.server_lr$"):  # fmt: skip
        _check_divergence(state, torch.tensor([3.0, 600.0]))
    for bad in (float("nan"), float("inf")):
        with pytest.raises(DivergenceError, match="became NaN or infinite"):
            _check_divergence(state, torch.tensor([1.0, bad]))
    state.params = torch.tensor([0.0, float("nan"), 0.0])
    with pytest.raises(DivergenceError, match="became NaN or infinite"):
        _check_divergence(state, torch.tensor([1.0]))


def test_a_loss_that_starts_above_max_loss_is_no_divergence() -> None:
    """A regression on raw targets starts with a squared error of thousands: max_loss alone stopped it in round 1."""
    state = _divergence_state([30_000.0], max_loss=10_000.0, scaled=False)
    _check_divergence(state, torch.tensor([29_000.0, 31_000.0]))
    with pytest.raises(DivergenceError, match=r"the targets span 25 to 346 and task.standardize is off"):
        _check_divergence(state, torch.tensor([3.1e6]))


def test_a_run_whose_loss_never_drops_below_a_tiny_max_loss_finishes(tmp_path: Path) -> None:
    assert run(parse_config(small(max_loss=1e-3, rounds=2))).status == "finished"


@pytest.mark.slow
def test_a_run_cut_off_after_its_last_checkpoint_resumes_to_the_same_summary(tmp_path: Path) -> None:
    """Killed after the last checkpoint, before summary.json: the resume trains no round, and still says which
    backend trained the run (APFL's is vectorised; the engine's choice for a plain cohort would be dense)."""
    cfg = parse_config(small(algorithm="apfl", rounds=2))
    run(cfg, tmp_path / "full")
    shutil.copytree(tmp_path / "full", tmp_path / "cut")
    (tmp_path / "cut" / "summary.json").unlink()
    resumed = resume(tmp_path / "cut")
    assert resumed.round == 2 and not resumed.already_finished

    def summary(name: str) -> dict[str, object]:
        found = json.loads((tmp_path / name / "summary.json").read_text())
        return {k: v for k, v in found.items() if k != "wall_time_s"}

    assert summary("full")["backend"] == "vectorised"
    assert summary("cut") == summary("full")


def test_divergence_stops_with_message_and_keeps_files(tmp_path: Path) -> None:
    cfg = parse_config(small(local={"steps": 5, "lr": 1e6, "batch_size": 8}, rounds=5))
    with pytest.raises(DivergenceError, match=r"diverged.*lower local.lr"):
        run(cfg, tmp_path / "d")
    summary = json.loads((tmp_path / "d/summary.json").read_text())
    assert summary["status"] == "diverged"
    assert (tmp_path / "d/config.yaml").is_file()


def test_early_stopping_callback() -> None:
    state = run(parse_config(small(rounds=30)), callbacks=[EarlyStopping("test_accuracy", 0.3)])
    assert state.status == "stopped early" and state.round < 30
    assert state.final["test_accuracy"] >= 0.3


class LocalTraining(Callback):
    def __init__(self) -> None:
        self.seconds: list[float] = []

    def on_round_end(self, state: RunState, metrics: dict[str, float] | None) -> bool:
        self.seconds.append(state.local_training_s)
        return False


def test_each_round_says_how_long_its_local_training_took() -> None:
    seen = LocalTraining()
    state = run(parse_config(small(rounds=3)), callbacks=[seen])
    assert len(seen.seconds) == 3 and all(s > 0 for s in seen.seconds)
    assert sum(seen.seconds) <= state.wall_time_s  # a part of the rounds' time


class CountRounds(Callback):
    def __init__(self) -> None:
        self.rounds = 0

    def on_round_end(self, state: RunState, metrics: dict[str, float] | None) -> bool:
        self.rounds += 1
        return False


def test_run_or_resume_loads_a_finished_run_and_continues_an_interrupted_one(tmp_path: Path) -> None:
    full = run(parse_config(small()), tmp_path / "full")
    counter = CountRounds()
    loaded = run_or_resume(parse_config(small()), tmp_path / "full", [counter])
    assert counter.rounds == 0 and loaded.history == full.history and torch.equal(loaded.params, full.params)

    with pytest.raises(KeyboardInterrupt):
        run(parse_config(small()), tmp_path / "cut", [Interrupt(at=2)])
    counter = CountRounds()
    finished = run_or_resume(parse_config(small()), tmp_path / "cut", [counter])
    assert counter.rounds == 4 and finished.history == full.history

    counter = CountRounds()  # another config in the same folder starts afresh
    other = run_or_resume(parse_config(small(seed=3)), tmp_path / "full", [counter])
    assert counter.rounds == 6 and other.history != full.history


# ---- resumes are checked -----------------------------------------------------------------------------------------


def _interrupted(tmp_path: Path, **changes: object) -> Path:
    """A run of `small` interrupted after round 3 of 6."""
    with pytest.raises(KeyboardInterrupt):
        run(parse_config(small(**changes)), tmp_path / "cut", callbacks=[Interrupt(at=3)])
    return tmp_path / "cut"


def _payload(folder: Path) -> dict:
    from fedhet.experiments.checkpoint import loads

    return loads(folder / "checkpoint.pt", "c")


def _rewrite(folder: Path, **changes: object) -> None:
    """Rewrite the checkpoint with a valid checksum (a crafted file, or one from a buggy writer)."""
    from fedhet.experiments.checkpoint import dumps

    (folder / "checkpoint.pt").write_bytes(dumps({**_payload(folder), **changes}))


EDITS = {
    "emptied config.yaml": (lambda f: (f / "config.yaml").write_text(""), r"config.yaml' is empty"),
    "edited seed": (
        lambda f: (f / "config.yaml").write_text((f / "config.yaml").read_text().replace("seed: 2", "seed: 3")),
        "another config",
    ),
    "invalid config.yaml": (lambda f: (f / "config.yaml").write_text("rounds: [\n"), "not valid YAML"),
    "config.yaml gone": (lambda f: (f / "config.yaml").unlink(), "has no config.yaml"),
    "checkpoint of another model": (lambda f: _rewrite(f, params=torch.zeros(7)), r"another model \(\(7,\)"),
    "checkpoint from another run": (lambda f: _rewrite(f, config_sha256="0" * 64), "another config"),
    "round 10**6": (lambda f: _rewrite(f, round=10**6), "at round 1000000, beyond the 6 rounds planned"),
    "round 0": (lambda f: _rewrite(f, round=0), r"corrupt \(round 0\)"),
    "round as text": (lambda f: _rewrite(f, round="3"), "corrupt"),
    "missing strategy state": (lambda f: _rewrite(f, strategy=None), "does not fit this run"),
    "missing key": (
        lambda f: (f / "checkpoint.pt").write_bytes(
            __import__("fedhet.experiments.checkpoint", fromlist=["dumps"]).dumps(
                {k: v for k, v in _payload(f).items() if k != "availability"}
            )
        ),
        "does not fit this run",
    ),
    "wrong metrics count": (lambda f: _rewrite(f, metrics=[{}, {}]), "does not fit this run"),
    "flipped byte": (
        lambda f: (f / "checkpoint.pt").write_bytes(_flip((f / "checkpoint.pt").read_bytes())),
        "checksum",
    ),
    "truncated": (
        lambda f: (f / "checkpoint.pt").write_bytes((f / "checkpoint.pt").read_bytes()[:500]),
        "corrupt or truncated",
    ),
    "random bytes": (lambda f: (f / "checkpoint.pt").write_bytes(bytes(range(256)) * 8), "corrupt"),
    "zero bytes": (lambda f: (f / "checkpoint.pt").write_bytes(b""), "empty file"),
    "a folder": (lambda f: ((f / "checkpoint.pt").unlink(), (f / "checkpoint.pt").mkdir()), "is a folder"),
    "edited metrics.csv": (
        lambda f: (f / "metrics.csv").write_bytes((f / "metrics.csv").read_bytes().replace(b"\r\n2,", b"\r\n7,")),
        "metrics.csv' does not match the checkpoint",
    ),
    "truncated metrics.csv": (
        lambda f: (f / "metrics.csv").write_bytes((f / "metrics.csv").read_bytes()[:100]),
        "metrics.csv' does not match",
    ),
}


def _flip(data: bytes) -> bytes:
    """Flip one bit inside the stored parameters (the payload's largest tensor)."""
    out = bytearray(data)
    out[len(data) // 2] ^= 0x10
    return bytes(out)


@pytest.mark.parametrize("edit", list(EDITS))
def test_a_resume_refuses_what_does_not_match_in_one_line_and_changes_nothing(tmp_path: Path, edit: str) -> None:
    from fedhet.errors import FedhetError

    folder = _interrupted(tmp_path)
    change, message = EDITS[edit]
    change(folder)
    before = {p.name: p.read_bytes() for p in folder.iterdir() if p.is_file()}
    with pytest.raises(FedhetError, match=message) as info:
        resume(folder)
    assert "\n" not in str(info.value)
    assert {p.name: p.read_bytes() for p in folder.iterdir() if p.is_file()} == before


def test_a_changed_data_dir_and_more_rounds_are_allowed(tmp_path: Path) -> None:
    full = run(parse_config(small(rounds=8)), tmp_path / "full")
    folder = _interrupted(tmp_path)
    text = (folder / "config.yaml").read_text()
    (folder / "config.yaml").write_text(text.replace("data_dir: data", "data_dir: elsewhere"))
    resumed = resume(folder, rounds=8)
    assert resumed.round == 8 and "rounds: 8" in (folder / "config.yaml").read_text()
    assert (folder / "metrics.csv").read_bytes() == (tmp_path / "full/metrics.csv").read_bytes()
    assert torch.equal(resumed.params, full.params)
    with pytest.raises(CheckpointError, match="beyond the 5 rounds planned; resume with --rounds 8"):
        resume(folder, rounds=5)


def test_a_run_interrupted_before_its_first_checkpoint_restarts(tmp_path: Path) -> None:
    run(parse_config(small()), tmp_path / "full")
    with pytest.raises(KeyboardInterrupt):
        run(parse_config(small(checkpoint_every=4)), tmp_path / "cut", callbacks=[Interrupt(at=2)])
    (tmp_path / "cut/config.yaml").write_text((tmp_path / "full/config.yaml").read_text())
    assert not (tmp_path / "cut/checkpoint.pt").exists()
    assert resume(tmp_path / "cut").round == 6
    assert (tmp_path / "cut/metrics.csv").read_bytes() == (tmp_path / "full/metrics.csv").read_bytes()


def test_checkpoint_every_cuts_metrics_back_to_the_checkpoint(tmp_path: Path) -> None:
    run(parse_config(small(checkpoint_every=2)), tmp_path / "full")
    folder = _interrupted(tmp_path, checkpoint_every=2)  # checkpoint at round 2, rows up to 3
    assert _payload(folder)["round"] == 2
    assert resume(folder).round == 6
    assert (folder / "metrics.csv").read_bytes() == (tmp_path / "full/metrics.csv").read_bytes()


# ---- kills in the middle of every write --------------------------------------------------------------------------

KILL_CONFIG = small(
    algorithm="scaffold",  # server and client state
    availability={"name": "bernoulli", "p": 0.8},  # its own random stream
    metrics=["alpha_accuracy"],  # a plugin that reads the history back
    model="logistic",
    num_clients=6,
    clients_per_round=3,
    local={"steps": 2, "lr": 0.1, "batch_size": 8},
    rounds=3,
    eval_every=2,  # rows at rounds 2 and 3 only
)


class Killed(BaseException):
    """The process died (nothing after it runs: every later write fails too)."""


def _kill_at(monkeypatch: pytest.MonkeyPatch, n: int) -> list[int]:
    """Make the n-th write primitive call die halfway; returns the call counter."""
    from fedhet import atomic

    calls = [0]
    real_write, real_replace, real_append = atomic._write_file, atomic._replace, atomic._append

    def step() -> bool:
        if calls[0] >= n:
            raise Killed  # dead processes write nothing
        calls[0] += 1
        return calls[0] == n

    def write_file(path: Path, data: bytes | bytearray | memoryview) -> None:
        if step():
            real_write(path, bytes(data)[: len(data) // 2])
            raise Killed
        real_write(path, data)

    def replace(source: Path, target: Path) -> None:
        if step():
            raise Killed
        real_replace(source, target)

    def append(path: Path, data: bytes) -> None:
        if step():
            real_append(path, data[: len(data) // 2])
            raise Killed
        real_append(path, data)

    monkeypatch.setattr(atomic, "_write_file", write_file)
    monkeypatch.setattr(atomic, "_replace", replace)
    monkeypatch.setattr(atomic, "_append", append)
    return calls


def _outputs(folder: Path) -> dict[str, object]:
    summary = json.loads((folder / "summary.json").read_text())
    summary.pop("wall_time_s")
    return {
        "metrics": (folder / "metrics.csv").read_bytes(),
        "clients": (folder / "clients.csv").read_bytes(),
        "config": (folder / "config.yaml").read_bytes(),
        "summary": summary,
    }


@pytest.mark.slow
def test_a_kill_in_any_write_resumes_to_identical_files(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    with monkeypatch.context() as m:
        calls = _kill_at(m, 10**9)
        run(parse_config(KILL_CONFIG), tmp_path / "full")
        writes = calls[0]
    expected = _outputs(tmp_path / "full")
    assert writes >= 14  # config, metrics, 3 checkpoints (write + rename), 2 rows, clients, summary
    for n in range(1, writes + 1):
        folder = tmp_path / f"kill{n}"
        with monkeypatch.context() as m:
            _kill_at(m, n)
            with pytest.raises(Killed):
                run(parse_config(KILL_CONFIG), folder)
        (folder / ".checkpoint.pt.dead.tmp").write_bytes(b"what a killed write leaves")
        if (folder / "config.yaml").is_file():
            resume(folder)
        else:  # killed before config.yaml existed: nothing to resume, start again
            run(parse_config(KILL_CONFIG), folder)
        assert _outputs(folder) == expected, n
        assert not [p for p in folder.iterdir() if p.name.endswith(".tmp")], n


def test_a_full_disk_leaves_no_temporary_file_and_the_run_resumes(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import errno

    from fedhet import atomic

    run(parse_config(small()), tmp_path / "full")
    real = atomic._write_file

    def full(path: Path, data: bytes | bytearray | memoryview) -> None:
        if path.name.startswith(".checkpoint.pt") and len(list((tmp_path / "cut").glob("checkpoint.pt"))):
            real(path, bytes(data)[:10])
            raise OSError(errno.ENOSPC, "No space left on device", str(path))
        real(path, data)

    monkeypatch.setattr(atomic, "_write_file", full)
    with pytest.raises(OSError, match="No space left"):
        run(parse_config(small()), tmp_path / "cut")
    monkeypatch.undo()
    assert not [p for p in (tmp_path / "cut").iterdir() if p.name.endswith(".tmp")]
    assert json.loads((tmp_path / "cut/summary.json").read_text())["status"] == "interrupted"
    resume(tmp_path / "cut")
    assert (tmp_path / "cut/metrics.csv").read_bytes() == (tmp_path / "full/metrics.csv").read_bytes()


@pytest.mark.parametrize(("algorithm", "backend"), [("fedavg", "dense"), ("perfedavg", "vectorised")])
def test_summary_names_the_backend_that_trained(tmp_path: Path, algorithm: str, backend: str) -> None:
    # Per-FedAvg's local rule needs autograd: `auto` trains it vectorised although the MLP has a dense backend
    run(parse_config(small(algorithm=algorithm, rounds=2)), tmp_path / "r")
    assert json.loads((tmp_path / "r/summary.json").read_text())["backend"] == backend


def test_config_yaml_records_the_values_the_run_derived(tmp_path: Path) -> None:
    """q-FFL's L = 1/local.lr (unset lipschitz) is written under `derived`; the file still reads back as the same
    config (a resume, a rerun of it), and a run that derives nothing has no such section."""
    from fedhet.experiments.config import load_yaml
    from fedhet.experiments.runfolder import identity

    out = tmp_path / "qffl"
    state = run(parse_config(small(algorithm="qffl", rounds=2)), out)
    written = load_yaml(out / "config.yaml")
    assert written["derived"] == {"algorithm": {"lipschitz": pytest.approx(1 / 0.1)}}
    assert "lipschitz" in written["algorithm"] and written["algorithm"]["lipschitz"] is None
    again = parse_config(written)
    assert identity(state.experiment.resolved_config()) == identity(run(again).experiment.resolved_config())
    resumed = resume(out, rounds=3)
    assert resumed.round == 3 and load_yaml(out / "config.yaml")["derived"] == written["derived"]
    run(parse_config(small(algorithm={"name": "qffl", "lipschitz": 1.0}, rounds=1)), tmp_path / "given")
    assert "derived" not in load_yaml(tmp_path / "given" / "config.yaml")
    run(parse_config(small(rounds=1)), tmp_path / "fedavg")
    assert "derived" not in load_yaml(tmp_path / "fedavg" / "config.yaml")


def test_derived_values_of_wrapped_strategies_metrics_and_requirements(tmp_path: Path) -> None:
    from fedhet.experiments.config import load_yaml

    config = small(
        algorithm={"name": "gsnr", "base": "qffl", "batch": 4},
        metrics=["contribution"],
        availability={"name": "appeal", "mandatory_rounds": 1},
        requirements={"steps": 2},
        rounds=1,
    )
    run(parse_config(config), tmp_path / "r")
    derived = load_yaml(tmp_path / "r" / "config.yaml")["derived"]
    assert derived == {
        "algorithm": {"samples": 8, "base": {"lipschitz": pytest.approx(10.0)}},
        "metrics": [{"samples": 8, "batch": 8}],
        "requirements": {"lr": 0.1, "batch_size": 8},
    }


def test_a_run_without_a_system_model_keeps_no_clock_and_writes_what_it_wrote(tmp_path: Path) -> None:
    state = run(parse_config(small(rounds=2)), tmp_path / "r")
    assert state.clock is None and "time_s" not in state.final
    text = (tmp_path / "r/config.yaml").read_text()
    assert "system:" not in text and "deadline:" not in text


@pytest.mark.parametrize("policy", ["drop", "partial", "overselect"])
def test_a_deadline_shortens_rounds_and_a_resumed_timed_run_is_byte_identical(tmp_path: Path, policy: str) -> None:
    timed = small(system={"name": "lognormal", "compute_sigma": 1.5}, rounds=6)
    waiting = run(parse_config(timed))
    assert waiting.final["late_clients"] == 0.0 and waiting.final["time_s"] > 0
    cfg = parse_config({**timed, "deadline": {"seconds": 0.6, "policy": policy}})
    run(cfg, tmp_path / "full")
    with pytest.raises(KeyboardInterrupt):
        run(cfg, tmp_path / "cut", callbacks=[Interrupt(at=3)])
    resume(tmp_path / "cut")
    assert (tmp_path / "cut/metrics.csv").read_text() == (tmp_path / "full/metrics.csv").read_text()
    rows = list(csv.DictReader((tmp_path / "full/metrics.csv").open()))
    assert float(rows[-1]["time_s"]) < waiting.final["time_s"]  # the deadline shortened the rounds
    if policy != "partial":
        assert sum(float(r["late_clients"]) for r in rows) > 0


def test_overselection_selects_more_without_changing_the_run_s_cohort_size() -> None:
    """⌈(1 + r)·m⌉ clients are selected (the strategy's `ctx.selects`), m updates kept; the context's
    clients_per_round, which other parts read (DP's m, PoC's d), stays m at every moment."""
    cfg = small(system={"name": "lognormal", "compute_sigma": 1.5}, rounds=3)
    m = cfg["clients_per_round"]
    cfg["deadline"] = {"seconds": 60, "policy": {"name": "overselect", "r": 0.5}}
    state = run(parse_config(cfg))
    ctx = state.experiment.strategy.ctx
    assert ctx.clients_per_round == m and ctx.selects == math.ceil(1.5 * m)
    assert all(row["participants"] == m for row in state.history)
    assert all(row["late_clients"] == math.ceil(1.5 * m) - m for row in state.history)


def test_a_deadline_nobody_meets_is_one_note_and_counted_across_a_resume(tmp_path: Path) -> None:
    from fedhet.errors import FedhetNote

    # constant clients: 2 × 50 ms latency alone exceed a 10 ms deadline, so every round is left without updates
    cfg = parse_config(small(system="constant", deadline={"seconds": 0.01}, rounds=4))
    note = r"^round 1: no client of the \d+ selected can finish within deadline"
    with pytest.warns(FedhetNote, match=note) as notes, pytest.raises(KeyboardInterrupt):
        run(cfg, tmp_path / "r", callbacks=[Interrupt(at=2)])
    assert len([n for n in notes if issubclass(n.category, FedhetNote)]) == 1  # once, not every round
    state = resume(tmp_path / "r")
    assert state.final["participants"] == 0 and state.final["time_s"] == pytest.approx(0.04)
    assert json.loads((tmp_path / "r/summary.json").read_text())["deadline_empty_rounds"] == 4
    assert torch.equal(state.params, state.experiment.engine.initial_params())  # the model never moved


class _Raises(Callback):
    """Raises `error` at the end of round 2: code of the user's (a callback, a plugin) failing, or Ctrl-C."""

    def __init__(self, error: BaseException) -> None:
        self.error = error

    def on_round_end(self, state: RunState, metrics: dict[str, float] | None) -> bool:
        if state.round == 2:
            raise self.error
        return False


@pytest.mark.parametrize(("error", "status"), [(RuntimeError("a bug"), "failed"), (KeyboardInterrupt(), "interrupted")])
def test_a_crash_in_code_is_failed_and_ctrl_c_is_interrupted(tmp_path: Path, error: BaseException, status: str) -> None:
    with pytest.raises(type(error)):
        run(parse_config(small(rounds=4)), tmp_path / "r", [_Raises(error)])
    summary = json.loads((tmp_path / "r" / "summary.json").read_text())
    assert summary["status"] == status and summary["rounds"] == 2


def test_a_resume_imports_nothing_its_folder_names_unless_trusted(tmp_path: Path) -> None:
    nets = tmp_path / "nets.py"
    nets.write_text(
        "import pathlib\nfrom torch import nn\npathlib.Path(__file__).with_name('imported').write_text('x')\n\n"
        "class Net(nn.Sequential):\n    def __init__(self, num_classes):\n"
        "        super().__init__(nn.Flatten(), nn.Linear(64, num_classes))\n"
    )
    run(parse_config(small(rounds=2, model={"name": "torch", "target": f"{nets}:Net"})), tmp_path / "r")
    (tmp_path / "imported").unlink()
    with pytest.raises(ConfigError, match=r"names code to import \(.*nets.py:Net\).*--trust-imports"):
        resume(tmp_path / "r", rounds=3)
    assert not (tmp_path / "imported").exists()
    assert resume(tmp_path / "r", rounds=3, trust=True).round == 3


def test_run_or_resume_reads_the_folder_as_text_and_trusts_only_the_same_config(tmp_path: Path) -> None:
    """A sweep's folder whose config.yaml was edited to import a file is not resumed (nor imported): it is replaced
    by a run of the sweep's own config."""
    config = parse_config(small(rounds=2))
    run(config, tmp_path / "r")
    (tmp_path / "evil.py").write_text("import pathlib\npathlib.Path(__file__).with_name('pwned').write_text('x')\n")
    text = (tmp_path / "r" / "config.yaml").read_text()
    (tmp_path / "r" / "config.yaml").write_text(
        f"imports: [{tmp_path / 'evil.py'}]\n" + text.replace("imports: []\n", "")
    )
    state = run_or_resume(config, tmp_path / "r")
    assert state.status == "finished" and not (tmp_path / "pwned").exists()
    assert "evil" not in (tmp_path / "r" / "config.yaml").read_text()


@pytest.mark.parametrize("wrapper", ["gsnr", "secagg"])
def test_a_wrapper_with_its_default_base_resumes(wrapper: str, tmp_path: Path) -> None:
    """A wrapping strategy whose `base` is left to its default wrote 'fedavg' in config.yaml but recorded the resolved
    base in its identity, so its own run folder was refused as "written by a run of another config"."""
    run(parse_config(small(algorithm=wrapper, rounds=2)), tmp_path / "r")
    resumed = resume(tmp_path / "r", rounds=3)
    assert resumed.status == "finished" and resumed.round == 3


def test_ditto_with_its_state_on_disk_matches_memory_and_resumes_identically(tmp_path: Path) -> None:
    """personal_state disk: the same files as in memory (the rows in client-state-*.bin, listed as fedhet's), and an
    interrupted run resumes to the same bytes."""
    cfg = small(algorithm="ditto", rounds=4)
    run(parse_config({**cfg, "personal_state": "memory"}), tmp_path / "memory")
    disk = parse_config({**cfg, "personal_state": "disk"})
    run(disk, tmp_path / "disk")
    assert (tmp_path / "disk/client-state-0.bin").stat().st_size > 0
    for cut in ("cut", "moved"):
        with pytest.raises(KeyboardInterrupt):
            run(disk, tmp_path / cut, callbacks=[Interrupt(at=2)])
    config = tmp_path / "moved/config.yaml"  # personal_state is not part of the run's identity: it may change
    config.write_text(config.read_text().replace("personal_state: disk", "personal_state: memory"))
    resume(tmp_path / "cut")
    resume(tmp_path / "moved")  # a memory run reads the disk run's packed checkpoint
    for name in ("metrics.csv", "clients.csv"):
        memory = (tmp_path / "memory" / name).read_text()
        assert (tmp_path / "disk" / name).read_text() == memory
        assert (tmp_path / "cut" / name).read_text() == memory
        assert (tmp_path / "moved" / name).read_text() == memory
    run(parse_config({**cfg, "rounds": 1}), tmp_path / "disk", overwrite=True)  # fedhet's own files are replaced
    assert not (tmp_path / "disk/client-state-0.bin").exists()


def test_a_link_in_place_of_a_client_state_file_is_refused_before_a_resume_writes(tmp_path: Path) -> None:
    out = tmp_path / "run"
    with pytest.raises(KeyboardInterrupt):
        run(parse_config(small(algorithm="ditto", personal_state="disk")), out, callbacks=[Interrupt(at=2)])
    outside = tmp_path / "outside"
    outside.write_bytes(b"precious")
    (out / "client-state-0.bin").unlink()
    (out / "client-state-0.bin").symlink_to(outside)
    before = {p.name: p.read_bytes() for p in out.iterdir() if not p.is_symlink() and p.is_file()}
    with pytest.raises(LinkError, match="symbolic link"):
        resume(out)
    assert outside.read_bytes() == b"precious"
    assert {p.name: p.read_bytes() for p in out.iterdir() if not p.is_symlink() and p.is_file()} == before


def test_disk_state_needs_a_run_folder() -> None:
    with pytest.raises(ConfigError, match="personal_state 'disk'"):
        run(parse_config(small(algorithm="ditto", personal_state="disk", rounds=1)))
