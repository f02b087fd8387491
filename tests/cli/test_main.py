"""The command line as a user types it: outputs, and one-line errors with exit code 2."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
from typer.testing import CliRunner

from fedhet.cli.main import app

runner = CliRunner()
FAST = ["--dataset", "digits", "--rounds", "3", "--set", "num_clients=6", "--set", "model.hidden=[8]"]


def invoke(*args: str) -> tuple[int, str]:
    result = runner.invoke(app, list(args), env={"COLUMNS": "200"})
    return result.exit_code, result.output


def test_run_writes_folder_and_prints_summary(tmp_path: Path) -> None:
    code, out = invoke(
        "run", "--algorithm", "fedprox", "--set", "algorithm.mu=0.1", *FAST, "--out", str(tmp_path / "r")
    )
    assert code == 0, out
    assert "test_accuracy" in out and "run folder" in out
    summary = json.loads((tmp_path / "r/summary.json").read_text())
    assert summary["algorithm"] == "fedprox" and summary["rounds"] == 3


def test_target_epsilon_sets_the_noise_of_a_dp_run(tmp_path: Path) -> None:
    code, out = invoke("run", "--algorithm", "dp", *FAST, "--target-epsilon", "6", "--out", str(tmp_path / "r"))
    assert code == 0, out
    summary = json.loads((tmp_path / "r/summary.json").read_text())
    assert summary["privacy"]["client"]["epsilon"] == pytest.approx(6.0, rel=0.01)
    assert summary["final"]["dp_epsilon"] == pytest.approx(6.0, rel=0.01) and "dp_epsilon" in out
    code, out = invoke("run", "--resume", str(tmp_path / "r"), "--target-epsilon", "2")
    assert code == 2 and "leave out --target-epsilon" in out


def test_yaml_config_and_flags(tmp_path: Path) -> None:
    cfg = tmp_path / "c.yaml"
    cfg.write_text("algorithm: scaffold\nrounds: 50\nnum_clients: 6\nmodel: {name: logistic}\n")
    code, out = invoke("run", str(cfg), "--rounds", "2", "--quiet", "--out", str(tmp_path / "r"))
    assert code == 0, out
    assert json.loads((tmp_path / "r/summary.json").read_text())["rounds"] == 2


def test_refuses_to_overwrite_and_resumes(tmp_path: Path) -> None:
    out_dir = str(tmp_path / "r")
    assert invoke("run", *FAST, "--quiet", "--out", out_dir)[0] == 0
    code, out = invoke("run", *FAST, "--quiet", "--out", out_dir)
    assert code == 2 and "--resume" in out
    code, out = invoke("run", "--resume", out_dir, "--quiet")
    assert code == 0, out


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["run", "--algorithm", "fedavgg"], "unknown algorithm 'fedavgg' (did you mean 'fedavg'?)"),
        (["run", "--set", "rouns=3"], "unknown key 'rouns' (did you mean 'rounds'?)"),
        (["run", "--rounds", "-5"], "invalid value for 'rounds'"),
        (["run", "--dataset", "mnist", "--data-dir", "/nonexistent-fedhet"], "mnist"),
        (["run", "--resume", "/nonexistent-fedhet"], "not a run folder"),
        (["list", "algos"], "did you mean 'algorithms'?"),
        (["run", *FAST, "--target-epsilon", "3"], "sets the noise of a DP mechanism, and this run has none"),
        (["run", "--algorithm", "dp", "--target-epsilon", "-1"], "invalid value for 'privacy.target_epsilon'"),
    ],
)
def test_bad_input_is_one_line_and_exit_2(args: list[str], message: str) -> None:
    code, out = invoke(*args)
    assert code == 2, out
    assert message in out
    assert "Traceback" not in out
    assert len(out.strip().splitlines()) == 1, out


def test_a_partial_override_of_a_strategys_server_optimiser_keeps_its_defaults(tmp_path: Path) -> None:
    """--set algorithm.server_optimizer.tau=0.01 on fedadam: Adam with τ = 0.01 and FedAdam's other defaults."""
    import yaml

    out = tmp_path / "r"
    code, text = invoke(
        "run",
        "--algorithm",
        "fedadam",
        "--set",
        "algorithm.server_optimizer.tau=0.01",
        *FAST,
        "--quiet",
        "--out",
        str(out),
    )
    assert code == 0, text
    algorithm = yaml.safe_load((out / "config.yaml").read_text())["algorithm"]
    assert algorithm["server_lr"] == 0.01
    assert algorithm["server_optimizer"] == {
        "name": "adam",
        "beta1": 0.9,
        "beta2": 0.99,
        "tau": 0.01,
        "bias_correction": False,
    }


def test_a_metric_plugin_that_names_a_built_in_column_is_refused_in_one_line(tmp_path: Path) -> None:
    plugin = tmp_path / "my_metric.py"
    plugin.write_text(
        "from typing import ClassVar\n"
        "from fedhet.metrics.base import METRIC_PLUGINS, Metric\n\n"
        "@METRIC_PLUGINS.register\n"
        "class Minus(Metric):\n"
        "    name: ClassVar[str] = 'cli_minus_one'\n"
        "    def columns(self):\n"
        "        return ('test_accuracy',)\n"
        "    def compute(self, view):\n"
        "        return {'test_accuracy': -1.0}, {}\n"
    )
    code, text = invoke(
        "run", "--import", str(plugin), "--set", "metrics=[cli_minus_one]", *FAST, "--out", str(tmp_path / "r")
    )
    assert code == 2
    assert text.strip().splitlines() == [
        "error: metrics[0] ('cli_minus_one') writes the metrics.csv column 'test_accuracy', which fedhet writes "
        "itself; give the plugin's column another name"
    ]
    assert not (tmp_path / "r").exists()


def test_corrupt_dataset_file(tmp_path: Path) -> None:
    folder = tmp_path / "mnist"
    folder.mkdir()
    for name in (
        "train-images-idx3-ubyte",
        "train-labels-idx1-ubyte",
        "t10k-images-idx3-ubyte",
        "t10k-labels-idx1-ubyte",
    ):
        (folder / name).write_bytes(b"\x00\x00\x08\x03garbage")
    code, out = invoke("run", "--dataset", "mnist", "--data-dir", str(tmp_path), "--rounds", "1")
    assert code == 2 and "Traceback" not in out and len(out.strip().splitlines()) == 1, out


def test_list_compare_and_plot(tmp_path: Path) -> None:
    code, out = invoke("list")
    assert code == 0
    for name in ("fedavg", "fedprox", "scaffold", "digits", "synthetic", "dirichlet", "mlp", "bernoulli"):
        assert name in out
    runs = []
    for algorithm in ("fedavg", "fedprox"):
        path = tmp_path / algorithm
        assert invoke("run", "--algorithm", algorithm, *FAST, "--quiet", "--out", str(path))[0] == 0
        runs.append(str(path))
    code, out = invoke("compare", *runs, "--plot", str(tmp_path / "cmp.png"))
    assert code == 0, out
    assert "fedprox" in out and "0." in out and (tmp_path / "cmp.png").stat().st_size > 1000
    code, out = invoke("plot", *runs, "--metric", "test_loss", "-o", str(tmp_path / "loss.png"))
    assert code == 0 and (tmp_path / "loss.png").stat().st_size > 1000
    code, out = invoke("plot", *runs, "--metric", "nope", "-o", str(tmp_path / "x.png"))
    assert code == 2 and "available" in out


def test_track_flag_and_resume_of_a_finished_run(tmp_path: Path) -> None:
    pytest.importorskip("tensorboard")
    out_dir = tmp_path / "r"
    code, out = invoke("run", *FAST, "--track", "tensorboard", "--out", str(out_dir))
    assert code == 0, out
    assert f"tensorboard: tensorboard --logdir {out_dir / 'tensorboard'}" in out
    assert "track:\n- tensorboard" in (out_dir / "config.yaml").read_text()
    assert any((out_dir / "tensorboard").iterdir())
    code, out = invoke("run", "--resume", str(out_dir))
    assert code == 0 and out.strip() == f"'{out_dir}' is already finished (3 rounds); nothing to resume"
    code, out = invoke("run", *FAST, "--track", "tensorbord", "--out", str(tmp_path / "x"))
    assert code == 2 and "did you mean 'tensorboard'?" in out and len(out.strip().splitlines()) == 1


def test_compare_names_runs_by_what_differs_and_fits_80_columns(tmp_path: Path) -> None:
    runs = []
    for name, extra in (("a", []), ("b", ["--algorithm", "fedprox", "--set", "algorithm.mu=0.1", "--seed", "1"])):
        assert invoke("run", *FAST, *extra, "--quiet", "--out", str(tmp_path / name))[0] == 0
        runs.append(str(tmp_path / name))
    result = runner.invoke(app, ["compare", *runs, "--column", "participants"], env={"COLUMNS": "80"})
    assert result.exit_code == 0, result.output
    assert "fedavg, seed 0" in result.output and "fedprox, seed 1" in result.output  # mu: one fedprox run
    assert re.search(r"│\s+3 │\s+6 │", result.output) and "6.0000" not in result.output  # rounds, participants
    result = runner.invoke(app, ["compare", *runs], env={"COLUMNS": "80"})
    lines = result.output.splitlines()
    assert result.exit_code == 0 and max(len(line) for line in lines) <= 80, result.output
    assert "left out to fit 80 columns" in " ".join(result.output.split())


def test_sweep_from_a_yaml_section_and_flags(tmp_path: Path) -> None:
    cfg = tmp_path / "grid.yaml"
    cfg.write_text(
        "dataset: digits\nrounds: 2\nnum_clients: 6\nmodel: {name: mlp, hidden: [8]}\n"
        "sweep:\n  grid:\n    local.lr: [0.02, 0.1]\n  seeds: 2\n"
    )
    out_dir = tmp_path / "sweep"
    args = ["sweep", str(cfg), "--grid", "algorithm=fedavg,fedprox", "--out", str(out_dir), "--workers", "1"]
    code, out = invoke(*args, "--show", "test_loss")
    assert code == 0, out
    assert "best by test_accuracy (max):" in out and "| point | test_accuracy | test_loss |" in out
    assert len(list(out_dir.glob("*/seed*/metrics.csv"))) == 8
    assert (out_dir / "lr-0.1_algorithm-fedprox" / "seed1" / "summary.json").is_file()
    code, again = invoke(*args, "--show", "test_loss")  # everything is reused: the same summary
    assert code == 0 and "8 runs on this process; 8 already finished" in again
    assert [line for line in again.splitlines() if line.startswith("|")] == [
        line for line in out.splitlines() if line.startswith("|")
    ]


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["sweep", "--seeds", "0"], "--seeds 0: give the number of seeds, at least 1"),
        (["sweep", "--grid", "local.lr"], "--grid 'local.lr' must look like key=value1,value2"),
        (["sweep", "--grid", "local.lr=0.1,0.1"], "the value 0.1 is listed twice"),
        (["sweep", "--grid", "algorithm=fedavgg"], "grid point algorithm=fedavgg: unknown algorithm"),
        (["sweep", "--workers", "0"], "--workers 0: give at least 1"),
        (["reproduce", "fedmgda-improved", "--seeds", "0"], "--seeds 0: give at least 1 seed"),
    ],
)
def test_bad_sweeps_are_one_line_and_exit_2(args: list[str], message: str, tmp_path: Path) -> None:
    code, out = invoke(*args, "--out", str(tmp_path / "x"), "--quiet")
    assert code == 2, out
    assert message in out and len(out.strip().splitlines()) == 1, out


def test_compare_puts_time_on_the_x_axis_and_says_when_a_target_was_reached(tmp_path: Path) -> None:
    from fedhet.experiments.config import parse_config
    from fedhet.experiments.runner import run

    base = {"num_clients": 6, "clients_per_round": 3, "rounds": 3, "model": {"name": "mlp", "hidden": [8]}}
    run(parse_config({**base, "system": "lognormal"}), tmp_path / "timed")
    run(parse_config(base), tmp_path / "plain")
    runner = CliRunner()
    result = runner.invoke(app, ["compare", str(tmp_path / "timed"), "--target", "0.1", "--x", "time", "--plot",
                                 str(tmp_path / "t.png")], env={"COLUMNS": "200"})  # fmt: skip
    assert result.exit_code == 0, result.output
    assert "time (s) to test_accuracy 0.1" in result.output and (tmp_path / "t.png").is_file()
    refused = runner.invoke(app, ["plot", str(tmp_path / "plain"), "--x", "time", "-o", str(tmp_path / "p.png")])
    assert refused.exit_code == 2 and "no run has a simulated clock" in refused.output
