"""The papers' models: shapes, parameter counts, and per-client gradients under `vmap(grad)`."""

from __future__ import annotations

import copy
import math
from typing import Any

import pytest
import torch
import torch.nn.functional as F
from torch import Tensor, nn
from torch.func import functional_call, grad, vmap

from fedhet.engine.functional import FlatModel
from fedhet.errors import ConfigError
from fedhet.models.base import MODELS
from fedhet.models.zoo import image_shape
from fedhet.registry import spec_of

CLIENTS = 3
BATCH = 4

# (spec, input shape, classes, token inputs?) for every model, small where the defaults are slow to test.
CASES: list[tuple[dict[str, Any], tuple[int, ...], int, bool]] = [
    ({"name": "logistic"}, (784,), 10, False),
    ({"name": "logistic", "bias": False}, (1, 28, 28), 10, False),
    ({"name": "mlp"}, (1, 28, 28), 10, False),
    ({"name": "mlp", "hidden": [64, 30], "activation": "tanh", "dropout": 0.5}, (784,), 10, False),
    (
        {"name": "mlp", "hidden": [16, 8], "activation": "sigmoid", "dropout": 0.2, "dropout_after": "all"},
        (60,),
        5,
        False,
    ),
    ({"name": "mlp", "hidden": [32], "activation": "gelu"}, (3, 8, 8), 4, False),
    ({"name": "cnn_mnist"}, (1, 28, 28), 10, False),
    ({"name": "cnn_mnist", "channels": [4, 8], "hidden": 16, "padding": "valid"}, (784,), 10, False),
    ({"name": "lenet_cifar"}, (3, 32, 32), 10, False),
    ({"name": "lenet_cifar"}, (3072,), 10, False),
    ({"name": "cnn_cifar"}, (3, 32, 32), 10, False),
    ({"name": "vgg16", "widths": [4, 4, 8, 8, 8], "hidden": 16, "norm": "none"}, (3072,), 10, False),
    ({"name": "char_lstm"}, (8,), 80, True),
    ({"name": "char_lstm", "embed_dim": 4, "hidden": 12, "layers": 3}, (5,), 20, True),
    ({"name": "char_lstm", "hidden": 16, "fused": True}, (6,), 30, True),
]
IDS = [f"{c[0]['name']}-{i}" for i, c in enumerate(CASES)]


def build(spec: dict[str, Any], shape: tuple[int, ...], classes: int, seed: int = 0) -> nn.Module:
    torch.manual_seed(seed)
    return MODELS.build(spec).build(shape, classes)


def inputs(shape: tuple[int, ...], classes: int, tokens: bool, *lead: int, seed: int = 1) -> Tensor:
    gen = torch.Generator().manual_seed(seed)
    if tokens:
        return torch.randint(0, classes, (*lead, *shape), generator=gen)
    return torch.randn(*lead, *shape, generator=gen)


def n_params(module: nn.Module) -> int:
    return sum(p.numel() for p in module.parameters())


def stacked_params(module: nn.Module, clients: int = CLIENTS, spread: float = 0.05) -> dict[str, Tensor]:
    """Each parameter stacked `clients` times along a new first axis, client k's copy nudged by k * spread."""
    gen = torch.Generator().manual_seed(7)
    return {
        name: torch.stack([p.detach() + k * spread * torch.randn(p.shape, generator=gen) for k in range(clients)])
        for name, p in module.named_parameters()
    }


@pytest.mark.filterwarnings("ignore:There is a performance drop")
@pytest.mark.parametrize(("spec", "shape", "classes", "tokens"), CASES, ids=IDS)
def test_output_shape(spec: dict[str, Any], shape: tuple[int, ...], classes: int, tokens: bool) -> None:
    model = build(spec, shape, classes).eval()
    out = model(inputs(shape, classes, tokens, 5))
    assert out.shape == (5, classes)
    assert out.dtype == torch.float32
    assert not any(isinstance(m, nn.modules.batchnorm._BatchNorm) for m in model.modules())
    assert not list(model.buffers())


def test_image_models_accept_flat_and_image_batches() -> None:
    for spec, shape in [("cnn_mnist", (1, 28, 28)), ("lenet_cifar", (3, 32, 32)), ("cnn_cifar", (3, 32, 32))]:
        model = build({"name": spec}, shape, 10).eval()
        x = torch.randn(2, *shape)
        torch.testing.assert_close(model(x), model(x.reshape(2, -1)))
    assert image_shape((784,), "m") == (1, 28, 28)
    assert image_shape((3072,), "m") == (3, 32, 32)
    assert image_shape((28, 28), "m") == (1, 28, 28)
    with pytest.raises(ConfigError, match="image inputs"):
        image_shape((10,), "cnn_mnist")
    with pytest.raises(ConfigError, match="too small"):
        MODELS.build("lenet_cifar").build((3, 8, 8), 10)
    with pytest.raises(ConfigError, match="token sequences"):
        MODELS.build("char_lstm").build((1, 28, 28), 10)


@pytest.mark.parametrize(
    ("spec", "shape", "classes", "expected"),
    [
        ({"name": "logistic"}, (784,), 10, 7_850),
        ({"name": "logistic", "bias": False}, (1, 28, 28), 10, 7_840),
        ({"name": "mlp"}, (784,), 10, 159_010),
        ({"name": "mlp", "hidden": [200, 200]}, (784,), 10, 199_210),  # FedAvg's 2NN
        ({"name": "mlp", "hidden": [64, 30], "dropout": 0.5}, (784,), 10, 52_500),  # MaxFL
        ({"name": "mlp", "hidden": []}, (784,), 10, 7_850),
        ({"name": "cnn_mnist"}, (1, 28, 28), 10, 1_663_370),  # McMahan et al. 2017
        ({"name": "cnn_mnist"}, (784,), 10, 1_663_370),
        ({"name": "cnn_mnist", "padding": "valid"}, (1, 28, 28), 10, 582_026),
        ({"name": "lenet_cifar"}, (3, 32, 32), 10, 62_006),
        ({"name": "cnn_cifar"}, (3, 32, 32), 10, 2_156_490),
        ({"name": "vgg16", "norm": "none"}, (3, 32, 32), 100, 15_291_300),  # 14,714,688 conv + 576,612 head
        ({"name": "vgg16"}, (3, 32, 32), 100, 15_299_748),  # + GroupNorm's 2 × 4,224 affine parameters
        ({"name": "char_lstm"}, (80,), 80, 819_920),  # LEAF Shakespeare, 80 characters
        ({"name": "char_lstm", "fused": True}, (80,), 80, 819_920),
    ],
)
def test_parameter_counts(spec: dict[str, Any], shape: tuple[int, ...], classes: int, expected: int) -> None:
    assert n_params(build(spec, shape, classes)) == expected


def test_known_counts_by_hand() -> None:
    assert 784 * 64 + 64 + 64 * 30 + 30 + 30 * 10 + 10 == 52_500
    # embedding 80x8, LSTM layers 4*256*(8+256+2) and 4*256*(256+256+2), read-out 256*80+80
    assert 80 * 8 + 4 * 256 * (8 + 256 + 2) + 4 * 256 * (256 + 256 + 2) + 256 * 80 + 80 == 819_920


@pytest.mark.parametrize(("spec", "shape", "classes", "tokens"), CASES, ids=IDS)
@pytest.mark.filterwarnings("ignore:There is a performance drop")  # fused nn.LSTM under vmap
def test_vmap_grad_matches_per_client_autograd(
    spec: dict[str, Any], shape: tuple[int, ...], classes: int, tokens: bool
) -> None:
    model = build(spec, shape, classes).eval()  # eval: dropout off
    params = stacked_params(model)
    x = inputs(shape, classes, tokens, CLIENTS, BATCH)
    y = torch.randint(0, classes, (CLIENTS, BATCH), generator=torch.Generator().manual_seed(2))

    def loss_fn(p: dict[str, Tensor], xb: Tensor, yb: Tensor) -> Tensor:
        return F.cross_entropy(functional_call(model, p, (xb,)), yb)

    batched = vmap(grad(loss_fn))(params, x, y)

    for k in range(CLIENTS):
        local = copy.deepcopy(model)
        with torch.no_grad():
            for name, p in local.named_parameters():
                p.copy_(params[name][k])
        local.zero_grad()
        F.cross_entropy(local(x[k]), y[k]).backward()
        for name, p in local.named_parameters():
            assert p.grad is not None
            # float32 sums in another order: entries near 0 of a large gradient (cnn_cifar's head: largest entry
            # 36) differ by ~1e-6 of its scale, which depends on the CPU's kernels
            scale = max(1.0, float(p.grad.abs().max()))
            torch.testing.assert_close(batched[name][k], p.grad, rtol=1e-5, atol=2e-6 * scale, msg=name)


@pytest.mark.filterwarnings("ignore:There is a performance drop")
def test_engine_flat_model_runs_every_model() -> None:
    """The engine's own path: one flat parameter vector per client, stacked, under vmap(grad)."""
    for spec, shape, classes, tokens in CASES:
        flat = FlatModel(build(spec, shape, classes).eval())
        theta = flat.initial_params().repeat(CLIENTS, 1)
        x = inputs(shape, classes, tokens, CLIENTS, BATCH)
        y = torch.randint(0, classes, (CLIENTS, BATCH))
        w = torch.ones(CLIENTS, BATCH)
        g = vmap(grad(flat.batch_loss))(theta, x, y, w)
        assert g.shape == (CLIENTS, flat.size)
        assert torch.isfinite(g).all()


def test_mlp_dropout_train_mode_under_vmap() -> None:
    spec = {"name": "mlp", "hidden": [64, 30], "dropout": 0.5}
    model = build(spec, (784,), 10).train()
    assert sum(isinstance(m, nn.Dropout) for m in model.modules()) == 1  # after the first hidden layer only
    params = stacked_params(model)
    x = torch.randn(CLIENTS, BATCH, 784)
    y = torch.randint(0, 10, (CLIENTS, BATCH))

    def loss_fn(p: dict[str, Tensor], xb: Tensor, yb: Tensor) -> Tensor:
        return F.cross_entropy(functional_call(model, p, (xb,)), yb)

    for randomness in ("same", "different"):
        torch.manual_seed(0)
        g = vmap(grad(loss_fn), randomness=randomness)(params, x, y)
        assert all(torch.isfinite(v).all() for v in g.values())
    # dropout is really on in train mode: the same batch gives different gradients on two draws
    torch.manual_seed(0)
    g1 = vmap(grad(loss_fn), randomness="same")(params, x, y)
    g2 = vmap(grad(loss_fn), randomness="same")(params, x, y)
    assert not torch.allclose(g1["1.weight"], g2["1.weight"])

    all_layers = build({**spec, "dropout_after": "all"}, (784,), 10)
    assert sum(isinstance(m, nn.Dropout) for m in all_layers.modules()) == 2
    assert not any(isinstance(m, nn.Dropout) for m in build({"name": "mlp"}, (784,), 10).modules())


@pytest.mark.filterwarnings("ignore:There is a performance drop")
def test_char_lstm_loop_matches_torch_lstm() -> None:
    """The hand-written LSTM has nn.LSTM's parameters (names, order, initialisation) and computes the same."""
    spec = {"name": "char_lstm", "embed_dim": 6, "hidden": 10, "layers": 2}
    loop = build(spec, (7,), 20, seed=4).eval()
    fused = build({**spec, "fused": True}, (7,), 20, seed=4).eval()
    assert isinstance(fused.get_submodule("lstm"), nn.LSTM)
    assert not isinstance(loop.get_submodule("lstm"), nn.LSTM)
    loop_params, fused_params = dict(loop.named_parameters()), dict(fused.named_parameters())
    assert list(loop_params) == list(fused_params)
    for name, p in loop_params.items():
        torch.testing.assert_close(p, fused_params[name], rtol=0, atol=0, msg=name)
    assert all(p.abs().max() <= 1 / math.sqrt(10) for p in loop.get_submodule("lstm").parameters())

    x = torch.randint(0, 20, (4, 7))
    torch.testing.assert_close(loop(x), fused(x))
    # and under vmap(grad) over stacked parameters
    params = stacked_params(loop)
    xs = torch.randint(0, 20, (CLIENTS, BATCH, 7))
    ys = torch.randint(0, 20, (CLIENTS, BATCH))
    grads = [
        vmap(grad(lambda p, xb, yb, m=m: F.cross_entropy(functional_call(m, p, (xb,)), yb)))(params, xs, ys)
        for m in (loop, fused)
    ]
    for name in params:
        torch.testing.assert_close(grads[0][name], grads[1][name], rtol=1e-5, atol=1e-6, msg=name)


@pytest.mark.parametrize(
    ("spec", "message"),
    [
        ({"name": "mlp", "dropout": 1.0}, "mlp.dropout"),
        ({"name": "mlp", "activation": "swish"}, "mlp.activation"),
        ({"name": "mlp", "hidden": [0]}, "mlp.hidden"),
        ({"name": "cnn_mnist", "channels": [32]}, "cnn_mnist.channels"),
        ({"name": "char_lstm", "layers": 0}, "char_lstm.layers"),
        ({"name": "logistic", "hiden": 3}, "unknown key"),
    ],
)
def test_invalid_parameters(spec: dict[str, Any], message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        MODELS.build(spec, where=spec["name"])


def test_registered_with_descriptions_and_round_trip() -> None:
    names = {"logistic", "mlp", "cnn_mnist", "lenet_cifar", "cnn_cifar", "vgg16", "char_lstm"}
    assert names <= set(MODELS.names())
    for name in names:
        cls = MODELS.get(name)
        assert cls.description and "\n" not in cls.description
        assert cls.__doc__
        spec = MODELS.build(name)
        assert MODELS.build(spec_of(spec)) == spec
    mlp = MODELS.build({"name": "mlp", "hidden": [64, 30], "dropout": 0.5})
    assert spec_of(mlp) == {
        "name": "mlp",
        "hidden": [64, 30],
        "activation": "relu",
        "dropout": 0.5,
        "dropout_after": "first",
    }


def test_vgg16_group_norm_under_vmap() -> None:
    """VGG-16's GroupNorm is per sample, so vmap over clients gives each client's own gradient (up to float32
    rounding through 13 normalised layers, ~1e-4 of the gradient's scale)."""
    model = build({"name": "vgg16", "widths": [4, 4, 8, 8, 8], "hidden": 16}, (3, 32, 32), 100).eval()
    params = stacked_params(model)
    x = inputs((3, 32, 32), 100, False, CLIENTS, BATCH)
    y = torch.randint(0, 100, (CLIENTS, BATCH), generator=torch.Generator().manual_seed(2))

    def loss_fn(p: dict[str, Tensor], xb: Tensor, yb: Tensor) -> Tensor:
        return F.cross_entropy(functional_call(model, p, (xb,)), yb)

    batched = vmap(grad(loss_fn))(params, x, y)
    for k in range(CLIENTS):
        local = copy.deepcopy(model)
        with torch.no_grad():
            for name, p in local.named_parameters():
                p.copy_(params[name][k])
        F.cross_entropy(local(x[k]), y[k]).backward()
        grads = {name: p.grad for name, p in local.named_parameters() if p.grad is not None}
        scale = max(float(g.abs().max()) for g in grads.values())  # conv biases before a norm get ≈ 0
        for name, g in grads.items():
            torch.testing.assert_close(batched[name][k], g, rtol=0, atol=1e-3 * scale, msg=name)


def test_the_lstm_uses_the_fused_kernel_outside_vmap_and_the_loop_under_it(monkeypatch: pytest.MonkeyPatch) -> None:
    model = build({"name": "char_lstm", "embed_dim": 6, "hidden": 10, "layers": 2}, (7,), 20, seed=4)
    x = torch.randint(0, 20, (4, 7))
    y = torch.randint(0, 20, (4,))
    calls: list[int] = []
    fused = torch.lstm

    def counting(*args: Any) -> Any:
        calls.append(1)
        return fused(*args)

    monkeypatch.setattr(torch, "lstm", counting)
    out = model(x)
    assert len(calls) == 1  # plain autograd and evaluation: torch's kernel
    F.cross_entropy(out, y).backward()
    grads = {name: p.grad.clone() for name, p in model.named_parameters() if p.grad is not None}
    params = stacked_params(model)
    batched = vmap(grad(lambda p, xb, yb: F.cross_entropy(functional_call(model, p, (xb,)), yb)))(
        {k: v[:1] for k, v in params.items()}, x.unsqueeze(0), y.unsqueeze(0)
    )
    assert len(calls) == 1  # under vmap: the written-out loop, batched natively
    for name, g in grads.items():
        torch.testing.assert_close(batched[name][0], g, rtol=1e-5, atol=1e-6, msg=name)


def test_the_fused_lstm_path_reads_the_parameters_functional_call_substitutes() -> None:
    model = build({"name": "char_lstm", "embed_dim": 6, "hidden": 10, "layers": 2}, (7,), 20, seed=4).eval()
    other = {k: v[1] for k, v in stacked_params(model).items()}  # nudged away from the module's own
    x = torch.randint(0, 20, (4, 7))
    loaded = copy.deepcopy(model)
    loaded.load_state_dict(other)
    torch.testing.assert_close(functional_call(model, other, (x,)), loaded(x))
    assert not torch.allclose(model(x), loaded(x))


@pytest.mark.parametrize(
    ("spec", "expected"),
    [
        ({"name": "resnet18"}, 11_173_962),  # torchvision's ResNet-18 with a 3x3 stem, for CIFAR-10
        ({"name": "resnet18", "width": 16}, 701_466),
        ({"name": "resnet8"}, 78_042),
        ({"name": "resnet8", "norm": "group"}, 78_042),
    ],
)
def test_resnet_parameter_counts(spec: dict[str, Any], expected: int) -> None:
    assert n_params(build(spec, (3, 32, 32), 10)) == expected


def test_resnet18_has_torchvisions_layout_with_a_cifar_stem() -> None:
    model = build({"name": "resnet18"}, (3, 32, 32), 10)
    state = model.state_dict()
    assert state["conv1.weight"].shape == (64, 3, 3, 3)  # 3x3 stem (torchvision: 7x7, stride 2, then max-pool)
    assert not any(isinstance(m, nn.MaxPool2d) for m in model.modules())
    assert state["layer2.0.downsample.0.weight"].shape == (128, 64, 1, 1)
    assert state["layer4.1.bn2.running_var"].shape == (512,) and "layer4.1.bn2.num_batches_tracked" in state
    assert state["fc.weight"].shape == (10, 512)
    assert sum(isinstance(m, nn.BatchNorm2d) for m in model.modules()) == 20  # 1 + 8 blocks x 2 + 3 shortcuts
    assert model(torch.randn(2, 3072)).shape == (2, 10)  # flat CIFAR rows too
    grouped = build({"name": "resnet8", "norm": "group"}, (3, 32, 32), 10)
    assert not list(grouped.buffers())  # GroupNorm: no running statistics


@pytest.mark.slow
def test_a_resnet_trains_its_statistics_alike_on_both_autograd_backends() -> None:
    from fedhet.engine.engine import Engine
    from fedhet.engine.plan import LocalSettings
    from helpers.tiny import tiny_data

    data = tiny_data([6, 9, 5], dim=3 * 8 * 8, classes=3, seed=4)
    out = []
    for backend in ("sequential", "vectorised"):
        model = FlatModel(build({"name": "resnet8", "width": 4}, (3, 8, 8), 3))
        engine = Engine(model, data, backend=backend, seed=0)  # type: ignore[arg-type]
        plan = LocalSettings(3, 0.1, 4).plan(torch.arange(3), data.train.sizes)
        out.append(engine.train(model.initial_params(), plan, 0).params)
    assert model.stat_names[:3] == ["bn1.running_mean", "bn1.running_var", "bn1.num_batches_tracked"]
    torch.testing.assert_close(out[0], out[1], atol=1e-5, rtol=1e-4)
    assert not torch.equal(out[0][:, model.stats], model.initial_params()[model.stats].expand(3, -1))
