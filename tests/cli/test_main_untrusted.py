"""Adversarial inputs, third pass (issue 33): configs and run folders that try to run code, folders fedhet does not
own, damaged data files and the rest. Each is refused with exit code 2 and one line on stderr, runs nothing it
names (no ``pwned`` file appears), creates no fedhet marker and changes no file."""

from __future__ import annotations

import importlib.util
import io
import json
import os
import zipfile
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest
from typer.testing import CliRunner

from fedhet.cli.main import app

runner = CliRunner()
FAST = ["--dataset", "digits", "--rounds", "2", "--set", "num_clients=6", "--quiet"]
OWN_DATA = ["--rounds", "2", "--set", "num_clients=4", "--set", "partition.min_size=2", "--quiet"]  # the config's data
SMALL = "dataset: digits\nrounds: 2\nnum_clients: 6\n"
Setup = Callable[[Path], None]
PWN = "touch pwned"
EVIL_PY = "import pathlib\npathlib.Path('pwned').write_text('ran')\n"


def _write(name: str, data: str | bytes) -> Setup:
    def setup(root: Path) -> None:
        path = root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(data.encode() if isinstance(data, str) else data)

    return setup


def _both(*setups: Setup) -> Setup:
    def setup(root: Path) -> None:
        for s in setups:
            s(root)

    return setup


def _none(root: Path) -> None:
    del root


def _marker(name: str, kind: str = "run") -> Setup:
    """Folder `name` with fedhet's marker of a `kind` folder, as fedhet leaves one."""
    return _write(f"{name}/.fedhet.lock", json.dumps({"fedhet": kind, "pid": None, "files": ["config.yaml"]}) + "\n")


def _npz(name: str, damage: Callable[[bytes], bytes] | None = None, **arrays: np.ndarray) -> Setup:
    def setup(root: Path) -> None:
        buffer = io.BytesIO()
        np.savez(buffer, **arrays)  # stored, not compressed: a flipped byte is a flipped array byte
        data = buffer.getvalue()
        (root / name).write_bytes(damage(data) if damage else data)

    return setup


def _flip_in_y(data: bytes) -> bytes:
    """The archive with one byte of array y's data changed (its CRC no longer matches)."""
    with zipfile.ZipFile(io.BytesIO(data)) as z:
        info = z.getinfo("y.npy")
    at = info.header_offset + 30 + len(info.filename) + len(info.extra) + info.file_size - 1
    return data[:at] + bytes([data[at] ^ 0xFF]) + data[at + 1 :]


XS = np.random.default_rng(0).normal(size=(40, 3))
YS = np.arange(40) % 2
TABLE = "a,b,y\n" + "".join(f"{i},{i % 3},{i % 2}\n" for i in range(40))
TORCH_EVIL = f'model: {{name: torch, target: "subprocess:getoutput", kwargs: {{cmd: "{PWN}"}}}}\n'

CASES: dict[str, tuple[list[str], Setup, str]] = {
    # ---- a config you pass: a model target is an nn.Module class, checked before anything is called
    "target runs a command": (
        ["run", "c.yaml", *FAST],
        _write("c.yaml", TORCH_EVIL),
        "is a function, not an nn.Module",
    ),
    "target runs a command, --estimate": (
        ["run", "c.yaml", *FAST, "--estimate"],
        _write("c.yaml", TORCH_EVIL),
        "is a function, not an nn.Module",
    ),
    "target runs a command, sweep": (
        ["sweep", "c.yaml", "--out", "s", "--workers", "2", "--quiet"],
        _write("c.yaml", SMALL + TORCH_EVIL),
        "is a function, not an nn.Module",
    ),
    "target os.system": (
        ["run", "c.yaml", *FAST],
        _write("c.yaml", f'model: {{name: torch, target: "os:system", kwargs: {{command: "{PWN}"}}}}\n'),
        "not an nn.Module class",
    ),
    "target a class that is no module": (
        ["run", "c.yaml", *FAST],
        _write("c.yaml", 'model: {name: torch, target: "subprocess:Popen", kwargs: {args: [touch, pwned]}}\n'),
        "is a class, not an nn.Module class",
    ),
    "target a function of an imported file": (
        ["run", "c.yaml", *FAST],
        _both(
            _write("c.yaml", 'imports: [nets.py]\nmodel: {name: torch, target: "nets.py:build"}\n'),
            _write("nets.py", "def build(num_classes):\n    open('pwned', 'w')\n"),
        ),
        "needs @fedhet.model_factory",
    ),
    "plugin calls sys.exit": (
        ["run", "c.yaml", *FAST],
        _both(_write("c.yaml", "imports: [bye.py]\n"), _write("bye.py", "import sys\nsys.exit(0)\n")),
        "bye.py' failed: SystemExit",  # the file by its absolute path (config.yaml keeps those)
    ),
    "a key given twice": (["run", "c.yaml", *FAST], _write("c.yaml", "rounds: 2\nrounds: 3\n"), "key 'rounds' twice"),
    "--trust-imports without --resume": (["run", *FAST, "--trust-imports"], _none, "goes with --resume"),
    # ---- a run folder's config names code: imported only with --trust-imports
    "resume a folder whose config imports a file": (
        ["run", "--resume", "r", "--quiet"],
        _both(_marker("r"), _write("r/config.yaml", "imports: [evil.py]\nrounds: 2\n"), _write("evil.py", EVIL_PY)),
        "names code to import (evil.py)",
    ),
    "resume a folder whose config names a target": (
        ["run", "--resume", "r", "--quiet"],
        _both(_marker("r"), _write("r/config.yaml", TORCH_EVIL)),
        "--trust-imports",
    ),
    # ---- folders fedhet does not own (by its marker, never by file names)
    "out holds the user's config.yaml": (
        ["run", *FAST, "--out", "u"],
        _write("u/config.yaml", "# my settings\nrounds: 2\n"),
        "not a fedhet run folder",
    ),
    "out holds the user's config.yaml, --overwrite": (
        ["run", *FAST, "--out", "u", "--overwrite"],
        _write("u/config.yaml", "# my settings\nrounds: 2\n"),
        "not a fedhet run folder",
    ),
    "out holds the user's metrics.csv": (
        ["run", *FAST, "--out", "u"],
        _write("u/metrics.csv", "round,mine\n1,2\n"),
        "not a fedhet run folder",
    ),
    "out holds the user's files and a crafted summary.json": (
        ["run", *FAST, "--out", "u", "--overwrite"],
        _both(_write("u/summary.json", '{"files": ["mine.txt"]}'), _write("u/mine.txt", "mine")),
        "not a fedhet run folder",
    ),
    "resume a folder of the user's config.yaml": (
        ["run", "--resume", "u"],
        _write("u/config.yaml", "rounds: 2\n"),
        "not a run folder",
    ),
    "resume a folder whose marker is a link": (
        ["run", "--resume", "u"],
        _both(_marker("elsewhere"), _write("u/config.yaml", "rounds: 2\n"), lambda root: _link(root)),
        "not a run folder",
    ),
    "out is a sweep folder": (["run", *FAST, "--out", "s"], _marker("s", "sweep"), "is a fedhet sweep folder"),
    "sweep into the user's folder": (
        ["sweep", "--out", "u", "--quiet", "--set", "rounds=1"],
        _write("u/summary.md", "my notes"),
        "not a fedhet sweep folder",
    ),
    "sweep into a run folder": (
        ["sweep", "--out", "r", "--quiet", "--set", "rounds=1"],
        _both(_marker("r"), _write("r/config.yaml", "rounds: 2\n")),
        "is a fedhet run folder, not a sweep folder",
    ),
    # ---- damaged or odd data
    "table delimiter of two characters": (
        ["run", "c.yaml", *OWN_DATA],
        _both(
            _write("c.yaml", "dataset: {name: table, path: t.csv, label: y, delimiter: ';;'}\n"), _write("t.csv", "")
        ),
        "delimiter",
    ),
    "the label among the features": (
        ["run", "c.yaml", *OWN_DATA],
        _both(
            _write("c.yaml", "dataset: {name: table, path: t.csv, label: y, features: [a, y]}\n"),
            _write("t.csv", TABLE),
        ),
        "the label column 'y' is listed among the features",
    ),
    "an inf label": (
        ["run", "c.yaml", *OWN_DATA],
        _both(
            _write("c.yaml", "dataset: {name: table, path: t.csv, label: y}\n"),
            _write("t.csv", TABLE.replace("\n39,0,1\n", "\n39,0,inf\n")),
        ),
        "label 'inf'",
    ),
    "a label of 10^12": (
        ["run", "c.yaml", *OWN_DATA],
        _both(
            _write("c.yaml", "dataset: {name: arrays, path: d.npz}\n"),
            _npz("d.npz", x=XS, y=np.where(YS == 1, 10**12, 0)),
        ),
        "classes",
    ),
    "a truncated npz": (
        ["run", "c.yaml", *OWN_DATA],
        _both(
            _write("c.yaml", "dataset: {name: arrays, path: d.npz}\n"),
            _npz("d.npz", lambda d: d[: len(d) // 2], x=XS, y=YS),
        ),
        "d.npz",
    ),
    "an npz with a bad CRC": (
        ["run", "c.yaml", *OWN_DATA],
        _both(_write("c.yaml", "dataset: {name: arrays, path: d.npz}\n"), _npz("d.npz", _flip_in_y, x=XS, y=YS)),
        "is damaged",
    ),
    "paper-data recipe without its files": (
        ["reproduce", "fedmgda-fairness", "--paper-data", "--quick", "--out", "p", "--workers", "1", "--quiet"],
        _none,
        "none of the",
    ),
    "compare a summary.json nested 100,000 deep": (
        ["compare", "g"],
        _both(_write("g/summary.json", "[" * 100_000 + "]" * 100_000), _write("g/metrics.csv", "round\r\n1\r\n")),
        "nested too deeply",
    ),
    "plot to an unknown image format": (
        ["plot", "g", "-o", "out.xyz"],
        _both(_write("g/summary.json", '{"final": {}}'), _write("g/metrics.csv", "round,test_accuracy\r\n1,0.5\r\n")),
        "not an image format",
    ),
}
if importlib.util.find_spec("wandb") is None:
    CASES["a tracker that is not installed"] = (["run", *FAST, "--track", "wandb", "--out", "r"], _none, "pip install")
if importlib.util.find_spec("ray") is None:
    CASES["sweep --ray without Ray"] = (["sweep", "--ray", "auto", "--out", "s", "--quiet"], _none, "--ray needs Ray")


def _link(root: Path) -> None:
    (root / "u" / ".fedhet.lock").symlink_to(root / "elsewhere" / ".fedhet.lock")


def _snapshot(root: Path) -> dict[str, bytes | None]:
    """Every file and folder under `root` with its bytes (a marker's pid may change: its name must not appear)."""
    return {
        str(p.relative_to(root)): (p.read_bytes() if p.is_file() and p.name != ".fedhet.lock" else None)
        for p in sorted(root.rglob("*"))
        if not p.name.endswith(".pyc") and "__pycache__" not in p.parts
    }


@pytest.mark.parametrize("case", list(CASES))
def test_refused_in_one_line_runs_nothing_and_writes_nothing(
    case: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    args, setup, fragment = CASES[case]
    monkeypatch.chdir(tmp_path)
    setup(tmp_path)
    before = _snapshot(tmp_path)
    result = runner.invoke(app, args, env={"COLUMNS": "200"})
    assert result.exit_code == 2, (result.exit_code, result.output)
    assert result.stdout == "", result.stdout
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in result.stderr, result.stderr
    assert fragment in lines[0], (fragment, lines[0])
    assert _snapshot(tmp_path) == before  # no file changed, none created (no marker either)
    assert not (tmp_path / "pwned").exists()


def test_a_decompression_bomb_image_is_one_line(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from PIL import Image

    for label in ("a", "b"):
        (tmp_path / "imgs" / label).mkdir(parents=True)
        Image.new("L", (8, 8)).save(tmp_path / "imgs" / label / "small.png")
    Image.new("L", (60, 60)).save(tmp_path / "imgs" / "a" / "bomb.png")
    monkeypatch.setattr(Image, "MAX_IMAGE_PIXELS", 1000)  # 3600 pixels: more than twice the limit, as a real bomb
    monkeypatch.chdir(tmp_path)
    (tmp_path / "c.yaml").write_text("dataset: {name: image_folder, path: imgs}\n")
    result = runner.invoke(app, ["run", "c.yaml", *OWN_DATA, "--set", "num_clients=2"], env={"COLUMNS": "200"})
    assert result.exit_code == 2 and len(result.stderr.strip().splitlines()) == 1, result.output
    assert "bomb.png" in result.stderr and "decompression bomb" in result.stderr


@pytest.mark.parametrize(
    "error",
    [
        MemoryError(),
        RuntimeError("DefaultCPUAllocator: can't allocate memory: you tried to allocate 40000000000 bytes"),
    ],
)
def test_out_of_memory_is_one_line(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, error: BaseException) -> None:
    from fedhet.experiments import build

    def huge(*args: object, **kwargs: object) -> None:
        held = bytearray(1 << 20)  # what the failed work holds until the error is reported
        del held
        raise error

    monkeypatch.setattr(build, "federate_dataset", huge)
    monkeypatch.chdir(tmp_path)
    result = runner.invoke(app, ["run", *FAST, "--out", "r"])
    assert result.exit_code == 2 and result.stderr.strip() == (
        "error: out of memory; lower the sizes in the config (clients, local.batch_size, the model)"
    )
    assert not (tmp_path / "r").exists()


def test_estimate_writes_nothing_even_with_a_tracker(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    result = runner.invoke(app, ["run", *FAST, "--set", "track=[tensorboard]", "--estimate"], env={"COLUMNS": "200"})
    assert result.exit_code == 0, result.output
    assert "nothing was written" in result.stdout
    assert list(tmp_path.iterdir()) == []


def test_compare_names_runs_by_folder_when_their_configs_are_alias_bombs(tmp_path: Path) -> None:
    bomb = "a: &a [x, x, x, x, x, x, x, x, x, x]\n" + "".join(
        f"{c}: &{c} [*{p}, *{p}, *{p}, *{p}, *{p}, *{p}, *{p}, *{p}, *{p}, *{p}]\n"
        for p, c in zip("abcdefgh", "bcdefghi", strict=True)
    )  # 10^9 values once expanded
    for name in ("one", "two"):
        _both(
            _write(f"{name}/summary.json", '{"final": {"test_accuracy": 0.5}}'),
            _write(f"{name}/metrics.csv", "round,test_accuracy\r\n1,0.5\r\n"),
            _write(f"{name}/config.yaml", bomb),
        )(tmp_path)
    result = runner.invoke(app, ["compare", str(tmp_path / "one"), str(tmp_path / "two")], env={"COLUMNS": "200"})
    assert result.exit_code == 0, result.output
    assert "one" in result.stdout and "two" in result.stdout


def test_a_quiet_sweep_says_why_its_runs_failed(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    args = ["sweep", "--grid", "partition.min_size=20,1000", "--set", "rounds=1", "--set", "num_clients=6"]
    result = runner.invoke(app, [*args, "--out", "s", "--workers", "1", "--quiet"], env={"COLUMNS": "200"})
    assert result.exit_code == 1, result.output
    assert "failed: partition.min_size=1000, seed 0: " in result.stderr
    assert "1000" in result.stderr.split("failed: ")[1]


def test_trust_imports_resumes_a_run_of_your_own_plugin(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The flow a folder's config with imports keeps: refused without the flag, resumed with it."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "nets.py").write_text(
        "from torch import nn\n\nclass Net(nn.Sequential):\n"
        "    def __init__(self, num_classes):\n        super().__init__(nn.Flatten(), nn.Linear(64, num_classes))\n"
    )
    first = runner.invoke(app, ["run", *FAST, "--model", "torch", "--set", "model.target=nets.py:Net", "--out", "r"])
    assert first.exit_code == 0, first.output
    refused = runner.invoke(app, ["run", "--resume", "r", "--rounds", "3", "--quiet"])
    assert refused.exit_code == 2 and "nets.py:Net)" in refused.stderr and "names code to import" in refused.stderr
    trusted = runner.invoke(app, ["run", "--resume", "r", "--rounds", "3", "--quiet", "--trust-imports"])
    assert trusted.exit_code == 0, trusted.output
    assert json.loads((tmp_path / "r" / "summary.json").read_text())["rounds"] == 3


def test_no_marker_is_created_when_a_run_is_refused(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    (tmp_path / "u").mkdir()
    (tmp_path / "u" / "notes.txt").write_text("mine")
    for args in (["run", *FAST, "--out", "u"], ["sweep", "--out", "u", "--quiet"], ["run", "--resume", "u"]):
        assert runner.invoke(app, args).exit_code == 2
    assert os.listdir(tmp_path / "u") == ["notes.txt"]
