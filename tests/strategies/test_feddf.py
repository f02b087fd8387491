"""FedDF: FedAvg within each architecture, then one Adam step of the distillation written out by hand."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from fedhet.engine.functional import FlatModel
from fedhet.engine.plan import LocalPlan
from fedhet.errors import ConfigError
from fedhet.strategies.feddf import FedDF, distill, ensemble_logits
from helpers.architectures import context, engine


def linear(weight: list[list[float]], bias: list[float]) -> tuple[FlatModel, torch.Tensor]:
    model = FlatModel(nn.Linear(2, 2))
    return model, torch.cat(
        [torch.tensor(weight, dtype=torch.float32).reshape(-1), torch.tensor(bias, dtype=torch.float32)]
    )


def test_the_teacher_is_the_mean_of_the_logits() -> None:
    x = torch.tensor([[1.0, 2.0]])
    a, b = linear([[1, 0], [0, 1]], [0, 0]), linear([[0, 1], [1, 1]], [1, -1])
    torch.testing.assert_close(ensemble_logits([a, b], x), torch.tensor([[(1 + 3) / 2, (2 + 2) / 2]]))


def test_one_distillation_step_by_hand() -> None:
    """s = W x + b; ∂KL(σ(t/T) ‖ σ(s/T))/∂s = (σ(s/T) − σ(t/T)) / (T·B) per row; Adam's first step is
    −η g / (|g| + ε) (its moments, bias-corrected, are g and g²)."""
    model, w = linear([[0.5, -1.0], [0.2, 0.3]], [0.1, 0.0])
    x = torch.tensor([[1.0, 2.0], [-1.0, 0.5]])
    teacher = torch.tensor([[2.0, 0.0], [0.0, 1.0]])
    lr, temperature = 0.01, 2.0
    out = distill(model, w, x, teacher, 1, lr, 2, temperature, torch.tensor([0, 1]))
    s = x @ torch.tensor([[0.5, -1.0], [0.2, 0.3]]).T + torch.tensor([0.1, 0.0])
    ds = (torch.softmax(s / temperature, -1) - torch.softmax(teacher / temperature, -1)) / (temperature * 2)
    g = torch.cat([(ds.T @ x).reshape(-1), ds.sum(0)])
    torch.testing.assert_close(out, w - lr * g / (g.abs() + 1e-8), atol=1e-6, rtol=1e-5)
    assert torch.equal(distill(model, w, x, teacher, 0, lr, 2, temperature, torch.tensor([0, 1])), w)


def test_without_distillation_each_architecture_is_averaged_over_its_clients() -> None:
    eng = engine(members=[0, 1, 0, 1], sizes=[6, 8, 5, 7])
    df = FedDF(distill_steps=0)
    df.setup(context(eng))
    w, clients = eng.initial_params(), torch.tensor([0, 2, 3])
    result = eng.train(w, LocalPlan.uniform(clients, 2, 0.1, 4), 0)
    new = df.aggregate(0, w, result)
    b0, b1 = eng.blocks
    torch.testing.assert_close(new[b0], (6 * result.params[0, b0] + 5 * result.params[1, b0]) / 11)
    torch.testing.assert_close(new[b1], result.params[2, b1])  # one client of member 1
    alone = df.aggregate(0, w, result.rows(torch.tensor([0])))
    assert torch.equal(alone[b1], w[b1])  # no client of member 1: its model stays


def test_distillation_moves_each_student_towards_the_ensemble() -> None:
    eng = engine(members=[0, 1, 0, 1], sizes=[6, 8, 5, 7])
    eng.data.seen[3] = False  # client 3 is held out: its training inputs are the proxy set
    df = FedDF(distill_steps=20, distill_lr=0.01, distill_batch=4)
    df.setup(context(eng))
    w, clients = eng.initial_params(), torch.tensor([0, 1, 2])
    result = eng.train(w, LocalPlan.uniform(clients, 2, 0.1, 4), 0)
    averaged = FedDF(distill_steps=0)
    averaged.setup(context(eng))
    x = df.proxy()
    assert len(x) == 7
    teacher = ensemble_logits(
        [
            (eng.parts[int(eng.members[k])].model, result.params[i, eng.blocks[int(eng.members[k])]])
            for i, k in enumerate(clients.tolist())
        ],
        x,
    )
    before, after = averaged.aggregate(0, w, result), df.aggregate(0, w, result)

    def gap(params: torch.Tensor, a: int) -> float:
        out = eng.parts[a].model.logits(params[eng.blocks[a]], x)
        return float(
            torch.nn.functional.kl_div(
                out.log_softmax(-1), teacher.log_softmax(-1), log_target=True, reduction="batchmean"
            )
        )

    for a in (0, 1):
        assert gap(after, a) < gap(before, a)


def test_a_run_without_held_out_clients_is_refused() -> None:
    with pytest.raises(ConfigError, match="set unseen_clients"):
        FedDF().setup(context(engine()))
    FedDF(distill_steps=0).setup(context(engine()))
