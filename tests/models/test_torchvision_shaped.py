"""A ResNet built the way torchvision builds ``resnet18`` (7×7 stem, max-pool, in-place ReLU, BasicBlocks with a
``downsample`` branch, adaptive average pooling), given as a user's marked factory: it trains with every
batch-norm policy, on the sequential and the vectorised backends. (torchvision itself cannot be installed beside
this machine's CPU build of torch; docs/batchnorm.md shows the two-line factory that wraps its resnet18.)"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import pytest

from fedhet.experiments.config import parse_config
from fedhet.experiments.runner import run

NETS = """
from torch import nn
from fedhet.models.torch_model import model_factory


class Block(nn.Module):
    def __init__(self, cin, cout, stride):
        super().__init__()
        self.conv1 = nn.Conv2d(cin, cout, 3, stride, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(cout)
        self.relu = nn.ReLU(inplace=True)
        self.conv2 = nn.Conv2d(cout, cout, 3, 1, 1, bias=False)
        self.bn2 = nn.BatchNorm2d(cout)
        self.downsample = None
        if stride != 1 or cin != cout:
            self.downsample = nn.Sequential(nn.Conv2d(cin, cout, 1, stride, bias=False), nn.BatchNorm2d(cout))

    def forward(self, x):
        identity = x if self.downsample is None else self.downsample(x)
        out = self.relu(self.bn1(self.conv1(x)))
        out = self.bn2(self.conv2(out))
        out += identity
        return self.relu(out)


class TorchvisionShapedResNet(nn.Module):
    def __init__(self, channels, num_classes, width=4):
        super().__init__()
        self.conv1 = nn.Conv2d(channels, width, 7, 2, 3, bias=False)
        self.bn1 = nn.BatchNorm2d(width)
        self.relu = nn.ReLU(inplace=True)
        self.maxpool = nn.MaxPool2d(3, 2, 1)
        widths = [width, 2 * width, 4 * width, 8 * width]
        stages, cin = [], width
        for i, cout in enumerate(widths):
            stages.append(nn.Sequential(Block(cin, cout, 1 if i == 0 else 2), Block(cout, cout, 1)))
            cin = cout
        self.layer1, self.layer2, self.layer3, self.layer4 = stages
        self.avgpool = nn.AdaptiveAvgPool2d((1, 1))
        self.fc = nn.Linear(cin, num_classes)

    def forward(self, x):
        x = self.maxpool(self.relu(self.bn1(self.conv1(x))))
        x = self.layer4(self.layer3(self.layer2(self.layer1(x))))
        return self.fc(self.avgpool(x).flatten(1))


@model_factory
def resnet18_like(input_shape, num_classes):
    channels = input_shape[0] if len(input_shape) == 3 else 1
    return nn.Sequential(nn.Unflatten(1, (channels, 8, 8)), TorchvisionShapedResNet(channels, num_classes))
"""


@pytest.fixture(scope="module")
def nets(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("nets") / "nets.py"
    path.write_text(NETS)
    return path


@pytest.mark.slow  # a ResNet-18-shaped network, 2 rounds on 2 backends and 3 policies: ~10 s
@pytest.mark.parametrize("backend", ["sequential", "vectorised"])
@pytest.mark.parametrize(
    ("algorithm", "policy"), [("fedavg", "aggregate"), ("fedbn", "local"), ("fedavg", "recompute")]
)
def test_a_torchvision_shaped_resnet_trains_with_each_policy(
    nets: Path, backend: str, algorithm: str, policy: str
) -> None:
    cfg: dict[str, Any] = {
        "dataset": "digits",
        "algorithm": algorithm,
        "model": {"name": "torch", "target": f"{nets}:resnet18_like", "batch_norm": policy},
        "backend": backend,
        "num_clients": 4,
        "clients_per_round": 2,
        "rounds": 2,
        "local": {"steps": 2, "lr": 0.05, "batch_size": 8},
        "personal_eval": {"appeal": False},
    }
    final = run(parse_config(cfg)).final
    assert math.isfinite(final["test_loss"]) and 0.0 <= final["test_accuracy"] <= 1.0
    if algorithm == "fedbn":
        assert math.isfinite(final["personal_test_accuracy"])
