"""GSNR contribution scores: summary over rounds, agreement with FedGSNR, and flipped-label clients rank last."""

from __future__ import annotations

import csv
import math
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch

from fedhet.engine.threads import torch_threads
from fedhet.experiments.config import parse_config
from fedhet.experiments.runner import run
from fedhet.methods.fedgsnr.contribution import Contribution, contribution_scores

SMALL = {
    "dataset": "digits",
    "partition": "iid",
    "model": {"name": "mlp", "hidden": [16]},
    "num_clients": 10,
    "clients_per_round": 10,
    "rounds": 8,
    "local": {"steps": 10, "lr": 0.1, "batch_size": 10},
}


def test_scores_skip_rounds_without_a_measurement() -> None:
    history = torch.tensor([[1.0, float("nan")], [3.0, 2.0], [8.0, 4.0]], dtype=torch.float64)
    torch.testing.assert_close(contribution_scores(history), torch.tensor([4.0, 3.0], dtype=torch.float64))
    torch.testing.assert_close(contribution_scores(history, "median"), torch.tensor([3.0, 2.0], dtype=torch.float64))
    assert bool(contribution_scores(torch.zeros(0, 3)).isnan().all())


@pytest.fixture(autouse=True)
def one_thread() -> Iterator[None]:
    with torch_threads(1):  # a 1,210-parameter model: extra torch threads only contend
        yield


@pytest.mark.parametrize("mapping", ["shift", "random"])
def test_a_client_with_corrupted_labels_ranks_below_the_clean_ones(mapping: str) -> None:
    """Fig. 6(a): on IID data the client whose labels are shifted (l → l + 1) or replaced by random ones has the
    lowest score, for every seed (6 of 6 tried)."""
    for seed in (0, 1, 2):
        raw = {
            **SMALL,
            "seed": seed,
            "label_noise": {"fraction": 0.1, "mapping": mapping},
            "metrics": [{"name": "contribution", "samples": 64}],
        }
        state = run(parse_config(raw))
        scores = state.client_columns["contribution"]
        corrupted = state.experiment.data.info["corrupted"]
        assert int(corrupted.sum()) == 1
        assert float(scores[corrupted].max()) < float(scores[~corrupted].min()), (seed, scores)
        plugin = state.experiment.metrics[0]
        assert isinstance(plugin, Contribution)
        rounds, history = plugin.history()
        assert rounds.tolist() == [float(r) for r in range(1, 9)] and history.shape == (8, 10)
        assert bool((history >= 0).all())


def test_label_shift_lowers_the_clients_own_score_under_nonbalance() -> None:
    """Fig. 6(b): under NonBalance the shifted client is not always the lowest (clients holding two classes score
    low anyway), but its score falls below what the same client scores with its true labels (5 of 5 seeds)."""
    for seed in (0, 1, 2):
        scores = {}
        for fraction in (0.1, 0.0):
            raw = {
                **SMALL,
                "seed": seed,
                "partition": {"name": "nonbalance"},
                "label_noise": {"fraction": fraction, "mapping": "shift"},
                "metrics": [{"name": "contribution", "samples": 64}],
            }
            state = run(parse_config(raw))
            scores[fraction] = state.client_columns["contribution"]
            if fraction:
                corrupted = state.experiment.data.info["corrupted"]
        assert float(scores[0.1][corrupted]) < float(scores[0.0][corrupted]), seed


def test_metric_sees_what_fedgsnr_sees_resumes_and_writes_the_run_folder(tmp_path: Path) -> None:
    raw = {**SMALL, "rounds": 3, "algorithm": {"name": "gsnr"}, "metrics": ["contribution"]}
    state = run(parse_config(raw), tmp_path)
    strategy_r = state.experiment.strategy.last_allocation()["gsnr"]  # type: ignore[attr-defined]
    # full participation: same model, same samples, same global statistics → same r
    torch.testing.assert_close(state.client_columns["contribution_last"], strategy_r)
    assert state.final["contribution_round_mean"] == pytest.approx(state.final["gsnr_mean"])
    plugin = state.experiment.metrics[0]
    copy = Contribution()
    copy.load_state_dict(plugin.state_dict())
    torch.testing.assert_close(copy.history()[1], plugin.history()[1])  # type: ignore[attr-defined]
    assert not math.isnan(float(state.client_columns["contribution_nopt"].mean()))
    with (tmp_path / "contribution.csv").open() as f:
        rows = list(csv.DictReader(f))
    assert len(rows) == 3 * 10 and rows[-1]["round"] == "3" and rows[-1]["client"] == "9"
    last = torch.tensor([float(row["gsnr"]) for row in rows[-10:]], dtype=torch.float64)
    torch.testing.assert_close(last, strategy_r)
    assert (tmp_path / "contribution.png").stat().st_size > 5_000
