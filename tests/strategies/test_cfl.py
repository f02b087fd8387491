"""CFL (Sattler et al. 2020, Algorithm 1): FedAvg per cluster, a cluster bipartitioned by its updates' cosine
similarities once its mean update is small (< ε1) and some client's is large (> ε2)."""

from __future__ import annotations

import csv
from pathlib import Path

import pytest
import torch
from torch import Tensor

from fedhet.engine.engine import Engine
from fedhet.engine.plan import LocalResult
from fedhet.experiments.config import parse_config
from fedhet.experiments.runner import resume, run
from fedhet.strategies.cfl import CFL, bipartition, cosine_similarities, update_norms
from helpers.hostile import assert_refused
from helpers.tiny import linear_model, make_context, tiny_data

A = torch.tensor([2.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0])  # ‖a‖ = 2: above ε2 = 1.6


def test_update_norms_by_hand() -> None:
    updates = torch.tensor([[3.0, 4.0], [0.0, 0.0]])
    assert update_norms(updates, torch.tensor([0.5, 0.5])) == pytest.approx((2.5, 5.0))  # ‖(1.5, 2)‖, ‖(3, 4)‖
    assert update_norms(updates, torch.tensor([0.0, 1.0])) == pytest.approx((0.0, 5.0))


def test_cosine_similarities_by_hand() -> None:
    alpha = cosine_similarities(torch.tensor([[1.0, 0.0], [1.0, 1.0], [-2.0, 0.0], [0.0, 0.0]]))
    s = 2**-0.5
    expected = [[1, s, -1, 0], [s, 1, -s, 0], [-1, -s, 1, 0], [0, 0, 0, 0]]
    torch.testing.assert_close(alpha, torch.tensor(expected, dtype=torch.float64))


@pytest.mark.parametrize("linkage", ["complete", "single"])
def test_opposite_updates_are_bipartitioned_into_their_groups(linkage: str) -> None:
    gen = torch.Generator().manual_seed(0)
    u = torch.randn(6, generator=gen)
    noise = 0.1 * torch.randn(5, 6, generator=gen)
    signs = torch.tensor([1.0, -1.0, 1.0, 1.0, -1.0])  # interleaved groups {0, 2, 3}, {1, 4}
    second = bipartition(signs[:, None] * u + noise, linkage)  # type: ignore[arg-type]
    assert second.tolist() == [False, True, False, False, True]  # the half of client 0 first
    assert bipartition(torch.tensor([[1.0, 0.0], [0.0, 1.0]])).tolist() == [False, True]  # two: one each


def _cfl(**settings: object) -> tuple[CFL, Engine]:
    """CFL over four tiny clients of 4 samples each (equal weights), all in every round."""
    strategy = CFL(**settings)
    engine = Engine(linear_model(dim=3), tiny_data([4, 4, 4, 4], dim=3), backend="sequential", seed=0)
    strategy.setup(make_context(engine, m=4))
    return strategy, engine


def _result(w0: Tensor, updates: Tensor) -> LocalResult:
    m = len(updates)
    nan = torch.full((m,), float("nan"))
    return LocalResult(torch.arange(m), w0 + updates, nan, torch.ones(m), nan)


def test_opposite_updates_split_the_cluster_and_each_half_averages_its_own() -> None:
    """Δ = (a, a, −a, −a): the mean update is 0 < ε1 and ‖a‖ = 2 > ε2, so the cluster splits into {0, 1} and
    {2, 3}; both halves start from θ and average their own updates in the same round: θ + a and θ − a."""
    strategy, engine = _cfl()
    w0 = engine.initial_params()
    a = A[: len(w0)]
    w = strategy.aggregate(0, w0, _result(w0, torch.stack([a, a, -a, -a])))
    assert strategy.assignment.tolist() == [0, 0, 1, 1]
    torch.testing.assert_close(strategy.models, torch.stack([w0 + a, w0 - a]))
    torch.testing.assert_close(w, w0 + a)  # the largest cluster, ties to the lowest index
    assert strategy.round_metrics()["clusters"] == 2
    assert strategy.round_metrics()["update_norm_mean"] == pytest.approx(0.0)
    assert strategy.round_metrics()["update_norm_max"] == pytest.approx(2.0)


@pytest.mark.parametrize(
    ("signs", "why"),
    [
        ([1, 1, 1, 1], "aligned: the mean update is as long as each, 2 > ε1"),
        ([1, 1, 1, -1], "three against one: the mean is 1 > ε1"),
    ],
)
def test_no_split_while_the_mean_update_is_large(signs: list[float], why: str) -> None:
    strategy, engine = _cfl()
    w0 = engine.initial_params()
    a = A[: len(w0)]
    updates = torch.tensor(signs)[:, None] * a
    w = strategy.aggregate(0, w0, _result(w0, updates))
    assert strategy.assignment.tolist() == [0, 0, 0, 0], why
    torch.testing.assert_close(w, w0 + updates.mean(0))  # FedAvg of the one cluster


@pytest.mark.parametrize(
    ("settings", "why"),
    [
        ({"eps2": 2.5}, "no client's update is above ε2"),
        ({"min_size": 5}, "fewer updates than min_size"),
        ({"min_rounds": 1}, "the cluster is younger than min_rounds"),
        ({"max_clusters": 1}, "no room for a second cluster"),
    ],
)
def test_the_split_conditions(settings: dict[str, object], why: str) -> None:
    strategy, engine = _cfl(**settings)
    w0 = engine.initial_params()
    a = A[: len(w0)]
    strategy.aggregate(0, w0, _result(w0, torch.stack([a, a, -a, -a])))
    assert len(strategy.models) == 1, why


def test_members_absent_at_a_split_are_placed_by_their_lowest_loss() -> None:
    strategy, engine = _cfl()
    w0 = engine.initial_params()
    a = A[: len(w0)]
    result = _result(w0, torch.stack([a, -a, 0.1 * a]))  # clients 0..2 trained (mean 0.07 < ε1); 3 did not
    strategy.aggregate(0, w0, result)
    assert strategy.assignment.tolist() == [0, 1, 0, -1]
    plan = strategy.personalization(torch.arange(4))
    assert plan.starts is not None
    losses = [float(engine.losses_at(theta, torch.tensor([3]), "train")[0]) for theta in strategy.models]
    best = min(range(2), key=losses.__getitem__)
    torch.testing.assert_close(plan.starts[3], strategy.models[best])
    torch.testing.assert_close(plan.starts[:3], strategy.models[torch.tensor([0, 1, 0])])


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


def test_cfl_that_never_splits_is_fedavg(tmp_path: Path) -> None:
    run(parse_config(_config("fedavg")), tmp_path / "fedavg")
    run(parse_config(_config({"name": "cfl", "eps2": 1e6})), tmp_path / "cfl")
    fedavg, cfl = _rows(tmp_path / "fedavg"), _rows(tmp_path / "cfl")
    assert len(fedavg) == len(cfl) == 3
    for a, b in zip(fedavg, cfl, strict=True):
        assert float(b["clusters"]) == 1
        for key, value in a.items():
            assert float(b[key]) == pytest.approx(float(value), rel=1e-6, abs=1e-6), key
        assert float(b["personal_test_accuracy"]) == pytest.approx(float(a["test_accuracy"]), abs=1e-6)


def test_resume_after_interruption_matches_uninterrupted(tmp_path: Path) -> None:
    """Splits every round (ε1 large, ε2 = 0), some members away: the tree, placements and models all resume."""
    from fedhet.experiments.callbacks import Callback
    from fedhet.experiments.runner import RunState

    class Interrupt(Callback):
        def on_round_end(self, state: RunState, metrics: dict[str, float] | None) -> bool:
            if state.round == 2:
                raise KeyboardInterrupt
            return False

    algorithm = {"name": "cfl", "eps1": 1e3, "eps2": 0, "min_size": 2}
    cfg = parse_config(_config(algorithm, rounds=4, shift={"name": "rotation", "groups": 2}))
    run(cfg, tmp_path / "full")
    assert float(_rows(tmp_path / "full")[-1]["clusters"]) > 2
    with pytest.raises(KeyboardInterrupt):
        run(cfg, tmp_path / "cut", callbacks=[Interrupt()])
    resume(tmp_path / "cut")
    for name in ("metrics.csv", "clients.csv"):
        assert (tmp_path / "cut" / name).read_text() == (tmp_path / "full" / name).read_text()


FAST = ["--dataset", "digits", "--model", "logistic", "--rounds", "1", "--set", "num_clients=4"]


@pytest.mark.parametrize(
    ("flags", "fragment"),
    [
        (["--set", "algorithm.eps1=0"], "eps1"),
        (["--set", "algorithm.eps2=-1"], "eps2"),
        (["--set", "algorithm.min_size=1"], "min_size"),
        (["--set", "algorithm.max_clusters=0"], "max_clusters"),
        (["--set", "algorithm.linkage=ward"], "linkage"),
        (["--set", "algorithm.server_optimizer=adam"], "cfl with max_clusters > 1"),
    ],
)
def test_bad_settings_are_refused_in_one_line(
    flags: list[str], fragment: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    assert_refused(["run", "--algorithm", "cfl", *FAST, *flags, "--out", "r"], fragment, tmp_path)
