"""The public Python API: fedhet.run, fedhet.load_run, fedhet.Config, callbacks, version, python -m fedhet."""

from __future__ import annotations

import os
import subprocess
import sys
from importlib.metadata import version
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
import yaml
from torch import nn

import fedhet
from fedhet.api import ClientTable, _client_table
from fedhet.catalog import MODELS
from fedhet.errors import ConfigError, FedhetError
from fedhet.experiments.config import parse_config
from fedhet.experiments.runner import RunState
from fedhet.experiments.runner import run as runner_run

SMALL: dict[str, Any] = {"rounds": 3, "num_clients": 6, "clients_per_round": 4, "local": {"steps": 2}, "seed": 2}
SRC = Path(fedhet.__file__).resolve().parents[1]


def test_the_client_table_is_columns_and_still_a_sequence_of_rows(tmp_path: Path) -> None:
    table = ClientTable({"client": np.arange(3.0), "user": ["a", "b", "c"], "loss": np.array([0.5, np.nan, 2.0])})
    assert len(table) == 3 and table.columns == ["client", "user", "loss"]
    np.testing.assert_array_equal(table["loss"], [0.5, np.nan, 2.0])  # a column: one array
    assert table[2] == {"client": 2.0, "user": "c", "loss": 2.0} and table[-1] == table[2]
    assert [row["user"] for row in table] == ["a", "b", "c"] and table[:1] == [table[0]]
    assert isinstance(table[0]["loss"], float) and np.isnan(table[1]["loss"])  # NaN where not scored
    assert table == ClientTable({"client": np.arange(3.0), "user": ["a", "b", "c"], "loss": np.array([0.5, np.nan, 2])})
    with pytest.raises(ConfigError, match=r"no client column 'acc'.*client, user, loss"):
        table["acc"]
    with pytest.raises(IndexError):
        table[3]
    (tmp_path / "clients.csv").write_text("client,user,loss\n0,a,0.5\n1,b,\n2,c,2\n")
    assert _client_table(tmp_path / "clients.csv") == table  # an empty cell is NaN
    assert len(ClientTable()) == 0 and list(ClientTable()) == []


def test_run_returns_metrics_clients_and_the_final_model(tmp_path: Path) -> None:
    result = fedhet.run(SMALL, out=tmp_path / "run")
    assert result.status == "finished" and result.rounds == 3 and len(result.history) == 3
    assert result.final == result.history[-1] and 0.0 <= result.final["test_accuracy"] <= 1.0
    assert result.metric("round") == [1.0, 2.0, 3.0]
    assert len(result.clients) == 6 and {"client", "test_accuracy"} <= result.clients[0].keys()
    assert result.config["model"]["name"] == "mlp" and result.out == tmp_path / "run"
    # the state dict loads into the model the config describes and reproduces the final test accuracy
    module = MODELS.build(result.config["model"]).build((64,), 10)
    module.load_state_dict(result.state_dict)
    again = fedhet.load_run(tmp_path / "run")
    assert again.final == result.final and again.history == result.history  # CSV/JSON keep every digit
    assert again.clients == result.clients
    assert again.clients.columns == result.clients.columns and again.clients[-1] == result.clients[5]
    assert again.state_dict is not None and again.state_dict.keys() == result.state_dict.keys()
    assert all(torch.equal(again.state_dict[k], v) for k, v in result.state_dict.items())


def test_the_state_dict_holds_the_trained_global_model() -> None:
    state = runner_run(parse_config(SMALL))
    result = fedhet.run(SMALL)
    flat = torch.cat([result.state_dict[name].reshape(-1) for name in state.experiment.engine.model.names])
    assert torch.allclose(flat, state.params)
    assert not torch.allclose(flat, state.experiment.engine.initial_params())


def test_a_config_dict_yaml_file_and_config_object_give_the_same_run(tmp_path: Path) -> None:
    path = tmp_path / "c.yaml"
    path.write_text(yaml.safe_dump(SMALL))
    a = fedhet.run(SMALL)
    b = fedhet.run(path)
    c = fedhet.run(fedhet.Config(**SMALL))
    d = fedhet.run(str(path))
    assert a.history == b.history == c.history == d.history


def test_load_run_rebuilds_the_model_of_a_cli_run_folder(tmp_path: Path) -> None:
    runner_run(parse_config(SMALL), tmp_path / "cli")  # what `fedhet run` writes: no model.pt
    assert not (tmp_path / "cli" / "model.pt").exists()
    loaded = fedhet.load_run(tmp_path / "cli")
    direct = fedhet.run(SMALL)
    assert loaded.state_dict is not None and loaded.state_dict.keys() == direct.state_dict.keys()
    assert all(torch.allclose(loaded.state_dict[k], v) for k, v in direct.state_dict.items())
    assert fedhet.load_run(tmp_path / "cli", model=False).state_dict is None


def test_config_errors_are_the_cli_one_liners(tmp_path: Path) -> None:
    with pytest.raises(ConfigError) as err:
        fedhet.Config(rounds=0)
    with pytest.raises(ConfigError) as cli:
        parse_config({"rounds": 0})
    assert str(err.value) == str(cli.value) and "\n" not in str(err.value)
    with pytest.raises(ConfigError, match="unknown key 'rouns' \\(did you mean 'rounds'\\?\\)"):
        fedhet.run({"rouns": 3})
    with pytest.raises(ConfigError, match=r"config file '.*missing.yaml' does not exist"):
        fedhet.run(tmp_path / "missing.yaml")
    with pytest.raises(ConfigError, match=r"config must be a dict, a YAML file path or a fedhet.Config; got a int"):
        fedhet.run(3)  # type: ignore[arg-type]
    with pytest.raises(ConfigError, match=r"'dataset' must be a name, a mapping, a fedhet.datasets.Dataset"):
        fedhet.Config(dataset=[1, 2])


def test_a_config_round_trips_through_yaml() -> None:
    cfg = fedhet.Config(**SMALL, algorithm={"name": "fedprox", "mu": 0.1})
    assert fedhet.Config(**yaml.safe_load(cfg.to_yaml())) == cfg
    assert cfg.to_dict()["algorithm"] == {"name": "fedprox", "mu": 0.1}


def test_arrays_and_a_model_class_from_python(tmp_path: Path) -> None:
    rng = np.random.default_rng(0)
    x = rng.normal(size=(150, 5)).astype(np.float32)
    y = (x[:, 0] > 0).astype(int)

    class Net(nn.Module):  # defined inside a function: held in memory, not importable
        def __init__(self, input_shape: tuple[int, ...], num_classes: int) -> None:
            super().__init__()
            self.fc = nn.Linear(input_shape[0], num_classes)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return self.fc(x)

    result = fedhet.run(
        {**SMALL, "dataset": (x, y), "model": Net, "local": {"steps": 5, "lr": 0.5}}, out=tmp_path / "r"
    )
    assert result.config["dataset"]["name"] == "in_memory"
    assert result.config["model"]["target"].startswith("<python>:")
    assert result.final["test_accuracy"] > 0.8  # a linearly separable problem
    assert set(result.state_dict) == {"fc.weight", "fc.bias"}
    # the same arrays as a Dataset, and the model as an instance, are accepted too
    data = fedhet.datasets.from_arrays(x, y)
    again = fedhet.run({**SMALL, "dataset": data, "model": nn.Linear(5, 2)})
    assert again.status == "finished"


def test_component_objects_are_accepted() -> None:
    from fedhet.catalog import STRATEGIES

    prox = STRATEGIES.build({"name": "fedprox", "mu": 0.3})
    cfg = fedhet.Config(**SMALL, algorithm=prox)
    assert cfg.spec("algorithm")["name"] == "fedprox" and cfg.spec("algorithm")["mu"] == 0.3


class Recorder(fedhet.Callback):
    def __init__(self) -> None:
        self.events: list[str] = []

    def on_run_start(self, state: RunState) -> None:
        self.events.append("start")

    def on_round_end(self, state: RunState, metrics: dict[str, float] | None) -> bool:
        self.events.append(f"round {state.round}")
        return state.round == 2  # stop early after round 2

    def on_run_end(self, state: RunState) -> None:
        self.events.append(state.status)


def test_callbacks_see_every_round_and_can_stop_the_run() -> None:
    recorder = Recorder()
    result = fedhet.run({**SMALL, "rounds": 5}, callbacks=[recorder])
    assert recorder.events == ["start", "round 1", "round 2", "stopped early"]
    assert result.status == "stopped early" and result.rounds == 2


def test_an_existing_run_folder_is_kept_unless_overwrite(tmp_path: Path) -> None:
    fedhet.run(SMALL, out=tmp_path / "r")
    with pytest.raises(FedhetError, match=r"already holds a run; read it with fedhet.load_run"):
        fedhet.run(SMALL, out=tmp_path / "r")
    assert fedhet.run({**SMALL, "rounds": 1}, out=tmp_path / "r", overwrite=True).rounds == 1
    assert fedhet.load_run(tmp_path / "r").rounds == 1


def test_progress_shows_a_bar(capsys: pytest.CaptureFixture[str]) -> None:
    fedhet.run({**SMALL, "rounds": 2}, progress=True)
    assert "2/2" in capsys.readouterr().out


def test_metric_names_a_missing_metric() -> None:
    result = fedhet.run({**SMALL, "rounds": 1})
    with pytest.raises(ConfigError, match=r"no metric 'accuracy' in this run; it has: .*test_accuracy"):
        result.metric("accuracy")


def test_version_comes_from_the_package_metadata() -> None:
    assert fedhet.__version__ == version("fedhet")


def python(*args: str) -> subprocess.CompletedProcess[str]:
    env = {"PYTHONPATH": str(SRC), "PATH": "/usr/bin:/bin"}
    return subprocess.run([sys.executable, *args], capture_output=True, text=True, env=env, timeout=120)


def test_import_fedhet_is_light_and_help_says_what_to_do_first() -> None:
    out = python("-c", "import sys, fedhet; print('torch' in sys.modules, fedhet.__doc__)")
    assert out.returncode == 0, out.stderr
    assert out.stdout.startswith("False")  # torch is imported on first use only
    assert "fedhet.run(" in out.stdout and "fedhet run --algorithm" in out.stdout


@pytest.mark.slow
def test_python_dash_m_fedhet_and_version_flag() -> None:
    out = python("-m", "fedhet", "--version")
    assert out.returncode == 0 and out.stdout.strip() == f"fedhet {version('fedhet')}"
    listed = python("-m", "fedhet", "list", "datasets")
    assert listed.returncode == 0 and "image_folder" in listed.stdout and "table" in listed.stdout


def test_the_package_is_typed() -> None:
    assert (Path(fedhet.__file__).parent / "py.typed").is_file()
    assert {"run", "load_run", "Config", "RunResult", "Callback", "datasets", "__version__"} <= set(dir(fedhet))
    with pytest.raises(AttributeError, match="has no attribute 'nothing'"):
        _ = fedhet.nothing  # type: ignore[attr-defined]


def test_load_run_rebuilds_a_model_its_folder_names_only_when_trusted(tmp_path: Path) -> None:
    nets = tmp_path / "nets.py"
    nets.write_text(
        "import pathlib\nfrom torch import nn\npathlib.Path(__file__).with_name('imported').write_text('x')\n\n"
        "class Net(nn.Sequential):\n    def __init__(self, num_classes):\n"
        "        super().__init__(nn.Flatten(), nn.Linear(64, num_classes))\n"
    )
    runner_run(parse_config({**SMALL, "model": {"name": "torch", "target": f"{nets}:Net"}}), tmp_path / "cli")
    (tmp_path / "imported").unlink()
    with pytest.raises(ConfigError, match=r"names code to import .*trust=True"):
        fedhet.load_run(tmp_path / "cli")
    assert not (tmp_path / "imported").exists()
    read = fedhet.load_run(tmp_path / "cli", model=False)  # metrics and clients need no code
    assert read.rounds == 3 and len(read.clients) == 6 and read.state_dict is None
    trusted = fedhet.load_run(tmp_path / "cli", trust=True)
    assert trusted.state_dict is not None and trusted.state_dict["1.weight"].shape == (10, 64)


def test_load_run_refuses_a_garbled_clients_csv_in_one_line(tmp_path: Path) -> None:
    runner_run(parse_config(SMALL), tmp_path / "r")
    (tmp_path / "r" / "clients.csv").write_text("client,test_accuracy\n0,high\n")
    with pytest.raises(FedhetError, match=r"^'.*clients.csv' is not a table of numbers and user names \(.*\)$"):
        fedhet.load_run(tmp_path / "r", model=False)


def test_overwrite_never_deletes_a_folder_of_yours(tmp_path: Path) -> None:
    """overwrite=True once removed the whole folder; it is --overwrite's: a folder fedhet did not create is refused
    and a run folder loses only the files its marker lists (model.pt included)."""
    mine = tmp_path / "mine"
    mine.mkdir()
    (mine / "checkpoint.pt").write_text("my own checkpoint")
    with pytest.raises(FedhetError, match="not a fedhet run folder"):
        fedhet.run(SMALL, out=mine, overwrite=True)
    assert os.listdir(mine) == ["checkpoint.pt"]
    fedhet.run(SMALL, out=tmp_path / "r")
    (tmp_path / "r" / "notes.txt").write_text("mine")
    fedhet.run({**SMALL, "rounds": 1}, out=tmp_path / "r", overwrite=True)
    assert (tmp_path / "r" / "notes.txt").read_text() == "mine" and (tmp_path / "r" / "model.pt").is_file()
