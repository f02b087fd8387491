"""Every CNN of the model zoo at a small width or input (quick to train), and image data for them: shared by the
conv backend's tests and the GPU tests."""

from __future__ import annotations

from typing import Any

import torch

from fedhet.catalog import MODELS
from fedhet.data.dataset import ClientData
from fedhet.engine.functional import FlatModel

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
