"""APFL: a personal model and an adaptive mixing weight kept by each client (Deng et al. 2020, Algorithm 1)."""

from __future__ import annotations

import pytest
import torch

from fedhet.errors import ConfigError
from fedhet.strategies.apfl import APFL
from fedhet.strategies.base import STRATEGIES
from helpers.personal import LR, STEPS, TOL, gradient, personal_models, run_round, setup, weighted


def _reference(
    model: object, w: torch.Tensor, v: torch.Tensor, alpha: float, k: int, alpha_lr: float = LR
) -> tuple[torch.Tensor, ...]:
    """APFL's local steps, written out: w ← w − η∇f(w); v ← v − ηα∇f(v̄); α ← clip(α − η_α⟨v − w, ∇f(v̄)⟩)."""
    a = torch.tensor(alpha)
    for _ in range(STEPS):
        mixed = a * v + (1 - a) * w
        g_mixed = gradient(model, mixed, k)  # type: ignore[arg-type]
        g_w = gradient(model, w, k)  # type: ignore[arg-type]
        v, a, w = v - LR * a * g_mixed, (a - alpha_lr * torch.dot(v - w, g_mixed)).clamp(0, 1), w - LR * g_w
    return w, v, a


@pytest.mark.parametrize("backend", ["vectorised", "sequential"])
def test_two_rounds_match_the_hand_computed_updates(backend: str) -> None:
    strategy = APFL(alpha=0.3)
    engine = setup(strategy, backend)
    model = engine.model
    w = model.initial_params()
    v = [w, w]  # a client's first personal model: the global model it first receives
    alpha = [torch.tensor(0.3), torch.tensor(0.3)]
    for t in range(2):
        out = [_reference(model, w, v[k], float(alpha[k]), k) for k in range(2)]
        v, alpha = [o[1] for o in out], [o[2] for o in out]
        _, w = run_round(strategy, engine, w, t)
        torch.testing.assert_close(w, weighted([o[0] for o in out]), **TOL)
        mixed = torch.stack([alpha[k] * v[k] + (1 - alpha[k]) * w for k in range(2)])
        torch.testing.assert_close(personal_models(strategy, engine, w, t + 1), mixed, **TOL)
    assert abs(float(alpha[0]) - 0.3) > 1e-6  # α moved


def test_a_fixed_alpha_stays_and_apfl_refuses_the_dense_backend() -> None:
    strategy = APFL(alpha=0.4, adaptive=False)
    engine = setup(strategy, "sequential")
    w = engine.model.initial_params()
    run_round(strategy, engine, w, 0)
    stored = engine.state_rows("apfl.alpha", torch.tensor([0, 1]), 1, torch.zeros(2))
    assert stored.tolist() == pytest.approx([0.4, 0.4])
    on_dense = APFL()
    dense = setup(on_dense, "dense")
    with pytest.raises(ConfigError, match="backend 'dense' cannot run this local objective"):
        run_round(on_dense, dense, w, 0)
    with pytest.raises(ConfigError, match="alpha"):
        STRATEGIES.build({"name": "apfl", "alpha": 1.5})


def test_each_client_learns_its_own_alpha_with_its_own_rate() -> None:
    """α is personal state (Algorithm 1 learns α_k per client) with step η_α = alpha_lr, here 5 × local.lr."""
    strategy = APFL(alpha=0.3, alpha_lr=5 * LR)
    engine = setup(strategy, "sequential")
    model = engine.model
    w = model.initial_params()
    v, alpha = [w, w], [0.3, 0.3]
    for t in range(2):
        out = [_reference(model, w, v[k], alpha[k], k, alpha_lr=5 * LR) for k in range(2)]
        v, alpha = [o[1] for o in out], [float(o[2]) for o in out]
        _, w = run_round(strategy, engine, w, t)
        stored = engine.state_rows("apfl.alpha", torch.tensor([0, 1]), t + 1, torch.zeros(2))
        assert stored.tolist() == pytest.approx(alpha, abs=1e-6)
    assert abs(alpha[0] - alpha[1]) > 1e-4  # one α per client
