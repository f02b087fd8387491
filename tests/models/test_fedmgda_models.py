"""FedMGDA+'s image models (Tables 2–4): parameter counts, flat inputs, dropout, and `vmap(grad)` per client."""

from __future__ import annotations

import pytest
import torch
from torch import nn
from torch.func import functional_call, grad, vmap

from fedhet.data.dataset import ClientData, FederatedData
from fedhet.engine.engine import Engine
from fedhet.engine.functional import FlatModel
from fedhet.engine.plan import LocalPlan
from fedhet.models.base import MODELS
from fedhet.models.fedmgda import ChannelDropout


def build(name: str, shape: tuple[int, ...], classes: int) -> nn.Module:
    torch.manual_seed(0)
    return MODELS.build(name).build(shape, classes)


@pytest.mark.parametrize(
    ("name", "shape", "classes", "expected"),
    [
        ("cnn_cifar_lrn", (3, 32, 32), 10, 797_962),  # Table 2
        ("cnn_fmnist", (1, 28, 28), 10, 21_840),  # Table 3
        ("cnn_femnist", (1, 28, 28), 62, 1_206_590),  # Table 4
    ],
)
def test_parameter_counts_match_the_tables(name: str, shape: tuple[int, ...], classes: int, expected: int) -> None:
    model = build(name, shape, classes)
    assert sum(p.numel() for p in model.parameters()) == expected
    assert not list(model.buffers())
    x = torch.randn(2, *shape)
    model.eval()
    assert model(x).shape == (2, classes)
    torch.testing.assert_close(model(x), model(x.reshape(2, -1)))


def test_table_two_layer_sizes() -> None:
    assert 3 * 64 * 25 + 64 + 64 * 64 * 25 + 64 + 1600 * 384 + 384 + 384 * 192 + 192 + 192 * 10 + 10 == 797_962
    convs = [m for m in build("cnn_cifar_lrn", (3, 32, 32), 10).modules() if isinstance(m, nn.LocalResponseNorm)]
    assert [m.size for m in convs] == [2, 2]


def test_channel_dropout_zeroes_whole_channels() -> None:
    torch.manual_seed(3)
    layer = ChannelDropout(0.5).train()
    out = layer(torch.ones(4, 6, 3, 3))
    per_channel = out.reshape(4, 6, 9)
    assert bool(((per_channel == 0).all(-1) | (per_channel == 2).all(-1)).all())  # 0 or 1/(1 − p), per channel
    assert bool((per_channel == 0).any()) and bool((per_channel == 2).any())
    assert torch.equal(layer.eval()(torch.ones(2, 3, 2, 2)), torch.ones(2, 3, 2, 2))


@pytest.mark.parametrize("name", ["cnn_cifar_lrn", "cnn_fmnist"])
def test_per_client_gradients_under_vmap(name: str) -> None:
    shape = (3, 32, 32) if name == "cnn_cifar_lrn" else (1, 28, 28)
    module = build(name, shape, 10).eval()
    flat = FlatModel(module)
    params = {k: torch.stack([p.detach(), p.detach() * 1.01]) for k, p in module.named_parameters()}
    x, y = torch.randn(2, 3, *shape), torch.randint(0, 10, (2, 3))

    def loss(p: dict[str, torch.Tensor], xb: torch.Tensor, yb: torch.Tensor) -> torch.Tensor:
        return nn.functional.cross_entropy(functional_call(module, p, (xb,)), yb)

    batched = vmap(grad(loss))(params, x, y)
    for k in range(2):
        single = grad(loss)({n: v[k] for n, v in params.items()}, x[k], y[k])
        for n in single:
            torch.testing.assert_close(batched[n][k], single[n], atol=1e-5, rtol=1e-4)
    assert flat.size == sum(p.numel() for p in module.parameters())


def test_both_backends_train_the_dropout_model_alike() -> None:
    gen = torch.Generator().manual_seed(0)
    xs = [torch.randn(6, 1, 28, 28, generator=gen) for _ in range(3)]
    ys = [torch.randint(0, 10, (6,), generator=gen) for _ in range(3)]
    part = ClientData.from_parts(xs, ys)
    data = FederatedData("img", part, part, 10, torch.ones(3, dtype=torch.bool))
    for name in ("cnn_fmnist",):  # its channel dropout is the layer to check
        model = FlatModel(build(name, (1, 28, 28), 10))
        w0 = model.initial_params()
        plan = LocalPlan.uniform(torch.arange(3), 2, 0.05, 3)
        seq = Engine(model, data, backend="sequential", seed=1).train(w0, plan, 0)
        vec = Engine(model, data, backend="vectorised", seed=1).train(w0, plan, 0)
        torch.testing.assert_close(seq.params, vec.params, atol=1e-5, rtol=1e-4)
        assert not torch.allclose(seq.params[0], w0)
