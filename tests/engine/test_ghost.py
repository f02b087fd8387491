"""DP-SGD on the dense backend: per-sample gradient norms by ghost clipping (`fedhet.engine.ghost`) against
autograd's per-sample gradients, and the dense backend's DP-SGD against the vectorised backend's, round by round."""

from __future__ import annotations

import itertools
import math
from dataclasses import replace

import pytest
import torch
from torch import nn
from torch.func import functional_call, grad, vmap

from fedhet.data.dataset import ClientData, FederatedData
from fedhet.engine.engine import Engine, resolve_backend
from fedhet.engine.functional import FlatModel
from fedhet.engine.ghost import clip_factors, draw_noise, square_norms
from fedhet.engine.objective import Proximal, WeightDecay
from fedhet.engine.optimizers import SGD, Adam
from fedhet.engine.plan import LocalPlan
from fedhet.engine.privacy import ExampleDP, UpdateClip, step_noise
from fedhet.engine.task import Binary, Regression, Task
from fedhet.errors import ConfigError
from helpers.tiny import tiny_data

TOL = {"atol": 1e-5, "rtol": 1e-5}


def test_ghost_norms_of_two_samples_by_hand() -> None:
    """Two samples through Linear(2, 2) (bias) and Linear(2, 1) (no bias): ‖∇W_i‖² = ‖a_i‖²‖δ_i‖², + ‖δ_i‖² for
    the bias. Sample 1: a = (1, 2), δ = (3, 0) at layer 1, a = (1, 1), δ = (2,) at layer 2: (5 + 1)·9 + 2·4 = 62.
    Sample 2: a = (0, 1), δ = (1, 1); a = (2, 0), δ = (−1,): (1 + 1)·2 + 4·1 = 8."""
    inputs = [torch.tensor([5.0, 1.0]), torch.tensor([2.0, 4.0])]  # ‖a_i‖² of each layer
    deltas = [torch.tensor([[3.0, 0.0], [1.0, 1.0]]), torch.tensor([[2.0], [-1.0]])]
    square = square_norms(inputs, deltas, [(True, True), (True, False)])
    torch.testing.assert_close(square, torch.tensor([62.0, 8.0]))
    # a frozen first-layer weight leaves its bias: 9 + 8 = 17 and 2 + 4 = 6
    torch.testing.assert_close(square_norms(inputs, deltas, [(False, True), (True, False)]), torch.tensor([17.0, 6.0]))
    # c_i = min(1, C/‖g_i‖): C = 4 clips the first (4/√62), not the second (√8 < 4)
    torch.testing.assert_close(clip_factors(square, 4.0), torch.tensor([4 / math.sqrt(62), 1.0]))
    assert clip_factors(torch.zeros(1), 1.0).item() == 1.0 and clip_factors(square, math.inf).tolist() == [1.0, 1.0]


def test_ghost_norms_are_autograd_per_sample_gradient_norms() -> None:
    """A 2-layer MLP, 2 samples: the norms from each layer's inputs and output gradients (one batch backward
    pass) are those of the per-sample gradients that vmap(grad) materialises."""
    torch.manual_seed(0)
    net = nn.Sequential(nn.Linear(3, 4), nn.Tanh(), nn.Linear(4, 2))
    x, y = torch.randn(2, 3), torch.tensor([0, 1])
    params = {k: v.detach() for k, v in net.named_parameters()}

    def loss(p: dict[str, torch.Tensor], xi: torch.Tensor, yi: torch.Tensor) -> torch.Tensor:
        out = functional_call(net, p, (xi.unsqueeze(0),))
        return nn.functional.cross_entropy(out, yi.unsqueeze(0))

    per_sample = vmap(grad(loss), in_dims=(None, 0, 0))(params, x, y)
    expected = sum(g.reshape(2, -1).square().sum(1) for g in per_sample.values())
    z1 = x @ params["0.weight"].T + params["0.bias"]
    a1 = torch.tanh(z1).requires_grad_()
    z2 = (a1 @ params["2.weight"].T + params["2.bias"]).requires_grad_()
    delta2 = torch.softmax(z2, 1) - nn.functional.one_hot(y, 2)  # ∂ℓ_i/∂z_i
    delta1 = (delta2 @ params["2.weight"]) * (1 - a1.detach() ** 2)
    square = square_norms([x.square().sum(1), a1.detach().square().sum(1)], [delta1, delta2], [(True, True)] * 2)
    torch.testing.assert_close(square, expected)


def test_the_noise_is_the_vectorised_backends() -> None:
    clients = [4, 0, 7]
    out = draw_noise(clients, 3, 2, "dp-sgd/train/0", 5, torch.empty(3, 11))
    assert torch.equal(out, step_noise(torch.tensor(clients), 11, 3, 2, "dp-sgd/train/0", 5))


def _mlp(dims: tuple[int, ...], seed: int = 0) -> FlatModel:
    torch.manual_seed(seed)
    layers: list[nn.Module] = []
    for i, (a, b) in enumerate(itertools.pairwise(dims)):
        layers.append(nn.Linear(a, b))
        if i < len(dims) - 2:
            layers.append(nn.Tanh() if i % 2 == 0 else nn.ReLU())
    return FlatModel(nn.Sequential(*layers))


# name -> (model dims, plan changes, DP-SGD's noise multiplier): noise on and off, Poisson and shuffled batches, the
# first layer from Gram matrices (a wide input, no noise), other optimisers, affine terms, frozen layers, steps
# that differ across clients in chunks of 2, client-level clipping of the update as well
CASES: dict[str, tuple[tuple[int, ...], dict[str, object], float, str]] = {
    "noise off": ((3, 4, 5, 2), {}, 0.0, "poisson"),
    "noise on": ((3, 4, 5, 2), {}, 1.3, "poisson"),
    "shuffled, noise on": ((3, 4, 2), {}, 0.8, "shuffle"),
    "gram first layer": ((40, 16, 2), {}, 0.0, "poisson"),
    "wide, noise on": ((40, 16, 2), {}, 1.0, "poisson"),
    "momentum": ((3, 4, 2), {"optimizer": SGD(momentum=0.9)}, 1.0, "poisson"),
    "adam": ((3, 4, 2), {"optimizer": Adam()}, 0.5, "shuffle"),
    "proximal and decay": ((40, 16, 2), {"terms": (Proximal(mu=0.1), WeightDecay(lam=0.01))}, 0.0, "poisson"),
    "proximal, noise on": ((3, 4, 2), {"terms": (Proximal(mu=0.1),)}, 1.0, "poisson"),
    "gram, terms, noise on": ((40, 16, 2), {"terms": (Proximal(mu=0.1), WeightDecay(lam=0.01))}, 1.0, "poisson"),
    "gram on the steps' rows, noise on": ((100, 32, 2), {}, 1.0, "shuffle"),
    "client-level clip too": ((40, 16, 2), {"clip": UpdateClip(0.05)}, 1.0, "poisson"),
    "client-level clip, noise off": ((40, 16, 2), {"clip": UpdateClip(0.05)}, 0.0, "poisson"),
    "frozen body": ((3, 4, 2), {"frozen": ("0.*",)}, 1.0, "poisson"),
    "uneven steps": ((3, 4, 2), {"steps": torch.tensor([5, 2, 0, 4])}, 1.0, "poisson"),
}


@pytest.mark.parametrize("case", list(CASES))
def test_dense_dp_sgd_gives_the_vectorised_numbers_round_after_round(case: str) -> None:
    dims, changes, z, sampling = CASES[case]
    data = tiny_data([6, 9, 4, 30], dim=dims[0], classes=2, seed=2)
    engines = [Engine(_mlp(dims), data, backend=b, seed=3, chunk_size=2) for b in ("dense", "vectorised")]  # type: ignore[arg-type]
    plan = replace(LocalPlan.uniform(torch.arange(4), 5, 0.3, 4), dp_sgd=ExampleDP(0.5, z, sampling), **changes)
    w = engines[0].initial_params()
    for round_ in range(3):
        dense, vectorised = (e.train(w, plan, round_) for e in engines)
        assert engines[0].last_backend == "dense"
        torch.testing.assert_close(dense.params, vectorised.params, **TOL)
        torch.testing.assert_close(dense.train_loss, vectorised.train_loss, **TOL, equal_nan=True)
        w = dense.params.mean(0)


def test_auto_picks_dense_for_dp_sgd_and_dense_refuses_only_what_needs_autograd() -> None:
    model = _mlp((3, 4, 2))
    assert resolve_backend("auto", model, autograd_only=True, dense_runs=True) == "dense"
    assert resolve_backend("dense", model, autograd_only=True, dense_runs=True) == "dense"
    assert resolve_backend("auto", model, autograd_only=True) != "dense"  # a data term or a local rule
    with pytest.raises(ConfigError, match="backend 'dense' cannot run this local objective"):
        resolve_backend("dense", model, autograd_only=True)
    engine = Engine(model, tiny_data([4, 4]), backend="auto", seed=0)
    plan = replace(LocalPlan.uniform(torch.arange(2), 2, 0.1, 2), dp_sgd=ExampleDP(1.0, 1.0))
    engine.train(engine.initial_params(), plan, 0)
    assert engine.last_backend == "dense"


def test_dense_dp_sgd_refuses_dropout_in_one_line() -> None:
    torch.manual_seed(0)
    model = FlatModel(nn.Sequential(nn.Linear(3, 4), nn.ReLU(), nn.Dropout(0.5), nn.Linear(4, 2)))
    engine = Engine(model, tiny_data([4, 4]), backend="dense", seed=0)
    plan = replace(LocalPlan.uniform(torch.arange(2), 1, 0.1, 2), dp_sgd=ExampleDP(1.0))
    with pytest.raises(ConfigError, match=r"local\.dp_sgd clips per-sample gradients .* dropout"):
        engine.train(engine.initial_params(), plan, 0)


@pytest.mark.parametrize("task", [Binary(), Regression()])
def test_dense_dp_sgd_takes_the_tasks_loss(task: Task) -> None:
    """Other tasks' per-sample loss gradients at the outputs (one output for a binary task, a mean over two for
    a regression): the vectorised backend's numbers, with noise."""
    outputs = 1 if isinstance(task, Binary) else 2
    gen = torch.Generator().manual_seed(1)
    xs = [torch.randn(n, 5, generator=gen) for n in (6, 9, 4)]
    ys = [
        torch.randint(0, 2, (len(x),), generator=gen) if outputs == 1 else torch.randn(len(x), 2, generator=gen)
        for x in xs
    ]
    part = ClientData.from_parts(xs, ys)
    data = FederatedData("t", part, part, outputs, torch.ones(3, dtype=torch.bool))
    plan = replace(LocalPlan.uniform(torch.arange(3), 4, 0.2, 3), dp_sgd=ExampleDP(0.3, 1.0))
    results = []
    for backend in ("dense", "vectorised"):
        torch.manual_seed(0)
        model = FlatModel(nn.Sequential(nn.Linear(5, 8), nn.Tanh(), nn.Linear(8, outputs)), task)
        engine = Engine(model, data, backend=backend, seed=0)  # type: ignore[arg-type]
        results.append(engine.train(engine.initial_params(), plan, 1))
    torch.testing.assert_close(results[0].params, results[1].params, **TOL)
    torch.testing.assert_close(results[0].train_loss, results[1].train_loss, **TOL)


@pytest.mark.parametrize("z", [0.0, 1.0])
def test_dense_dp_sgd_from_each_clients_own_start_point(z: float) -> None:
    """Own start points (a personal model's), the first layer from Gram matrices of each client's own weights."""
    data = tiny_data([6, 9, 4, 30], dim=40, classes=2, seed=2)
    engines = [Engine(_mlp((40, 16, 2)), data, backend=b, seed=3, chunk_size=2) for b in ("dense", "vectorised")]  # type: ignore[arg-type]
    w = engines[0].initial_params()
    starts = w + 0.1 * torch.randn(4, len(w), generator=torch.Generator().manual_seed(0))
    plan = replace(LocalPlan.uniform(torch.arange(4), 5, 0.3, 4), dp_sgd=ExampleDP(0.5, z), starts=starts)
    dense, vectorised = (e.train(w, plan, 1) for e in engines)
    torch.testing.assert_close(dense.params, vectorised.params, **TOL)


@pytest.mark.parametrize("dims", [(3, 4, 2), (40, 16, 2)])
def test_dense_dp_sgd_with_an_infinite_bound_and_no_noise_is_the_dense_backends_plain_sgd(
    dims: tuple[int, ...],
) -> None:
    """c_i = 1 and w_i/b_k = the batch's mean weights (full shuffled batches, b_k = min(B, n_k)): plain SGD, on the
    per-step path and on the Gram path of the first layer (a wide input), with weight decay."""
    engine = Engine(_mlp(dims), tiny_data([7, 12, 3], dim=dims[0], classes=2, seed=4), backend="dense", seed=2)
    w = engine.initial_params()
    plan = LocalPlan.uniform(torch.arange(3), 6, 0.3, 4, weight_decay=0.01)
    plain = engine.train(w, plan, 1)
    private = engine.train(w, replace(plan, dp_sgd=ExampleDP(math.inf, 0.0, "shuffle")), 1)
    torch.testing.assert_close(private.params, plain.params, **TOL)
    torch.testing.assert_close(private.train_loss, plain.train_loss, **TOL)
