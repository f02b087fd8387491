"""`fedhet describe`: the clients a config makes, described without training; hostile input refused in one line."""

from __future__ import annotations

import csv
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from typer.testing import CliRunner

from fedhet.cli.main import app
from helpers.domains import write_domains
from helpers.hostile import assert_refused


def _rows(path: Path) -> list[dict[str, str]]:
    with path.open() as file:
        return list(csv.DictReader(file))


def test_describe_writes_the_clients_and_a_figure_without_training(tmp_path: Path) -> None:
    out = tmp_path / "d"
    args = ["describe", "--dataset", "digits", "--partition", "label_k", "--set", "partition.labels_per_client=1"]
    args += ["--set", "num_clients=10", "--set", "shift={name: noise, groups: 2, strength: 0.3}", "--out", str(out)]
    result = CliRunner().invoke(app, args, env={"COLUMNS": "200"})
    assert result.exit_code == 0, result.output
    assert "mean TV distance to global labels" in result.output and "group 1" in result.output
    assert sorted(p.name for p in out.iterdir()) == ["clients.csv", "heterogeneity.png"]  # no run folder
    rows = _rows(out / "clients.csv")
    counts = np.array([[int(r[f"label_{c}"]) for c in range(10)] for r in rows])
    assert ((counts > 0).sum(axis=1) == 1).all()  # label_k with k = 1: one class per client
    shares = counts.sum(axis=0) / counts.sum()
    # one class c per client: TV = ½((1 − p_c) + Σ_{c' ≠ c} p_c') = 1 − p_c
    expected = [1 - shares[int(np.argmax(row))] for row in counts]
    assert [float(r["tv_distance"]) for r in rows] == pytest.approx(expected, abs=1e-6)
    assert [float(r["shift_level"]) for r in rows] == [0.0, 0.3] * 5
    assert (out / "heterogeneity.png").read_bytes()[:4] == b"\x89PNG"


def test_describe_takes_a_config_file_and_reports_an_iid_split_as_close_to_global(tmp_path: Path) -> None:
    config = tmp_path / "c.yaml"
    config.write_text("dataset: digits\npartition: iid\nnum_clients: 5\n")
    result = CliRunner().invoke(app, ["describe", str(config), "--out", str(tmp_path / "d")])
    assert result.exit_code == 0, result.output
    tv = [float(r["tv_distance"]) for r in _rows(tmp_path / "d" / "clients.csv")]
    assert max(tv) < 0.15  # IID: every client near the global distribution


def _link(target: str, name: str):  # type: ignore[no-untyped-def]
    def setup(root: Path) -> None:
        (root / target).mkdir(exist_ok=True)
        os.symlink(root / target, root / name)

    return setup


@pytest.mark.parametrize(
    ("args", "fragment", "setup"),
    [
        (["--set", "num_clients=abc"], "num_clients", None),
        (["--dataset", "nope"], "unknown dataset 'nope'", None),
        (["--set", "shift.name=spin"], "unknown shift 'spin'", None),
        (["--dataset", "breast_cancer", "--set", "shift.name=blur"], "not images", None),
        (["--set", "num_clients=100000"], "needs 1000000 samples", None),
        (["--out", "link"], "symbolic link", _link("elsewhere", "link")),
        (["--out", "afile"], "is a file", "afile"),
        (["--out", "d"], "symbolic link", "d/clients.csv"),
        (["--out", "run"], "a folder of fedhet's runs", "run/.fedhet.lock"),
    ],
)
def test_hostile_input_is_refused_in_one_line_and_writes_nothing(
    args: list[str], fragment: str, setup: object, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    if callable(setup):
        setup(tmp_path)
    elif setup == "afile":
        (tmp_path / "afile").write_text("mine")
    elif setup == "d/clients.csv":
        (tmp_path / "d").mkdir()
        (tmp_path / "secret.csv").write_text("mine")
        os.symlink(tmp_path / "secret.csv", tmp_path / "d" / "clients.csv")
    elif setup == "run/.fedhet.lock":
        (tmp_path / "run").mkdir()
        (tmp_path / "run" / "clients.csv").write_text("client,test_accuracy\n0,0.9\n")
        (tmp_path / "run" / ".fedhet.lock").write_text('{"fedhet": "run", "pid": null, "files": ["config.yaml"]}\n')
    assert_refused(["describe", "--dataset", "digits", *args], fragment, tmp_path)


def test_describe_names_each_domain(tmp_path: Path) -> None:
    root = write_domains(tmp_path / "d")
    args = ["describe", "--set", f"dataset={{name: image_domains, path: '{root}', grayscale: true}}"]
    args += ["--set", "shift.name=domain", "--partition", "iid", "--set", "num_clients=3", "--out", str(tmp_path / "o")]
    result = CliRunner().invoke(app, args, env={"COLUMNS": "200"})
    assert result.exit_code == 0, result.output
    assert "group 0 (cartoon)" in result.output and "group 2 (sketch)" in result.output
    assert [r["group"] for r in _rows(tmp_path / "o" / "clients.csv")] == ["0", "1", "2"]


def test_a_config_error_is_said_without_importing_torch() -> None:
    probe = (
        "import sys\nfrom fedhet.cli.main import app\ntry:\n    app(['describe', '--set', 'lcoal.lr=0.1'])\n"
        "except SystemExit as done:\n    print(done.code, 'torch' in sys.modules)"
    )
    src = Path(__file__).resolve().parents[2] / "src"
    env = {**os.environ, "PYTHONPATH": str(src)}
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, env=env)
    assert done.stdout.split() == ["2", "False"], done.stderr
    assert "unknown key 'lcoal'" in done.stderr
