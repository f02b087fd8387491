"""Adversarial inputs, fourth pass (issue 43): run and sweep folders holding links to files outside them, resumes of
hostile or damaged run folders, user code that calls sys.exit, and hostile data files. Each refusal is exit code 2
and one line on stderr, and changes no file (the files the links lead to least of all)."""

from __future__ import annotations

import io
import json
import os
import shutil
import struct
import sys
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest
from typer.testing import CliRunner

from fedhet.cli.main import app
from fedhet.data.tables import MAX_CATEGORIES
from fedhet.experiments.checkpoint import dump_view, loads

runner = CliRunner()
FAST = ["--dataset", "digits", "--rounds", "2", "--set", "num_clients=6", "--set", "model.hidden=[8]", "--quiet"]
RESUME = ["run", "--resume", "run", "--rounds", "3", "--quiet"]
Setup = Callable[[Path], None]


def _snapshot(root: Path) -> dict[str, bytes | None]:
    """Every file and folder under `root` (links as what they lead to), with its bytes; a run folder's own marker
    is left out (a refused resume may rewrite its pid), a marker reached by another name is not."""
    return {
        str(p.relative_to(root)): (p.read_bytes() if p.is_file() else None)
        for p in sorted(root.rglob("*"))
        if not (p.name == ".fedhet.lock" and p.parent.name == "run")
    }


def _check_one_line(result: object, fragment: str) -> None:
    code, stdout, stderr = result.exit_code, result.stdout, result.stderr  # type: ignore[attr-defined]
    assert code == 2, (code, stdout, stderr)
    assert stdout == "", stdout
    lines = stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in stderr, stderr
    assert fragment in lines[0], (fragment, lines[0])


@pytest.fixture(scope="module")
def finished_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("finished") / "run"
    result = runner.invoke(app, ["run", *FAST, "--out", str(out)])
    assert result.exit_code == 0, result.output
    return out


# ---- a run folder whose files are links to files outside it ------------------------------------------------------


def _moved_out(name: str, hard: bool) -> Setup:
    """The run's `name` moved out of the folder (to ``outside/NAME``) and linked back in."""

    def setup(root: Path) -> None:
        (root / "outside").mkdir(exist_ok=True)
        target = root / "outside" / name
        shutil.move(root / "run" / name, target)
        if hard:
            os.link(target, root / "run" / name)
        else:
            (root / "run" / name).symlink_to(target)

    return setup


def _fewer_rows(root: Path) -> None:
    """The checkpoint edited (checksum and all) to say that metrics.csv held one row: a resume cut the file back."""
    path = root / "run" / "checkpoint.pt"
    saved = loads(path, "checkpoint")
    saved["metrics_rows"] = 1
    path.write_bytes(bytes(dump_view(saved)))


LINKED: dict[str, tuple[list[Setup], str]] = {
    "metrics.csv a symbolic link": ([_moved_out("metrics.csv", hard=False)], "metrics.csv' is a symbolic link"),
    "metrics.csv a hard link": ([_moved_out("metrics.csv", hard=True)], "metrics.csv' is a hard link"),
    "metrics.csv a hard link, fewer rows in the checkpoint": (
        [_moved_out("metrics.csv", hard=True), _fewer_rows],
        "metrics.csv' is a hard link",
    ),
    "config.yaml a symbolic link": ([_moved_out("config.yaml", hard=False)], "config.yaml' is a symbolic link"),
    "checkpoint.pt a hard link": ([_moved_out("checkpoint.pt", hard=True)], "checkpoint.pt' is a hard link"),
    "summary.json a symbolic link": ([_moved_out("summary.json", hard=False)], "summary.json' is a symbolic link"),
    "the marker a hard link": (
        [lambda root: os.link(root / "run" / ".fedhet.lock", root / "other.lock")],
        ".fedhet.lock' is a hard link",
    ),
}


@pytest.mark.parametrize("case", list(LINKED))
def test_a_run_folder_with_links_out_is_refused_and_the_files_outside_are_untouched(
    case: str, finished_run: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    shutil.copytree(finished_run, tmp_path / "run")
    monkeypatch.chdir(tmp_path)
    setups, fragment = LINKED[case]
    for setup in setups:
        setup(tmp_path)
    before = _snapshot(tmp_path)
    result = runner.invoke(app, RESUME, env={"COLUMNS": "200"})
    _check_one_line(result, fragment)
    assert _snapshot(tmp_path) == before  # the outside files byte for byte, and the run's


def test_overwrite_removes_a_link_never_what_it_leads_to(finished_run: Path, tmp_path: Path) -> None:
    shutil.copytree(finished_run, tmp_path / "run")
    _moved_out("metrics.csv", hard=False)(tmp_path)
    _moved_out("clients.csv", hard=True)(tmp_path)
    outside = {p.name: p.read_bytes() for p in (tmp_path / "outside").iterdir()}
    result = runner.invoke(app, ["run", *FAST, "--out", str(tmp_path / "run"), "--overwrite"])
    assert result.exit_code == 0, result.output
    assert {p.name: p.read_bytes() for p in (tmp_path / "outside").iterdir()} == outside
    for name in ("metrics.csv", "clients.csv"):
        path = tmp_path / "run" / name
        assert not path.is_symlink() and path.stat().st_nlink == 1


# ---- a sweep folder whose points are links ----------------------------------------------------------------------

SWEEP = ["sweep", "--grid", "local.lr=0.02,0.05", "--set", "rounds=1", "--set", "num_clients=4", "--out", "s"]
POINTS = ["lr-0.02", "lr-0.05"]


def _sweep_folder(root: Path) -> None:
    """A sweep folder of fedhet's whose marker lists both points, and a run folder of yours, ``mine/seed0``."""
    (root / "s").mkdir()
    marker = {"fedhet": "sweep", "pid": None, "files": ["sweep.json", *POINTS]}
    (root / "s" / ".fedhet.lock").write_text(json.dumps(marker) + "\n")
    (root / "mine" / "seed0").mkdir(parents=True)
    (root / "mine" / "seed0" / "metrics.csv").write_text("round,test_accuracy\r\n1,0.5\r\n")
    (root / "mine" / "seed0" / "notes.txt").write_text("mine")


def _linked_seed(root: Path) -> None:
    (root / "s" / "lr-0.05").mkdir()
    (root / "s" / "lr-0.05" / "seed0").symlink_to(root / "mine" / "seed0")


def _linked_metrics(root: Path) -> None:
    (root / "s" / "lr-0.02" / "seed0").mkdir(parents=True)
    os.link(root / "mine" / "seed0" / "metrics.csv", root / "s" / "lr-0.02" / "seed0" / "metrics.csv")


SWEEP_LINKS: dict[str, tuple[Setup, str]] = {
    "a point folder links to your folder": (
        lambda root: (root / "s" / "lr-0.05").symlink_to(root / "mine"),
        "lr-0.05' is a symbolic link",
    ),
    "a seed folder links to your run folder": (_linked_seed, "seed0' is a symbolic link"),
    "a run's metrics.csv is a hard link to yours": (_linked_metrics, "metrics.csv' is a hard link"),
}


@pytest.mark.parametrize("case", list(SWEEP_LINKS))
def test_a_sweep_never_follows_a_linked_point(case: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    _sweep_folder(tmp_path)
    setup, fragment = SWEEP_LINKS[case]
    setup(tmp_path)
    before = _snapshot(tmp_path)
    result = runner.invoke(app, [*SWEEP, "--workers", "1", "--quiet"], env={"COLUMNS": "200"})
    _check_one_line(result, fragment)
    assert _snapshot(tmp_path) == before
    assert sorted(os.listdir(tmp_path / "mine" / "seed0")) == ["metrics.csv", "notes.txt"]


# ---- resumes of damaged run folders ---------------------------------------------------------------------------


def test_a_checkpoint_nested_too_deeply_is_one_line(
    finished_run: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    shutil.copytree(finished_run, tmp_path / "run")
    path = tmp_path / "run" / "checkpoint.pt"
    saved = loads(path, "checkpoint")
    deep: list[object] = []
    for _ in range(3 * sys.getrecursionlimit()):
        deep = [deep]
    limit = sys.getrecursionlimit()
    sys.setrecursionlimit(20 * limit)  # what it takes to write (and checksum) such a file
    try:
        path.write_bytes(bytes(dump_view({**saved, "strategy": {"deep": deep}})))
    finally:
        sys.setrecursionlimit(limit)
    monkeypatch.chdir(tmp_path)
    before = _snapshot(tmp_path)
    result = runner.invoke(app, RESUME, env={"COLUMNS": "200"})
    _check_one_line(result, "is corrupt (its content is nested too deeply)")
    assert _snapshot(tmp_path) == before


@pytest.mark.parametrize("damage", [b"client,x\r\n0,garbage\r\n", b""])
def test_resuming_a_finished_run_rewrites_a_damaged_clients_csv_from_its_checkpoint(
    damage: bytes, finished_run: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    shutil.copytree(finished_run, tmp_path / "run")
    monkeypatch.chdir(tmp_path)
    clients = tmp_path / "run" / "clients.csv"
    original = clients.read_bytes()
    clients.write_bytes(damage)
    result = runner.invoke(app, ["run", "--resume", "run"], env={"COLUMNS": "200"})
    assert result.exit_code == 0, result.output
    assert "is already finished" in result.stdout
    assert "clients.csv' did not match the run's checkpoint" in result.stderr
    assert clients.read_bytes() == original
    again = runner.invoke(app, ["run", "--resume", "run"], env={"COLUMNS": "200"})
    assert again.exit_code == 0 and again.stderr == ""  # an intact file: nothing said, nothing written


def test_overwrite_removes_only_what_the_marker_lists(finished_run: Path, tmp_path: Path) -> None:
    shutil.copytree(finished_run, tmp_path / "run")
    (tmp_path / "run" / ".fedhet.lock").write_text(json.dumps({"fedhet": "run", "pid": None, "files": []}) + "\n")
    for name in ("best.pt", "availability.npz"):
        (tmp_path / "run" / name).write_text("mine")
    result = runner.invoke(app, ["run", *FAST, "--out", str(tmp_path / "run"), "--overwrite"])
    assert result.exit_code == 0, result.output
    for name in ("best.pt", "availability.npz"):  # the run writes neither: they are left as they were
        assert (tmp_path / "run" / name).read_text() == "mine"


@pytest.mark.slow
def test_a_model_that_calls_sys_exit_mid_run_fails_the_run(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    _write("nets.py", EXITING_FORWARD.replace("or not Path('r').exists()", "and Path('r').exists()"))(tmp_path)
    args = ["run", "--dataset", "digits", "--model", "torch", "--set", "model.target=nets.py:Net", "--rounds", "3"]
    result = runner.invoke(app, [*args, "--set", "num_clients=4", "--quiet", "--out", "r"], env={"COLUMNS": "200"})
    _check_one_line(result, "round 2: the run's code (its model, a plugin or a callback) called sys.exit(0)")
    assert json.loads((tmp_path / "r" / "summary.json").read_text())["status"] == "failed"


# ---- user code that calls sys.exit, hostile data files -----------------------------------------------------------

OWN_DATA = ["--rounds", "1", "--set", "num_clients=4", "--set", "partition.min_size=2", "--quiet", "--out", "r"]
XS = np.random.default_rng(0).normal(size=(40, 3))
YS = np.arange(40) % 2
EXITING_MODEL = (
    "import sys\nfrom torch import nn\n\nclass Net(nn.Module):\n    def __init__(self, num_classes):\n"
    "        super().__init__()\n        sys.exit(0)\n"
)

EXITING_FORWARD = (
    "import sys\nfrom pathlib import Path\nfrom torch import nn\n\nclass Net(nn.Module):\n"
    "    def __init__(self, num_classes):\n        super().__init__()\n        self.l = nn.Linear(64, num_classes)\n"
    "    def forward(self, x):\n"
    "        rows = Path('r/metrics.csv').read_text().splitlines() if Path('r/metrics.csv').exists() else []\n"
    "        if len(rows) > 1 or not Path('r').exists():  # before the run starts, or in its second round\n"
    "            sys.exit(0)\n"
    "        return self.l(x.flatten(1))\n"
)


def _write(name: str, data: str | bytes) -> Setup:
    def setup(root: Path) -> None:
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_bytes(data.encode() if isinstance(data, str) else data)

    return setup


def _npy(name: str, header: str, pad: int = 0, version: int = 1, data: bytes = XS.tobytes()) -> Setup:
    """A .npy file with the given header dict (padded by `pad` spaces) and data bytes."""
    text = (header + " " * pad + "\n").encode()
    size = struct.pack("<H", len(text)) if version == 1 else struct.pack("<I", len(text))
    return _write(name, b"\x93NUMPY" + bytes([version, 0]) + size + text + data)


def _zip_as_npy(root: Path) -> None:
    buffer = io.BytesIO()
    np.savez(buffer, x=XS)
    (root / "x.npy").write_bytes(buffer.getvalue())


def _labels(root: Path) -> None:
    np.save(root / "y.npy", YS)


def _images(root: Path) -> None:
    from PIL import Image

    for label in ("a", "b"):
        (root / "imgs" / label).mkdir(parents=True)
        for i in range(2):
            Image.new("L", (8, 8)).save(root / "imgs" / label / f"{i}.png")


def _both(*setups: Setup) -> Setup:
    def setup(root: Path) -> None:
        for s in setups:
            s(root)

    return setup


NPY = "dataset: {name: arrays, x: x.npy, y: y.npy}\n"
HEADER = "{'descr': '<f8', 'fortran_order': False, 'shape': (40, 3), }"
TABLE_CONFIG = "dataset: {name: table, path: t.csv, label: y}\n"
TABLE = "a,b,y\n" + "".join(f"{i},{i % 3},{i % 2}\n" for i in range(40))
CASES: dict[str, tuple[list[str], Setup, str]] = {
    "a model that calls sys.exit(0)": (
        ["run", "--dataset", "digits", "--model", "torch", "--set", "model.target=nets.py:Net", *OWN_DATA],
        _write("nets.py", EXITING_MODEL),
        "failed: SystemExit: 0",
    ),
    "a model whose forward calls sys.exit(0)": (
        ["run", "--dataset", "digits", "--model", "torch", "--set", "model.target=nets.py:Net", *OWN_DATA],
        _write("nets.py", EXITING_FORWARD),
        "called sys.exit(0)",
    ),
    "a .npy that is a zip file": (
        ["run", "c.yaml", *OWN_DATA],
        _both(_write("c.yaml", NPY), _zip_as_npy, _labels),
        "is a .npz",
    ),
    "a .npy with a huge header": (
        ["run", "c.yaml", *OWN_DATA],
        _both(_write("c.yaml", NPY), _npy("x.npy", HEADER, pad=1_000_000, version=2), _labels),
        "its header is longer than a NumPy file's",
    ),
    "a .npy whose shape claims more than it holds": (
        ["run", "c.yaml", *OWN_DATA],
        _both(_write("c.yaml", NPY), _npy("x.npy", HEADER.replace("(40, 3)", "(10000000000000, 3)")), _labels),
        "truncated or damaged: its header claims shape (10000000000000, 3)",
    ),
    "a NaN text cell": (
        ["run", "c.yaml", *OWN_DATA],
        _both(
            _write("c.yaml", "dataset: {name: table, path: t.csv, label: y}\n"),
            _write("t.csv", TABLE.replace("\n7,", "\nnan,")),
        ),
        "column 'a' holds 'nan' in data row 8, which is NaN",
    ),
    "an overflowing feature": (
        ["run", "c.yaml", *OWN_DATA],
        _both(
            _write("c.yaml", "dataset: {name: table, path: t.csv, label: y}\n"),
            _write("t.csv", TABLE.replace("\n7,", "\n1e400,")),
        ),
        "column 'a' holds '1e400' in data row 8, which is out of range",
    ),
    "a categorical column of too many values": (
        ["run", "c.yaml", *OWN_DATA],
        _both(
            _write("c.yaml", "dataset: {name: table, path: t.csv, label: y, categorical: [c]}\n"),
            _write("t.csv", "c,y\n" + "".join(f"v{i},{i % 2}\n" for i in range(MAX_CATEGORIES + 1))),
        ),
        f"has {MAX_CATEGORIES + 1:,} distinct values, more than the {MAX_CATEGORIES:,} one-hot columns",
    ),
    **{
        f"image size {size}": (
            ["run", "c.yaml", *OWN_DATA],
            _both(_write("c.yaml", f"dataset: {{name: image_folder, path: imgs, size: {size}}}\n"), _images),
            "dataset.size.0",
        )
        for size in ("[0, 8]", "[-3, 8]", "[100000, 100000]")
    },
}


@pytest.mark.parametrize("case", list(CASES))
def test_refused_in_one_line_and_nothing_written(case: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    args, setup, fragment = CASES[case]
    monkeypatch.chdir(tmp_path)
    setup(tmp_path)
    before = _snapshot(tmp_path)
    result = runner.invoke(app, args, env={"COLUMNS": "200"})
    _check_one_line(result, fragment)
    assert _snapshot(tmp_path) == before
