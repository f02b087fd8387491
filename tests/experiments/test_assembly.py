"""Assembling a run's config from its sources: a file, flags, --set overrides (partial ones complete the component's
defaults), plugin imports, trackers; and the default run folder."""

from __future__ import annotations

from pathlib import Path

import pytest

from fedhet.errors import ConfigError
from fedhet.experiments.assembly import (
    apply_override,
    assemble,
    default_recipe_folder,
    default_run_folder,
    default_sweep_folder,
    set_component,
)
from fedhet.experiments.build import components
from fedhet.experiments.config import parse_config


def test_overrides_parse_yaml_values_and_expand_components() -> None:
    raw: dict = {"algorithm": "fedprox"}
    apply_override(raw, "algorithm.mu=0.5")
    apply_override(raw, "local.lr=0.2")
    apply_override(raw, "partition.alpha=0.1")
    apply_override(raw, "model.hidden=[8, 4]")
    cfg = parse_config(raw)
    assert cfg.spec("algorithm") == {"name": "fedprox", "mu": 0.5}
    assert cfg.local.lr == 0.2
    assert cfg.spec("partition") == {"name": "dirichlet", "alpha": 0.1}
    assert cfg.spec("model") == {"name": "mlp", "hidden": [8, 4]}
    with pytest.raises(ConfigError, match="key=value"):
        apply_override(raw, "local.lr")


def test_set_component_keeps_params_only_for_the_same_name() -> None:
    raw: dict = {"algorithm": {"name": "fedprox", "mu": 0.5}}
    set_component(raw, "algorithm", "fedprox")
    assert raw["algorithm"] == {"name": "fedprox", "mu": 0.5}
    set_component(raw, "algorithm", "fedavg")
    assert raw["algorithm"] == "fedavg"


def test_sources_apply_in_order(tmp_path: Path) -> None:
    """The file, then component flags (the file's parameters kept for the same component), values, imports
    appended, overrides last, trackers added once."""
    file = tmp_path / "run.yaml"
    file.write_text("algorithm: {name: fedprox, mu: 0.5}\nrounds: 7\nimports: [a]\ntrack: [tensorboard]\n")
    raw = assemble(
        file,
        components={"algorithm": "fedprox", "dataset": None},
        values={"rounds": 3, "seed": None, "data_dir": Path("here")},
        imports=["b"],
        overrides=["rounds=4"],
        track=["tensorboard", "mlflow"],
    )
    assert raw == {
        "algorithm": {"name": "fedprox", "mu": 0.5},
        "rounds": 4,
        "imports": ["a", "b"],
        "track": ["tensorboard", "mlflow"],
        "data_dir": "here",
    }
    assert assemble(file, components={"algorithm": "fedavg"})["algorithm"] == "fedavg"


def test_default_folders_name_what_they_hold() -> None:
    cfg = parse_config({"algorithm": "fedprox", "seed": 3})
    assert default_run_folder(cfg, now=1234.5) == Path("runs/fedprox_digits_seed3_1234")
    assert default_sweep_folder(Path("conf/lr.yaml")) == Path("runs/sweep-lr")
    assert default_sweep_folder(None) == Path("runs/sweep-default")
    assert default_recipe_folder("maxfl-table1") == Path("runs/maxfl-table1")


def test_partial_override_of_a_nested_component_keeps_its_defaults() -> None:
    """--set algorithm.server_optimizer.tau=0.01 on fedadam: Adam with τ = 0.01 and its other defaults (issue 32),
    the strategy's other defaults too; a mapping with another name replaces the component."""
    raw: dict = {"algorithm": "fedadam"}
    apply_override(raw, "algorithm.server_optimizer.tau=0.01")
    built = components(parse_config(raw)).algorithm
    adam = components(parse_config({"algorithm": "fedadam"})).algorithm
    assert built.server_optimizer.name == "adam"
    assert built.server_optimizer.tau == 0.01
    assert built.server_optimizer.model_dump() == {**adam.server_optimizer.model_dump(), "tau": 0.01}
    assert built.server_lr == adam.server_lr == 1e-2
    apply_override(raw, "algorithm.server_optimizer={name: yogi}")
    assert components(parse_config(raw)).algorithm.server_optimizer.name == "yogi"


def test_partial_override_of_the_local_optimizer_and_of_a_base_strategy() -> None:
    raw: dict = {}
    apply_override(raw, "local.optimizer.momentum=0.9")
    optimizer = components(parse_config(raw)).optimizer
    assert optimizer.name == "sgd" and optimizer.momentum == 0.9
    raw = {"algorithm": "gsnr"}
    apply_override(raw, "algorithm.base.weighting=uniform")
    base = components(parse_config(raw)).algorithm.base
    assert isinstance(base, dict) and base["name"] == "fedavg" and base["weighting"] == "uniform"
    apply_override(raw, "algorithm.base.mu=0.1")
    with pytest.raises(ConfigError, match=r"unknown key 'algorithm.base.mu'"):
        components(parse_config(raw))


def test_two_runs_of_one_second_get_two_default_folders(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Two quick runs without --out in the same second: the second is not refused as "already holds a run"."""
    monkeypatch.chdir(tmp_path)
    cfg = parse_config({"algorithm": "fedprox", "seed": 3})
    first = default_run_folder(cfg, now=1234.5)
    first.mkdir(parents=True)
    assert default_run_folder(cfg, now=1234.5) == Path("runs/fedprox_digits_seed3_1234_2")
    Path("runs/fedprox_digits_seed3_1234_2").mkdir()
    assert default_run_folder(cfg, now=1234.5) == Path("runs/fedprox_digits_seed3_1234_3")
