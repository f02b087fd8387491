"""FedGH: the server's header step on the clients' prototypes, by hand, and the header every client receives."""

from __future__ import annotations

import math

import pytest
import torch

from fedhet.engine.engine import Engine
from fedhet.engine.plan import LocalPlan
from fedhet.errors import ConfigError
from fedhet.strategies.fedgh import PERSONAL, FedGH, prototype_pairs, train_header
from helpers.architectures import context, engine
from helpers.tiny import linear_model, make_context, tiny_data


def test_prototype_pairs_are_each_clients_class_means() -> None:
    sums = torch.tensor([[[2.0, 4.0], [0.0, 0.0]], [[3.0, 0.0], [1.0, 3.0]]])
    counts = torch.tensor([[2.0, 0.0], [1.0, 2.0]])
    prototypes, classes = prototype_pairs(sums, counts)
    torch.testing.assert_close(prototypes, torch.tensor([[1.0, 2.0], [3.0, 0.0], [0.5, 1.5]]))
    assert classes.tolist() == [0, 0, 1]


def test_one_header_step_by_hand() -> None:
    """Two pairs, two classes, W = 0, b = 0: softmax is (1/2, 1/2) for both, so with z_1 = (1, 0) of class 0 and
    z_2 = (0, 2) of class 1, ∇_W = ½ Σ_i (p_i − e_{y_i}) z_iᵀ = ½ [[−½, 1], [½, −1]] and ∇_b = 0."""
    w, b = torch.zeros(2, 2), torch.zeros(2)
    z, y = torch.tensor([[1.0, 0.0], [0.0, 2.0]]), torch.tensor([0, 1])
    new_w, new_b = train_header(w, b, z, y, lr=0.4, steps=1)
    torch.testing.assert_close(new_w, -0.4 * torch.tensor([[-0.25, 0.5], [0.25, -0.5]]))
    torch.testing.assert_close(new_b, torch.zeros(2))
    # the second step from there: p_1 = softmax((0.1, -0.1)), p_2 = softmax((-0.4, 0.4))
    w2, b2 = train_header(w, b, z, y, lr=0.4, steps=2)
    p1 = torch.tensor([1.0, math.exp(-0.2)]) / (1 + math.exp(-0.2))
    p2 = torch.tensor([math.exp(-0.8), 1.0]) / (1 + math.exp(-0.8))
    grad_w = 0.5 * (torch.outer(p1 - torch.tensor([1.0, 0.0]), z[0]) + torch.outer(p2 - torch.tensor([0.0, 1.0]), z[1]))
    grad_b = 0.5 * (p1 - torch.tensor([1.0, 0.0]) + p2 - torch.tensor([0.0, 1.0]))
    torch.testing.assert_close(w2, new_w - 0.4 * grad_w)
    torch.testing.assert_close(b2, -0.4 * grad_b)
    assert train_header(w, b, z[:0], y[:0], 0.4, 5)[0].equal(w)  # no pairs: unchanged


def test_a_round_trains_one_header_for_every_architecture() -> None:
    eng = engine()
    gh = FedGH(header_steps=3, header_lr=0.5)
    gh.setup(context(eng))
    w, clients = eng.initial_params(), torch.arange(4)
    result = gh.local_training(0, clients, w, lambda plan: eng.train(w, plan, 0))
    after = LocalPlan.uniform(clients, 0, 0.1, 4, personal=PERSONAL, phase=1)
    pairs = prototype_pairs(*eng.representations(w, after, 0))
    new = gh.aggregate(0, w, result)
    expected = train_header(*gh.header(w), *pairs, lr=0.5, steps=3)
    for a, (weight, bias) in enumerate(eng.heads):
        torch.testing.assert_close(new[weight], expected[0].reshape(-1))
        torch.testing.assert_close(new[bias], expected[1])
        body = slice(eng.blocks[a].start, weight.start)
        assert torch.equal(new[body], w[body])  # the bodies stay with the clients
    # each client's model: its own trained body, the global header
    starts = eng.personal_starts(new, gh.personalization(clients), 1)
    assert starts is not None
    for a, (weight, _) in enumerate(eng.heads):
        mine = eng.members == a
        assert torch.equal(starts[mine][:, weight], new[weight].expand(int(mine.sum()), -1))
        assert not torch.equal(starts[mine][:, eng.blocks[a].start], w[eng.blocks[a].start].expand(int(mine.sum())))


def test_a_model_without_architectures_is_refused() -> None:
    with pytest.raises(ConfigError, match="use model: architectures"):
        FedGH().setup(make_context(Engine(linear_model(3, 2), tiny_data([4, 5]))))
