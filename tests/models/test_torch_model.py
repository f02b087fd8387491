"""Any PyTorch model by import path (`model: {name: torch, target: ...}`): building, refusals, and the same
metrics on the sequential and vectorised backends."""

from __future__ import annotations

import math
import re
import textwrap
import warnings
from pathlib import Path
from typing import Any

import pytest
import torch
from torch import nn

from fedhet.catalog import MODELS
from fedhet.errors import ConfigError
from fedhet.experiments.config import parse_config
from fedhet.experiments.runner import run
from fedhet.models.torch_model import TorchModel, hold_model, resolve_target

NETS = '''
import torch
from torch import nn

import fedhet


class CNN(nn.Module):
    """A plain CNN for (1, 8, 8) images."""

    def __init__(self, input_shape, num_classes, channels=4):
        super().__init__()
        self.conv = nn.Conv2d(input_shape[0], channels, 3, padding=1)
        self.head = nn.Linear(channels * 16, num_classes)

    def forward(self, x):
        z = torch.max_pool2d(torch.relu(self.conv(x)), 2)
        return self.head(z.flatten(1))


class RowLSTM(nn.Module):
    """Reads an 8x8 image row by row with nn.LSTM."""

    def __init__(self, num_classes, hidden=12):
        super().__init__()
        self.lstm = nn.LSTM(8, hidden, batch_first=True)
        self.out = nn.Linear(hidden, num_classes)

    def forward(self, x):
        seq = x.reshape(x.shape[0], 8, 8)
        h, _ = self.lstm(seq)
        return self.out(h[:, -1])


class BatchNormNet(nn.Module):
    def __init__(self, num_classes, track=True):
        super().__init__()
        self.conv = nn.Conv2d(1, 4, 3, padding=1)
        self.norm = nn.BatchNorm2d(4, track_running_stats=track)
        self.head = nn.Linear(4 * 64, num_classes)

    def forward(self, x):
        return self.head(torch.relu(self.norm(self.conv(x))).flatten(1))


class ItemNet(nn.Module):
    """Calls .item() in forward: fine for plain autograd, impossible under torch.func.vmap."""

    def __init__(self, num_classes):
        super().__init__()
        self.conv = nn.Conv2d(1, 2, 3, padding=1)
        self.head = nn.Linear(2 * 64, num_classes)

    def forward(self, x):
        scale = 1.0 if x.abs().max().item() < 1e9 else 0.5
        return self.head(torch.tanh(self.conv(x)).flatten(1) * scale)


class DropNet(nn.Module):
    """Channel dropout (nn.Dropout2d), not an nn.Dropout."""

    def __init__(self, num_classes):
        super().__init__()
        self.conv = nn.Conv2d(1, 2, 3, padding=1)
        self.drop = nn.Dropout2d(0.3)
        self.head = nn.Linear(2 * 64, num_classes)

    def forward(self, x):
        return self.head(self.drop(torch.relu(self.conv(x))).flatten(1))


@fedhet.model_factory
def factory(num_classes, width=5):
    return nn.Sequential(nn.Flatten(), nn.Linear(64, width), nn.Tanh(), nn.Linear(width, num_classes))


instance = nn.Sequential(nn.Flatten(), nn.Linear(64, 10))
not_a_model = 42


@fedhet.model_factory
def returns_a_number(num_classes):
    return 3


class Double(nn.Module):
    def __init__(self, num_classes):
        super().__init__()
        self.fc = nn.Linear(64, num_classes).double()

    def forward(self, x):
        return self.fc(x.double().flatten(1)).float()


class Empty(nn.Module):
    def forward(self, x):
        return x
'''


@pytest.fixture(scope="module")
def nets(tmp_path_factory: pytest.TempPathFactory) -> str:
    path = tmp_path_factory.mktemp("user") / "user_nets.py"
    path.write_text(textwrap.dedent(NETS))
    return str(path)


def build(nets: str, name: str, **kwargs: Any) -> nn.Module:
    spec = MODELS.build({"name": "torch", "target": f"{nets}:{name}", "kwargs": kwargs}, where="model")
    return spec.build((1, 8, 8), 10)


def test_a_class_gets_input_shape_and_num_classes(nets: str) -> None:
    model = build(nets, "CNN", channels=3)
    assert model.conv.in_channels == 1 and model.conv.out_channels == 3 and model.head.out_features == 10
    assert model(torch.zeros(2, 1, 8, 8)).shape == (2, 10)


def test_a_factory_and_an_instance_are_accepted(nets: str) -> None:
    assert build(nets, "factory", width=7)[1].out_features == 7
    spec = MODELS.build({"name": "torch", "target": f"{nets}:instance"})
    first, second = spec.build((64,), 10), spec.build((64,), 10)
    assert first is not second  # every build is a fresh copy
    assert torch.equal(first[1].weight, second[1].weight)


def test_objects_from_python_are_held_or_named_by_path() -> None:
    assert hold_model(nn.Linear) == "torch.nn.modules.linear:Linear"
    module = nn.Linear(3, 2)
    target = hold_model(module)
    assert target.startswith("<python>:Linear@")
    with torch.no_grad():
        module.weight.zero_()  # the held copy does not change
    assert not torch.equal(resolve_target(target).weight, module.weight)

    def local_factory(num_classes: int) -> nn.Module:
        return nn.Linear(64, num_classes)

    held = TorchModel(target=hold_model(local_factory)).build((64,), 4)
    assert isinstance(held, nn.Linear) and held.out_features == 4


@pytest.mark.parametrize(
    ("name", "kwargs", "message"),
    [
        ("CNN", {"colours": 3}, "building model '.*:CNN' failed: TypeError: .*colours"),
        ("not_a_model", {}, "is a int, not an nn.Module class"),
        ("returns_a_number", {}, "returned a int, not an nn.Module"),
        ("Double", {}, "parameter 'fc.weight' is torch.float64; fedhet trains float32 models"),
        ("Empty", {}, "has no parameters to train"),
        ("instance", {"width": 3}, "is a module instance; it takes no kwargs"),
        ("Missing", {}, "has no attribute 'Missing'"),
    ],
)
def test_refusals_are_one_line_config_errors(nets: str, name: str, kwargs: dict[str, Any], message: str) -> None:
    with pytest.raises(ConfigError, match=r"^[^\n]+$") as err:
        build(nets, name, **kwargs)
    assert re.search(message, str(err.value)), str(err.value)


def test_importing_the_target_does_not_shift_the_seeded_initialisation(tmp_path: Path) -> None:
    nets = tmp_path / "drawing.py"
    nets.write_text("import torch\nfrom torch import nn\nNOISE = torch.randn(5)\nNet = nn.Linear\n")
    spec = TorchModel(target=f"{nets}:Net", kwargs={"in_features": 4, "out_features": 2})
    weights = []
    for _ in range(2):  # the first build imports the file, which draws random numbers
        with torch.random.fork_rng():
            torch.manual_seed(0)
            weights.append(spec.build((4,), 2).weight.detach())
    assert torch.equal(weights[0], weights[1])


def test_a_config_without_target_names_the_key() -> None:
    with pytest.raises(ConfigError, match=r"model.target"):
        MODELS.build({"name": "torch"}, where="model")


def small_run(nets: str, model: str, backend: str, cohort: int = 6, **extra: Any) -> Any:
    raw = {
        "dataset": {"name": "digits", "image": True},
        "model": {"name": "torch", "target": f"{nets}:{model}", **extra},
        "num_clients": 12,
        "clients_per_round": cohort,
        "rounds": 2,
        "local": {"steps": 3, "batch_size": 8, "lr": 0.05},
        "backend": backend,
        "seed": 3,
    }
    return run(parse_config(raw))


@pytest.mark.slow
@pytest.mark.parametrize(
    ("model", "extra"),
    [("CNN", {}), ("RowLSTM", {}), ("BatchNormNet", {"kwargs": {"track": False}}), ("BatchNormNet", {})],
)
def test_sequential_and_vectorised_give_the_same_metrics(nets: str, model: str, extra: dict[str, Any]) -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)  # nn.LSTM under vmap: "performance drop" notice
        seq = small_run(nets, model, "sequential", **extra)
        vec = small_run(nets, model, "vectorised", **extra)
    assert len(seq.history) == len(vec.history) == 2
    for a, b in zip(seq.history, vec.history, strict=True):
        assert a.keys() == b.keys()
        for key in a:
            assert math.isclose(a[key], b[key], rel_tol=1e-5, abs_tol=1e-5), (model, key, a[key], b[key])
    assert not torch.equal(seq.params, seq.experiment.engine.initial_params())  # it trained
    assert torch.allclose(seq.params, vec.params, atol=1e-5)


def test_a_users_batch_norm_model_trains_its_running_statistics(nets: str) -> None:
    """BatchNorm with running statistics: the statistics train with the model, are averaged (FedAvg), and come out
    in the final state dict as torch keeps them (num_batches_tracked an integer)."""
    from fedhet.engine.functional import state_dict_of

    state = small_run(nets, "BatchNormNet", "auto")
    model = state.experiment.engine.model
    assert model.stat_names == ["norm.running_mean", "norm.running_var", "norm.num_batches_tracked"]
    assert model.statistics == "aggregate"
    assert float(state.params[model.slices["norm.num_batches_tracked"]]) == 2 * 3  # 2 rounds of 3 steps
    saved = state_dict_of(model, state.params)
    assert saved["norm.num_batches_tracked"].dtype == torch.int64 and int(saved["norm.num_batches_tracked"]) == 6
    fresh = build(nets, "BatchNormNet")
    fresh.load_state_dict(saved)
    torch.testing.assert_close(fresh.norm.running_mean, state.params[model.slices["norm.running_mean"]])


def test_auto_falls_back_to_sequential_when_vmap_cannot_run_the_model(nets: str) -> None:
    threads = torch.get_num_threads()
    torch.set_num_threads(2)  # `auto` would pick the vectorised backend for this small model and cohort of 10
    try:
        with pytest.warns(UserWarning, match="sequential"):
            state = small_run(nets, "ItemNet", "auto", cohort=10)
    finally:
        torch.set_num_threads(threads)
    assert state.status == "finished" and 0.0 <= state.final["test_accuracy"] <= 1.0


def test_channel_dropout_is_seeded_like_dropout(nets: str) -> None:
    """Dropout2d masks must come from the seeded streams too: the same run twice gives the same numbers, and
    both backends agree (today the sequential runs differ and vmap refuses the unseeded random op)."""
    first = small_run(nets, "DropNet", "sequential")
    again = small_run(nets, "DropNet", "sequential")
    assert first.history == again.history
    vec = small_run(nets, "DropNet", "vectorised")
    assert torch.allclose(first.params, vec.params, atol=1e-5)


def test_the_vectorised_backend_cannot_run_a_model_that_calls_item(nets: str) -> None:
    """Why the fallback above is needed: vmap refuses `.item()` (sequential runs it); asked for explicitly, the
    vectorised backend is refused in one line that names the cause."""
    assert small_run(nets, "ItemNet", "sequential").status == "finished"
    with pytest.raises(ConfigError, match=r"backend 'vectorised' cannot run this model.*item"):
        small_run(nets, "ItemNet", "vectorised")
