"""FLOPs per parameter: a Linear layer's weights 2 each, biases 1; a convolution's per output position."""

from __future__ import annotations

import torch
from torch import nn

from fedhet.models.flops import parameter_flops


def test_an_mlp_by_hand() -> None:
    mlp = nn.Sequential(nn.Linear(4, 3), nn.ReLU(), nn.Linear(3, 2))
    flops = parameter_flops(mlp, (4,))
    assert flops.tolist() == [2.0] * 12 + [1.0] * 3 + [2.0] * 6 + [1.0] * 2
    assert len(flops) == sum(p.numel() for p in mlp.parameters())


def test_a_convolution_costs_per_output_position() -> None:
    """3×3 kernel, padding 1 on 5×5 inputs: 25 output positions; after 2×2 pooling the Linear sees 2·2·2 inputs."""
    net = nn.Sequential(nn.Conv2d(1, 2, 3, padding=1), nn.MaxPool2d(2), nn.Flatten(), nn.Linear(8, 3))
    flops = parameter_flops(net, (1, 5, 5))
    conv_w, conv_b = flops[:18], flops[18:20]
    assert bool((conv_w == 50.0).all()) and bool((conv_b == 25.0).all())  # 2·25 per weight, 25 per bias
    assert flops[20:44].tolist() == [2.0] * 24 and flops[44:].tolist() == [1.0] * 3


def test_shared_parameters_count_once_and_the_module_is_left_as_it_was() -> None:
    layer = nn.Linear(2, 2)
    net = nn.Sequential(layer, nn.ReLU(), layer).train()
    flops = parameter_flops(net, (2,))
    assert len(flops) == len(torch.nn.utils.parameters_to_vector(net.parameters())) == 6
    assert net.training
