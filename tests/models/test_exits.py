"""Multi-exit models: the ensemble of the held exits, absent (zero) exits, and training on the sum of the exits'
losses on every backend that runs them."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from fedhet.engine.engine import Engine, resolve_backend
from fedhet.engine.functional import FlatModel
from fedhet.engine.plan import LocalPlan
from fedhet.errors import ConfigError
from fedhet.models.base import MODELS
from fedhet.models.exits import ExitsMLP, MultiExit, ensemble, exit_losses
from fedhet.models.flops import parameter_flops
from helpers.tiny import tiny_data

SIZES = [3, 5]


def exits_model(hidden: list[int] | None = None, seed: int = 0) -> FlatModel:
    torch.manual_seed(seed)
    module = MODELS.build({"name": "mlp_exits", "hidden": hidden or [4, 4]}).build((3,), 2)
    return FlatModel(module)


def test_the_spec_builds_a_block_and_an_exit_per_hidden_layer() -> None:
    model = exits_model([5, 4, 3])
    assert isinstance(model.module, ExitsMLP) and model.exits == 3
    assert model.names == [
        *[f"blocks.{i}.0.{p}" for i in range(3) for p in ("weight", "bias")],
        *[f"heads.{i}.{p}" for i in range(3) for p in ("weight", "bias")],
    ]
    assert [tuple(s) for s in model.shapes[6::2]] == [(2, 5), (2, 4), (2, 3)]


def test_the_output_is_the_mean_of_the_exits_logits() -> None:
    model = exits_model()
    module = model.module
    assert isinstance(module, MultiExit)
    x = torch.randn(6, 3)
    h1 = torch.relu(module.blocks[0][0](x))
    h2 = torch.relu(module.blocks[1][0](h1))
    z1, z2 = module.heads[0](h1), module.heads[1](h2)
    torch.testing.assert_close(module(x), (z1 + z2) / 2)
    z, held = module(x, exits=True)
    torch.testing.assert_close(z, torch.stack([z1, z2]))
    assert held.tolist() == [1.0, 1.0]


def test_an_exit_with_a_zero_weight_is_absent_from_the_ensemble() -> None:
    model = exits_model()
    w = model.initial_params()
    w[model.slices["heads.1.weight"]] = 0.0
    x = torch.randn(6, 3)
    assert model.module(x, exits=True)[1].tolist() == [1.0, 1.0]  # the module's own weights: both held
    _, held = torch.func.functional_call(model.module, model.unflatten(w), (x,), {"exits": True})
    assert held.tolist() == [1.0, 0.0]
    out = model.logits(w, x)  # with exit 2 zeroed, the ensemble is exit 1 alone
    v = model.unflatten(w)
    h1 = torch.relu(x @ v["blocks.0.0.weight"].T + v["blocks.0.0.bias"])
    torch.testing.assert_close(out, h1 @ v["heads.0.weight"].T + v["heads.0.bias"])
    assert ensemble(torch.ones(2, 1, 3), torch.zeros(2)).tolist() == [[0.0, 0.0, 0.0]]  # none held: zeros


def test_one_hidden_layer_is_mlp_parameter_for_parameter() -> None:
    torch.manual_seed(3)
    plain = FlatModel(MODELS.build({"name": "mlp", "hidden": [4]}).build((3,), 2))
    torch.manual_seed(3)
    exits = FlatModel(MODELS.build({"name": "mlp_exits", "hidden": [4]}).build((3,), 2))
    assert torch.equal(plain.initial_params(), exits.initial_params())
    x = torch.randn(5, 3)
    torch.testing.assert_close(plain.logits(plain.initial_params(), x), exits.logits(exits.initial_params(), x))


def test_the_training_loss_is_the_sum_of_the_held_exits_cross_entropies() -> None:
    model = exits_model()
    x, y = torch.randn(4, 3), torch.tensor([0, 1, 1, 0])
    z, held = model.module(x, exits=True)
    expected = F.cross_entropy(z[0], y, reduction="none") + F.cross_entropy(z[1], y, reduction="none")
    torch.testing.assert_close(exit_losses(model.task.loss, z, held, y), expected)
    torch.testing.assert_close(model.module_batch_loss(x, y, torch.ones(4)), expected.mean())
    only_first = exit_losses(model.task.loss, z, torch.tensor([1.0, 0.0]), y)
    torch.testing.assert_close(only_first, F.cross_entropy(z[0], y, reduction="none"))


def _sgd_by_hand(
    model: FlatModel, w: torch.Tensor, x: torch.Tensor, y: torch.Tensor, steps: int, lr: float
) -> tuple[torch.Tensor, float]:
    """Full-batch SGD on Σ_i CE(exit_i) with plain autograd on the module: the model and the mean loss."""
    losses = []
    for _ in range(steps):
        v = {n: t.clone().requires_grad_(True) for n, t in model.unflatten(w.clone()).items()}
        z, _ = torch.func.functional_call(model.module, v, (x,), {"exits": True})
        loss = F.cross_entropy(z[0], y) + F.cross_entropy(z[1], y)
        grads = torch.autograd.grad(loss, list(v.values()))
        w = w - lr * torch.cat([g.reshape(-1) for g in grads])
        losses.append(float(loss.detach()))
    return w, sum(losses) / steps


@pytest.mark.parametrize("backend", ["sequential", "vectorised"])
def test_local_training_descends_the_sum_of_the_exits_losses(backend: str) -> None:
    data = tiny_data(SIZES, dim=3, classes=2, seed=5)
    engine = Engine(exits_model(), data, backend=backend, seed=1)  # type: ignore[arg-type]
    model = engine.model
    w = model.initial_params()
    plan = LocalPlan.uniform(torch.tensor([0, 1]), 2, 0.1, 8)  # batch 8 > every client: full-batch steps
    got = engine.train(w, plan, 0)
    for k in range(2):
        x, y = data.train.client(k)
        expected, loss = _sgd_by_hand(model, w, x, y, 2, 0.1)
        torch.testing.assert_close(got.params[k], expected, atol=1e-6, rtol=1e-5)
        assert float(got.train_loss[k]) == pytest.approx(loss, abs=1e-5)  # the loss trained: both exits'


def test_the_hand_derived_backends_refuse_a_multi_exit_model_and_auto_picks_autograd() -> None:
    model = exits_model()
    with pytest.raises(ConfigError, match="backend 'dense'"):
        resolve_backend("dense", model)
    with pytest.raises(ConfigError, match="backend 'conv'"):
        resolve_backend("conv", model)
    assert resolve_backend("auto", model) in ("sequential", "vectorised")


def test_every_layer_of_every_exit_is_counted_in_the_flops() -> None:
    module = MODELS.build({"name": "mlp_exits", "hidden": [4, 4]}).build((3,), 2)
    flops = parameter_flops(module, (3,))
    assert float(flops.sum()) == (2 * 12 + 4) + (2 * 16 + 4) + 2 * (2 * 8 + 2)


def test_the_cnn_with_exits_pools_while_it_can_and_averages_its_exits() -> None:
    torch.manual_seed(0)
    module = MODELS.build({"name": "cnn_exits", "channels": [3, 4, 5]}).build((1, 4, 4), 2)
    assert isinstance(module, MultiExit) and module.num_exits == 3
    x = torch.randn(2, 16)  # flat 4×4 images
    z, held = module(x, exits=True)
    assert z.shape == (3, 2, 2) and held.tolist() == [1.0, 1.0, 1.0]
    torch.testing.assert_close(module(x), z.mean(0))
    pools = [sum(isinstance(m, torch.nn.MaxPool2d) for m in block) for block in module.blocks]
    assert pools == [1, 1, 0]  # 4 → 2 → 1 pixel, then no more pooling
    flops = parameter_flops(module, (1, 4, 4))
    # (2 FLOPs a weight + 1 a bias) at each output position: 4×4, 2×2 and 1×1 pixels
    convs = (2 * 3 * 1 * 9 + 3) * 16 + (2 * 4 * 3 * 9 + 4) * 4 + (2 * 5 * 4 * 9 + 5) * 1
    heads = sum(2 * c * 2 + 2 for c in (3, 4, 5))
    assert float(flops.sum()) == convs + heads


def test_the_cnn_trains_alike_on_both_autograd_backends() -> None:
    torch.manual_seed(0)
    data = tiny_data(SIZES, dim=16, classes=2, seed=5)
    params = []
    for backend in ("sequential", "vectorised"):
        torch.manual_seed(0)
        module = MODELS.build({"name": "cnn_exits", "channels": [3, 4]}).build((16,), 2)
        engine = Engine(FlatModel(module), data, backend=backend, seed=1)  # type: ignore[arg-type]
        plan = LocalPlan.uniform(torch.tensor([0, 1]), 2, 0.1, 8)
        params.append(engine.train(engine.model.initial_params(), plan, 0).params)
    torch.testing.assert_close(params[0], params[1], atol=1e-6, rtol=1e-5)
