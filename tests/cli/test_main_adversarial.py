"""Adversarial inputs to the command line: each gives exit code 2 and exactly one line on stderr, no traceback, and
leaves every file as it was (nothing is written before the input is validated)."""

from __future__ import annotations

import json
import os
import pickle
import shutil
from collections.abc import Callable
from pathlib import Path

import pytest
import torch
from typer.testing import CliRunner

from fedhet.cli.main import app

runner = CliRunner()
FAST = ["--dataset", "digits", "--rounds", "2", "--set", "num_clients=6", "--set", "model.hidden=[8]", "--quiet"]
Setup = Callable[[Path], None]


def _write(name: str, data: str | bytes) -> Setup:
    def setup(root: Path) -> None:
        path = root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(data.encode() if isinstance(data, str) else data)

    return setup


def _mkdir(name: str) -> Setup:
    return lambda root: (root / name).mkdir(parents=True)


def _both(*setups: Setup) -> Setup:
    def setup(root: Path) -> None:
        for s in setups:
            s(root)

    return setup


def _none(root: Path) -> None:
    del root


def _run(name: str) -> Setup:
    """Folder `name` marked as a fedhet run folder (its `.fedhet.lock` marker), as fedhet leaves one."""
    return _write(f"{name}/.fedhet.lock", '{"fedhet": "run", "pid": null, "files": ["config.yaml"]}\n')


ALIAS_BOMB = "a: &a [x, x, x, x, x, x, x, x, x, x]\n" + "".join(
    f"{c}: &{c} [*{p}, *{p}, *{p}, *{p}, *{p}, *{p}, *{p}, *{p}, *{p}, *{p}]\n"
    for p, c in zip("abcdef", "bcdefg", strict=True)
)

# (args, setup, a fragment of the message)
CASES: dict[str, tuple[list[str], Setup, str]] = {
    # ---- values out of range or of the wrong type
    "unknown algorithm": (["run", "--algorithm", "fedavgg"], _none, "did you mean 'fedavg'?"),
    "unknown key": (["run", "--set", "rouns=3"], _none, "did you mean 'rounds'?"),
    "negative rounds": (["run", "--rounds", "-5"], _none, "invalid value for 'rounds'"),
    "zero rounds": (["run", "--rounds", "0"], _none, "invalid value for 'rounds'"),
    "absurd rounds": (["run", "--set", "rounds=100000000000000000000000"], _none, "less than or equal to 1000000"),
    "rounds 1e23 as text": (["run", "--set", "rounds=1e23"], _none, "invalid value for 'rounds'"),
    "rounds yes": (["run", "--set", "rounds=yes"], _none, "not yes/no/true/false"),
    "fractional rounds": (["run", "--set", "rounds=3.5"], _none, "invalid value for 'rounds'"),
    "huge batch": (["run", *FAST, "--set", "local.batch_size=1000000000"], _none, "local.batch_size"),
    "batch needing 15 GiB": (["run", *FAST, "--set", "local.batch_size=1000000"], _none, "GiB of mini-batches"),
    "zero batch": (["run", "--set", "local.batch_size=0"], _none, "local.batch_size"),
    "huge steps": (["run", "--set", "local.steps=100000000"], _none, "local.steps"),
    "zero lr": (["run", "--set", "local.lr=0"], _none, "local.lr"),
    "infinite lr": (["run", "--set", "local.lr=.inf"], _none, "finite number"),
    "nan lr": (["run", "--set", "local.lr=.nan"], _none, "finite number"),
    "lr as text": (["run", "--set", "local.lr=fast"], _none, "local.lr"),
    "cohort above clients": (["run", *FAST, "--set", "clients_per_round=50"], _none, "more than num_clients (6)"),
    "zero clients": (["run", "--set", "num_clients=0"], _none, "num_clients"),
    "absurd clients": (["run", "--set", "num_clients=100000000"], _none, "num_clients"),
    "negative seed": (["run", "--seed", "-1"], _none, "invalid value for 'seed'"),
    "huge seed": (["run", "--set", "seed=100000000000000000000000"], _none, "invalid value for 'seed'"),
    "test fraction 1": (["run", "--set", "test_fraction=1"], _none, "test_fraction"),
    "availability p 1.5": (
        ["run", *FAST, "--set", "availability.name=bernoulli", "--set", "availability.p=1.5"],
        _none,
        "availability.p",
    ),
    "availability p nan": (
        ["run", *FAST, "--set", "availability.name=bernoulli", "--set", "availability.p=.nan"],
        _none,
        "availability.p",
    ),
    "availability p per client, wrong count": (
        ["run", *FAST, "--set", "availability.name=bernoulli", "--set", "availability.p=[0.5, 0.5]"],
        _none,
        "one per client (6)",
    ),
    "markov pi 1.5": (
        ["run", *FAST, "--set", "availability.name=markov", "--set", "availability.pi=1.5"],
        _none,
        "between 0 and 1",
    ),
    "model does not fit the data": (["run", *FAST[:-5], "--quiet", "--model", "char_lstm"], _none, "does not fit"),
    "unknown dataset": (["run", "--dataset", "nope"], _none, "unknown dataset 'nope'"),
    "negative hidden": (["run", "--set", "model.hidden=[-1]"], _none, "model.hidden"),
    "dirichlet alpha 0": (["run", "--set", "partition.alpha=0"], _none, "partition.alpha"),
    "unknown backend": (["run", "--set", "backend=gpu"], _none, "backend"),
    "eval_every 0": (["run", "--set", "eval_every=0"], _none, "eval_every"),
    "checkpoint_every 0": (["run", "--set", "checkpoint_every=0"], _none, "checkpoint_every"),
    "max_loss 0": (["run", "--set", "max_loss=0"], _none, "max_loss"),
    "unknown metric plugin": (["run", "--set", "metrics=[nope]"], _none, "unknown metric 'nope'"),
    "section set to a number": (["run", "--set", "local=3"], _none, "local"),
    "key below a number": (["run", "--set", "local.lr.x=1"], _none, "local.lr"),
    "key below a set number": (["run", "--set", "local.lr=1", "--set", "local.lr.x=1"], _none, "not a section"),
    "empty key": (["run", "--set", "=3"], _none, "empty key"),
    "no equals sign": (["run", "--set", "rounds"], _none, "key=value"),
    "unknown engine": (["run", "--engine", "warp"], _none, "--engine 'warp'"),
    "missing dataset file": (["run", "--dataset", "mnist", "--data-dir", "nowhere"], _none, "mnist"),
    # ---- config files
    "config missing": (["run", "missing.yaml"], _none, "does not exist"),
    "config is a folder": (["run", "cfg"], _mkdir("cfg"), "is a folder"),
    "config not UTF-8": (["run", "c.yaml"], _write("c.yaml", b"rounds: 3\nalgorithm: \xff\xfe\n"), "not UTF-8"),
    "config key not a string": (["run", "c.yaml"], _write("c.yaml", "1: 2\n"), "key 1 is not a name"),
    "nested key not a string": (["run", "c.yaml"], _write("c.yaml", "local:\n  3: 2\n"), "'local.3' is not a name"),
    "config is a list": (["run", "c.yaml"], _write("c.yaml", "- rounds\n"), "mapping"),
    "config is a number": (["run", "c.yaml"], _write("c.yaml", "3\n"), "mapping"),
    "config invalid YAML": (["run", "c.yaml"], _write("c.yaml", "rounds: [1,\n"), "not valid YAML"),
    "config nested 10000 deep": (["run", "c.yaml"], _write("c.yaml", "a: " + "[" * 10000), "nested too deeply"),
    "config alias bomb": (["run", "c.yaml"], _write("c.yaml", ALIAS_BOMB), "expands to more than"),
    "config over 1 MiB": (["run", "c.yaml"], _write("c.yaml", "# x\n" * 300_000), "at most"),
    "rounds: yes in YAML": (["run", "c.yaml"], _write("c.yaml", "rounds: yes\n"), "not yes/no/true/false"),
    "rounds 1e23 in YAML": (["run", "c.yaml"], _write("c.yaml", "rounds: 1.0e+23\n"), "rounds"),
    "config with a python tag": (
        ["run", "c.yaml"],
        _write("c.yaml", "rounds: !!python/object/apply:os.system ['touch pwned']\n"),
        "not valid YAML",
    ),
    # ---- run folders
    "out is a file": (["run", *FAST, "--out", "f"], _write("f", "x"), "is a file, not a folder"),
    "out below a file": (["run", *FAST, "--out", "f/run"], _write("f", "x"), "is a file"),
    "out holds user files": (
        ["run", *FAST, "--out", "u"],
        _write("u/notes.txt", "mine"),
        "not a fedhet run folder",
    ),
    "out holds user files, --overwrite": (
        ["run", *FAST, "--out", "u", "--overwrite"],
        _write("u/notes.txt", "mine"),
        "not a fedhet run folder",
    ),
    "out holds a run": (
        ["run", *FAST, "--out", "r"],
        _both(_run("r"), _write("r/config.yaml", "rounds: 2\n")),
        "--resume r",
    ),
    "resume a missing folder": (["run", "--resume", "nowhere"], _none, "not a run folder"),
    "resume a file": (["run", "--resume", "f"], _write("f", "x"), "not a run folder"),
    "resume an empty folder": (["run", "--resume", "e"], _mkdir("e"), "not a run folder"),
    "resume a user folder": (["run", "--resume", "u"], _write("u/notes.txt", "mine"), "not a run folder"),
    "resume with --seed": (["run", "--resume", "r", "--seed", "3"], _none, "leave out --seed"),
    "resume with --set": (["run", "--resume", "r", "--set", "local.lr=1"], _none, "leave out --set"),
    "resume with a config file": (["run", "c.yaml", "--resume", "r"], _none, "leave out the config file"),
    "resume with --overwrite": (["run", "--resume", "r", "--overwrite"], _none, "leave out --overwrite"),
    "resume with --out": (["run", "--resume", "r", "--out", "s"], _none, "leave out --out"),
    "resume with --data-dir": (["run", "--resume", "r", "--data-dir", "d"], _none, "leave out --data-dir"),
    "resume an empty config.yaml": (
        ["run", "--resume", "r"],
        _both(_run("r"), _write("r/config.yaml", "")),
        "is empty",
    ),
    "resume an invalid config.yaml": (
        ["run", "--resume", "r"],
        _both(_run("r"), _write("r/config.yaml", "rounds: -1\n")),
        "r/config.yaml': invalid value for 'rounds'",
    ),
    # ---- other commands
    "reproduce --seeds 0": (["reproduce", "maxfl-table1", "--quick", "--seeds", "0"], _none, "at least 1 seed"),
    "reproduce --seeds -2": (["reproduce", "maxfl-table1", "--seeds", "-2"], _none, "at least 1 seed"),
    "unknown recipe": (["reproduce", "nope"], _none, "unknown recipe"),
    "bench --threads -1": (["bench", "--threads", "-1"], _none, "--threads -1"),
    "list something unknown": (["list", "algos"], _none, "did you mean 'algorithms'?"),
    "compare a missing folder": (["compare", "nowhere"], _none, "not a run folder"),
    "compare garbled summary.json": (
        ["compare", "g"],
        _both(_write("g/summary.json", "garbage{"), _write("g/metrics.csv", "round\r\n1\r\n")),
        "not valid JSON",
    ),
    "compare summary.json that is a list": (
        ["compare", "g"],
        _both(_write("g/summary.json", "[1, 2]"), _write("g/metrics.csv", "round\r\n1\r\n")),
        "does not hold a run summary",
    ),
    "compare summary.json with text finals": (
        ["compare", "g"],
        _both(_write("g/summary.json", '{"final": {"test_accuracy": "high"}}'), _write("g/metrics.csv", "")),
        "does not hold a run summary",
    ),
    "compare garbled metrics.csv": (
        ["compare", "g"],
        _both(_write("g/summary.json", "{}"), _write("g/metrics.csv", "round,acc\r\n1,high\r\n")),
        "not a metrics table of numbers",
    ),
    "plot binary metrics.csv": (
        ["plot", "g", "-o", "p.png"],
        _both(_write("g/summary.json", "{}"), _write("g/metrics.csv", b"\xff\xfe\x00garbage")),
        "not a metrics table",
    ),
    "plot metrics.csv with an extra field": (
        ["plot", "g", "-o", "p.png"],
        _both(_write("g/summary.json", "{}"), _write("g/metrics.csv", "round\r\n1,2,3\r\n")),
        "not a metrics table",
    ),
    # usage errors: typer's usage box becomes one line, for every command
    "a word for a number": (["run", "--target-epsilon", "lots"], _none, "invalid value for '--target-epsilon'"),
    "a word for a count": (["run", "--rounds", "many"], _none, "invalid value for '--rounds'"),
    "sweep workers": (["sweep", "--workers", "x"], _none, "invalid value for '--workers'"),
    "reproduce seeds": (["reproduce", "maxfl", "--seeds", "two"], _none, "invalid value for '--seeds'"),
    "compare target": (["compare", "g", "--target", "high"], _none, "invalid value for '--target'"),
    "bench threads": (["bench", "--threads", "all"], _none, "invalid value for '--threads'"),
    "an option without its value": (["list", "--import"], _none, "option '--import' requires an argument"),
    "a missing argument": (["plot"], _none, "missing argument 'runs'; see fedhet plot --help"),
    "an unknown option": (["run", "--bogus"], _none, "no such option: --bogus"),
    "an unknown option of fedhet": (["--bogus"], _none, "no such option: --bogus; see fedhet --help"),
    "an unknown command": (["bogus"], _none, "no such command 'bogus'"),
}


def _snapshot(root: Path) -> dict[str, bytes | None]:
    """Every file and folder under `root` with its bytes; a run folder's lock file (which a refused resume may
    create, empty but for the pid of the process that took it) is left out."""
    return {
        str(p.relative_to(root)): (p.read_bytes() if p.is_file() else None)
        for p in sorted(root.rglob("*"))
        if p.name != ".fedhet.lock"
    }


def _check_one_line(code: int, stdout: str, stderr: str, fragment: str) -> None:
    assert code == 2, (code, stdout, stderr)
    assert stdout == "", stdout
    lines = stderr.strip().splitlines()
    assert len(lines) == 1, stderr
    assert "Traceback" not in stderr and fragment in lines[0], (fragment, lines[0])


@pytest.mark.parametrize("case", list(CASES))
def test_bad_input_is_one_line_exit_2_and_writes_nothing(
    case: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    args, setup, fragment = CASES[case]
    monkeypatch.chdir(tmp_path)
    setup(tmp_path)
    before = _snapshot(tmp_path)
    result = runner.invoke(app, args, env={"COLUMNS": "200"})
    _check_one_line(result.exit_code, result.stdout, result.stderr, fragment)
    assert _snapshot(tmp_path) == before
    assert not (tmp_path / "pwned").exists()


# ---- a damaged run folder ----------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def finished_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("finished") / "run"
    result = runner.invoke(app, ["run", *FAST, "--out", str(out)])
    assert result.exit_code == 0, result.output
    return out


class _Evil:
    def __reduce__(self) -> tuple[object, ...]:
        return (os.system, ("touch pwned",))


def _torch(value: object) -> bytes:
    import io

    buffer = io.BytesIO()
    torch.save(value, buffer)
    return buffer.getvalue()


def _damage(change: Callable[[Path], None]) -> Callable[[Path], None]:
    return change


DAMAGE: dict[str, tuple[Callable[[Path], None], str]] = {
    "zero-byte checkpoint": (lambda f: (f / "checkpoint.pt").write_bytes(b""), "corrupt (empty file)"),
    "truncated checkpoint": (
        lambda f: (f / "checkpoint.pt").write_bytes((f / "checkpoint.pt").read_bytes()[:300]),
        "corrupt or truncated",
    ),
    "random-byte checkpoint": (lambda f: (f / "checkpoint.pt").write_bytes(os.urandom(5000)), "corrupt"),
    "checkpoint is a folder": (
        lambda f: ((f / "checkpoint.pt").unlink(), (f / "checkpoint.pt").mkdir()),
        "is a folder",
    ),
    "code-running checkpoint": (
        lambda f: (f / "checkpoint.pt").write_bytes(_torch({"params": _Evil()})),
        "refuses to load",
    ),
    "pickled checkpoint": (
        lambda f: (f / "checkpoint.pt").write_bytes(pickle.dumps({"params": _Evil()})),
        "checkpoint",
    ),
    "plain torch checkpoint of the old format": (
        lambda f: (f / "checkpoint.pt").write_bytes(_torch({"round": 2, "params": torch.zeros(3)})),
        "not a fedhet checkpoint",
    ),
    "edited seed": (
        lambda f: (f / "config.yaml").write_text((f / "config.yaml").read_text().replace("seed: 0", "seed: 5")),
        "another config",
    ),
    "emptied config.yaml": (lambda f: (f / "config.yaml").write_text(""), "is empty"),
    "config.yaml not UTF-8": (lambda f: (f / "config.yaml").write_bytes(b"\xff\xfe"), "not UTF-8"),
    "garbled metrics.csv": (lambda f: (f / "metrics.csv").write_text("x"), "metrics.csv' does not match"),
}


@pytest.mark.parametrize("damage", list(DAMAGE))
def test_a_damaged_run_folder_is_refused_in_one_line(
    damage: str, finished_run: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    folder = tmp_path / "run"
    shutil.copytree(finished_run, folder)
    monkeypatch.chdir(tmp_path)
    change, fragment = DAMAGE[damage]
    change(folder)
    before = _snapshot(tmp_path)
    result = runner.invoke(app, ["run", "--resume", "run", "--quiet"], env={"COLUMNS": "200"})
    _check_one_line(result.exit_code, result.stdout, result.stderr, fragment)
    assert _snapshot(tmp_path) == before
    assert not (tmp_path / "pwned").exists()
    if "checkpoint" in damage:
        assert "fedhet run --out run --overwrite" in result.stderr  # says how to restart


def test_overwrite_replaces_a_run_and_keeps_user_files(finished_run: Path, tmp_path: Path) -> None:
    folder = tmp_path / "run"
    shutil.copytree(finished_run, folder)
    (folder / "notes.txt").write_text("mine")
    result = runner.invoke(app, ["run", *FAST, "--seed", "4", "--out", str(folder), "--overwrite"])
    assert result.exit_code == 0, result.output
    assert (folder / "notes.txt").read_text() == "mine"
    assert json.loads((folder / "summary.json").read_text())["seed"] == 4


def test_resume_with_more_rounds_continues_the_run(finished_run: Path, tmp_path: Path) -> None:
    folder = tmp_path / "run"
    shutil.copytree(finished_run, folder)
    result = runner.invoke(app, ["run", "--resume", str(folder), "--rounds", "3", "--quiet"])
    assert result.exit_code == 0, result.output
    summary = json.loads((folder / "summary.json").read_text())
    assert summary["rounds"] == 3 and summary["status"] == "finished"
    result = runner.invoke(app, ["run", "--resume", str(folder), "--rounds", "1", "--quiet"])
    _check_one_line(result.exit_code, result.stdout, result.stderr, "--rounds 3 or more")


def test_a_full_disk_is_one_line_with_the_resume_command(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import errno

    from fedhet import atomic

    real = atomic._write_file

    def full(path: Path, data: bytes | bytearray | memoryview) -> None:
        if ".checkpoint.pt." in path.name:
            real(path, bytes(data)[:5])
            raise OSError(errno.ENOSPC, "No space left on device", str(path))
        real(path, data)

    monkeypatch.setattr(atomic, "_write_file", full)
    monkeypatch.chdir(tmp_path)
    result = runner.invoke(app, ["run", *FAST, "--out", "r"])
    _check_one_line(result.exit_code, result.stdout, result.stderr, "No space left on device")
    assert "cannot write 'r/checkpoint.pt'" in result.stderr and "fedhet run --resume r" in result.stderr
    assert not [p.name for p in (tmp_path / "r").iterdir() if p.name.endswith(".tmp")]
