"""`fedhet run --engine flower`: Flower's simulation runtime reaches the native engine's metrics.

Tolerance: 1e-5 relative (absolute below 1) on every metrics.csv value. The nodes run the same engine on the same
mini-batch streams, so the only differences are float reductions in another order (vectorised vs per-node
cohorts); measured differences are ~1e-7.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from flower_helpers import assert_same_metrics, read_metrics, small_config

from fedhet.experiments.runner import run
from fedhet.flower.simulation import simulate


@pytest.mark.parametrize("algorithm", ["fedavg", {"name": "maxfl", "finetune_steps": 2}], ids=["fedavg", "maxfl"])
def test_simulation_matches_native(tmp_path: Path, algorithm: object) -> None:
    config = small_config(algorithm, requirements={"steps": 5})
    run(config, tmp_path / "native")
    state = simulate(config, tmp_path / "flower", nodes=2, timeout=120)
    assert state.status == "finished"
    assert_same_metrics(read_metrics(tmp_path / "native"), read_metrics(tmp_path / "flower"))
    for name in ("config.yaml", "metrics.csv", "clients.csv", "summary.json"):
        assert (tmp_path / "flower" / name).is_file()
    summary = json.loads((tmp_path / "flower" / "summary.json").read_text())
    assert summary["engine"] == "flower" and summary["nodes"] == 2 and summary["nodes_lost"] == []
    assert (tmp_path / "native" / "config.yaml").read_text() == (tmp_path / "flower" / "config.yaml").read_text()


@pytest.mark.parametrize(
    ("algorithm", "extra"),
    [
        ("ditto", {}),
        ("fedrep", {"model": {"name": "mlp", "hidden": [8]}}),
        ("apfl", {}),
        ({"name": "fedavg_ft", "finetune_steps": 2}, {}),
    ],
    ids=["ditto", "fedrep", "apfl", "fedavg_ft"],
)
def test_personal_models_on_the_simulation_runtime_match_native(
    tmp_path: Path, algorithm: object, extra: dict[str, object]
) -> None:
    """Issue 48: a node's messages go to whichever Ray actor is free, and the personalised columns came from the
    state the answering actor last trained (another node's round, or none). Every column, personalised ones
    included, within the tolerance of the native run; Ditto's run twice gives the same numbers."""
    config = small_config(algorithm, **extra)
    run(config, tmp_path / "native")
    simulate(config, tmp_path / "flower", nodes=3, timeout=120)
    native, flower = read_metrics(tmp_path / "native"), read_metrics(tmp_path / "flower")
    assert "personal_test_accuracy" in native[0]
    assert_same_metrics(native, flower)
    if algorithm == "ditto":
        simulate(config, tmp_path / "again", nodes=3, timeout=120)
        assert_same_metrics(flower, read_metrics(tmp_path / "again"), tol=0)


def test_flowers_own_secagg_on_the_simulation_runtime_gives_the_simulated_secagg_numbers(tmp_path: Path) -> None:
    """`algorithm.protocol: flower`: Flower's SecAgg+ workflow and mod between the simulated nodes (one client each,
    any Ray actor answering any node's message) against fedhet's simulated secure aggregation (docs/secagg.md)."""
    config = small_config({"name": "secagg", "protocol": "flower"}, rounds=2)
    run(small_config("secagg", rounds=2), tmp_path / "native")
    state = simulate(config, tmp_path / "flower", nodes=6, timeout=120)
    assert state.status == "finished"
    rows = read_metrics(tmp_path / "flower")
    assert all(float(r["secagg_failed"]) == 0 and float(r["secagg_dropouts"]) == 0 for r in rows)
    assert_same_metrics(read_metrics(tmp_path / "native"), rows)
