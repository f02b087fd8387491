"""The image models of FedMGDA+ (Hu, Shaloudegi, Zhang, Yu, Appendix B, Tables 2–4), layer for layer.

* ``cnn_cifar_lrn`` (Table 2, 797,962 parameters on CIFAR-10): conv 5×5 (64) → ReLU → max-pool 2 → LRN(2) →
  conv 5×5 (64) → ReLU → LRN(2) → max-pool 2 → fc 384 → ReLU → fc 192 → ReLU → fc C, no padding. This is the
  TensorFlow CIFAR tutorial network that the paper's released code builds (``CNNCifar``); fedhet's
  ``cnn_cifar`` is a different, FedAvg-style network.
* ``cnn_fmnist`` (Table 3, 21,840 parameters on Fashion-MNIST): conv 5×5 (10) → max-pool 2 → ReLU → conv 5×5 (20)
  → dropout (channels, p = 0.5) → max-pool 2 → ReLU → fc 50 → ReLU → dropout (0.5) → fc C.
* ``cnn_femnist`` (Table 4, 1,206,590 parameters on FEMNIST's 62 classes; Reddi et al. 2021): conv 3×3 (32) →
  ReLU → conv 3×3 (64) → ReLU → max-pool 2 → dropout (0.25) → fc 128 → ReLU → dropout (0.5) → fc C. Table 4
  leaves the activation of the first convolution and of fc 128 blank; Reddi et al.'s model uses ReLU there.

The softmax of the tables is the cross-entropy loss the engine applies to the logits. Dropout is seeded by the
engine per local step (`fedhet.models.base`); the channel dropout of ``cnn_fmnist`` is written as a dropout
mask over (B, C) broadcast over the pixels, which is what ``nn.Dropout2d`` computes.
"""

from __future__ import annotations

from typing import ClassVar

from torch import Tensor, nn

from fedhet.models.base import MODELS, ModelSpec
from fedhet.models.zoo import ConvClassifier, _flat_size, image_shape

__all__ = ["CNNFEMNIST", "CNNCifarLRN", "CNNFashion", "ChannelDropout"]


class ChannelDropout(nn.Module):
    """Zeroes whole channels with probability p (as ``nn.Dropout2d``), built on ``nn.Dropout`` so that the
    engine seeds it like any other dropout."""

    def __init__(self, p: float) -> None:
        super().__init__()
        self.dropout = nn.Dropout(p)

    def forward(self, x: Tensor) -> Tensor:
        mask = self.dropout(x.new_ones(x.shape[0], x.shape[1]))
        return x * mask[:, :, None, None]


@MODELS.register
class CNNCifarLRN(ModelSpec):
    """FedMGDA+'s CIFAR-10 CNN (Table 2): two 5×5 conv layers with LRN, fc 384, fc 192."""

    name: ClassVar[str] = "cnn_cifar_lrn"
    description: ClassVar[str] = "FedMGDA+ CIFAR CNN (Table 2): 2 conv 5x5 (64) with LRN, fc 384, fc 192."

    def build(self, input_shape: tuple[int, ...], num_classes: int) -> nn.Module:
        shape = image_shape(input_shape, self.name)
        features = nn.Sequential(
            nn.Conv2d(shape[0], 64, 5),
            nn.ReLU(),
            nn.MaxPool2d(2),
            nn.LocalResponseNorm(2),
            nn.Conv2d(64, 64, 5),
            nn.ReLU(),
            nn.LocalResponseNorm(2),
            nn.MaxPool2d(2),
        )
        flat = _flat_size(features, shape, self.name)
        head = nn.Sequential(
            nn.Linear(flat, 384), nn.ReLU(), nn.Linear(384, 192), nn.ReLU(), nn.Linear(192, num_classes)
        )
        return ConvClassifier(shape, features, head)


@MODELS.register
class CNNFashion(ModelSpec):
    """FedMGDA+'s Fashion-MNIST CNN (Table 3): two 5×5 conv layers (10, 20), channel dropout, fc 50."""

    name: ClassVar[str] = "cnn_fmnist"
    description: ClassVar[str] = "FedMGDA+ Fashion-MNIST CNN (Table 3): conv 10, conv 20, dropout, fc 50."

    def build(self, input_shape: tuple[int, ...], num_classes: int) -> nn.Module:
        shape = image_shape(input_shape, self.name)
        features = nn.Sequential(
            nn.Conv2d(shape[0], 10, 5),
            nn.MaxPool2d(2),
            nn.ReLU(),
            nn.Conv2d(10, 20, 5),
            ChannelDropout(0.5),
            nn.MaxPool2d(2),
            nn.ReLU(),
        )
        flat = _flat_size(features, shape, self.name)
        head = nn.Sequential(nn.Linear(flat, 50), nn.ReLU(), nn.Dropout(0.5), nn.Linear(50, num_classes))
        return ConvClassifier(shape, features, head)


@MODELS.register
class CNNFEMNIST(ModelSpec):
    """FedMGDA+'s FEMNIST CNN (Table 4, after Reddi et al. 2021): conv 3×3 (32, 64), max-pool, fc 128."""

    name: ClassVar[str] = "cnn_femnist"
    description: ClassVar[str] = "FedMGDA+ FEMNIST CNN (Table 4): conv 3x3 32, conv 3x3 64, pool, fc 128."

    def build(self, input_shape: tuple[int, ...], num_classes: int) -> nn.Module:
        shape = image_shape(input_shape, self.name)
        features = nn.Sequential(
            nn.Conv2d(shape[0], 32, 3),
            nn.ReLU(),
            nn.Conv2d(32, 64, 3),
            nn.ReLU(),
            nn.MaxPool2d(2),
            nn.Dropout(0.25),
        )
        flat = _flat_size(features, shape, self.name)
        head = nn.Sequential(nn.Linear(flat, 128), nn.ReLU(), nn.Dropout(0.5), nn.Linear(128, num_classes))
        return ConvClassifier(shape, features, head)
