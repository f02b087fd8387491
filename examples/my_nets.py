"""Small PyTorch models for the examples, used by import path: ``target: "examples/my_nets.py:CNN"``.

fedhet passes ``input_shape`` (one sample's shape, e.g. [1, 16, 16]) and ``num_classes`` to any parameter of
those names; other arguments come from ``kwargs``.
"""

from __future__ import annotations

import torch
from torch import nn


class CNN(nn.Module):
    """Two 3x3 convolutions with max-pooling and a linear read-out, for small images (C, H, W)."""

    def __init__(self, input_shape: tuple[int, ...], num_classes: int, channels: int = 8) -> None:
        super().__init__()
        c, h, w = input_shape
        self.features = nn.Sequential(
            nn.Conv2d(c, channels, 3, padding=1),
            nn.ReLU(),
            nn.MaxPool2d(2),
            nn.Conv2d(channels, channels, 3, padding=1),
            nn.GroupNorm(2, channels),  # not BatchNorm: running statistics cannot be averaged across clients
            nn.ReLU(),
            nn.MaxPool2d(2),
        )
        self.head = nn.Linear(channels * (h // 4) * (w // 4), num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.features(x).flatten(1))


class TabularNet(nn.Module):
    """A two-layer perceptron for tables (flat features)."""

    def __init__(self, input_shape: tuple[int, ...], num_classes: int, hidden: int = 32) -> None:
        super().__init__()
        self.layers = nn.Sequential(nn.Linear(input_shape[0], hidden), nn.GELU(), nn.Linear(hidden, num_classes))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.layers(x)
