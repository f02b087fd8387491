"""The client-level DP wrapper: clipping and noise by hand, adaptive clipping's bound, the bare strategy again with
no noise and no bound, and the bases it refuses."""

from __future__ import annotations

import math
import warnings

import numpy as np
import pytest
import torch
from torch import nn

from fedhet.catalog import STRATEGIES
from fedhet.data.dataset import FederatedData
from fedhet.engine.engine import Engine
from fedhet.engine.functional import FlatModel
from fedhet.engine.privacy import UpdateClip, update_norms
from fedhet.errors import ConfigError, FedhetWarning
from fedhet.methods.maxfl.strategy import MaxFL
from fedhet.privacy.strategy import DP, adaptive_bound, update_noise_multiplier, weights_of
from fedhet.requirements import ClientRequirements, Requirements, RequirementsConfig
from fedhet.seeding import numpy_rng, torch_gen
from fedhet.strategies.base import Strategy
from helpers.tiny import make_context, tiny_data
from helpers.zoo_cnns import image_federated, zoo_model

SIZES = [6, 9, 4, 12]
LR = 0.5


def _mlp() -> FlatModel:
    torch.manual_seed(0)
    return FlatModel(nn.Sequential(nn.Linear(3, 4), nn.Tanh(), nn.Linear(4, 2)))


def _setup(strategy: Strategy, engine: Engine, m: int = 4) -> Strategy:
    for part in strategy.parts():
        if isinstance(part, MaxFL):
            rho = torch.full((engine.data.num_clients,), 0.6)
            part.use_requirements(ClientRequirements(engine, RequirementsConfig(), Requirements(rho, None, None)))
    strategy.setup(make_context(engine, steps=4, lr=LR, batch=4, m=m))
    return strategy


def _rounds(strategy: Strategy, engine: Engine, rounds: int = 3) -> torch.Tensor:
    """`rounds` rounds of `strategy` on `engine`, every client available."""
    w = engine.initial_params()
    everyone = torch.ones(engine.data.num_clients, dtype=torch.bool)
    for t in range(rounds):
        clients = strategy.select(t, everyone)
        result = strategy.local_training(t, clients, w, lambda plan, w=w, t=t: engine.train(w, plan, t))
        w = strategy.aggregate(t, w, result)
    return w


def _engine(backend: str) -> Engine:
    if backend == "conv":
        model, shape = zoo_model("fedavg_cnn")
        return Engine(model, image_federated(shape, SIZES), backend="conv", seed=3)
    return Engine(_mlp(), tiny_data(SIZES, dim=3, classes=2, seed=1), backend=backend, seed=3)  # type: ignore[arg-type]


BASES = ["fedavg", {"name": "fedprox", "mu": 0.1}, {"name": "maxfl", "eps": 0.01}, "ditto", "fedper", "krum"]


@pytest.mark.parametrize("backend", ["dense", "vectorised", "sequential", "conv"])
@pytest.mark.parametrize("base", BASES, ids=lambda b: b if isinstance(b, str) else b["name"])
def test_no_noise_and_an_infinite_bound_is_the_bare_strategy(backend: str, base: str | dict) -> None:
    wrapped = DP(base=base, clip=math.inf, noise_multiplier=0.0, sampling="fixed")
    bare = _rounds(_setup(STRATEGIES.build(wrapped.base), _engine(backend), m=3), _engine(backend))
    engine = _engine(backend)
    got = _rounds(_setup(wrapped, engine, m=3), engine)
    torch.testing.assert_close(got, bare, atol=0, rtol=0)


def test_central_noise_by_hand() -> None:
    """w ← w − (mean_k Δ_k min(1, C/‖Δ_k‖) + zC/m ξ), ξ from (seed, "dp-central-noise", round), for a uniform mean."""
    engine = _engine("dense")
    strategy = _setup(DP(base={"name": "fedavg", "weighting": "uniform"}, clip=0.3, noise_multiplier=1.5), engine)
    w = engine.initial_params()
    clients = torch.arange(4)
    free = engine.train(w, strategy.ctx.local.plan(clients), 2)
    updates = w - free.params
    norms = update_norms(free.params, w)
    assert 0 < int((norms > 0.3).sum()) < 4  # some clipped, some not
    clipped = updates * (0.3 / norms).clamp(max=1).unsqueeze(1)
    xi = torch.randn(w.shape, generator=torch_gen(0, "dp-central-noise", 2))
    expected = w - (clipped.mean(0) + 1.5 * 0.3 / 4 * xi)
    result = strategy.local_training(2, clients, w, lambda plan: engine.train(w, plan, 2))
    assert result.clipped is not None and result.clipped.tolist() == (norms > 0.3).tolist()
    torch.testing.assert_close(strategy.aggregate(2, w, result), expected, atol=1e-6, rtol=1e-5)
    assert strategy.round_metrics()["dp_noise_std"] == pytest.approx(1.5 * 0.3 / 4)
    assert strategy.round_metrics()["dp_clipped_share"] == float((norms > 0.3).double().mean())


def test_central_noise_pays_for_the_largest_weight() -> None:
    """FedAvg by samples weighs client k by n_k/Σn: the noise is zC max_k p_k."""
    engine = _engine("dense")
    strategy = _setup(DP(base={"name": "fedavg", "weighting": "samples"}, clip=0.3, noise_multiplier=1.5), engine)
    w = engine.initial_params()
    result = strategy.local_training(0, torch.arange(4), w, lambda plan: engine.train(w, plan, 0))
    strategy.aggregate(0, w, result)
    assert strategy.round_metrics()["dp_noise_std"] == pytest.approx(1.5 * 0.3 * 12 / sum(SIZES))


@pytest.mark.parametrize("base", BASES[:5], ids=lambda b: b if isinstance(b, str) else b["name"])
def test_declared_weights_are_the_weights_the_base_aggregates_with(base: str | dict) -> None:
    """The contract central noise relies on: aggregate = w − η_g Σ_k p_k Δ_k with p = aggregation_weights."""
    engine = _engine("vectorised")
    strategy = _setup(STRATEGIES.build(base), engine)
    assert weights_of(strategy)
    w = engine.initial_params()
    clients = torch.tensor([0, 2, 3])
    result = strategy.local_training(0, clients, w, lambda plan: engine.train(w, plan, 0))
    p = strategy.aggregation_weights(0, result)
    assert p is not None
    expected = w - p @ result.updates(w)
    torch.testing.assert_close(strategy.aggregate(0, w, result), expected, atol=1e-6, rtol=1e-5)


@pytest.mark.parametrize("base", ["krum", "median", "fedmgda_plus", {"name": "fednova", "mu": 0.1}, "qffl"])
def test_central_noise_refuses_a_base_without_declared_weights(base: str | dict) -> None:
    engine = _engine("dense")
    with pytest.raises(ConfigError, match=r"central DP noise is calibrated to the weights.*noise: local"):
        _setup(DP(base=base, clip=1.0, noise_multiplier=1.0), engine)
    _setup(DP(base=base, clip=1.0, noise_multiplier=1.0, noise="local"), _engine("dense"))  # local noise: any base


def test_a_base_that_sends_client_state_is_refused_in_one_line() -> None:
    engine = _engine("dense")
    strategy = _setup(DP(base="scaffold", clip=1.0, noise_multiplier=1.0, noise="local"), engine)
    w = engine.initial_params()
    with pytest.raises(ConfigError, match="'scaffold' also sends the state of scaffold"):
        strategy.local_training(0, torch.arange(4), w, lambda plan: engine.train(w, plan, 0))


def test_adaptive_clipping_moves_the_bound_towards_the_quantile_by_hand() -> None:
    """C ← C exp(−η_C (b̃ − γ)), b̃ = (#unclipped + σ_b N)/m, N from (seed, "dp-clip-count", round)."""
    engine = _engine("dense")
    strategy = _setup(
        DP(base="fedavg", clip=0.05, clipping="adaptive", noise_multiplier=0.5, count_noise=2.0, quantile=0.7), engine
    )
    assert isinstance(strategy, DP)
    w = engine.initial_params()
    result = strategy.local_training(4, torch.arange(4), w, lambda plan: engine.train(w, plan, 4))
    assert result.clipped is not None
    unclipped = int((~result.clipped).sum())
    strategy.aggregate(4, w, result)
    noise = float(numpy_rng(0, "dp-clip-count", 4).normal()) * 2.0
    expected = 0.05 * math.exp(-0.2 * ((unclipped + noise) / 4 - 0.7))
    assert strategy.bound == pytest.approx(expected, rel=1e-12)
    assert adaptive_bound(1.0, 3, 0.0, 4, 0.75, 0.2) == 1.0  # at the quantile: unchanged
    assert adaptive_bound(1.0, 0, 0.0, 4, 0.5, 0.2) > 1.0 > adaptive_bound(1.0, 4, 0.0, 4, 0.5, 0.2)


def test_the_count_takes_its_share_of_the_noise() -> None:
    """z_Δ = (z⁻² − (2σ_b)⁻²)^(−1/2) (Andrew et al., Theorem 1), refused where the count takes it all."""
    assert update_noise_multiplier(1.0, 5.0) == pytest.approx((1 - 1 / 100) ** -0.5)
    assert update_noise_multiplier(1.0, math.inf) == 1.0 and update_noise_multiplier(0.0, 1.0) == 0.0
    with pytest.raises(ConfigError, match="needs z < 2σ_b = 1"):
        update_noise_multiplier(1.0, 0.5)


def test_poisson_sampling_takes_each_client_with_probability_m_over_k() -> None:
    data: FederatedData = tiny_data([2] * 50, dim=3, classes=2)
    strategy = _setup(DP(base="fedavg", sampling="poisson", noise_multiplier=1.0), Engine(_mlp(), data), m=10)
    everyone = torch.ones(50, dtype=torch.bool)
    sizes = [len(strategy.select(t, everyone)) for t in range(200)]
    assert abs(np.mean(sizes) - 10) < 0.6 and np.var(sizes) > 4  # binomial(50, 0.2): mean 10, variance 8
    assert torch.equal(strategy.select(3, everyone), strategy.select(3, everyone))
    half = torch.arange(50) % 2 == 0
    assert set(strategy.select(3, half).tolist()) == {k for k in strategy.select(3, everyone).tolist() if k % 2 == 0}


@pytest.mark.parametrize(
    ("spec", "message"),
    [
        ({"clipping": "adaptive", "noise": "local"}, "adaptive clipping noises the clipped count on the server"),
        ({"clip": math.inf, "noise_multiplier": 1.0}, "give a finite clip"),
        ({"base": {"name": "dp"}}, "the base of dp cannot be dp itself"),
        ({"base": "fedbuff"}, "'fedbuff' is asynchronous"),
        ({"server_lr": 0.5}, "set algorithm.base.server_lr"),
    ],
)
def test_contradictions_are_refused_in_one_line(spec: dict, message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        STRATEGIES.build({"name": "dp", **spec})


def test_a_wrapper_without_noise_multiplier_takes_one() -> None:
    strategy = _setup(DP(base="fedavg", clip=1.0), _engine("dense"))
    assert isinstance(strategy, DP) and strategy.z == 1.0
    strategy.use_noise_multiplier(2.5)  # what a target ε does before the run
    assert strategy.z == 2.5 and strategy.client_clip() == UpdateClip(1.0, 0.0)


def test_a_base_weighs_clients_uniformly_unless_told() -> None:
    """DP-FedAvg's uniform weights are the default of a base with a ``weighting``; an explicit one is kept."""
    assert DP().inner.weighting == "uniform"  # type: ignore[attr-defined]
    assert DP(base="fedprox").inner.weighting == "uniform"  # type: ignore[attr-defined]
    assert DP(base={"name": "fedavg", "weighting": "samples"}).inner.weighting == "samples"  # type: ignore[attr-defined]
    assert DP(base="maxfl").base["name"] == "maxfl"  # no weighting to set
    assert DP().sampling == "poisson"  # DP-FedAvg's: each client with probability q


@pytest.mark.parametrize(("z", "warns"), [(50.0, True), (0.01, False)])
def test_noise_that_swamps_the_updates_is_said_in_one_line(z: float, warns: bool) -> None:
    """‖ξ‖ = σ√P against √T‖Σ_k p_k Δ_k‖ (T = 1 here): σ = zC/m with every update clipped to C = 0.01, so the
    mean update has norm at most C and the noise's is about z·C/4·√P (P = 26)."""
    engine = _engine("dense")
    strategy = _setup(DP(clip=0.01, noise_multiplier=z, sampling="fixed"), engine)
    w = engine.initial_params()
    clients = torch.arange(4)
    result = strategy.local_training(0, clients, w, lambda plan: engine.train(w, plan, 0))
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        strategy.aggregate(0, w, result)
        strategy.aggregate(1, w, result)  # once a run
    said = [str(c.message) for c in caught if issubclass(c.category, FedhetWarning)]
    assert len(said) == (1 if warns else 0)
    if warns:
        assert "noise swamps the updates" in said[0] and "\n" not in said[0]
        assert f"σ = {z * 0.01 / 4:.3g} on each of 26 parameters" in said[0]


@pytest.mark.parametrize("lr", [10.0, 1e6])
def test_adaptive_clipping_keeps_a_finite_positive_bound(lr: float) -> None:
    """C exp(−η(b̃ − γ)) with a huge step: the exponent is held to ±30, so C stays finite and positive."""
    up = adaptive_bound(1.0, 0.0, 0.0, 10, 0.5, lr)  # no update unclipped: C grows
    down = adaptive_bound(1.0, 10.0, 0.0, 10, 0.5, lr)
    assert math.isfinite(up) and up == pytest.approx(math.exp(min(30.0, lr * 0.5)))
    assert 0 < down == pytest.approx(math.exp(-min(30.0, lr * 0.5)))


@pytest.mark.parametrize(("noise", "share"), [("central", 4.0), ("local", 2.0)])
def test_a_clip_left_out_is_set_from_the_noise(noise: str, share: float) -> None:
    """C = rms(w₀)·m/(z√T) (local noise: √m): the run's noise on a coordinate, √T·zC/m, is the initial weights'
    rms; m = 4, z = 2, T = 9 here; no noise: no bound."""
    engine = _engine("dense")
    w0 = engine.initial_params()
    rms = float(w0.double().pow(2).mean().sqrt())
    strategy = DP(noise_multiplier=2.0, noise=noise)  # type: ignore[arg-type]
    ctx = make_context(engine, m=4)
    ctx.rounds = 9
    strategy.setup(ctx)
    assert strategy.bound == pytest.approx(rms * share / (2.0 * 3.0))
    assert strategy.derived() == {"clip": pytest.approx(rms * share / 6.0)}
    strategy.use_noise_multiplier(4.0)  # a target ε's z moves the bound with it
    assert strategy.bound == pytest.approx(rms * share / 12.0)
    quiet = DP(noise_multiplier=0.0)
    quiet.setup(ctx)
    assert quiet.bound == math.inf and DP(clip=0.5).derived() == {}
