"""Client optimisers: momentum and Nesterov by hand, Adam against torch.optim, state kept or reset by round."""

from __future__ import annotations

import math

import pytest
import torch
from torch import nn

from fedhet.data.dataset import ClientData, FederatedData
from fedhet.engine.engine import Engine
from fedhet.engine.functional import FlatModel
from fedhet.engine.optimizers import SGD, Adam, ClientOptimizer
from fedhet.engine.plan import LocalPlan
from helpers.tiny import tiny_data

BACKENDS = ["sequential", "vectorised", "dense"]


def one_sample() -> FederatedData:
    """One client holding the single sample x = 1 with label 0."""
    part = ClientData(torch.ones(1, 1), torch.zeros(1, dtype=torch.long), torch.tensor([0, 1]))
    return FederatedData("one", part, part, 2, torch.ones(1, dtype=torch.bool))


def zero_linear() -> FlatModel:
    model = nn.Linear(1, 2)
    nn.init.zeros_(model.weight)
    nn.init.zeros_(model.bias)
    return FlatModel(model)


def two_steps(backend: str, optimizer: ClientOptimizer, lr: float = 0.1) -> torch.Tensor:
    engine = Engine(zero_linear(), one_sample(), backend=backend)  # type: ignore[arg-type]
    plan = LocalPlan.uniform(torch.tensor([0]), 2, lr, 1, optimizer=optimizer)
    return engine.train(engine.initial_params(), plan, 0).params[0]


def sigmoid(z: float) -> float:
    return 1 / (1 + math.exp(-z))


@pytest.mark.parametrize("backend", BACKENDS)
def test_momentum_two_steps_by_hand(backend: str) -> None:
    """W = b = 0 and x = 1, y = 0: every parameter is ±w, the logits are (2w, −2w), the gradient of each is
    ±(p − 1) with p = σ(4w) the probability of class 0. Step 1: b = g₀ = ∓½, w₁ = η/2. Step 2: b = μ g₀ + g₁,
    w₂ = w₁ + η (μ/2 + 1 − σ(4 w₁))."""
    eta, mu = 0.1, 0.9
    w1 = eta / 2
    w2 = w1 + eta * (mu / 2 + 1 - sigmoid(4 * w1))
    got = two_steps(backend, SGD(momentum=mu), eta)
    # parameters: W (2×1) then b (2): class 0 up, class 1 down
    torch.testing.assert_close(got, torch.tensor([w2, -w2, w2, -w2]), atol=1e-6, rtol=1e-6)
    plain = two_steps(backend, SGD(), eta)
    assert abs(float(plain[0]) - (w1 + eta * (1 - sigmoid(4 * w1)))) < 1e-6  # μ = 0 is plain SGD


@pytest.mark.parametrize("backend", BACKENDS)
def test_nesterov_two_steps_by_hand(backend: str) -> None:
    """Nesterov: w ← w − η (g + μ b). Step 1: b = g_0, w₁ = η (1 + μ)/2. Step 2: b = μ g_0 + g_1,
    w₂ = w₁ + η (q + μ (μ/2 + q)) with q = 1 − σ(4 w₁)."""
    eta, mu = 0.1, 0.9
    w1 = eta * (1 + mu) / 2
    q = 1 - sigmoid(4 * w1)
    w2 = w1 + eta * (q + mu * (mu / 2 + q))
    got = two_steps(backend, SGD(momentum=mu, nesterov=True), eta)
    torch.testing.assert_close(got, torch.tensor([w2, -w2, w2, -w2]), atol=1e-6, rtol=1e-6)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize(
    ("ours", "theirs"),
    [
        (SGD(momentum=0.8), lambda p: torch.optim.SGD(p, lr=0.2, momentum=0.8)),
        (SGD(momentum=0.8, nesterov=True), lambda p: torch.optim.SGD(p, lr=0.2, momentum=0.8, nesterov=True)),
        (Adam(), lambda p: torch.optim.Adam(p, lr=0.2)),
        (Adam(beta1=0.5, beta2=0.9, eps=1e-3), lambda p: torch.optim.Adam(p, lr=0.2, betas=(0.5, 0.9), eps=1e-3)),
    ],
    ids=["momentum", "nesterov", "adam", "adam-options"],
)
def test_optimisers_match_torch_optim(backend: str, ours: ClientOptimizer, theirs: object) -> None:
    """Full-batch steps (batch = the client's data), so every step sees the same samples as torch's loop."""
    data = tiny_data([6], dim=4, classes=3, seed=2)
    torch.manual_seed(1)
    module = nn.Sequential(nn.Linear(4, 5), nn.Tanh(), nn.Linear(5, 3))
    model = FlatModel(module)
    w0 = model.initial_params()
    engine = Engine(model, data, backend=backend)  # type: ignore[arg-type]
    got = engine.train(w0, LocalPlan.uniform(torch.tensor([0]), 4, 0.2, 6, optimizer=ours), 0).params[0]
    reference = nn.Sequential(nn.Linear(4, 5), nn.Tanh(), nn.Linear(5, 3))
    torch.nn.utils.vector_to_parameters(w0.clone(), reference.parameters())
    opt = theirs(reference.parameters())  # type: ignore[operator]
    x, y = data.train.client(0)
    for _ in range(4):
        opt.zero_grad()
        nn.functional.cross_entropy(reference(x), y).backward()
        opt.step()
    expected = torch.nn.utils.parameters_to_vector(reference.parameters()).detach()
    assert float((expected - w0).abs().max()) > 1e-2
    torch.testing.assert_close(got, expected, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("backend", BACKENDS)
def test_persistent_state_carries_over_rounds_and_fresh_state_does_not(backend: str) -> None:
    """With full batches, two rounds of one step each (the second from the first's model) equal one round of two
    steps when the momentum persists, and two restarts when it does not."""
    data = tiny_data([5, 7], dim=3, classes=2, seed=4)
    model = FlatModel(nn.Linear(3, 2))
    w0 = model.initial_params()

    def rounds(optimizer: ClientOptimizer) -> torch.Tensor:
        engine = Engine(model, data, backend=backend)  # type: ignore[arg-type]
        w = w0
        for t in range(2):
            plan = LocalPlan(torch.tensor([1]), torch.tensor([1]), torch.tensor([0.3]), 7, optimizer=optimizer)
            w = engine.train(w, plan, t).params[0]
        return w

    engine = Engine(model, data, backend=backend)  # type: ignore[arg-type]
    plan = LocalPlan(torch.tensor([1]), torch.tensor([2]), torch.tensor([0.3]), 7, optimizer=SGD(momentum=0.9))
    straight = engine.train(w0, plan, 0).params[0]
    torch.testing.assert_close(rounds(SGD(momentum=0.9, persistent=True)), straight, atol=1e-6, rtol=1e-6)
    restarted = rounds(SGD(momentum=0.9))
    assert float((restarted - straight).abs().max()) > 1e-4


def test_persistent_state_is_kept_per_client_and_only_for_clients_that_trained() -> None:
    data = tiny_data([4, 4, 4], seed=1)
    engine = Engine(FlatModel(nn.Linear(3, 2)), data)
    opt = Adam(persistent=True)
    plan = LocalPlan(torch.tensor([0, 2]), torch.tensor([3, 0]), torch.full((2,), 0.1), 2, optimizer=opt)
    engine.train(engine.initial_params(), plan, 0)
    assert engine.client_state.clients(opt.state_key("m")) == [0]  # client 2 took no step
    count = engine.state_rows(opt.state_key("count"), torch.tensor([0]), 1, torch.zeros(1))
    assert count.tolist() == [3.0]


def test_local_epochs_give_each_client_its_passes_over_its_data() -> None:
    from fedhet.engine.plan import LocalSettings, epoch_steps

    sizes = torch.tensor([10, 25, 0, 3])
    assert epoch_steps(sizes, 8, 1.0).tolist() == [2, 4, 0, 1]
    assert epoch_steps(sizes, 8, 2.5).tolist() == [4, 8, 0, 1]
    local = LocalSettings(steps=5, lr=0.1, batch_size=8, epochs=2.0)
    assert local.plan(torch.arange(4), sizes).steps.tolist() == [3, 7, 0, 1]
    assert LocalSettings(steps=5, lr=0.1, batch_size=8).plan(torch.arange(4), sizes).steps.tolist() == [5] * 4
