"""The conv backend (hand-written backward passes for CNNs, batched over clients) against autograd and the
autograd backends, on every CNN of the model zoo."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from fedhet.catalog import MODELS
from fedhet.engine import conv
from fedhet.engine.conv import batched_loss_grad, conv_layers, dropout_masks, train_conv
from fedhet.engine.engine import Engine, resolve_backend
from fedhet.engine.functional import FlatModel
from fedhet.engine.local import train_sequential, train_vectorised
from fedhet.engine.objective import ParameterTerm, Proximal, WeightDecay
from fedhet.engine.optimizers import SGD, Adam, ClientOptimizer
from fedhet.engine.plan import LocalPlan, LocalSettings
from fedhet.engine.request import TrainRequest
from fedhet.errors import ConfigError
from fedhet.models.zoo import ConvClassifier, ToImage
from fedhet.seeding import derive_seed
from helpers.tiny import Shift, cohort
from helpers.zoo_cnns import ZOO, image_data, image_federated, scaffold_rounds, zoo_model

TOL = {"atol": 1e-6, "rtol": 1e-5}


def test_which_models_qualify() -> None:
    for name in ZOO:
        model, _ = zoo_model(name)
        spec = conv_layers(model)
        assert spec is not None, name
        assert spec.size == model.size and spec.shapes[-1] == (10,)
    model = zoo_model("cnn_fmnist")[0]
    fmnist = conv_layers(model)
    assert fmnist is not None and fmnist.has_dropout
    assert conv_layers(model) is fmnist  # found once per model
    assert not conv_layers(zoo_model("lenet")[0]).has_dropout  # type: ignore[union-attr]
    mlp = FlatModel(MODELS.build({"name": "mlp"}).build((784,), 10))
    assert conv_layers(mlp) is None  # no convolution: the dense backend's
    lstm = FlatModel(MODELS.build({"name": "char_lstm", "hidden": 8}).build((5,), 10))
    assert conv_layers(lstm) is None
    shape = (1, 6, 6)
    batchnorm = nn.Sequential(ToImage(shape), nn.Conv2d(1, 2, 3), nn.BatchNorm2d(2), nn.Flatten(), nn.Linear(32, 3))
    assert conv_layers(FlatModel(batchnorm)) is None  # buffers updated in forward: not supported
    same = ConvClassifier(shape, nn.Sequential(nn.Conv2d(1, 2, 3, padding="same")), nn.Sequential(nn.Linear(72, 3)))
    assert conv_layers(FlatModel(same)) is None  # string padding
    bare = nn.Sequential(nn.Conv2d(1, 2, 3), nn.ReLU(), nn.Flatten(), nn.Linear(32, 3))
    assert conv_layers(FlatModel(bare)) is None  # the sample shape is unknown
    spec = conv_layers(FlatModel(bare), input_shape=shape)
    assert spec is not None and spec.shapes == ((2, 4, 4), (2, 4, 4), (32,), (3,))


def test_logit_gradient_by_hand() -> None:
    """One client, one layer: logits z = conv(x) (a 1×1 kernel of weight 1 on a 1×1 image, no bias, then a
    Linear layer of weight 0): ℓ = (2 ce(0, ·)) / 2 = log 3, ∂ℓ/∂b_linear = softmax − mean onehot."""
    net = nn.Sequential(nn.Conv2d(1, 1, 1, bias=False), nn.Flatten(), nn.Linear(1, 3))
    model = FlatModel(net)
    spec = conv_layers(model, input_shape=(1, 1, 1))
    assert spec is not None
    params = torch.tensor([[1.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0]])  # conv weight, linear weight (3×1), bias (3)
    x = torch.tensor([[[[[2.0]]], [[[5.0]]], [[[7.0]]]]])  # 3 rows, the last one padding (weight 0)
    y, wt = torch.tensor([[0, 2, 1]]), torch.tensor([[1.0, 1.0, 0.0]])
    grad, loss = batched_loss_grad(spec, params, x, y, wt)
    torch.testing.assert_close(loss, torch.log(torch.tensor([3.0])))
    d = torch.tensor([[1 / 3 - 1, 1 / 3, 1 / 3], [1 / 3, 1 / 3, 1 / 3 - 1]]) / 2  # (softmax − onehot) / Σ wt
    expected = torch.cat([torch.zeros(1), d[0] * 2 + d[1] * 5, d.sum(0)])  # ∂W = Σ d x, ∂b = Σ d; conv: Σ 0
    torch.testing.assert_close(grad[0], expected)


@pytest.mark.parametrize("name", list(ZOO))
def test_batched_loss_grad_equals_autograd(name: str) -> None:
    model, shape = zoo_model(name)
    spec = conv_layers(model)
    assert spec is not None
    gen = torch.Generator().manual_seed(2)
    c, b = 3, 4
    params = model.initial_params() + 0.05 * torch.randn(c, model.size, generator=gen)
    x = torch.randn(c, b, *shape, generator=gen)
    y = torch.randint(0, 10, (c, b), generator=gen)
    wt = torch.tensor([[1.0, 1.0, 1.0, 1.0], [1.0, 1.0, 0.0, 0.0], [0.0, 0.0, 0.0, 0.0]])  # padding; no samples
    model.module.eval()  # no dropout on either side
    grad, loss = batched_loss_grad(spec, params, x, y, wt, workers=2)
    for k in range(c):
        w = params[k].clone().requires_grad_(True)
        expected_loss = model.batch_loss(w, x[k], y[k], wt[k])
        (expected,) = torch.autograd.grad(expected_loss, w)
        torch.testing.assert_close(loss[k], expected_loss.detach(), **TOL)
        if name != "vgg16_gn":
            torch.testing.assert_close(grad[k], expected, **TOL)
            continue
        # GroupNorm of single channels of 2×2 maps: float32 autograd itself is 1e-5 off, so both are compared
        # with float64 autograd
        model.module.double()
        w64 = params[k].double().requires_grad_(True)
        (exact,) = torch.autograd.grad(model.batch_loss(w64, x[k].double(), y[k], wt[k].double()), w64)
        model.module.float()
        autograd_error = float((expected.double() - exact).abs().max())
        # within twice float32 autograd's error, or 5e-5 of the gradient's scale: on some CPUs autograd's own error
        # is the smaller by chance (measured here: ours 2.7e-5, autograd 1.3e-5, largest gradient entry 1.3)
        bound = max(2 * autograd_error, 5e-5 * float(exact.abs().max()))
        assert float((grad[k].double() - exact).abs().max()) <= bound
    assert float(grad[0].abs().max()) > 1e-3 and float(grad[2].abs().max()) == 0.0


def test_direct_kernel_for_one_input_channel_with_and_without_the_input_gradient() -> None:
    """Convolutions of one input channel run their backward on torch's direct kernel, here also a middle layer
    (whose input gradient is needed), strided and padded, with and without bias; the gradients equal autograd's."""
    shape = (1, 9, 9)
    features = nn.Sequential(
        nn.Conv2d(1, 1, 3, padding=1), nn.ReLU(), nn.Conv2d(1, 3, 3, stride=2, padding=1, bias=False), nn.ReLU()
    )
    model = FlatModel(ConvClassifier(shape, features, nn.Sequential(nn.Linear(75, 10))))
    spec = conv_layers(model)
    assert spec is not None
    convs = [layer for layer in spec.layers if isinstance(layer, conv.Conv)]
    a = torch.zeros(1, 1, *shape)
    assert [c.direct_backward(a) for c in convs] == [True, True]
    lenet = conv_layers(zoo_model("lenet")[0])
    assert lenet is not None
    assert not any(c.direct_backward(a) for c in lenet.layers if isinstance(c, conv.Conv))  # 3 and 6 channels
    assert not convs[0].direct_backward(a.double())  # float32 only, as measured
    gen = torch.Generator().manual_seed(4)
    params = model.initial_params() + 0.1 * torch.randn(2, model.size, generator=gen)
    x, y = torch.randn(2, 5, *shape, generator=gen), torch.randint(0, 10, (2, 5), generator=gen)
    wt = torch.ones(2, 5)
    grad, loss = batched_loss_grad(spec, params, x, y, wt)
    for k in range(2):
        w = params[k].clone().requires_grad_(True)
        expected_loss = model.batch_loss(w, x[k], y[k], wt[k])
        (expected,) = torch.autograd.grad(expected_loss, w)
        torch.testing.assert_close(loss[k], expected_loss.detach(), **TOL)
        torch.testing.assert_close(grad[k], expected, **TOL)
        assert float(expected[: convs[0].shape[0] * 9].abs().max()) > 1e-3  # the first layer learns


def test_dropout_masks_follow_the_modules_draws() -> None:
    model, _ = zoo_model("cnn_fmnist")
    spec = conv_layers(model)
    assert spec is not None
    masks = dropout_masks(spec, 4, seed=3, round_=2, step=1, stream="train")
    drawn = [m for m in masks if m is not None]
    assert [tuple(m.shape) for m in drawn] == [(4, 20), (4, 50)]  # channel dropout (b, C), then (b, 50)
    assert all(set(m.unique().tolist()) <= {0.0, 2.0} for m in drawn)
    again = dropout_masks(spec, 4, seed=3, round_=2, step=1, stream="train")
    assert all(torch.equal(a, b) for a, b in zip(drawn, [m for m in again if m is not None], strict=True))
    other = dropout_masks(spec, 4, seed=3, round_=2, step=2, stream="train")
    assert not torch.equal(drawn[1], [m for m in other if m is not None][1])


def _plan(**extra: object) -> LocalPlan:
    """Unequal steps (one client skips the round) and learning rates; batches larger than some clients."""
    return LocalPlan(
        clients=torch.tensor([0, 1, 2, 3, 4]),
        steps=torch.tensor([4, 0, 6, 1, 6]),
        lr=torch.tensor([0.1, 0.1, 0.05, 0.2, 0.15]),
        batch_size=4,
        **extra,  # type: ignore[arg-type]
    )


TERMS = (Proximal(mu=0.1), WeightDecay(lam=0.01), Shift())  # FedProx, weight decay, a SCAFFOLD-like correction


def _shift(model: FlatModel) -> torch.Tensor:
    return 0.01 * torch.randn(5, model.size, generator=torch.Generator().manual_seed(6))


@pytest.mark.parametrize("name", [n for n in ZOO if n != "vgg16_gn"])
def test_train_conv_matches_the_sequential_backend(name: str) -> None:
    model, shape = zoo_model(name)
    spec = conv_layers(model)
    assert spec is not None
    data = image_data(shape, [9, 3, 14, 2, 11])
    w0 = model.initial_params()
    plan, shift = _plan(terms=TERMS), _shift(model)
    model.module.train()
    seq = train_sequential(TrainRequest(model, data, w0, plan, cohort(plan, w0, shift), 3, 2))
    got = train_conv(TrainRequest(model, data, w0, plan, cohort(plan, w0, shift), 3, 2, chunk_size=2, workers=2), spec)
    assert float((seq[0] - w0).abs().max()) > 1e-2  # the clients moved
    torch.testing.assert_close(got[0], seq[0], **TOL)
    torch.testing.assert_close(got[1], seq[1], equal_nan=True, **TOL)
    assert torch.equal(got[0][1], w0) and torch.isnan(got[1][1])  # zero steps: the received model, no loss
    assert got[2] == {}  # plain SGD keeps no state


@pytest.mark.parametrize("terms", [(), (Proximal(mu=0.5),), (WeightDecay(lam=0.05),), (Shift(),)])
def test_each_term_alone(terms: tuple[ParameterTerm, ...]) -> None:
    model, shape = zoo_model("lenet")
    spec = conv_layers(model)
    assert spec is not None
    data = image_data(shape, [9, 3, 14, 2, 11])
    w0 = model.initial_params()
    plan, shift = _plan(terms=terms), 10 * _shift(model)
    seq = train_sequential(TrainRequest(model, data, w0, plan, cohort(plan, w0, shift), 0, 1))
    got = train_conv(TrainRequest(model, data, w0, plan, cohort(plan, w0, shift), 0, 1, workers=1), spec)
    torch.testing.assert_close(got[0], seq[0], **TOL)
    torch.testing.assert_close(got[1], seq[1], equal_nan=True, **TOL)
    if terms:  # each term changes the result
        plain = train_conv(TrainRequest(model, data, w0, _plan(), cohort(_plan(), w0), 0, 1, workers=1), spec)
        assert float((plain[0] - got[0]).abs().max()) > 1e-4


@pytest.mark.parametrize(
    "optimizer",
    [SGD(momentum=0.9), SGD(momentum=0.8, nesterov=True), Adam(eps=1e-3), Adam(beta1=0.5, beta2=0.9, eps=1e-3)],
    ids=["momentum", "nesterov", "adam", "adam-options"],
)
@pytest.mark.parametrize("name", ["lenet", "cnn_fmnist"])
def test_optimisers_with_state_match_the_sequential_backend(name: str, optimizer: ClientOptimizer) -> None:
    """Stateful optimisers step the flat weights from a gradient buffer; their state comes back as the other
    backends return it (clients with fewer steps keep theirs from their last step).

    Adam runs where the comparison is well conditioned. Its step η m̂/(√v̂ + ε) has slope η/ε in a gradient
    near 0, and gradients here cancel to 1e-10 at some coordinates by chance: with ε = 1e-8 and η = 0.2,
    rounding-level changes of w0 (relative 1e-7) moved the sequential backend's own result by up to 0.058 on
    3.8% of cnn_fmnist's weights (a ReLU flipped after a wrong-signed step), and another CPU's rounding did
    the same to this test. At Adam's usual step size (η/100) with ε = 1e-3 those changes move the result by
    at most 1e-7 on both models, so the backends must agree to the same tolerance as for SGD."""
    model, shape = zoo_model(name)
    spec = conv_layers(model)
    assert spec is not None
    data = image_data(shape, [9, 3, 14, 2, 11])
    w0 = model.initial_params()
    plan, shift = _plan(terms=TERMS, optimizer=optimizer), _shift(model)
    if isinstance(optimizer, Adam):
        plan.lr = plan.lr / 100
    model.module.train()
    seq = train_sequential(TrainRequest(model, data, w0, plan, cohort(plan, w0, shift), 3, 2))
    got = train_conv(TrainRequest(model, data, w0, plan, cohort(plan, w0, shift), 3, 2, chunk_size=2, workers=2), spec)
    assert float((seq[0] - w0).abs().max()) > (5e-3 if isinstance(optimizer, Adam) else 1e-2)  # several steps
    torch.testing.assert_close(got[0], seq[0], **TOL)
    torch.testing.assert_close(got[1], seq[1], equal_nan=True, **TOL)
    assert got[2].keys() == seq[2].keys() == optimizer.state_kinds().keys()
    for key in got[2]:  # sums of gradients (vectorised and sequential part by 6e-6 on cnn_fmnist's momentum)
        torch.testing.assert_close(got[2][key], seq[2][key], atol=1e-5, rtol=TOL["rtol"])
    if "count" in got[2]:
        assert got[2]["count"].tolist() == plan.steps.float().tolist()


def test_group_norm_vgg_as_close_as_the_autograd_backends() -> None:
    """VGG-16 with GroupNorm at a tiny width normalises single channels of 2×2 maps in its last stage, where
    float rounding grows fast with the steps: the sequential and vectorised backends part too. The conv
    backend must stay as close to the sequential one as the vectorised one does (or within 1e-5)."""
    model, shape = zoo_model("vgg16_gn")
    spec = conv_layers(model)
    assert spec is not None
    data = image_data(shape, [9, 3, 14, 2, 11])
    w0 = model.initial_params()
    plan = LocalPlan.uniform(torch.arange(5), 3, 0.05, 4, weight_decay=0.01)
    plan.steps = torch.tensor([3, 0, 3, 1, 2])
    model.module.train()
    seq = train_sequential(TrainRequest(model, data, w0, plan, cohort(plan, w0), 3, 2))
    vec = train_vectorised(TrainRequest(model, data, w0, plan, cohort(plan, w0), 3, 2))
    got = train_conv(TrainRequest(model, data, w0, plan, cohort(plan, w0), 3, 2, workers=1), spec)
    assert float((seq[0] - w0).abs().max()) > 1e-2
    for k in range(5):
        spread = float((vec[0][k] - seq[0][k]).abs().max())
        assert float((got[0][k] - seq[0][k]).abs().max()) <= max(2 * spread, 1e-5 * float(seq[0][k].abs().max()))
    torch.testing.assert_close(got[1], seq[1], equal_nan=True, atol=1e-4, rtol=1e-4)


@pytest.mark.parametrize("chunk,workers", [(0, 1), (1, 2), (3, 2), (5, 1)])
def test_chunks_and_workers_and_the_vectorised_backend(chunk: int, workers: int) -> None:
    model, shape = zoo_model("cnn_fmnist")  # with dropout: masks shared by clients and steps seeded alike
    spec = conv_layers(model)
    assert spec is not None
    data = image_data(shape, [9, 3, 14, 2, 11])
    w0 = model.initial_params()
    plan = _plan(terms=(Proximal(mu=0.1),))
    model.module.train()
    vec = train_vectorised(TrainRequest(model, data, w0, plan, cohort(plan, w0), 5, 1))
    got = train_conv(
        TrainRequest(model, data, w0, plan, cohort(plan, w0), 5, 1, chunk_size=chunk, workers=workers), spec
    )
    torch.testing.assert_close(got[0], vec[0], **TOL)
    torch.testing.assert_close(got[1], vec[1], equal_nan=True, **TOL)


def test_no_steps_and_no_clients() -> None:
    model, shape = zoo_model("lenet")
    spec = conv_layers(model)
    assert spec is not None
    data = image_data(shape, [3, 4])
    w0 = model.initial_params()
    none = LocalPlan.uniform(torch.arange(2), 0, 0.1, 4, optimizer=Adam())
    params, losses, state = train_conv(TrainRequest(model, data, w0, none, cohort(none, w0), 0, 0), spec)
    assert torch.equal(params, w0.expand(2, -1)) and bool(torch.isnan(losses).all())
    assert torch.equal(state["count"], torch.zeros(2))
    empty = LocalPlan.uniform(torch.zeros(0, dtype=torch.long), 3, 0.1, 4)
    params, losses, _ = train_conv(TrainRequest(model, data, w0, empty, cohort(empty, w0), 0, 0), spec)
    assert params.shape == (0, model.size) and losses.shape == (0,)


@pytest.mark.parametrize("name", ["lenet", "cnn_fmnist"])
def test_large_linear_layers_client_by_client(name: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """Linear layers above `LARGE_LINEAR` weights (FedAvg CNN's 512×3136) run with 2-D products per client:
    the same gradients and the same training (here every Linear layer takes that path)."""
    monkeypatch.setattr(conv, "LARGE_LINEAR", 1)
    model, shape = zoo_model(name)
    spec = conv_layers(model)
    assert spec is not None and all(la.per_client for la in spec.layers if isinstance(la, conv.Linear))
    gen = torch.Generator().manual_seed(4)
    params = model.initial_params() + 0.05 * torch.randn(3, model.size, generator=gen)
    x, y = torch.randn(3, 4, *shape, generator=gen), torch.randint(0, 10, (3, 4), generator=gen)
    wt = torch.tensor([[1.0, 1.0, 1.0, 1.0], [1.0, 1.0, 0.0, 0.0], [0.0, 1.0, 1.0, 1.0]])
    model.module.eval()
    grad, _ = batched_loss_grad(spec, params, x, y, wt)
    for k in range(3):
        w = params[k].clone().requires_grad_(True)
        (expected,) = torch.autograd.grad(model.batch_loss(w, x[k], y[k], wt[k]), w)
        torch.testing.assert_close(grad[k], expected, **TOL)
    data = image_data(shape, [9, 3, 14, 2, 11])
    w0 = model.initial_params()
    plan, shift = _plan(terms=TERMS), _shift(model)
    model.module.train()
    seq = train_sequential(TrainRequest(model, data, w0, plan, cohort(plan, w0, shift), 3, 2))
    got = train_conv(TrainRequest(model, data, w0, plan, cohort(plan, w0, shift), 3, 2, chunk_size=3, workers=1), spec)
    torch.testing.assert_close(got[0], seq[0], **TOL)
    momentum = _plan(terms=TERMS, optimizer=SGD(momentum=0.9))
    seq = train_sequential(TrainRequest(model, data, w0, momentum, cohort(momentum, w0, shift), 3, 2))
    got = train_conv(
        TrainRequest(model, data, w0, momentum, cohort(momentum, w0, shift), 3, 2, chunk_size=3, workers=1), spec
    )
    torch.testing.assert_close(got[0], seq[0], **TOL)


def test_batched_loss_grad_with_the_steps_dropout_masks() -> None:
    """With the masks of `dropout_masks`, the gradient is autograd's on the module in training mode seeded as
    the sequential backend seeds a step (the masks the modules draw are the same for every client)."""
    model, shape = zoo_model("cnn_fmnist")
    spec = conv_layers(model)
    assert spec is not None
    gen = torch.Generator().manual_seed(5)
    params = model.initial_params() + 0.05 * torch.randn(2, model.size, generator=gen)
    x, y = torch.randn(2, 4, *shape, generator=gen), torch.randint(0, 10, (2, 4), generator=gen)
    wt = torch.ones(2, 4)
    masks = dropout_masks(spec, 4, seed=7, round_=3, step=2, stream="train")
    grad, loss = batched_loss_grad(spec, params, x, y, wt, masks)
    no_dropout, _ = batched_loss_grad(spec, params, x, y, wt)
    assert float((grad - no_dropout).abs().max()) > 1e-3  # the masks matter
    model.module.train()
    for k in range(2):
        torch.manual_seed(derive_seed(7, "dropout/train", 3, 2))
        w = params[k].clone().requires_grad_(True)
        expected_loss = model.batch_loss(w, x[k], y[k], wt[k])
        (expected,) = torch.autograd.grad(expected_loss, w)
        torch.testing.assert_close(loss[k], expected_loss.detach(), **TOL)
        torch.testing.assert_close(grad[k], expected, **TOL)


@pytest.mark.parametrize("name", list(ZOO))
def test_auto_picks_conv_for_the_zoos_cnns_on_a_cpu(name: str) -> None:
    model, _ = zoo_model(name)
    assert resolve_backend("auto", model, cohort=1) == "conv"
    assert resolve_backend("auto", model, cohort=300) == "conv"
    assert resolve_backend("conv", model, cohort=3) == "conv"
    # an objective that needs autograd (a data term, a local rule), or a GPU: the autograd backends
    assert resolve_backend("auto", model, cohort=30, autograd_only=True) in ("vectorised", "sequential")
    assert resolve_backend("auto", model, cohort=30, device=torch.device("cuda")) == "vectorised"


def test_auto_leaves_conv_for_sequential_when_a_steps_activations_are_large(monkeypatch: pytest.MonkeyPatch) -> None:
    model, _ = zoo_model("lenet")
    spec = conv_layers(model)
    assert spec is not None
    per_sample = conv.step_bytes(spec, 1)
    assert conv.step_bytes(spec, 10) == 10 * per_sample > 0
    monkeypatch.setattr(conv, "MAX_STEP_BYTES", 64 * per_sample)
    assert resolve_backend("auto", model, cohort=30, batch_size=64) == "conv"
    assert resolve_backend("auto", model, cohort=30, batch_size=65) == "sequential"
    assert resolve_backend("conv", model, cohort=30, batch_size=65) == "conv"  # asked for: as asked
    engine = Engine(model, image_federated((3, 32, 32), [70, 70]), local=LocalSettings(steps=1, lr=0.1, batch_size=65))
    assert engine.backend_for(2) == "sequential" and engine.backend_for(2, batch_size=8) == "conv"
    result = engine.train(model.initial_params(), LocalPlan.uniform(torch.arange(2), 1, 0.1, 65), 0)
    assert engine.last_backend == "sequential" and bool(torch.isfinite(result.params).all())


def test_explicit_conv_needs_a_cnn_it_knows_and_an_objective_without_autograd() -> None:
    mlp = FlatModel(MODELS.build({"name": "mlp", "hidden": [16]}).build((64,), 10))
    with pytest.raises(ConfigError, match="backend 'conv' needs a CNN") as err:
        Engine(mlp, image_federated((64,), [3]), backend="conv")
    assert "\n" not in str(err.value) and "'auto', 'vectorised' or 'sequential'" in str(err.value)
    lenet, _ = zoo_model("lenet")
    with pytest.raises(ConfigError, match="backend 'conv' cannot run this local objective"):
        resolve_backend("conv", lenet, cohort=3, autograd_only=True)
    shape = (1, 6, 6)
    same = ConvClassifier(shape, nn.Sequential(nn.Conv2d(1, 2, 3, padding="same")), nn.Sequential(nn.Linear(72, 3)))
    unknown = FlatModel(same)  # string padding: not for the conv backend, auto falls back
    assert resolve_backend("auto", unknown, cohort=30) in ("vectorised", "sequential")
    with pytest.raises(ConfigError, match="backend 'conv' needs a CNN"):
        resolve_backend("conv", unknown)
    user = nn.Sequential(ToImage(shape), nn.Conv2d(1, 2, 3), nn.ReLU(), nn.Flatten(), nn.Linear(32, 3))
    assert resolve_backend("auto", FlatModel(user), cohort=3) == "conv"  # a user's CNN as a chain from ToImage

    class Custom(nn.Module):  # its own forward: the chain of layers is unknown
        def __init__(self) -> None:
            super().__init__()
            self.conv, self.head = nn.Conv2d(1, 2, 3), nn.Linear(32, 3)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return self.head(self.conv(x.view(-1, *shape)).flatten(1))

    assert resolve_backend("auto", FlatModel(Custom()), cohort=3) != "conv"


def test_engine_rounds_with_scaffold_state_agree_with_sequential() -> None:
    """Whole rounds through `Engine.train`: SCAFFOLD's control variates read from the client store in round 1,
    their change reported back, unequal steps and learning rates, dropout (cnn_fmnist)."""
    results = {backend: scaffold_rounds("cnn_fmnist", backend) for backend in ("sequential", "conv")}
    assert len(results["conv"]) == 5  # the control variates' change came back (model, loss, Δc_i, two scores)
    for got, expected in zip(results["conv"], results["sequential"], strict=True):
        torch.testing.assert_close(got, expected, equal_nan=True, **TOL)


@pytest.mark.parametrize("algorithm", ["fedprox", "scaffold"])
def test_runs_on_conv_give_the_sequential_metrics(algorithm: str) -> None:
    """Whole runs from a config (real 8×8 digits, the FEMNIST CNN with dropout): `backend: conv` and `auto`
    give the sequential backend's metrics to 1e-5."""
    from fedhet.experiments.config import parse_config
    from fedhet.experiments.runner import run

    config = {
        "dataset": {"name": "digits", "image": True},
        "algorithm": {"name": algorithm, "mu": 0.1} if algorithm == "fedprox" else algorithm,
        "partition": {"name": "dirichlet", "alpha": 0.5, "min_size": 20},
        "model": {"name": "cnn_femnist"},
        "num_clients": 6,
        "clients_per_round": 3,
        "rounds": 2,
        "local": {"steps": 2, "lr": 0.05, "batch_size": 8, "weight_decay": 0.001},
        "seed": 5,
    }
    cnn = FlatModel(MODELS.build({"name": "cnn_femnist"}).build((1, 8, 8), 10))
    assert conv_layers(cnn) is not None and resolve_backend("auto", cnn, cohort=3) == "conv"
    states = {b: run(parse_config({**config, "backend": b})) for b in ("sequential", "conv", "auto")}
    reference = states["sequential"]
    for backend in ("conv", "auto"):
        state = states[backend]
        torch.testing.assert_close(state.params, reference.params, atol=1e-5, rtol=1e-5)
        for got, expected in zip(state.history, reference.history, strict=True):
            assert got.keys() == expected.keys()
            for key in got:
                assert got[key] == pytest.approx(expected[key], abs=1e-5), (backend, key)


def test_auto_probes_vmap_for_a_cnn_only_when_an_objective_needs_autograd() -> None:
    model, shape = zoo_model("lenet", seed=3)
    engine = Engine(model, image_federated(shape, [4, 5]))
    assert model.vmap_probe is None  # conv needs no vmap: no probe at start (it costs vmap's first use)
    assert engine.backend_for(30) == "conv"
    assert engine.backend_for(30, autograd_only=True) in ("vectorised", "sequential")
    assert model.vmap_probe is not None and model.vmap_probe.failure is None
