"""GSNR contribution scores: summary over rounds, agreement with FedGSNR, and flipped-label clients rank last."""

from __future__ import annotations

import math

import pytest
import torch

from fedhet.experiments.config import parse_config
from fedhet.experiments.runner import run
from fedhet.metrics.contribution import Contribution, contribution_scores

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


@pytest.mark.parametrize(("seed", "mapping"), [(0, "shift"), (2, "random")])
def test_a_client_with_corrupted_labels_ranks_below_the_clean_ones(seed: int, mapping: str) -> None:
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
    assert float(scores[corrupted].max()) < float(scores[~corrupted].min())
    assert int(scores.argmin()) == int(corrupted.nonzero()[0, 0])
    plugin = state.experiment.metrics[0]
    assert isinstance(plugin, Contribution)
    rounds, history = plugin.history()
    assert rounds.tolist() == [float(r) for r in range(1, 9)] and history.shape == (8, 10)
    assert bool((history >= 0).all())


def test_metric_sees_what_fedgsnr_sees_and_resumes() -> None:
    raw = {**SMALL, "rounds": 3, "algorithm": {"name": "gsnr"}, "metrics": ["contribution"]}
    state = run(parse_config(raw))
    strategy_r = state.experiment.strategy.last_allocation()["gsnr"]  # type: ignore[attr-defined]
    # full participation: same model, same samples, same global statistics → same r
    torch.testing.assert_close(state.client_columns["contribution_last"], strategy_r)
    assert state.final["contribution_round_mean"] == pytest.approx(state.final["gsnr_mean"])
    plugin = state.experiment.metrics[0]
    copy = Contribution()
    copy.load_state_dict(plugin.state_dict())
    torch.testing.assert_close(copy.history()[1], plugin.history()[1])  # type: ignore[attr-defined]
    assert not math.isnan(float(state.client_columns["contribution_nopt"].mean()))
