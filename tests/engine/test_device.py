"""The `device` option: clear errors where a device is missing; on a CUDA machine, the same numbers as the CPU."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from conftest import Shift, tiny_data
from fedhet.engine.engine import Engine
from fedhet.engine.functional import FlatModel
from fedhet.engine.objective import Proximal
from fedhet.engine.plan import LocalPlan
from fedhet.errors import ConfigError
from fedhet.experiments.config import parse_config


def _mlp(dropout: float = 0.2) -> FlatModel:
    torch.manual_seed(0)
    return FlatModel(nn.Sequential(nn.Linear(5, 8), nn.Tanh(), nn.Dropout(dropout), nn.Linear(8, 3)))


def test_unknown_or_missing_devices_fail_with_a_clear_message() -> None:
    data = tiny_data([4, 6], dim=5, classes=3)
    with pytest.raises(ConfigError, match="fedhet runs on 'cpu' or 'cuda'"):
        Engine(_mlp(), data, device="meta")
    with pytest.raises(ConfigError, match="not a torch device"):
        Engine(_mlp(), data, device="gpu0")
    if not torch.cuda.is_available():
        with pytest.raises(ConfigError, match="no CUDA GPU"):
            Engine(_mlp(), data, device="cuda")
    assert Engine(_mlp(), data, device="cpu").placed("train") is None  # the CPU uses the data as it is
    assert parse_config({"dataset": "digits", "device": "cuda"}).device == "cuda"


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU (none on the CI machines)")
@pytest.mark.parametrize("backend", ["dense", "vectorised"])
def test_cuda_gives_the_cpu_numbers(backend: str) -> None:
    data = tiny_data([9, 3, 14, 6], dim=5, classes=3)
    # dense draws dropout masks on the CPU (the CPU's masks); vmap would draw them from the CUDA generator
    model = _mlp(0.2 if backend == "dense" else 0.0)
    plan = LocalPlan(
        clients=torch.tensor([0, 1, 2, 3]),
        steps=torch.tensor([4, 0, 6, 2]),
        lr=torch.tensor([0.1, 0.1, 0.05, 0.2]),
        batch_size=4,
        terms=(Proximal(mu=0.1), Shift()),
    )
    cpu = Engine(model, data, backend="sequential", seed=3)
    gpu = Engine(model, data, backend=backend, seed=3, device="cuda")  # type: ignore[arg-type]
    shift = torch.randn(4, model.size) * 0.01
    for engine in (cpu, gpu):
        engine.client_state.write("test_shift.c", plan.clients, shift, -1)
    w0 = model.initial_params()
    expected, got = cpu.train(w0, plan, 1), gpu.train(w0, plan, 1)
    assert got.params.device.type == "cpu"
    torch.testing.assert_close(got.params, expected.params, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(got.train_loss, expected.train_loss, atol=1e-5, rtol=1e-5, equal_nan=True)
    w = expected.params.mean(0)
    torch.testing.assert_close(gpu.scores(w).loss, cpu.scores(w).loss, atol=1e-5, rtol=1e-5)
