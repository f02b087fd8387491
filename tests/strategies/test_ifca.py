"""IFCA (Ghosh et al. 2020, Algorithm 2): cluster identity by the lowest loss, per-cluster model averaging."""

from __future__ import annotations

import csv
import math
from pathlib import Path

import pytest
import torch
from torch import Tensor

from fedhet.engine.functional import FlatModel
from fedhet.errors import ConfigError
from fedhet.experiments.config import parse_config
from fedhet.experiments.runner import resume, run
from fedhet.strategies.ifca import IFCA, assignment_ari, cluster_average, cluster_choice
from helpers.personal import SIZES, STEPS, TOL, data, run_round, setup, sgd


def test_each_client_chooses_the_model_with_its_lowest_loss() -> None:
    losses = torch.tensor([[1.0, float("nan"), 3.0, float("nan")], [2.0, 0.5, 3.0, float("nan")]])
    assert cluster_choice(losses).tolist() == [0, 1, 0, 0]  # NaN is +inf; ties go to the lowest index


def test_each_cluster_is_averaged_over_the_clients_that_chose_it() -> None:
    models = torch.tensor([[0.0, 0.0], [1.0, 1.0], [5.0, 5.0]])
    local = torch.tensor([[2.0, 0.0], [4.0, 3.0]])
    together = cluster_average(models, torch.tensor([1, 1]), local, torch.tensor([0.25, 0.75]))
    # cluster 1: 0.25·(2, 0) + 0.75·(4, 3) = (3.5, 2.25); clusters 0 and 2 nobody chose: kept
    torch.testing.assert_close(together, torch.tensor([[0.0, 0.0], [3.5, 2.25], [5.0, 5.0]]))
    apart = cluster_average(models, torch.tensor([2, 0]), local, torch.tensor([0.25, 0.75]))
    torch.testing.assert_close(apart, torch.tensor([[4.0, 3.0], [1.0, 1.0], [2.0, 0.0]]))  # weights renormalised
    half = cluster_average(models, torch.tensor([1, 1]), local, torch.tensor([0.25, 0.75]), lambda w, d: w - 0.5 * d)
    torch.testing.assert_close(half[1], torch.tensor([2.25, 1.625]))  # θ − η_g (θ − avg) with η_g = 0.5


def test_ari_of_the_chosen_clusters_against_the_groups() -> None:
    groups = torch.tensor([2, 2, 3, 3, 0])
    assert assignment_ari(torch.tensor([1, 1, 0, 0, -1]), groups) == pytest.approx(1.0)  # labels may differ
    assert assignment_ari(torch.tensor([0, 1, 0, 1, -1]), groups) == pytest.approx(-0.5)  # 2×2 crossed
    assert math.isnan(assignment_ari(torch.tensor([0, -1, -1, -1, -1]), groups))  # one client: undefined


def _loss(model: FlatModel, w: Tensor, k: int) -> float:
    x, y = data().train.client(k)
    return float(torch.nn.functional.cross_entropy(model.logits(w, x), y))


@pytest.mark.parametrize("backend", ["dense", "sequential"])
def test_two_clients_train_their_chosen_models_and_each_is_averaged(backend: str) -> None:
    """θ_1, θ_2 trained on client 0, 1 alone: each client picks the one with its lowest loss, trains it for its
    steps, and the cluster models become those of the clients that chose them (kept where none did)."""
    strategy = IFCA(k=3)
    engine = setup(strategy, backend)
    model = engine.model
    w0 = model.initial_params()
    own = [sgd(model, w0, k, 30, lr=0.5) for k in range(2)]
    models = torch.stack([own[0], own[1], w0])
    strategy._models = models.clone()
    choice = [min(range(3), key=lambda j, k=k: _loss(model, models[j], k)) for k in range(2)]
    assert choice == [0, 1]  # the construction: each client's own model fits it best
    _, w = run_round(strategy, engine, w0, 0)
    assert strategy.assignment.tolist() == choice
    expected = torch.stack([sgd(model, own[0], 0, STEPS), sgd(model, own[1], 1, STEPS), w0])
    torch.testing.assert_close(strategy.models, expected, **TOL)
    torch.testing.assert_close(w, expected[0], **TOL)  # a tie of the largest clusters: the lowest index
    plan = strategy.personalization(torch.tensor([0, 1]))
    assert plan.starts is not None
    torch.testing.assert_close(plan.starts, expected[:2], **TOL)  # each client's best cluster model, as trained
    both = IFCA(k=1)
    engine = setup(both, backend)
    _, w = run_round(both, engine, w0, 0)
    n = torch.tensor(SIZES, dtype=torch.float32)
    fedavg = (n[0] * sgd(model, w0, 0, STEPS) + n[1] * sgd(model, w0, 1, STEPS)) / n.sum()
    torch.testing.assert_close(w, fedavg, **TOL)


def test_cluster_models_start_apart_and_are_kept_in_the_state() -> None:
    strategy = IFCA(k=3)
    engine = setup(strategy, "sequential")
    w0 = engine.model.initial_params()
    models = strategy.models
    torch.testing.assert_close(models[0], w0)
    assert not torch.equal(models[1], w0) and not torch.equal(models[1], models[2])
    torch.testing.assert_close(models[1].sort().values, w0.sort().values)  # the same values, shuffled per parameter
    again = IFCA(k=3)
    setup(again, "sequential")
    torch.testing.assert_close(again.models, models)  # seeded
    again.load_state_dict({**strategy.state_dict(), "models": models + 1})
    torch.testing.assert_close(again.models, models + 1)


def _config(algorithm: object, **changes: object) -> dict:
    return {
        "algorithm": algorithm,
        "dataset": "digits",
        "model": "logistic",
        "num_clients": 8,
        "clients_per_round": 4,
        "rounds": 3,
        "local": {"steps": 3, "lr": 0.05, "batch_size": 8},
        "seed": 2,
        **changes,
    }


def _rows(folder: Path) -> list[dict[str, str]]:
    with (folder / "metrics.csv").open() as f:
        return list(csv.DictReader(f))


def test_ifca_with_one_cluster_is_fedavg(tmp_path: Path) -> None:
    run(parse_config(_config("fedavg")), tmp_path / "fedavg")
    run(parse_config(_config({"name": "ifca", "k": 1})), tmp_path / "ifca")
    fedavg, ifca = _rows(tmp_path / "fedavg"), _rows(tmp_path / "ifca")
    assert len(fedavg) == len(ifca) == 3
    for a, b in zip(fedavg, ifca, strict=True):
        for key, value in a.items():
            assert float(b[key]) == pytest.approx(float(value), rel=1e-6, abs=1e-6), key
        # its personalised model is its one cluster model, the global one
        assert float(b["personal_test_accuracy"]) == pytest.approx(float(a["test_accuracy"]), abs=1e-6)


def test_a_run_with_groups_reports_ari_and_per_group_accuracy(tmp_path: Path) -> None:
    shift = {"name": "rotation", "groups": 2}
    state = run(parse_config(_config({"name": "ifca", "k": 2}, shift=shift)), tmp_path / "r")
    row = _rows(tmp_path / "r")[-1]
    assert -1 <= float(row["ari"]) <= 1
    for prefix in ("test_accuracy", "personal_test_accuracy"):
        groups = [float(row[f"{prefix}_group{g}"]) for g in range(2)]
        assert float(row[f"{prefix}_worst_group"]) == min(groups)
    assert state.final["ari"] == pytest.approx(float(row["ari"]))
    plain = run(parse_config(_config({"name": "ifca", "k": 2})), tmp_path / "plain")
    assert "ari" not in plain.final and "test_accuracy_worst_group" not in plain.final  # no groups, no columns


def test_resume_after_interruption_matches_uninterrupted(tmp_path: Path) -> None:
    from fedhet.experiments.callbacks import Callback
    from fedhet.experiments.runner import RunState

    class Interrupt(Callback):
        def on_round_end(self, state: RunState, metrics: dict[str, float] | None) -> bool:
            if state.round == 2:
                raise KeyboardInterrupt
            return False

    cfg = parse_config(_config({"name": "ifca", "k": 2}, rounds=4, shift={"name": "rotation", "groups": 2}))
    run(cfg, tmp_path / "full")
    with pytest.raises(KeyboardInterrupt):
        run(cfg, tmp_path / "cut", callbacks=[Interrupt()])
    resume(tmp_path / "cut")
    for name in ("metrics.csv", "clients.csv"):
        assert (tmp_path / "cut" / name).read_text() == (tmp_path / "full" / name).read_text()


def test_a_stateful_server_optimiser_is_refused_for_several_clusters(tmp_path: Path) -> None:
    cfg = parse_config(_config({"name": "ifca", "k": 2, "server_optimizer": "momentum"}))
    with pytest.raises(ConfigError, match=r"server_optimizer 'momentum'.*ifca"):
        run(cfg, tmp_path / "r")
    assert not (tmp_path / "r").exists()
