"""FjORD's ordered dropout drawn per local mini-batch (``draws: batch``, `fedhet.strategies.fjord`): a round by
hand on the small networks, the draws seeded per (round, client), the backends alike, a resumed run
byte-identical, and ``draws: round`` as before."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from fedhet.engine.engine import Engine
from fedhet.engine.functional import FlatModel
from fedhet.engine.plan import LocalPlan, LocalResult
from fedhet.experiments.config import parse_config
from fedhet.experiments.runner import resume, run
from fedhet.flower.codec import decode_plan, encode_plan
from fedhet.strategies.fedavg import FedAvg
from fedhet.strategies.fjord import FjORD
from fedhet.strategies.submodels import width_mask
from helpers.personal import LR, SIZES, TOL, data, mlp, run_round, setup
from helpers.tiny import make_context, tiny_data

LEVELS = [1.0, 0.5, 0.25]  # of a hidden layer of 4 units: 4, 2 and 1 of them


def small_network_sgd(model: FlatModel, w: torch.Tensor, k: int, widths: list[int]) -> torch.Tensor:
    """Client k's full-batch SGD steps, step t on the small network Linear(3, u), Tanh, Linear(u, 2) of the first
    u = widths[t] hidden units of `w` (sliced out, trained by autograd, written back)."""
    x, y = data().train.client(k)
    p = {n: v.clone() for n, v in model.unflatten(w.clone()).items()}
    for u in widths:
        small = {
            "w1": p["0.weight"][:u].clone().requires_grad_(True),
            "b1": p["0.bias"][:u].clone().requires_grad_(True),
            "w2": p["2.weight"][:, :u].clone().requires_grad_(True),
            "b2": p["2.bias"].clone().requires_grad_(True),
        }
        logits = torch.tanh(x @ small["w1"].T + small["b1"]) @ small["w2"].T + small["b2"]
        grads = torch.autograd.grad(torch.nn.functional.cross_entropy(logits, y), list(small.values()))
        new = {n: (v - LR * g).detach() for (n, v), g in zip(small.items(), grads, strict=True)}
        p["0.weight"][:u], p["0.bias"][:u] = new["w1"], new["b1"]
        p["2.weight"][:, :u], p["2.bias"] = new["w2"], new["b2"]
    return torch.cat([v.reshape(-1) for v in p.values()])


def test_a_round_of_per_batch_draws_is_training_the_drawn_small_networks() -> None:
    """Client 0 (capacity 1) and client 1 (capacity 1/2), two full-batch steps each; in the round picked, client 1's
    steps draw p = 1/2 then p = 1/4: it trains 2 hidden units, then 1. Each coordinate of the round's model is the
    Eq. 2 average over the clients whose widest drawn sub-model holds it."""
    strategy = FjORD(levels=LEVELS, capacities=[1.0, 0.5])
    engine = setup(strategy, "vectorised")
    model, w, clients = engine.model, engine.model.initial_params(), torch.tensor([0, 1])
    levels = sorted(LEVELS)
    draws = {t: strategy.step_draws(t, clients, torch.tensor([2, 2])) for t in range(40)}
    t = next(t for t, d in draws.items() if [levels[i] for i in d[1].tolist()] == [0.5, 0.25])
    p0 = [levels[i] for i in draws[t][0].tolist()]
    widths = [[max(1, round(4 * p)) for p in p0], [2, 1]]
    trained = [small_network_sgd(model, w, k, widths[k]) for k in range(2)]
    unions = [width_mask(model, ["0", "2"], max(p0)), width_mask(model, ["0", "2"], 0.5)]
    trained = [torch.where(u, v, 0.0) for u, v in zip(unions, trained, strict=True)]  # sent back: the union only
    on = torch.stack(unions).float() * torch.tensor(SIZES, dtype=torch.float32).unsqueeze(1)
    expected = torch.where(on.sum(0) > 0, (on * torch.stack(trained)).sum(0) / on.sum(0).clamp_min(1), w)
    result, got = run_round(strategy, engine, w, t)
    torch.testing.assert_close(result.params, torch.stack(trained), **TOL)
    torch.testing.assert_close(got, expected, **TOL)
    once = FjORD(levels=LEVELS, capacities=[1.0, 0.5], draws="round")  # one p per round: another model
    assert not torch.allclose(run_round(once, setup(once, "vectorised"), w, t)[1], got, atol=1e-4)


def test_the_draws_are_seeded_per_client_whatever_the_cohort() -> None:
    strategy = FjORD(levels=LEVELS, capacities=[1.0, 0.5, 0.25] * 10)
    engine = Engine(mlp(), tiny_data([3] * 30, dim=3), backend="vectorised")
    strategy.setup(make_context(engine, steps=20, m=30))
    levels = torch.tensor(sorted(LEVELS))
    everyone = strategy.step_draws(2, torch.arange(30), torch.full((30,), 20))
    some = FjORD(levels=LEVELS, capacities=[1.0, 0.5, 0.25] * 10)
    some.setup(make_context(engine, steps=20, m=30))
    two = some.step_draws(2, torch.tensor([7, 4]), torch.tensor([20, 5]))
    assert torch.equal(two[0], everyone[7]) and torch.equal(two[1, :5], everyone[4, :5]) and not two[1, 5:].any()
    assert torch.equal(strategy.step_draws(2, torch.tensor([4]), torch.tensor([5]))[0], everyone[4, :5])
    p = levels[everyone]
    assert set(p[0].tolist()) == {1.0, 0.5, 0.25} and set(p[1].tolist()) == {0.5, 0.25} and set(p[2].tolist()) == {0.25}
    assert not torch.equal(strategy.step_draws(3, torch.arange(30), torch.full((30,), 20)), everyone)
    plan = strategy.configure(2, torch.arange(30), engine.model.initial_params())
    assert plan.step_index is not None and plan.masks is not None
    widest = [width_mask(engine.model, ["0", "2"], float(p[k].max())) for k in range(30)]
    assert torch.equal(plan.masks, torch.stack(widest))  # each client's union: its widest drawn sub-model
    assert torch.equal(plan.step_union(), plan.masks)


def test_the_sequential_and_vectorised_backends_train_the_same_per_step_sub_models() -> None:
    """Three clients taking 3, 1 and 2 steps in chunks of two, a mixture of widths per step, with momentum (whose
    state outside a step's sub-model is kept too)."""
    out = []
    for backend in ("vectorised", "sequential"):
        engine = Engine(mlp(), tiny_data([3, 5, 4], dim=3), backend=backend, seed=1, chunk_size=2)  # type: ignore[arg-type]
        masks = torch.stack([width_mask(engine.model, ["0", "2"], r) for r in (0.25, 0.5, 1.0)])
        index = torch.tensor([[2, 0, 1], [1, 0, 0], [0, 2, 0]])  # client 1 takes one step, client 2 two
        plan = LocalPlan(
            torch.arange(3), torch.tensor([3, 1, 2]), torch.full((3,), LR), 2, step_masks=masks, step_index=index
        )
        assert plan.masks is not None and plan.masks.sum(1).tolist() == [masks[2].sum(), masks[1].sum(), masks[2].sum()]
        out.append(engine.train(engine.model.initial_params(), plan, 0).params)
        assert engine.last_backend == backend
    torch.testing.assert_close(out[0], out[1], **TOL)


@pytest.mark.parametrize("backend", ["dense", "vectorised", "sequential"])
def test_every_client_at_full_width_is_fedavg(backend: str) -> None:
    scheme, fedavg = FjORD(levels=[1.0]), FedAvg()
    engines = [setup(scheme, backend), setup(fedavg, backend)]
    w = [engines[0].model.initial_params()] * 2
    for t in range(2):
        w = [run_round(s, e, v, t)[1] for s, e, v in zip([scheme, fedavg], engines, w, strict=True)]
        torch.testing.assert_close(w[0], w[1], atol=1e-6, rtol=1e-6)


def test_the_dense_backend_hands_per_step_sub_models_to_another_and_says_so() -> None:
    strategy = FjORD(levels=LEVELS, capacities=[1.0, 0.5])
    engine = setup(strategy, "dense")
    w = engine.model.initial_params()
    with pytest.warns(UserWarning, match="per-step sub-models"):
        got = run_round(strategy, engine, w, 0)[1]
    assert engine.last_backend in ("vectorised", "sequential")
    twin = FjORD(levels=LEVELS, capacities=[1.0, 0.5])
    torch.testing.assert_close(run_round(twin, setup(twin, "sequential"), w, 0)[1], got, **TOL)


def test_the_plan_travels_through_the_flower_codec() -> None:
    strategy = FjORD(levels=LEVELS, capacities=[1.0, 0.5])
    engine = setup(strategy, "vectorised")
    plan = strategy.configure(0, torch.tensor([0, 1]), engine.model.initial_params())
    back = decode_plan(*encode_plan(plan, torch.tensor([1])))
    assert back.step_masks is not None and back.step_index is not None and plan.step_index is not None
    assert plan.step_masks is not None and torch.equal(back.step_masks, plan.step_masks)
    assert torch.equal(back.step_index, plan.step_index[[1]])
    assert back.masks is not None and plan.masks is not None and torch.equal(back.masks, plan.masks[[1]])


def config(draws: str, rounds: int = 4) -> dict[str, object]:
    return {
        "algorithm": {"name": "fjord", "levels": [1, 0.5, 0.25], "draws": draws},
        "dataset": "digits",
        "model": {"name": "mlp", "hidden": [8]},
        "num_clients": 6,
        "clients_per_round": 4,
        "rounds": rounds,
        "local": {"steps": 3, "lr": 0.05, "batch_size": 8},
        "seed": 1,
    }


def test_a_resumed_run_is_byte_identical(tmp_path: Path) -> None:
    run(parse_config(config("batch")), tmp_path / "straight")
    run(parse_config(config("batch", rounds=2)), tmp_path / "cut")
    text = (tmp_path / "cut" / "config.yaml").read_text().replace("rounds: 2", "rounds: 4")
    (tmp_path / "cut" / "config.yaml").write_text(text)
    resume(tmp_path / "cut")
    for file in ("metrics.csv", "clients.csv"):
        assert (tmp_path / "cut" / file).read_bytes() == (tmp_path / "straight" / file).read_bytes(), file
    once = run(parse_config(config("round")), tmp_path / "round")
    assert (tmp_path / "round" / "metrics.csv").read_bytes() != (tmp_path / "straight" / "metrics.csv").read_bytes()
    assert once.final["test_accuracy"] >= 0


def bn_mlp(units: int) -> torch.nn.Sequential:
    return torch.nn.Sequential(
        torch.nn.Linear(3, units), torch.nn.BatchNorm1d(units, momentum=0.3), torch.nn.ReLU(), torch.nn.Linear(units, 2)
    )


def sgd_step(net: torch.nn.Module, x: torch.Tensor, y: torch.Tensor) -> None:
    """One full-batch SGD step of `net` in training mode (its running statistics updated by the forward pass)."""
    net.train()
    loss = torch.nn.functional.cross_entropy(net(x), y)
    grads = torch.autograd.grad(loss, list(net.parameters()))
    with torch.no_grad():
        for p, g in zip(net.parameters(), grads, strict=True):
            p.sub_(LR * g)


@pytest.mark.parametrize("backend", ["sequential", "vectorised"])
def test_a_step_of_a_narrower_sub_model_keeps_the_other_units_and_their_batch_norm_statistics(backend: str) -> None:
    """One client's two steps: the whole network (4 units), then its first 2 units (p = 1, then 1/2), against the
    two networks trained by hand: units 2 and 3 (weights, batch-norm weight, bias and running statistics) keep
    what the first step left."""
    torch.manual_seed(0)
    module = bn_mlp(4)
    with torch.no_grad():
        module[1].running_mean.copy_(torch.randn(4))
        module[1].running_var.copy_(torch.rand(4) + 0.5)
    model = FlatModel(module)
    federated = tiny_data([6], dim=3, classes=2, seed=5)
    engine = Engine(model, federated, backend=backend, seed=1)  # type: ignore[arg-type]
    layers = ["0", "3"]
    masks = torch.stack([width_mask(model, layers, r) for r in (0.25, 0.5, 1.0)])
    plan = LocalPlan(
        torch.tensor([0]),
        torch.tensor([2]),
        torch.full((1,), LR),
        6,
        step_masks=masks,
        step_index=torch.tensor([[2, 1]]),
    )
    w0 = model.initial_params()
    got = model.unflatten(engine.train(w0, plan, 0).params[0])
    x, y = federated.train.client(0)
    whole = bn_mlp(4)
    start = model.unflatten(w0)
    whole.load_state_dict({n: start[n].to(t.dtype) for n, t in whole.state_dict().items()})
    sgd_step(whole, x, y)
    after_one = {n: v.clone() for n, v in whole.state_dict().items()}
    half = bn_mlp(2)
    cut = {"3.weight": (slice(None), slice(0, 2)), "3.bias": (slice(None),)}  # the rest: the first 2 units
    half.load_state_dict(
        {n: after_one[n][cut.get(n, (slice(0, 2),) if after_one[n].dim() else ())] for n in half.state_dict()}
    )
    sgd_step(half, x, y)
    expected = {n: v.clone() for n, v in after_one.items()}
    for n, v in half.state_dict().items():
        expected[n][cut.get(n, (slice(0, 2),) if v.dim() else ())] = v
    for n, v in expected.items():
        torch.testing.assert_close(got[n], v.float(), **TOL, msg=n)


def test_a_client_cut_short_counts_for_the_widest_sub_model_of_the_steps_it_took() -> None:
    """Client 1 (capacity 1/2) draws p = 1/4, then 1/2: had a deadline cut it to one step, the units of 1/2 beyond
    1/4 are averaged over client 0 alone (Eq. 2); with both steps taken, over both."""
    strategy = FjORD(levels=LEVELS, capacities=[1.0, 0.5])
    engine = setup(strategy, "vectorised")
    model, clients = engine.model, torch.tensor([0, 1])
    levels = sorted(LEVELS)
    t = next(
        t
        for t in range(40)
        if [levels[i] for i in strategy.step_draws(t, clients, torch.tensor([2, 2]))[1]] == [0.25, 0.5]
    )
    w = torch.zeros(model.size)
    params = torch.stack([torch.full((model.size,), 2.0), torch.full((model.size,), 4.0)])
    quarter, half = width_mask(model, ["0", "2"], 0.25), width_mask(model, ["0", "2"], 0.5)
    between = half & ~quarter
    both = (3 * 2.0 + 5 * 4.0) / 8  # the clients' sizes: 3 and 5
    for steps, expected in (([2, 2], both), ([2, 1], 2.0)):
        strategy.configure(t, clients, w)
        result = LocalResult(clients, params, torch.zeros(2), torch.tensor(steps), torch.full((2,), LR))
        got = strategy.aggregate(t, w, result)
        assert got[quarter].tolist() == pytest.approx([both] * int(quarter.sum()))
        assert got[between].tolist() == pytest.approx([expected] * int(between.sum()))
