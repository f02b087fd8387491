"""FedMGDA+, FedMGDA and FedAvg-n (Hu et al., Algorithm 1): hand-computed steps and the ε = 0 ↔ FedAvg identity."""

from __future__ import annotations

import functools
import warnings

import pytest
import torch

from fedhet.engine.engine import Engine
from fedhet.engine.plan import LocalResult
from fedhet.errors import ConfigError
from fedhet.experiments.config import parse_config
from fedhet.experiments.runner import run
from fedhet.methods.fedmgda import strategy as fedmgda
from fedhet.methods.fedmgda.min_norm import solve_min_norm
from fedhet.methods.fedmgda.strategy import (
    FedAvgN,
    FedMGDA,
    FedMGDAPlus,
    beta_for_decay,
    mgda_weights,
    normalise_updates,
    step_size,
)
from fedhet.strategies.base import STRATEGIES
from fedhet.strategies.fedavg import FedAvg
from helpers.tiny import linear_model, make_context, tiny_data


def result_from_updates(clients: list[int], w: torch.Tensor, updates: torch.Tensor) -> LocalResult:
    m = len(clients)
    return LocalResult(torch.tensor(clients), w - updates, torch.zeros(m), torch.full((m,), 2), torch.full((m,), 0.1))


def setup(strategy: FedMGDAPlus | FedAvg, sizes: list[int], dim: int = 2) -> FedMGDAPlus | FedAvg:
    engine = Engine(linear_model(dim=dim, classes=2), tiny_data(sizes, dim=dim))
    strategy.setup(make_context(engine, m=len(sizes)))
    return strategy


def test_normalise_updates_unit_rows_and_zero_row() -> None:
    u = torch.tensor([[3.0, 4.0], [0.0, 0.0], [0.0, -2.0]])
    torch.testing.assert_close(normalise_updates(u), torch.tensor([[0.6, 0.8], [0.0, 0.0], [0.0, -1.0]]))


def test_step_size_schedule_and_beta() -> None:
    assert step_size(2.0, 0.5, 0) == 2.0
    assert step_size(2.0, 0.5, 99) == 2.0
    assert step_size(2.0, 0.5, 100) == 1.0
    assert step_size(2.0, 0.5, 250) == 0.5
    assert beta_for_decay(1 / 10, 2000) == pytest.approx(0.8913, abs=1e-4)  # the note's worked table
    assert beta_for_decay(1 / 3, 500) == pytest.approx(0.8027, abs=1e-4)
    assert beta_for_decay(0.0, 2000) == 1.0 and beta_for_decay(1.0, 2000) == 1.0  # "decay = 0": none


def test_fedmgda_plus_step_by_hand() -> None:
    """Normalised e1, e2 → MGDA λ = (½, ½), d = (½, ½); η_t = 2 · 0.5^⌊250/100⌋ = 0.5."""
    strategy = setup(FedMGDAPlus(server_lr=2.0, lr_decay=0.5), [4, 4])
    w = torch.tensor([1.0, 1.0, 0.0, 0.0, 0.0, 0.0])
    updates = torch.zeros(2, 6)
    updates[0, 0], updates[1, 1] = 5.0, 0.2
    new = strategy.aggregate(250, w, result_from_updates([0, 1], w, updates))
    torch.testing.assert_close(new, torch.tensor([0.75, 0.75, 0.0, 0.0, 0.0, 0.0]))
    metrics = strategy.round_metrics()
    assert metrics["server_step"] == 0.5 and metrics["mgda_lambda_max"] == pytest.approx(0.5)
    assert metrics["mgda_direction_norm"] == pytest.approx(0.5**0.5)


def test_fedmgda_unnormalised_min_norm_by_hand() -> None:
    """g1 = (2, 0), g2 = (0, 1): min 4λ1² + λ2² on the simplex → λ = (1/5, 4/5), d = (0.4, 0.8)."""
    strategy = setup(FedMGDA(), [4, 4])
    w = torch.zeros(6)
    updates = torch.zeros(2, 6)
    updates[0, 0], updates[1, 1] = 2.0, 1.0
    new = strategy.aggregate(0, w, result_from_updates([0, 1], w, updates))
    torch.testing.assert_close(new[:2], torch.tensor([-0.4, -0.8]))
    # ε = 0.1 around ½: λ1 is clipped to 0.4, d = (0.8, 0.6)
    boxed = setup(FedMGDA(epsilon=0.1), [4, 4])
    new = boxed.aggregate(0, w, result_from_updates([0, 1], w, updates))
    torch.testing.assert_close(new[:2], torch.tensor([-0.8, -0.6]))


def test_box_centre_by_data_size() -> None:
    """Centre λ0 = (0.2, 0.8) by sizes 1:4; ε = 0.1 → λ ∈ [0.1, 0.3] × [0.7, 0.9]."""
    w = torch.zeros(6)
    updates = torch.zeros(2, 6)
    updates[0, 0], updates[1, 1] = 1.0, 1.0  # unconstrained MGDA wants (½, ½)
    strategy = setup(FedMGDAPlus(weighting="samples", epsilon=0.1), [2, 8])
    new = strategy.aggregate(0, w, result_from_updates([0, 1], w, updates))
    torch.testing.assert_close(new[:2], torch.tensor([-0.3, -0.7]))
    uniform = setup(FedMGDAPlus(epsilon=0.1), [2, 8])  # the authors' uniform centre: (½, ½) is inside the box
    torch.testing.assert_close(
        uniform.aggregate(0, w, result_from_updates([0, 1], w, updates))[:2], -torch.full((2,), 0.5)
    )


@pytest.mark.parametrize("weighting", ["samples", "uniform"])
def test_epsilon_zero_without_normalisation_is_fedavg_exactly(weighting: str) -> None:
    data = tiny_data([5, 9, 3, 7], dim=3, seed=4)
    engine = Engine(linear_model(), data)
    fedavg, mgda = FedAvg(weighting=weighting), FedMGDAPlus(epsilon=0.0, normalize=False, weighting=weighting)
    for s in (fedavg, mgda):
        s.setup(make_context(engine, steps=4, lr=0.3, batch=2, m=4))
    w = engine.initial_params()
    clients = torch.tensor([0, 1, 2, 3])
    result = engine.train(w, fedavg.configure(0, clients, w), 0)
    assert torch.equal(fedavg.aggregate(0, w, result), mgda.aggregate(0, w, result))


def test_epsilon_zero_runs_identical_to_fedavg() -> None:
    base = {
        "dataset": "digits",
        "partition": {"name": "shards", "shards_per_client": 2},
        "model": "logistic",
        "num_clients": 8,
        "clients_per_round": 3,
        "rounds": 4,
        "local": {"steps": 3, "lr": 0.1, "batch_size": 10},
        "seed": 1,
    }
    avg = run(parse_config({**base, "algorithm": {"name": "fedavg", "weighting": "uniform"}}))
    mgda = run(parse_config({**base, "algorithm": {"name": "fedmgda", "epsilon": 0.0}}))
    assert torch.equal(avg.params, mgda.params)
    assert avg.final["test_accuracy"] == mgda.final["test_accuracy"]


def test_fedavg_n_is_mean_of_normalised_updates() -> None:
    strategy = setup(FedAvgN(server_lr=1.5), [3, 3, 6])
    w = torch.ones(6)
    updates = torch.zeros(3, 6)
    updates[0, 0], updates[1, 0], updates[2, 1] = 4.0, 0.5, -2.0
    new = strategy.aggregate(0, w, result_from_updates([0, 1, 2], w, updates))
    expected = w.clone()
    expected[0] -= 1.5 * 2 / 3
    expected[1] += 1.5 / 3
    torch.testing.assert_close(new, expected)


def test_normalised_direction_ignores_update_scale() -> None:
    """Scaling one client's update (the scaling attack, k = r = 1) leaves FedMGDA+ and FedAvg-n unchanged."""
    torch.manual_seed(0)
    w = torch.randn(6)
    updates = torch.randn(3, 6)
    attacked = updates.clone()
    attacked[1] *= 100.0
    for strategy in (FedMGDAPlus(epsilon=0.3), FedAvgN()):
        setup(strategy, [4, 4, 4])
        clean = strategy.aggregate(0, w, result_from_updates([0, 1, 2], w, updates))
        torch.testing.assert_close(strategy.aggregate(0, w, result_from_updates([0, 1, 2], w, attacked)), clean)
    plain = setup(FedAvg(weighting="uniform"), [4, 4, 4])
    clean = plain.aggregate(0, w, result_from_updates([0, 1, 2], w, updates))
    assert not torch.allclose(plain.aggregate(0, w, result_from_updates([0, 1, 2], w, attacked)), clean)


def test_common_descent_every_participant_improves_to_first_order() -> None:
    """With ε = 1, ⟨d, ḡ_i⟩ ≥ ‖d‖² > 0 for every client: a small step lowers every local linearisation."""
    torch.manual_seed(1)
    strategy = setup(FedMGDAPlus(server_lr=1.0), [4] * 5)
    w = torch.zeros(6)
    updates = torch.randn(5, 6) + 2.0
    new = strategy.aggregate(0, w, result_from_updates([0, 1, 2, 3, 4], w, updates))
    d = w - new
    inner = normalise_updates(updates) @ d
    assert bool((inner >= d @ d - 1e-6).all()) and float(d @ d) > 0


def test_prox_mu_reaches_the_local_plan_and_switches_are_validated() -> None:
    strategy = setup(FedMGDAPlus(prox_mu=0.2), [4, 4])
    plan = strategy.configure(0, torch.tensor([0, 1]), torch.zeros(6))
    assert [(t.name, t.model_dump()) for t in plan.terms] == [("proximal", {"mu": 0.2})]
    with pytest.raises(ConfigError):
        STRATEGIES.build({"name": "fedmgda", "normalize": True})
    with pytest.raises(ConfigError):
        STRATEGIES.build({"name": "fedavg_n", "epsilon": 0.5})
    assert STRATEGIES.build("fedmgda_plus").weighting == "uniform"  # the authors' centre 1/n


def test_scaling_attack_with_one_local_step_leaves_normalised_methods_unchanged() -> None:
    """f ← s·f for one client (§6.2.2) with k = r = 1: normalisation cancels s exactly, FedAvg follows the
    attacker."""
    base = {
        "dataset": "digits",
        "partition": {"name": "shards", "shards_per_client": 2},
        "model": "logistic",
        "num_clients": 6,
        "clients_per_round": 3,
        "rounds": 5,
        "local": {"steps": 1, "lr": 0.1, "batch_size": 400},
        "seed": 2,
    }
    attack = {"name": "malicious", "clients": [0], "loss_scale": 100.0, "always_participate": True}
    for algorithm in ({"name": "fedmgda_plus", "epsilon": 0.5}, {"name": "fedavg_n"}):
        clean = run(parse_config({**base, "algorithm": algorithm, "attack": {**attack, "loss_scale": 1.0}}))
        attacked = run(parse_config({**base, "algorithm": algorithm, "attack": attack}))
        torch.testing.assert_close(attacked.params, clean.params, atol=1e-6, rtol=1e-5)
    clean = run(parse_config({**base, "algorithm": "fedavg", "attack": {**attack, "loss_scale": 1.0}}))
    attacked = run(parse_config({**base, "algorithm": "fedavg", "attack": attack}))
    assert float((attacked.params - clean.params).abs().max()) > 0.1


def test_degenerate_cohorts_never_stop_a_round() -> None:
    """Issue 13: nearly parallel updates made the min-norm QP raise late in a FedMGDA+ run. Nearly parallel,
    duplicated and zero updates now aggregate to a finite model with λ on the simplex and no warning."""
    gen = torch.Generator().manual_seed(3)
    base = torch.randn(6, generator=gen)
    cohorts = [base + spread * torch.randn(8, 6, generator=gen) for spread in (1e-2, 1e-3, 1e-4)]  # cos ≈ 1 − 1e-8
    cohorts.append(torch.stack([base, base, torch.zeros(6), base, -base, torch.zeros(6), base, base]))
    w = torch.zeros(6)
    for updates in cohorts:
        for strategy in (FedMGDAPlus(epsilon=1.0), FedMGDAPlus(epsilon=0.05), FedMGDA(epsilon=0.3)):
            setup(strategy, [4] * 8)
            with warnings.catch_warnings():
                warnings.simplefilter("error")
                new = strategy.aggregate(0, w, result_from_updates(list(range(8)), w, updates))
            lam = strategy._lambda.double()
            assert bool(torch.isfinite(new).all()) and abs(float(lam.sum()) - 1.0) < 1e-6 and float(lam.min()) >= 0


def test_mgda_weights_on_huge_non_finite_and_unconverged_updates(monkeypatch: pytest.MonkeyPatch) -> None:
    center = torch.full((3,), 1 / 3)
    # float64 updates of size 1e200: ⟨g_i, g_j⟩ would overflow; λ* is that of the same updates at size 1
    updates = torch.tensor([[1.0, 0.0], [0.0, 2.0], [1.0, 1.0]], dtype=torch.float64)
    torch.testing.assert_close(mgda_weights(updates * 1e200, center, 1.0), mgda_weights(updates, center, 1.0))
    # a diverged client (nan update): λ0 with a warning, the nan reaches the model as it would with FedAvg
    with pytest.warns(RuntimeWarning, match="inf/nan"):
        lam = mgda_weights(torch.tensor([[1.0, 0.0], [float("nan"), 1.0], [0.0, 1.0]]), center, 1.0)
    torch.testing.assert_close(lam, center)
    # the solver stopped at its iteration cap: its best feasible λ is used, with a warning
    monkeypatch.setattr(fedmgda, "solve_min_norm", functools.partial(solve_min_norm, max_iter=1))
    gen = torch.Generator().manual_seed(5)
    with pytest.warns(RuntimeWarning, match="best feasible"):
        lam = mgda_weights(torch.randn(12, 20, generator=gen) + 1.0, torch.full((12,), 1 / 12), 1.0)
    assert abs(float(lam.sum()) - 1.0) < 1e-6 and float(lam.min()) >= 0
