"""The clients' side of differential privacy: update clipping and local noise after the steps, DP-SGD's per-sample
clipping and noise in them, and Poisson-sampled batches, on every backend that runs them."""

from __future__ import annotations

import math
from dataclasses import replace

import pytest
import torch
from torch import nn

from fedhet.engine import dense
from fedhet.engine.engine import Engine
from fedhet.engine.functional import FlatModel
from fedhet.engine.optimizers import SGD
from fedhet.engine.personal import Personal
from fedhet.engine.plan import LocalPlan
from fedhet.engine.privacy import ExampleDP, UpdateClip, clip_updates, poisson_batches, update_norms
from fedhet.errors import ConfigError
from fedhet.seeding import torch_gen
from fedhet.strategies.moon import ModelContrastive
from fedhet.strategies.scaffold import ControlVariates
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


def _wide_mlp(bias: bool = True) -> FlatModel:
    """A first layer wide enough for the dense backend's Gram path (`use_gram_first_layer`) at 3–4 steps of 4."""
    torch.manual_seed(0)
    return FlatModel(nn.Sequential(nn.Linear(30, 20, bias=bias), nn.Tanh(), nn.Linear(20, 3)))


def _bounds(norms: torch.Tensor) -> list[float]:
    """Bounds that clip some updates (halfway between two norms: no ties), all of them but the zero ones, none."""
    ranked = norms.sort().values
    return [float(ranked[1] + ranked[2]) / 2, 1e-4, math.inf]


CASES = {  # name: (data sizes, steps, LocalPlan.uniform's options or "starts", whether the Gram path clips)
    "steps' rows": ([9, 12, 5, 10], [3, 3, 3, 3], {}, True),
    "samples' rows (epochs)": ([5, 6, 4, 6], [4, 4, 4, 4], {}, True),
    "unequal steps, one client none": ([9, 12, 5, 10], [2, 4, 0, 3], {}, True),
    "no first-layer bias": ([9, 12, 5, 10], [3, 3, 3, 3], {"bias": False}, True),
    "weight decay (affine)": ([9, 12, 5, 10], [3, 3, 3, 3], {"weight_decay": 0.1}, False),
    "momentum (no Gram path)": ([9, 12, 5, 10], [3, 3, 3, 3], {"optimizer": SGD(momentum=0.9)}, False),
    "own start points": ([9, 12, 5, 10], [3, 3, 3, 3], {"starts": True}, False),
}


@pytest.mark.parametrize("case", list(CASES))
def test_the_dense_backend_clips_as_it_writes_the_models_as_clip_updates_does(
    case: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The dense backend clips each update itself (on the Gram path from its Gram matrices, before the weights are
    written; elsewhere after): the same clipped flags and models as `clip_updates` on the unclipped models."""
    sizes, steps, options, gram = CASES[case]
    options = dict(options)
    data = tiny_data(sizes, dim=30, classes=3, seed=5)
    engine = Engine(_wide_mlp(bool(options.pop("bias", True))), data, backend="dense", seed=3)
    w = engine.initial_params()
    clients = torch.arange(len(sizes))
    starts = w + 0.05 * torch.randn(len(sizes), len(w), generator=torch.Generator().manual_seed(1))
    own = bool(options.pop("starts", False))
    plan = replace(LocalPlan.uniform(clients, 1, 0.4, 4, **options), steps=torch.tensor(steps))  # type: ignore[arg-type]
    plan = replace(plan, starts=starts) if own else plan
    free = engine.train(w, plan, 2).params
    calls: list[float] = []
    before_writing = dense._Chunk._clip_before_writing

    def counted(chunk: dense._Chunk, bound: float) -> torch.Tensor:
        calls.append(bound)
        return before_writing(chunk, bound)

    monkeypatch.setattr(dense._Chunk, "_clip_before_writing", counted)
    for bound in _bounds(update_norms(free, w)):
        expected = free.clone()
        flags = clip_updates(expected, w, UpdateClip(bound), clients, 3, 2, "k")
        got = engine.train(w, replace(plan, clip=UpdateClip(bound)), 2)
        assert got.clipped is not None and got.clipped.tolist() == flags.tolist()
        torch.testing.assert_close(got.params, expected, **TOL)
    assert bool(calls) == gram  # the route this case is meant to take (an infinite bound takes neither)


@pytest.mark.parametrize("backend", ["dense", "vectorised", "sequential"])
def test_every_backend_clips_the_same_updates_to_the_same_models(backend: str) -> None:
    data = tiny_data([9, 12, 5, 10], dim=30, classes=3, seed=5)
    plan = LocalPlan(torch.arange(4), torch.tensor([2, 4, 1, 3]), torch.full((4,), 0.4), 4)
    out = {}
    for name in ("sequential", backend):
        engine = Engine(_wide_mlp(), data, backend=name, seed=3)  # type: ignore[arg-type]
        w = engine.initial_params()
        bound = _bounds(update_norms(engine.train(w, plan, 1).params, w))[0]
        out[name] = engine.train(w, replace(plan, clip=UpdateClip(bound, noise=0.01)), 1)
    assert out[backend].clipped is not None and out["sequential"].clipped is not None
    assert out[backend].clipped.tolist() == out["sequential"].clipped.tolist()
    assert 0 < int(out[backend].clipped.sum()) < 4
    torch.testing.assert_close(out[backend].params, out["sequential"].params, **TOL)


def test_the_conv_backend_clips_as_clip_updates_does() -> None:
    model, shape = zoo_model("lenet")
    engine = Engine(model, image_federated(shape, [6, 8, 5]), backend="conv", seed=1)
    w = engine.initial_params()
    plan = LocalPlan.uniform(torch.arange(3), 2, 0.05, 4)
    free = engine.train(w, plan, 0).params
    bound = _bounds(update_norms(free, w))[0]
    flags = clip_updates(free, w, UpdateClip(bound), plan.clients, 1, 0, "k")
    got = engine.train(w, replace(plan, clip=UpdateClip(bound)), 0)
    assert got.clipped is not None and got.clipped.tolist() == flags.tolist() and bool(flags.any())
    torch.testing.assert_close(got.params, free, **TOL)


def test_term_state_and_personal_parts_are_kept_from_the_unclipped_models_on_the_dense_backend() -> None:
    """Where the engine reads the models after training (SCAFFOLD's c_i from the final model, a personal part),
    the backend does not clip them first: the state is that of the unclipped models, only the update sent is
    clipped (the shared part's)."""
    data = tiny_data([9, 12, 5, 10], dim=30, classes=3, seed=5)
    clients = torch.arange(4)
    term = ControlVariates(c=torch.full((_wide_mlp().size,), 0.01))
    plans = {
        "scaffold": LocalPlan.uniform(clients, 3, 0.4, 4, terms=(term,)),
        "personal": LocalPlan.uniform(clients, 3, 0.4, 4, personal=Personal("mine", ("head",))),
    }
    for name, plan in plans.items():
        runs = {}
        for bound in (math.inf, 1e-3):
            engine = Engine(_wide_mlp(), data, backend="dense", seed=3)
            w = engine.initial_params()
            runs[bound] = (engine.train(w, replace(plan, clip=UpdateClip(bound)), 0), engine)  # type: ignore[arg-type]
        (free, free_engine), (clipped, clipped_engine) = runs[math.inf], runs[1e-3]
        expected = free.params.clone()
        assert clip_updates(expected, w, UpdateClip(1e-3), clients, 3, 0, "k").all()
        torch.testing.assert_close(clipped.params, expected, **TOL)
        if name == "scaffold":
            assert free.state_delta and free.state_delta.keys() == clipped.state_delta.keys()
            for key, delta in free.state_delta.items():
                torch.testing.assert_close(clipped.state_delta[key], delta, **TOL)
        else:
            mine = plan.personal.mask(free_engine.model)  # type: ignore[union-attr]
            kept = [e.personal_rows(w, plan, 1) for e in (free_engine, clipped_engine)]
            torch.testing.assert_close(kept[1], kept[0], **TOL)
            assert not torch.equal(kept[0], w[mine].expand_as(kept[0]))  # the personal part trained


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


def test_the_conv_backend_refuses_dp_sgd_in_one_line() -> None:
    """(The dense backend runs DP-SGD by ghost clipping: tests/engine/test_ghost.py.)"""
    backend = "conv"
    model, shape = zoo_model("lenet")
    data = image_federated(shape, [4, 4])
    engine = Engine(model, data, backend=backend)
    plan = replace(LocalPlan.uniform(torch.tensor([0, 1]), 1, 0.1, 4), dp_sgd=ExampleDP(1.0, 1.0))
    with pytest.raises(ConfigError, match=f"backend '{backend}' cannot run this local objective.*DP-SGD"):
        engine.train(engine.initial_params(), plan, 0)


def test_dp_sgd_refuses_a_data_term_in_one_line() -> None:
    engine = Engine(_mlp(), tiny_data([4, 4], dim=3, classes=2), backend="vectorised")
    w = engine.initial_params()
    plan = LocalPlan.uniform(torch.tensor([0, 1]), 1, 0.1, 4, terms=(ModelContrastive(),))
    with pytest.raises(ConfigError, match=r"local\.dp_sgd clips per-sample gradients .* a data-space term"):
        engine.train(w, replace(plan, dp_sgd=ExampleDP(1.0, 1.0)), 0)
