"""Hostile values of the update rules' parameters (issue 43): each is one line on stderr, exit code 2, and nothing
written, in the style of test_main_adversarial.py; and the model of issue 42 that `auto` sent to the dense backend."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from typer.testing import CliRunner

from fedhet.cli.main import app
from helpers.hostile import assert_refused

runner = CliRunner()
FAST = ["--dataset", "digits", "--rounds", "2", "--set", "num_clients=6", "--set", "model.hidden=[8]", "--quiet"]

# (the run's own flags, a fragment of the message)
CASES: dict[str, tuple[list[str], str]] = {
    "ditto lam inf": (["--algorithm", "ditto", "--set", "algorithm.lam=.inf"], "finite number"),
    "ditto lam 1e30": (["--algorithm", "ditto", "--set", "algorithm.lam=1e30"], "use lam < 40"),
    "ditto personal_lr overshoots": (
        ["--algorithm", "ditto", "--set", "algorithm.lam=1", "--set", "algorithm.personal_lr=5"],
        "algorithm.personal_lr 5",
    ),
    "ditto personal_lr nan": (["--algorithm", "ditto", "--set", "algorithm.personal_lr=.nan"], "finite number"),
    "ditto personal_steps 0": (["--algorithm", "ditto", "--set", "algorithm.personal_steps=0"], "personal_steps"),
    "ditto personal_steps out of memory": (
        ["--algorithm", "ditto", "--set", "algorithm.personal_steps=1000000"],
        "GiB of mini-batches",
    ),
    "fedrep head_factor inf": (["--algorithm", "fedrep", "--set", "algorithm.head_factor=.inf"], "finite number"),
    "fedrep head_factor 1e12": (["--algorithm", "fedrep", "--set", "algorithm.head_factor=1e12"], "less than or equal"),
    "fedrep head steps too many": (
        ["--algorithm", "fedrep", "--set", "algorithm.head_factor=1000", "--set", "local.steps=2000"],
        "more than 1,000,000",
    ),
    "fedrep head steps out of memory": (
        ["--algorithm", "fedrep", "--set", "algorithm.head_factor=1000", "--set", "local.steps=500"],
        "GiB of mini-batches",
    ),
    "fedrep unknown personal parameter": (
        ["--algorithm", "fedrep", "--set", "algorithm.personal=[nope]"],
        "'nope' matches none of the model's parameters",
    ),
    "fedper unknown personal parameter": (
        ["--algorithm", "fedper", "--set", "algorithm.personal=[nope]"],
        "'nope' matches none of the model's parameters",
    ),
    "fedavg_ft finetune_steps 1e8": (
        ["--algorithm", "fedavg_ft", "--set", "algorithm.finetune_steps=100000000"],
        "less than or equal to 1000000",
    ),
    "fedavg_ft finetune_steps out of memory": (
        ["--algorithm", "fedavg_ft", "--set", "algorithm.finetune_steps=1000000"],
        "GiB of mini-batches",
    ),
    "poc d below m": (
        ["--algorithm", "poc", "--set", "algorithm.d=2", "--set", "clients_per_round=4"],
        "algorithm.d (2) is less than clients_per_round (4)",
    ),
    "fedasync a inf": (["--algorithm", "fedasync", "--set", "algorithm.a=.inf"], "finite number"),
}


@pytest.mark.parametrize("case", list(CASES))
def test_a_rule_parameter_out_of_bounds_is_one_line_and_writes_nothing(
    case: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    flags, fragment = CASES[case]
    monkeypatch.chdir(tmp_path)
    assert_refused(["run", *FAST, *flags, "--out", "run"], fragment, tmp_path)


@pytest.mark.parametrize("backend", ["auto", "dense"])
def test_two_linear_layers_in_a_row_train_on_the_dense_backend(
    backend: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Issue 42: nn.Sequential(nn.Linear(3, 2), nn.Linear(2, 2)) from a file; `auto` picked dense, which crashed."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "net.py").write_text(
        "from torch import nn\n\n\nclass Net(nn.Sequential):\n"
        "    def __init__(self) -> None:\n        super().__init__(nn.Linear(3, 2), nn.Linear(2, 2))\n"
    )
    rng = np.random.default_rng(0)
    x = rng.normal(size=(120, 3)).astype("float32")
    np.savez(tmp_path / "d.npz", x=x, y=(x[:, 0] > 0).astype("int64"))
    args = ["run", "--dataset", "arrays", "--set", "dataset.path=d.npz", "--set", "model.name=torch"]
    args += ["--set", "model.target=net.py:Net", "--set", "num_clients=4", "--rounds", "3", "--backend", backend]
    result = runner.invoke(app, [*args, "--quiet", "--out", "run"], env={"COLUMNS": "200"})
    assert result.exit_code == 0, result.stderr
    summary = json.loads((tmp_path / "run/summary.json").read_text())
    assert summary["status"] == "finished" and summary["backend"] == "dense"
    assert 0.5 < summary["final"]["test_accuracy"] <= 1.0  # the label is the sign of x₀: a linear model learns it
