"""Config validation: one-line errors that name the key, and overrides."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from fedhet.errors import ConfigError
from fedhet.experiments.build import components
from fedhet.experiments.config import load_yaml, parse_config


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


def test_yaml_errors(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="does not exist"):
        load_yaml(tmp_path / "nope.yaml")
    bad = tmp_path / "bad.yaml"
    bad.write_text("rounds: [1,\n")
    with pytest.raises(ConfigError, match="not valid YAML"):
        load_yaml(bad)


# ---- adversarial configs (property-based) --------------------------------------------------------------------------

from hypothesis import HealthCheck, given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

from fedhet.experiments.config import MAX_BATCH_SLOTS, RunConfig  # noqa: E402

SCALARS = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(min_value=-(2**70), max_value=2**70),
    st.floats(allow_nan=True, allow_infinity=True),
    st.text(max_size=8),
    st.sampled_from(["fedavg", "scaffold", "mlp", "digits", "bernoulli", "dirichlet", "auto", "yes", "1e23"]),
)
VALUES = st.recursive(
    SCALARS,
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=6) | st.integers(), inner, max_size=3),
    max_leaves=8,
)
KEYS = st.sampled_from([*RunConfig.model_fields, "local", "rouns"]) | st.text(max_size=6)
NESTED = {
    "local": st.dictionaries(st.sampled_from(["steps", "lr", "batch_size", "weight_decay", "epochs"]), SCALARS),
    "availability": st.fixed_dictionaries(
        {"name": st.sampled_from(["bernoulli", "markov", "always"])},
        optional={"p": VALUES, "pi": VALUES, "lam": VALUES},
    ),
}


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(raw=st.dictionaries(KEYS, VALUES, max_size=6), nested=st.fixed_dictionaries({}, optional=NESTED))
def test_any_config_is_valid_or_one_config_error(raw: dict, nested: dict) -> None:
    """Whatever a YAML file or --set can produce: a valid config, or one ConfigError line (never another error)."""
    raw = {**raw, **nested}
    try:
        cfg = parse_config(raw)
    except ConfigError as err:
        assert "\n" not in str(err) and str(err)
        return
    assert 1 <= cfg.clients_per_round <= cfg.num_clients and 1 <= cfg.rounds <= 1_000_000
    assert cfg.clients_per_round * cfg.local.steps * cfg.local.batch_size <= MAX_BATCH_SLOTS
    try:
        components(cfg)
    except ConfigError as err:
        assert "\n" not in str(err) and str(err)


@settings(max_examples=200, deadline=None)
@given(data=st.binary(max_size=200) | st.text(max_size=200).map(str.encode))
def test_any_config_file_is_a_mapping_or_one_config_error(
    tmp_path_factory: pytest.TempPathFactory, data: bytes
) -> None:
    path = tmp_path_factory.mktemp("yaml") / "c.yaml"
    path.write_bytes(data)
    try:
        raw = load_yaml(path)
    except ConfigError as err:
        assert "\n" not in str(err)
        return
    assert isinstance(raw, dict)
    try:
        parse_config(raw)
    except ConfigError as err:
        assert "\n" not in str(err)


def test_limits_and_defaults() -> None:
    assert parse_config({"num_clients": 4}).clients_per_round == 4  # the default 10, capped at the clients
    with pytest.raises(ConfigError, match=r"clients_per_round \(5\) is more than num_clients \(4\)"):
        parse_config({"num_clients": 4, "clients_per_round": 5})
    with pytest.raises(ConfigError, match="not yes/no"):
        parse_config({"local": {"steps": True}})
    with pytest.raises(ConfigError, match="samples per round"):
        parse_config({"clients_per_round": 100, "num_clients": 100, "local": {"steps": 10_000, "batch_size": 1000}})
    with pytest.raises(ConfigError, match=r"local\.epochs"):
        parse_config({"local": {"epochs": 1e9}})


@settings(max_examples=200, deadline=None)
@given(
    name=st.sampled_from(["bernoulli", "markov", "markov_clusters", "always"]),
    params=st.dictionaries(st.sampled_from(["p", "pi", "lam", "clusters"]), VALUES, max_size=3),
    clients=st.integers(1, 6),
)
def test_availability_parameters_fail_before_the_first_round_or_never(name: str, params: dict, clients: int) -> None:
    """An availability process either refuses its parameters when built or set up (before a run folder is written),
    or answers every round (the issue's `availability.p=1.5` failed only in round 1)."""
    from fedhet.catalog import AVAILABILITY

    try:
        process = AVAILABILITY.build({"name": name, **params})
        process.setup(clients, seed=0)
    except ConfigError as err:
        assert "\n" not in str(err)
        return
    for round_ in range(3):
        mask = process.available(round_)
        assert mask.shape == (clients,) and mask.dtype == torch.bool
