"""CA-Fed (Algorithm 1): the greedy exclusion on a hand-computed case, the limits of κ̄², the loss reports."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from fedhet.engine.engine import Engine
from fedhet.engine.plan import LocalResult
from fedhet.methods.cafed.availability_aware import biased_importance, greedy_exclusion, proxy_error, tv_distance
from fedhet.methods.cafed.strategy import CAFed, cafed_weights, one_batch_losses
from fedhet.seeding import numpy_rng
from helpers.tiny import linear_model, make_context, tiny_data

# α = (1/2, 1/4, 1/4), π = (1, 1/2, 1/2): q = α/π = (1/2, 1/2, 1/2) and p = π ⊙~ q = α.
ALPHA = np.array([0.5, 0.25, 0.25])
PI = np.array([1.0, 0.5, 0.5])
LAM = np.array([0.0, 0.9, 0.5])  # pass 1 visits clients 1, 2, 0
GAP = np.array([0.0, 0.4, 0.1])  # F̂ − F̂*
GAMMA = 0.4  # Γ̂′ = max gap


def test_proxy_error_by_hand() -> None:
    q = ALPHA / PI
    np.testing.assert_allclose(biased_importance(PI, q), ALPHA)
    assert proxy_error(q, ALPHA, PI, GAP, GAMMA) == pytest.approx(0.4 * 0.25 + 0.1 * 0.25)  # d_TV = 0
    q1 = np.array([0.5, 0.0, 0.5])  # p = (2/3, 0, 1/3), d_TV = ½(1/6 + 1/4 + 1/12) = 1/4
    assert tv_distance(ALPHA, biased_importance(PI, q1)) == pytest.approx(0.25)
    assert proxy_error(q1, ALPHA, PI, GAP, GAMMA) == pytest.approx(0.1 / 3 + 0.25**2 * 0.4)
    assert proxy_error(q1, ALPHA, PI, GAP, GAMMA, bias_weight=3.0) == pytest.approx(0.1 / 3 + 3 * 0.25**2 * 0.4)


def test_greedy_exclusion_hand_computed() -> None:
    # ε̂(q) = 0.125. Pass 1 (λ̂ descending: 1, 2, 0):
    #   drop 1 → p = (2/3, 0, 1/3): ε̂⁺ = 0.1/3 + 0.0625·0.4 = 0.0583 < 0.125 → dropped;
    #   drop 2 → p = (1, 0, 0): ε̂⁺ = 0 + 0.25·0.4 = 0.1 > 0.0583 → kept;
    #   drop 0 → p = (0, 0, 1): ε̂⁺ = 0.1 + 0.5625·0.4 = 0.325 → kept.
    # Pass 2 (π̂ ascending: 1, 2, 0) changes nothing.
    q = cafed_weights(ALPHA, PI, LAM, GAP, GAMMA)
    np.testing.assert_allclose(q, [0.5, 0.0, 0.5])  # kept weights are not renormalised
    # τ above the gain of dropping client 1 (0.125 − 0.0583 = 0.0667): nobody is dropped
    np.testing.assert_allclose(cafed_weights(ALPHA, PI, LAM, GAP, GAMMA, tau=0.07), [0.5, 0.5, 0.5])
    # κ̄² = 0 (no bias penalty): 1 then 2 dropped, 0 kept as the last client with weight
    np.testing.assert_allclose(cafed_weights(ALPHA, PI, LAM, GAP, GAMMA, bias_weight=0.0), [0.5, 0.0, 0.0])
    # κ̄² → ∞: CA-Fed is Unbiased
    np.testing.assert_allclose(cafed_weights(ALPHA, PI, LAM, GAP, GAMMA, bias_weight=1e6), ALPHA / PI)


def test_greedy_order_matters() -> None:
    # visiting 2 first: drop 2 → p = (2/3, 1/3, 0): ε̂⁺ = 0.4/3 + 0.0625·0.4 = 0.158 > 0.125 → kept; then 1 dropped
    q = greedy_exclusion(ALPHA / PI, np.array([2, 1, 0]), ALPHA, PI, GAP, GAMMA)
    np.testing.assert_allclose(q, [0.5, 0.0, 0.5])
    # four equal clients, gaps (0.3, 0.3, 0, 0), Γ̂′ = 0.3, κ̄² = 2, ε̂ = 0.15: dropping either of the first two
    # gives 0.1 + 2·(1/4)²·0.3 = 0.1375; dropping the other one next gives 0 + 2·(1/2)²·0.3 = 0.15 > 0.1375.
    alpha, pi, gap, q = np.full(4, 0.25), np.ones(4), np.array([0.3, 0.3, 0.0, 0.0]), np.full(4, 0.25)
    first = greedy_exclusion(q, np.array([0, 1, 2, 3]), alpha, pi, gap, 0.3, bias_weight=2.0)
    second = greedy_exclusion(q, np.array([1, 0, 2, 3]), alpha, pi, gap, 0.3, bias_weight=2.0)
    np.testing.assert_allclose(first, [0.0, 0.25, 0.25, 0.25])
    np.testing.assert_allclose(second, [0.25, 0.0, 0.25, 0.25])
    abs_order = cafed_weights(ALPHA, PI, np.array([-0.95, 0.9, 0.0]), GAP, GAMMA, correlation_order="abs_lambda")
    np.testing.assert_allclose(abs_order, [0.5, 0.0, 0.5])


def test_ties_exclude_only_when_asked() -> None:
    zero = np.zeros(3)  # every F̂_k at its running minimum: ε̂ ≡ 0
    np.testing.assert_allclose(cafed_weights(ALPHA, PI, LAM, zero, 0.0), ALPHA / PI)
    literal = cafed_weights(ALPHA, PI, LAM, zero, 0.0, exclude_on_ties=True)
    np.testing.assert_allclose(literal, [0.5, 0.0, 0.0])  # all but the last one visited, never everyone


def engine_and_strategy(**params: object) -> tuple[Engine, CAFed]:
    engine = Engine(linear_model(), tiny_data([6, 8, 5, 7]))
    strategy = CAFed(oracle={"name": "markov", "pi": [0.9, 0.9, 0.1, 0.1], "lam": [0.0, 0.9, 0.0, 0.9]}, **params)
    strategy.setup(make_context(engine, batch=4))
    return engine, strategy


def test_one_batch_losses_match_a_manual_computation() -> None:
    engine, _ = engine_and_strategy()
    params = engine.initial_params() + 0.3
    clients = torch.tensor([1, 3])
    got = one_batch_losses(engine.model, engine.data.train, params, clients, 3, seed=0, round_=2)
    for i, k in enumerate((1, 3)):
        x, y = engine.data.train.client(k)
        rows = numpy_rng(0, "cafed-loss", 2, k).choice(len(y), size=3, replace=False)
        expected = engine.model.sample_losses(params, x[rows], y[rows]).mean()
        torch.testing.assert_close(got[i], expected)
    full = one_batch_losses(engine.model, engine.data.train, params, clients, 100, seed=0, round_=2)
    torch.testing.assert_close(full, engine.losses_at(params, clients))  # batch ≥ data: the full loss
    again = one_batch_losses(engine.model, engine.data.train, params, clients, 3, seed=0, round_=2)
    torch.testing.assert_close(got, again)


def test_select_trains_active_clients_with_weight_and_aggregates_eq3() -> None:
    engine, strategy = engine_and_strategy(loss_batch=0)
    available = torch.tensor([True, True, True, False])
    chosen = strategy.select(0, available)
    # first round: every F̂_k is at its minimum, nobody is excluded; q = α/π with α ∝ sizes (6, 8, 5, 7)/26
    alpha = np.array([6, 8, 5, 7]) / 26
    np.testing.assert_array_equal(chosen.numpy(), [0, 1, 2])
    np.testing.assert_allclose(strategy._q, alpha / np.array([0.9, 0.9, 0.1, 0.1]))
    np.testing.assert_allclose(strategy.losses.estimate[:3], engine.losses_at(engine.initial_params(), chosen))
    w = engine.initial_params()
    local = torch.stack([w + 1.0, w + 2.0, w - 1.0])
    result = LocalResult(chosen, local, torch.zeros(3), torch.full((3,), 2), torch.full((3,), 0.1))
    new = strategy.aggregate(0, w, result)
    q = alpha[:3] / np.array([0.9, 0.9, 0.1])
    expected = w + float(q[0] * 1.0 + q[1] * 2.0 - q[2] * 1.0)  # w + η_s Σ q_k Δ_k, η_s = 1, no normalisation
    torch.testing.assert_close(new, expected)
    metrics = strategy.round_metrics()
    assert metrics["selected"] == 3 and metrics["excluded"] == 0 and metrics["tv_alpha_p"] == pytest.approx(0)


def test_state_round_trip_gives_the_same_decisions() -> None:
    engine, strategy = engine_and_strategy()
    rng = np.random.default_rng(0)
    masks = [torch.as_tensor(rng.random(4) < 0.6) for _ in range(8)]
    w = engine.initial_params()
    for t, mask in enumerate(masks[:4]):
        chosen = strategy.select(t, mask)
        if len(chosen):
            shift = torch.randn(len(chosen), len(w), generator=torch.Generator().manual_seed(t))
            res = LocalResult(
                chosen, w + shift, torch.zeros(len(chosen)), torch.ones(len(chosen)), torch.ones(len(chosen))
            )
            w = strategy.aggregate(t, w, res)
    _, resumed = engine_and_strategy()
    resumed.load_state_dict(strategy.state_dict())
    for t, mask in enumerate(masks[4:], start=4):
        torch.testing.assert_close(strategy.select(t, mask), resumed.select(t, mask))
        np.testing.assert_array_equal(strategy._q, resumed._q)
    log = strategy.participation_log()
    assert log["active"].shape == (8, 4) and log["weights"].shape == (8, 4)
    np.testing.assert_array_equal(log["active"], np.stack([m.numpy() for m in masks]))
