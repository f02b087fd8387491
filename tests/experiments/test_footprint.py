"""`fedhet.experiments.footprint`: a run's memory by part, checked against sizes worked out by hand (a 64-8-10 MLP on
the digits: P = 64·8 + 8 + 8·10 + 10 = 610 parameters), and a run refused in one line, before anything is written,
when it does not fit the memory allowed (``FEDHET_MEMORY_LIMIT_MB``)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from fedhet.errors import ConfigError
from fedhet.experiments.build import build
from fedhet.experiments.config import parse_config
from fedhet.experiments.footprint import MB, MEMORY_LIMIT_ENV, available_bytes, footprint
from helpers.hostile import assert_refused

P = 610
BASE: dict[str, Any] = {
    "dataset": "digits",
    "model": {"name": "mlp", "hidden": [8]},
    "num_clients": 6,
    "clients_per_round": 3,
    "local": {"steps": 2, "lr": 0.05, "batch_size": 8},
}
# a round's padded mini-batches (`batch_bytes`): 3 clients × 2 steps × 8 rows × (8 + 4 bytes of index and weight
# + 64 float32 features)
BATCHES = 3 * 2 * 8 * (12 + 4 * 64)


@pytest.mark.parametrize(
    ("changes", "row", "per_model"),
    [
        ({"algorithm": "fedavg"}, 0, 2),  # nothing kept; the cohort's models and updates
        ({"algorithm": "scaffold"}, P, 3),  # c_i kept, and its change Δc_i reported
        ({"algorithm": "ditto"}, P, 2),  # the whole personal model kept
        ({"algorithm": {"name": "fedrep", "personal": ["head"]}}, 8 * 10 + 10, 2),  # the head kept
        ({"local": {**BASE["local"], "optimizer": {"name": "adam", "persistent": True}}}, 2 * P + 1, 4),  # m, v, t
    ],
)
def test_the_footprint_is_what_the_clients_keep_and_the_cohort_uses(
    changes: dict[str, Any], row: int, per_model: int
) -> None:
    exp = build(parse_config({**BASE, **changes}))
    found = footprint(exp)
    assert (found.params, found.clients, found.cohort_size) == (P, 6, 3)
    assert found.state_row == 4 * row and found.state == 6 * 4 * row
    assert found.cohort == per_model * 3 * P * 4 + BATCHES
    assert found.needed == found.state + found.cohort
    # the digits: 1,797 samples of 64 float32 features and an int64 label, the offsets of the train and test splits
    assert found.data == 1797 * (64 * 4 + 8) + 2 * 7 * 8
    assert exp.engine.client_state.keys() == []  # planning took nothing of the run's


def test_the_memory_allowed_comes_from_the_environment_or_the_machine(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(MEMORY_LIMIT_ENV, "1.5")
    assert available_bytes() == int(1.5 * MB)
    monkeypatch.setenv(MEMORY_LIMIT_ENV, "lots")
    with pytest.raises(ConfigError, match="is not a number of MB"):
        available_bytes()
    monkeypatch.delenv(MEMORY_LIMIT_ENV)
    found = available_bytes()
    assert found is None or found > 0


def test_a_run_that_does_not_fit_is_refused_before_anything_is_written(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    # SCAFFOLD on 6 clients: state 6 × 2,440 bytes; a cohort of 3: 3 × 3 × 2,440 + 12,864 bytes = 34,824; 0.04 MB
    monkeypatch.setenv(MEMORY_LIMIT_ENV, "0.04")
    args = ["run", "--algorithm", "scaffold", "--rounds", "1", "--out", "run", "--model", "mlp"]
    args += ["--set", "model.hidden=[8]", "--set", "num_clients=6", "--set", "clients_per_round=3"]
    args += ["--set", "local.steps=2", "--set", "local.batch_size=8"]
    line = assert_refused(args, "this run needs at least 0.0 MB beyond its data", tmp_path)
    assert "(6 clients' state 0.0 MB, a cohort of 3 0.0 MB) and 0.0 MB are allowed (FEDHET_MEMORY_LIMIT_MB)" in line
    monkeypatch.setenv(MEMORY_LIMIT_ENV, "0.05")  # 49,464 bytes needed: it fits
    build(parse_config({**BASE, "algorithm": "scaffold"}))
