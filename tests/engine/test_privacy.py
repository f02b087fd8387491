"""The clients' side of differential privacy: update clipping and local noise after the steps, DP-SGD's per-sample
clipping and noise in them, and Poisson-sampled batches, on every backend that runs them."""

from __future__ import annotations

import math
from dataclasses import replace

import pytest
import torch
from torch import nn

from fedhet.engine.engine import Engine
from fedhet.engine.functional import FlatModel
from fedhet.engine.plan import LocalPlan
from fedhet.engine.privacy import ExampleDP, UpdateClip, clip_updates, poisson_batches, update_norms
from fedhet.errors import ConfigError
from fedhet.seeding import torch_gen
from fedhet.strategies.moon import ModelContrastive
from helpers.tiny import tiny_data
from helpers.zoo_cnns import image_federated, zoo_model

TOL = {"atol": 1e-6, "rtol": 1e-5}


def _mlp(seed: int = 0) -> FlatModel:
    torch.manual_seed(seed)
    return FlatModel(nn.Sequential(nn.Linear(3, 4), nn.Tanh(), nn.Linear(4, 2)))


def test_updates_are_clipped_to_the_bound_and_others_left_bit_for_bit() -> None:
    start = torch.tensor([1.0, -1.0])
    params = torch.tensor([[4.0, 3.0], [1.3, -0.6], [1.0, -1.0]])  # updates (3, 4): norm 5; (0.3, 0.4): 0.5; 0
    before = params.clone()
    clipped = clip_updates(params, start, UpdateClip(1.0), torch.tensor([0, 1, 2]), 0, 0, "k")
    assert clipped.tolist() == [True, False, False]
    torch.testing.assert_close(params[0], torch.tensor([1.6, -0.2]))  # start + (3, 4)/5
    assert torch.equal(params[1:], before[1:])
    torch.testing.assert_close(update_norms(before, start), torch.tensor([5.0, 0.5, 0.0]))


def test_an_infinite_bound_without_noise_changes_nothing() -> None:
    params = torch.randn(5, 7, generator=torch.Generator().manual_seed(0))
    before = params.clone()
    clipped = clip_updates(params, torch.zeros(7), UpdateClip(math.inf), torch.arange(5), 0, 0, "k")
    assert not bool(clipped.any()) and torch.equal(params, before)


def test_local_noise_comes_from_each_clients_own_stream() -> None:
    """σ·N(0, I) from (seed, key, round, client): the same for a client whichever cohort it is in."""
    size, clip = 6, UpdateClip(10.0, noise=0.5)
    alone = torch.zeros(1, size)
    clip_updates(alone, torch.zeros(size), clip, torch.tensor([3]), 7, 2, "key")
    together = torch.zeros(3, size)
    clip_updates(together, torch.zeros(size), clip, torch.tensor([1, 3, 4]), 7, 2, "key")
    expected = 0.5 * torch.randn(size, generator=torch_gen(7, "key", 2, 3))
    assert torch.equal(alone[0], expected) and torch.equal(together[1], expected)
    assert not torch.equal(together[0], expected)


@pytest.mark.parametrize("backend", ["dense", "vectorised", "sequential"])
def test_the_engine_clips_what_each_client_sends_after_its_steps(backend: str) -> None:
    data = tiny_data([6, 9, 4], dim=3, classes=2, seed=2)
    engine = Engine(_mlp(), data, backend=backend, seed=1)  # type: ignore[arg-type]
    w = engine.initial_params()
    plan = LocalPlan.uniform(torch.arange(3), 5, 0.5, 4)
    free = engine.train(w, plan, 0)
    norms = update_norms(free.params, w)
    bound = float(norms.median())
    clipped = engine.train(w, replace(plan, clip=UpdateClip(bound)), 0)
    assert clipped.clipped is not None and clipped.clipped.tolist() == (norms > bound).tolist()
    expected = w + (free.params - w) * (bound / norms).clamp(max=1).unsqueeze(1)
    torch.testing.assert_close(clipped.params, expected, **TOL)
    noised = engine.train(w, replace(plan, clip=UpdateClip(bound, noise=0.1)), 0)
    noise = torch.stack([torch.randn(w.shape, generator=torch_gen(1, "dp-noise/train/0", 0, k)) for k in range(3)])
    noise = 0.1 * noise
    torch.testing.assert_close(noised.params, expected + noise, **TOL)


def test_poisson_batches_draw_each_sample_with_probability_b_over_n() -> None:
    offsets = torch.tensor([0, 40, 45, 145])  # clients of 40, 5 and 100 samples
    steps = torch.tensor([400, 3, 400])
    index, weight = poisson_batches(offsets, torch.tensor([0, 1, 2]), steps, 10, 3, 1)
    sizes = weight.sum(2)
    assert sizes[1, :3].tolist() == [5.0, 5.0, 5.0] and float(sizes[1, 3:].sum()) == 0  # q = 1: all 5, 3 steps
    assert abs(float(sizes[0].mean()) - 10) < 0.6 and abs(float(sizes[2].mean()) - 10) < 0.6  # E = q n = b
    assert float(sizes[0].var()) > 4  # binomial sizes (variance n q (1 − q) = 7.5), not a fixed batch
    alone, alone_weight = poisson_batches(offsets, torch.tensor([2]), steps[2:], 10, 3, 1)
    for t in range(400):
        picked = index[2, t][weight[2, t] > 0].tolist()
        assert all(45 <= i < 145 for i in picked) and len(set(picked)) == len(picked)  # its own rows, once each
        assert picked == alone[0, t][alone_weight[0, t] > 0].tolist()  # whoever else is in the cohort


def _per_sample_reference(model: FlatModel, w: torch.Tensor, x: torch.Tensor, y: torch.Tensor, clip: float):
    """Σ_i g_i min(1, C/‖g_i‖) over the samples, each g_i by autograd on that sample alone."""
    total = torch.zeros_like(w)
    for i in range(len(y)):
        v = w.detach().clone().requires_grad_(True)
        loss = nn.functional.cross_entropy(model.logits(v, x[i : i + 1]), y[i : i + 1])
        (g,) = torch.autograd.grad(loss, v)
        total += g * min(1.0, clip / float(g.norm()))
    return total


@pytest.mark.parametrize("backend", ["vectorised", "sequential"])
def test_dp_sgd_clips_each_sample_as_computed_by_hand(backend: str) -> None:
    """One DP-SGD step without noise on a client whose 4 samples form one batch (shuffle: b = n = 4):
    w − η Σ_i clip(g_i)/4."""
    data = tiny_data([4, 4], dim=3, classes=2, seed=3)
    model = _mlp()
    engine = Engine(model, data, backend=backend, seed=0)  # type: ignore[arg-type]
    w = engine.initial_params()
    plan = replace(LocalPlan.uniform(torch.tensor([0, 1]), 1, 0.5, 4), dp_sgd=ExampleDP(0.05, 0.0, "shuffle"))
    got = engine.train(w, plan, 0).params
    for k in range(2):
        x, y = data.train.client(k)
        expected = w - 0.5 * _per_sample_reference(model, w, x, y, 0.05) / 4
        torch.testing.assert_close(got[k], expected, **TOL)


@pytest.mark.parametrize("backend", ["vectorised", "sequential"])
def test_dp_sgd_with_an_infinite_bound_and_no_noise_is_plain_sgd(backend: str) -> None:
    data = tiny_data([7, 12, 3], dim=3, classes=2, seed=4)
    engine = Engine(_mlp(), data, backend=backend, seed=2)  # type: ignore[arg-type]
    w = engine.initial_params()
    plan = LocalPlan.uniform(torch.arange(3), 6, 0.3, 4, weight_decay=0.01)
    plain = engine.train(w, plan, 1)
    private = engine.train(w, replace(plan, dp_sgd=ExampleDP(math.inf, 0.0, "shuffle")), 1)
    torch.testing.assert_close(private.params, plain.params, **TOL)
    torch.testing.assert_close(private.train_loss, plain.train_loss, **TOL)


def test_dp_sgd_gives_the_same_numbers_on_both_autograd_backends() -> None:
    data = tiny_data([7, 12, 3, 9], dim=3, classes=2, seed=4)
    steps = torch.tensor([3, 5, 0, 4])
    out = {}
    for backend in ("vectorised", "sequential"):
        engine = Engine(_mlp(), data, backend=backend, seed=2)  # type: ignore[arg-type]
        w = engine.initial_params()
        plan = LocalPlan(torch.arange(4), steps, torch.full((4,), 0.3), 4, dp_sgd=ExampleDP(0.5, 1.1, "poisson"))
        out[backend] = engine.train(w, plan, 1)
    torch.testing.assert_close(out["vectorised"].params, out["sequential"].params, **TOL)
    assert torch.equal(out["sequential"].params[2], Engine(_mlp(), data, seed=2).initial_params())  # no steps


def test_dp_sgd_noise_is_z_times_the_bound_over_the_batch() -> None:
    """A noised step minus the same step without noise is −η σ ξ / b_k (σ = zC), ξ from the client's stream of that
    round and step."""
    data = tiny_data([6, 6], dim=3, classes=2, seed=1)
    engine = Engine(_mlp(), data, backend="vectorised", seed=5)  # type: ignore[arg-type]
    w = engine.initial_params()
    plan = LocalPlan.uniform(torch.tensor([0, 1]), 1, 0.2, 4)
    quiet = engine.train(w, replace(plan, dp_sgd=ExampleDP(0.7, 0.0, "shuffle")), 3).params
    loud = engine.train(w, replace(plan, dp_sgd=ExampleDP(0.7, 2.0, "shuffle")), 3).params
    for k in range(2):
        xi = torch.randn(w.shape, generator=torch_gen(5, "dp-sgd/train/0", 3, k, 0))
        torch.testing.assert_close(loud[k] - quiet[k], -0.2 * (2.0 * 0.7) * xi / 4, **TOL)


@pytest.mark.parametrize("backend", ["dense", "conv"])
def test_the_dense_and_conv_backends_refuse_dp_sgd_in_one_line(backend: str) -> None:
    if backend == "dense":
        model, data = _mlp(), tiny_data([4, 4], dim=3, classes=2)
    else:
        model, shape = zoo_model("lenet")
        data = image_federated(shape, [4, 4])
    engine = Engine(model, data, backend=backend)  # type: ignore[arg-type]
    plan = replace(LocalPlan.uniform(torch.tensor([0, 1]), 1, 0.1, 4), dp_sgd=ExampleDP(1.0, 1.0))
    with pytest.raises(ConfigError, match=f"backend '{backend}' cannot run this local objective.*DP-SGD"):
        engine.train(engine.initial_params(), plan, 0)


def test_dp_sgd_refuses_a_data_term_in_one_line() -> None:
    engine = Engine(_mlp(), tiny_data([4, 4], dim=3, classes=2), backend="vectorised")
    w = engine.initial_params()
    plan = LocalPlan.uniform(torch.tensor([0, 1]), 1, 0.1, 4, terms=(ModelContrastive(),))
    with pytest.raises(ConfigError, match=r"local\.dp_sgd clips per-sample gradients .* a data-space term"):
        engine.train(w, replace(plan, dp_sgd=ExampleDP(1.0, 1.0)), 0)
