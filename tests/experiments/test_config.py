"""Config validation: one-line errors that name the key, and overrides."""

from __future__ import annotations

from pathlib import Path

import pytest

from fedhet.errors import ConfigError
from fedhet.experiments.build import components
from fedhet.experiments.config import apply_override, load_yaml, parse_config, set_component


def test_defaults_are_valid() -> None:
    cfg = parse_config({})
    assert cfg.rounds == 20 and cfg.local.lr == 0.05
    built = components(cfg)
    assert built.algorithm.name == "fedavg"


def test_unknown_top_level_key_suggests_closest() -> None:
    with pytest.raises(ConfigError, match=r"unknown key 'rouns' \(did you mean 'rounds'\?\)"):
        parse_config({"rouns": 3})


def test_unknown_nested_key_lists_the_section_keys() -> None:
    with pytest.raises(ConfigError, match=r"unknown key 'local.stepz' \(did you mean 'steps'\?\).*batch_size"):
        parse_config({"local": {"stepz": 3}})


def test_out_of_range_and_wrong_type() -> None:
    with pytest.raises(ConfigError, match=r"invalid value for 'rounds': .*greater than or equal to 1 \(got -5\)"):
        parse_config({"rounds": -5})
    with pytest.raises(ConfigError, match=r"invalid value for 'local.lr'"):
        parse_config({"local": {"lr": "fast"}})


def test_component_errors_name_the_component_key() -> None:
    with pytest.raises(ConfigError, match=r"unknown algorithm 'fedavgg' \(did you mean 'fedavg'\?\)"):
        components(parse_config({"algorithm": "fedavgg"}))
    with pytest.raises(ConfigError, match=r"unknown key 'algorithm.mux' \(did you mean 'mu'\?\)"):
        components(parse_config({"algorithm": {"name": "fedprox", "mux": 1}}))
    with pytest.raises(ConfigError, match=r"invalid value for 'algorithm.mu'"):
        components(parse_config({"algorithm": {"name": "fedprox", "mu": -1}}))


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


def test_yaml_errors(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="does not exist"):
        load_yaml(tmp_path / "nope.yaml")
    bad = tmp_path / "bad.yaml"
    bad.write_text("rounds: [1,\n")
    with pytest.raises(ConfigError, match="not valid YAML"):
        load_yaml(bad)
