"""SCAFFOLD: control variates (option II) and the server step, checked by hand."""

from __future__ import annotations

import dataclasses

import torch

from fedhet.engine.engine import Engine
from fedhet.engine.plan import LocalResult
from fedhet.strategies.scaffold import ControlVariates, Scaffold, scaffold_client_variates
from helpers.tiny import linear_model, make_context, tiny_data

KEY = "scaffold.c_i"  # where the clients' c_i are stored


def test_option_two_variates() -> None:
    c_i = torch.tensor([[1.0, 0.0]])
    c = torch.tensor([0.5, 0.5])
    x = torch.tensor([2.0, 2.0])
    y = torch.tensor([[1.0, 3.0]])
    # c_i+ = c_i − c + (x − y)/(K η) with K = 4, η = 0.25
    out = scaffold_client_variates(c_i, c, x, y, torch.tensor([4]), torch.tensor([0.25]))
    torch.testing.assert_close(out, torch.tensor([[1.0 - 0.5 + 1.0, 0.0 - 0.5 - 1.0]]))
    torch.testing.assert_close(c_i, torch.tensor([[1.0, 0.0]]))  # computed in a new tensor: the inputs are intact
    torch.testing.assert_close(y, torch.tensor([[1.0, 3.0]]))


def test_round_updates_model_and_global_variate() -> None:
    data = tiny_data([3, 3, 3, 3])  # N = 4 clients
    engine = Engine(linear_model(), data)
    strategy = Scaffold(server_lr=0.5)
    strategy.setup(make_context(engine, m=2))
    p = engine.model.size
    x = torch.zeros(p)
    plan = strategy.configure(0, torch.tensor([1, 3]), x)
    (term,) = plan.terms  # the client adds −c_i itself: the plan carries only c
    assert isinstance(term, ControlVariates) and term.server_tensors().keys() == {"c"}
    torch.testing.assert_close(term.c, torch.zeros(p))
    y = torch.stack([torch.full((p,), -1.0), torch.full((p,), -3.0)])
    # the clients' c_i⁺ = (x − y)/(2 · 0.5) = 1 and 3 (from c_i = 0): they return Δc_i = 1 and 3
    delta_c = torch.stack([torch.full((p,), 1.0), torch.full((p,), 3.0)])
    result = LocalResult(
        torch.tensor([1, 3]),
        y,
        torch.zeros(2),
        torch.tensor([2, 2]),
        torch.tensor([0.5, 0.5]),
        state_delta={KEY: delta_c},
    )
    new = strategy.aggregate(0, x, result)
    torch.testing.assert_close(new, torch.full((p,), 0.5 * -2.0))  # x + η_g mean(y − x)
    torch.testing.assert_close(strategy.state_dict()["c"], torch.full((p,), 1.0))  # c = 0 + (1/N)(1 + 3)
    assert set(strategy.state_dict()) == {"c", "server_optimizer"}  # the c_i stay with the clients


def test_clients_keep_their_variates_in_the_engine() -> None:
    """The engine applies c − c_i, stores c_i⁺ (option II) and returns Δc_i; the next round reads c_i⁺."""
    data = tiny_data([4, 4, 4], seed=2)
    engine = Engine(linear_model(), data, backend="sequential")
    strategy = Scaffold()
    strategy.setup(make_context(engine, batch=2, steps=2, lr=0.1, m=2))
    x = engine.initial_params()
    plan = strategy.configure(0, torch.tensor([0, 2]), x)
    result = engine.train(x, plan, 0)
    expected = scaffold_client_variates(
        torch.zeros(2, x.numel()), torch.zeros(x.numel()), x, result.params, result.steps, result.lr
    )
    torch.testing.assert_close(result.state_delta[KEY], expected)
    stored = engine.state_rows(KEY, torch.tensor([0, 1, 2]), 1, torch.zeros(3, x.numel()))
    torch.testing.assert_close(stored, torch.stack([expected[0], torch.zeros(x.numel()), expected[1]]))
    new = strategy.aggregate(0, x, result)
    plan = strategy.configure(1, torch.tensor([0, 1]), new)
    again = engine.train(new, plan, 1)  # client 0 now corrects by c − c_0⁺, client 1 by c
    c = strategy.state_dict()["c"]
    torch.testing.assert_close(c, expected.sum(0) / 3)
    assert bool((again.state_delta[KEY][0] != 0).any())


def test_a_client_that_takes_no_step_keeps_its_variate() -> None:
    """Δc_i is 0 for a client of the cohort that took no step, and its stored c_i stays; the others' as usual."""
    data = tiny_data([4, 4, 4], seed=2)
    engine = Engine(linear_model(), data, backend="sequential")
    strategy = Scaffold()
    strategy.setup(make_context(engine, batch=2, steps=2, lr=0.1, m=2))
    x, clients = engine.initial_params(), torch.tensor([0, 2])
    start = engine.train(x, strategy.configure(0, clients, x), 0)
    first = start.state_delta[KEY].clone()  # c_i⁺ of both (c_i was 0)
    new = strategy.aggregate(0, x, start)
    plan = dataclasses.replace(strategy.configure(1, clients, new), steps=torch.tensor([2, 0]))
    result = engine.train(new, plan, 1)
    c = strategy.state_dict()["c"]
    expected = scaffold_client_variates(first[:1], c, new, result.params[:1], result.steps[:1], result.lr[:1])
    torch.testing.assert_close(result.state_delta[KEY], torch.cat([expected - first[:1], torch.zeros_like(first[1:])]))
    stored = engine.state_rows(KEY, clients, 2, torch.zeros(2, x.numel()))
    torch.testing.assert_close(stored, torch.cat([expected, first[1:]]))


def test_correction_removes_drift_on_a_shared_quadratic_view() -> None:
    """With c_i = ∇F_i(x) and c = ∇F(x), the first corrected step equals a step on the global gradient."""
    data = tiny_data([6, 6], seed=4)
    model = linear_model()
    engine = Engine(model, data, backend="sequential")
    x = model.initial_params()

    def full_grad(k: int) -> torch.Tensor:
        xs, ys = data.train.client(k)
        w = x.clone().requires_grad_(True)
        (g,) = torch.autograd.grad(torch.nn.functional.cross_entropy(model.logits(w, xs), ys), w)
        return g

    g0, g1 = full_grad(0), full_grad(1)
    strategy = Scaffold()
    strategy.setup(make_context(engine, batch=6, steps=1, lr=0.3, m=2))
    strategy.load_state_dict({"c": (g0 + g1) / 2})
    engine.client_state.write(KEY, torch.tensor([0, 1]), torch.stack([g0, g1]), -1)
    plan = strategy.configure(0, torch.tensor([0, 1]), x)
    result = engine.train(x, plan, 0)
    expected = x - 0.3 * (g0 + g1) / 2
    torch.testing.assert_close(result.params, torch.stack([expected, expected]), atol=1e-6, rtol=1e-5)
