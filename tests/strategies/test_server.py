"""Server optimisers (FedAvgM, FedAdagrad, FedAdam, FedYogi) by hand, and their state in checkpoints."""

from __future__ import annotations

import math

import pytest
import torch

from fedhet.catalog import STRATEGIES
from fedhet.engine.engine import Engine
from fedhet.engine.plan import LocalResult
from fedhet.errors import ConfigError
from fedhet.strategies.server import SERVER_OPTIMIZERS
from helpers.tiny import linear_model, make_context, tiny_data

W0 = torch.tensor([1.0, -2.0])
DIRECTIONS = [torch.tensor([2.0, 0.5]), torch.tensor([-1.0, 0.5])]


def steps(spec: dict[str, object], lr: float) -> list[torch.Tensor]:
    opt = SERVER_OPTIMIZERS.build(spec)
    w, out = W0, []
    for d in DIRECTIONS:
        w = opt.step(w, d, lr)
        out.append(w)
    return out


def test_sgd_and_momentum_by_hand() -> None:
    first, second = steps({"name": "sgd"}, 0.5)
    torch.testing.assert_close(second, W0 - 0.5 * (DIRECTIONS[0] + DIRECTIONS[1]))
    first, second = steps({"name": "momentum", "beta": 0.5}, 0.1)
    v1 = DIRECTIONS[0]
    v2 = 0.5 * v1 + DIRECTIONS[1]
    torch.testing.assert_close(first, W0 - 0.1 * v1)
    torch.testing.assert_close(second, W0 - 0.1 * v1 - 0.1 * v2)
    _, nesterov = steps({"name": "momentum", "beta": 0.5, "nesterov": True}, 0.1)
    torch.testing.assert_close(nesterov, W0 - 0.1 * (DIRECTIONS[0] + 0.5 * v1) - 0.1 * (DIRECTIONS[1] + 0.5 * v2))


@pytest.mark.parametrize("spec", [{"name": "sgd"}, {"name": "momentum", "beta": 0.9}])
def test_weight_decay_is_torch_sgds(spec: dict[str, object]) -> None:
    """With weight decay λ the step uses d + λ w, as torch.optim.SGD(momentum=β, weight_decay=λ) fed d as the
    gradient (CA-Fed's code steps its server that way); by hand for the first step."""
    lam, lr = 0.1, 0.5
    ours = steps({**spec, "weight_decay": lam}, lr)
    torch.testing.assert_close(ours[0], W0 - lr * (DIRECTIONS[0] + lam * W0))
    w = torch.nn.Parameter(W0.clone())
    reference = torch.optim.SGD([w], lr=lr, momentum=float(spec.get("beta", 0.0)), weight_decay=lam)  # type: ignore[arg-type]
    for d, expected in zip(DIRECTIONS, ours, strict=True):
        w.grad = d.clone()
        reference.step()
        torch.testing.assert_close(expected, w.detach())
    assert not torch.allclose(ours[1], steps(spec, lr)[1])  # the decay changed the steps


@pytest.mark.parametrize("kind", ["adagrad", "adam", "yogi"])
def test_adaptive_steps_by_hand(kind: str) -> None:
    """Reddi et al. Algorithm 2 coordinate by coordinate: m₋₁ = 0, v₋₁ = τ², no bias correction."""
    tau, b1, b2, lr = 0.1, 0.9, 0.99, 0.05
    got = steps({"name": kind, "tau": tau, "beta1": b1, "beta2": b2}, lr)
    for i in range(2):
        w, m, v = float(W0[i]), 0.0, tau**2
        for t, d in enumerate(DIRECTIONS):
            g = float(d[i])
            m = b1 * m + (1 - b1) * g
            if kind == "adagrad":
                v = v + g * g
            elif kind == "adam":
                v = b2 * v + (1 - b2) * g * g
            else:
                v = v - (1 - b2) * g * g * math.copysign(1.0, v - g * g)
            w = w - lr * m / (math.sqrt(v) + tau)
            assert float(got[t][i]) == pytest.approx(w, rel=1e-6)


def test_adam_bias_correction_is_the_flower_variant() -> None:
    tau, lr = 1e-3, 0.1
    (first, _) = steps({"name": "adam", "tau": tau, "bias_correction": True}, lr)
    d = DIRECTIONS[0].double()
    m_hat = (0.1 * d) / (1 - 0.9)
    v_hat = (0.99 * tau**2 + 0.01 * d * d) / (1 - 0.99)
    torch.testing.assert_close(first.double(), W0.double() - lr * m_hat / (v_hat.sqrt() + tau), atol=1e-6, rtol=1e-6)


def test_fedadam_strategy_steps_on_the_fedavg_direction_and_checkpoints_its_moments() -> None:
    engine = Engine(linear_model(), tiny_data([4, 4]))
    strategy = STRATEGIES.build({"name": "fedadam", "server_lr": 0.1})
    strategy.setup(make_context(engine, m=2))
    p = engine.model.size
    w = torch.zeros(p)
    local = torch.stack([torch.full((p,), -1.0), torch.full((p,), -3.0)])
    result = LocalResult(torch.tensor([0, 1]), local, torch.zeros(2), torch.ones(2), torch.ones(2))
    reference = SERVER_OPTIMIZERS.build({"name": "adam"})
    expected = reference.step(w, torch.full((p,), 2.0), 0.1)  # FedAvg's direction: mean of w − w_k = 2
    torch.testing.assert_close(strategy.aggregate(0, w, result), expected)
    saved = strategy.state_dict()
    second = strategy.aggregate(1, expected, result)
    again = STRATEGIES.build({"name": "fedadam", "server_lr": 0.1})
    again.setup(make_context(engine, m=2))
    again.load_state_dict(saved)
    torch.testing.assert_close(again.aggregate(1, expected, result), second)  # the moments were restored


def test_any_strategy_takes_a_server_optimiser_by_name() -> None:
    strategy = STRATEGIES.build({"name": "scaffold", "server_optimizer": {"name": "yogi", "tau": 0.01}})
    assert strategy.server_optimizer.name == "yogi"
    assert STRATEGIES.build("fedavgm").server_optimizer.name == "momentum"
    assert STRATEGIES.build("fedyogi").model_dump(mode="json")["server_optimizer"]["name"] == "yogi"
    with pytest.raises(ConfigError, match="server optimizer 'adamw'"):
        STRATEGIES.build({"name": "fedavg", "server_optimizer": "adamw"})
    with pytest.raises(ConfigError, match=r"base\.server_optimizer"):
        STRATEGIES.build({"name": "gsnr", "server_optimizer": "adam"})
