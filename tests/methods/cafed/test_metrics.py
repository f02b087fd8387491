"""CA-Fed's metrics: time average, second-half std, importance, α-weighted accuracy, availability.npz."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from fedhet.experiments.config import parse_config
from fedhet.experiments.participation import PARTICIPATION_FILE
from fedhet.experiments.runner import resume, run
from fedhet.methods.cafed.metrics import (
    cumulative_importance,
    excluded_share,
    importance,
    second_half_std,
    time_average,
)


def test_summaries_by_hand() -> None:
    np.testing.assert_allclose(time_average([0.2, 0.4, 0.9]), [0.2, 0.3, 0.5])
    # rounds 3 and 4 are after T/2 = 2: std of (0.5, 0.7) = 0.1
    assert second_half_std([1, 2, 3, 4], [0.1, 0.3, 0.5, 0.7], 4) == pytest.approx(0.1)
    weights = np.array([[1.0, 0.0, 3.0], [1.0, 2.0, 1.0]])
    np.testing.assert_allclose(importance(weights), [0.25, 0.25, 0.5])


def small_config(**changes: object) -> dict[str, object]:
    availability = {"name": "cafed_classes", "g": 0.3}
    raw = {
        "algorithm": {"name": "cafed", "oracle": availability},
        "dataset": {"name": "cafed_synthetic", "clients": 8, "samples": 40},
        "partition": "natural",
        "model": "logistic",
        "availability": availability,
        "metrics": ["alpha_accuracy"],
        "num_clients": 8,
        "test_fraction": 0.25,
        "rounds": 6,
        "local": {"steps": 2, "lr": 0.1, "batch_size": 8},
    }
    raw.update(changes)
    return raw


def test_run_logs_alpha_accuracy_and_participation(tmp_path: Path) -> None:
    state = run(parse_config(small_config()), tmp_path / "run")  # every run folder gets availability.npz
    history = state.history
    accuracy = [row["alpha_test_accuracy"] for row in history]
    # equal client sizes: α-weighted accuracy is the client mean
    assert accuracy[-1] == pytest.approx(history[-1]["test_accuracy"])
    assert history[-1]["time_avg_accuracy"] == pytest.approx(np.mean(accuracy))
    assert history[-1]["max_accuracy"] == pytest.approx(max(accuracy))
    assert history[-1]["second_half_std"] == pytest.approx(np.std(accuracy[3:]))
    with np.load(tmp_path / "run" / PARTICIPATION_FILE) as saved:
        assert saved["active"].shape == (6, 8) and saved["weights"].shape == (6, 8)
        assert (saved["selected"] <= saved["active"]).all()
        np.testing.assert_allclose(saved["alpha"], 1 / 8)
        np.testing.assert_allclose(np.unique(saved["pi"]), [0.2, 0.8])
        assert saved["group"].tolist() == [0] * 4 + [1] * 4
        for t, row in enumerate(history):
            assert row["selected"] == saved["selected"][t].sum()


def test_a_run_with_nothing_to_log_writes_no_participation_file(tmp_path: Path) -> None:
    run(parse_config({"rounds": 1, "num_clients": 4, "clients_per_round": 2}), tmp_path / "run")
    assert (tmp_path / "run" / "metrics.csv").is_file()
    assert not (tmp_path / "run" / PARTICIPATION_FILE).exists()


def test_resume_repeats_the_uninterrupted_run(tmp_path: Path) -> None:
    full = run(parse_config(small_config()), tmp_path / "full")
    run(parse_config(small_config(rounds=3)), tmp_path / "part")
    config = (tmp_path / "part" / "config.yaml").read_text().replace("rounds: 3", "rounds: 6")
    (tmp_path / "part" / "config.yaml").write_text(config)
    resumed = resume(tmp_path / "part")
    assert resumed.history[-1]["alpha_test_accuracy"] == full.history[-1]["alpha_test_accuracy"]
    assert (resumed.params == full.params).all()


def test_cumulative_importance_and_excluded_share_by_hand() -> None:
    weights = np.array([[0.0, 0.0], [1.0, 3.0], [1.0, 0.0]])
    np.testing.assert_allclose(cumulative_importance(weights), [[0, 0], [0.25, 0.75], [0.4, 0.6]])
    np.testing.assert_allclose(cumulative_importance(weights)[-1], importance(weights))
    active = np.array([[1, 1, 0], [1, 0, 0], [1, 1, 0]], dtype=bool)
    selected = np.array([[1, 0, 0], [0, 0, 0], [1, 1, 0]], dtype=bool)
    np.testing.assert_allclose(excluded_share(active, selected), [1 / 3, 1 / 2, np.nan])
