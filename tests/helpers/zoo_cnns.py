"""Every CNN of the model zoo at a small width or input (quick to train), image data for them, and whole engine
rounds with client state: shared by the conv backend's tests and the GPU tests."""

from __future__ import annotations

from typing import Any

import torch

from fedhet.catalog import MODELS
from fedhet.data.dataset import ClientData, FederatedData
from fedhet.engine.engine import Engine
from fedhet.engine.functional import FlatModel
from fedhet.engine.objective import Proximal
from fedhet.engine.optimizers import SGD
from fedhet.engine.plan import LocalPlan
from fedhet.strategies.scaffold import ControlVariates

# every CNN of the zoo, at its own layout and (where the model allows) a small width or input to keep it quick
ZOO: dict[str, tuple[dict[str, Any], tuple[int, ...]]] = {
    "lenet": ({"name": "lenet_cifar"}, (3, 32, 32)),
    "fedavg_cnn": ({"name": "cnn_mnist", "channels": [4, 8], "hidden": 16}, (784,)),  # flat MNIST-shaped input
    "fedavg_cnn_valid": ({"name": "cnn_mnist", "channels": [3, 5], "hidden": 12, "padding": "valid"}, (1, 28, 28)),
    "cnn_fmnist": ({"name": "cnn_fmnist"}, (1, 28, 28)),  # channel dropout and dropout
    "cnn_femnist": ({"name": "cnn_femnist"}, (1, 12, 12)),  # dropout on feature maps
    "cnn_cifar": ({"name": "cnn_cifar", "channels": [4, 8], "hidden": 16}, (3, 32, 32)),
    "cnn_cifar_lrn": ({"name": "cnn_cifar_lrn"}, (3, 16, 16)),  # local response normalisation
    "vgg16": ({"name": "vgg16", "widths": [4, 4, 8, 8, 8], "hidden": 16, "norm": "none"}, (3, 32, 32)),
    "vgg16_gn": ({"name": "vgg16", "widths": [4, 4, 8, 8, 8], "hidden": 16}, (3, 32, 32)),  # GroupNorm
}


def zoo_model(name: str, seed: int = 0) -> tuple[FlatModel, tuple[int, ...]]:
    """The zoo's CNN `name` (10 classes) and the shape of one input."""
    config, shape = ZOO[name]
    torch.manual_seed(seed)
    return FlatModel(MODELS.build(config).build(shape, 10)), shape


def image_data(shape: tuple[int, ...], sizes: list[int], seed: int = 1) -> ClientData:
    """Random inputs of `shape` and labels of 10 classes, `sizes[k]` samples for client k."""
    gen = torch.Generator().manual_seed(seed)
    xs = [torch.randn(n, *shape, generator=gen) for n in sizes]
    ys = [torch.randint(0, 10, (n,), generator=gen) for n in sizes]
    return ClientData.from_parts(xs, ys)


def image_federated(shape: tuple[int, ...], sizes: list[int]) -> FederatedData:
    """`image_data` as a federation whose clients' test data are their training data."""
    part = image_data(shape, sizes)
    return FederatedData("tiny-images", part, part, 10, torch.ones(len(sizes), dtype=torch.bool))


def scaffold_rounds(name: str, backend: str, device: str = "cpu") -> tuple[torch.Tensor, ...]:
    """Two rounds of `name` through `Engine.train` with SCAFFOLD's state (read from the client store in round 1),
    a proximal term, persistent momentum, unequal steps and learning rates (one client skips round 0): the mean
    model, losses, Δc_i, and the scores' losses and accuracies."""
    model, shape = zoo_model(name)
    data = image_federated(shape, [9, 3, 14, 2, 11, 6])
    c = 0.01 * torch.randn(model.size, generator=torch.Generator().manual_seed(8))
    engine = Engine(model, data, backend=backend, seed=4, device=device)  # type: ignore[arg-type]
    w = engine.initial_params()
    for round_, steps in enumerate(([3, 2, 0, 4], [1, 3, 2, 2])):
        plan = LocalPlan(
            torch.tensor([0, 2, 3, 5]),
            torch.tensor(steps),
            torch.tensor([0.1, 0.05, 0.1, 0.2]),
            4,
            terms=(Proximal(mu=0.1), ControlVariates(c=c)),
            optimizer=SGD(momentum=0.5, persistent=True),
        )
        result = engine.train(w, plan, round_)
        w = result.params.mean(0)
    assert engine.last_backend == backend
    scores = engine.scores(w)
    return w, result.train_loss, *result.state_delta.values(), scores.loss, scores.accuracy
