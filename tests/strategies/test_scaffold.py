"""SCAFFOLD: control variates (option II) and the server step, checked by hand."""

from __future__ import annotations

import torch

from conftest import linear_model, make_context, tiny_data
from fedhet.engine.engine import Engine
from fedhet.engine.plan import LocalResult
from fedhet.strategies.scaffold import Scaffold, scaffold_client_variates


def test_option_two_variates() -> None:
    c_i = torch.tensor([[1.0, 0.0]])
    c = torch.tensor([0.5, 0.5])
    x = torch.tensor([2.0, 2.0])
    y = torch.tensor([[1.0, 3.0]])
    # c_i+ = c_i − c + (x − y)/(K η) with K = 4, η = 0.25
    out = scaffold_client_variates(c_i, c, x, y, torch.tensor([4]), torch.tensor([0.25]))
    torch.testing.assert_close(out, torch.tensor([[1.0 - 0.5 + 1.0, 0.0 - 0.5 - 1.0]]))


def test_round_updates_model_and_global_variate() -> None:
    data = tiny_data([3, 3, 3, 3])  # N = 4 clients
    engine = Engine(linear_model(), data)
    strategy = Scaffold(server_lr=0.5)
    strategy.setup(make_context(engine, m=2))
    p = engine.model.size
    x = torch.zeros(p)
    plan = strategy.configure(0, torch.tensor([1, 3]), x)
    torch.testing.assert_close(plan.correction, torch.zeros(2, p))  # c = c_i = 0 at the start
    y = torch.stack([torch.full((p,), -1.0), torch.full((p,), -3.0)])
    result = LocalResult(torch.tensor([1, 3]), y, torch.zeros(2), torch.tensor([2, 2]), torch.tensor([0.5, 0.5]))
    new = strategy.aggregate(0, x, result)
    torch.testing.assert_close(new, torch.full((p,), 0.5 * -2.0))  # x + η_g mean(y − x)
    # c_i+ = (x − y)/(2 · 0.5) = 1 and 3; c = 0 + (1/N)(1 + 3) = 1
    state = strategy.state_dict()
    torch.testing.assert_close(state["c"], torch.full((p,), 1.0))
    torch.testing.assert_close(state["client_c"], torch.stack([torch.full((p,), 1.0), torch.full((p,), 3.0)]))
    # next round's correction for client 1 is c − c_1 = 1 − 1 = 0, for a new client 0 it is c − 0 = 1
    plan = strategy.configure(1, torch.tensor([0, 1]), new)
    torch.testing.assert_close(plan.correction, torch.stack([torch.full((p,), 1.0), torch.zeros(p)]))


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
    strategy.load_state_dict(
        {"c": (g0 + g1) / 2, "client_ids": torch.tensor([0, 1]), "client_c": torch.stack([g0, g1])}
    )
    plan = strategy.configure(0, torch.tensor([0, 1]), x)
    result = engine.train(x, plan, 0)
    expected = x - 0.3 * (g0 + g1) / 2
    torch.testing.assert_close(result.params, torch.stack([expected, expected]), atol=1e-6, rtol=1e-5)
