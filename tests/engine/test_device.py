"""The `device` option: clear errors where a device is missing; on a CUDA machine, the same numbers as the CPU."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from fedhet.engine.engine import Engine
from fedhet.engine.functional import FlatModel
from fedhet.engine.numerics import exact_float32
from fedhet.engine.objective import Proximal
from fedhet.engine.plan import LocalPlan
from fedhet.errors import ConfigError
from fedhet.experiments.config import parse_config
from helpers.tiny import Shift, tiny_data
from helpers.zoo_cnns import ZOO, scaffold_rounds, zoo_model

CUDA = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU (none on the CI machines)")


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


@CUDA
@pytest.mark.parametrize("backend", ["dense", "vectorised"])
def test_cuda_gives_the_cpu_numbers(backend: str) -> None:
    data = tiny_data([9, 3, 14, 6], dim=5, classes=3)
    model = _mlp(0.2)  # every backend draws the dropout masks on the CPU (the CPU's masks)
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


@CUDA
def test_cuda_dense_gram_first_layer_gives_the_cpu_numbers(monkeypatch: pytest.MonkeyPatch) -> None:
    """`dense`'s Gram first layer on a GPU, on the clients' samples (6 steps of 5 from at most 20 samples: several
    epochs): the sequential backend's numbers on the CPU."""
    import fedhet.engine.dense as dense

    used: list[bool] = []
    choose = dense.use_gram_first_layer
    monkeypatch.setattr(dense, "use_gram_first_layer", lambda *a: used.append(choose(*a)) or used[-1])
    torch.manual_seed(0)
    model = FlatModel(nn.Sequential(nn.Linear(64, 32), nn.ReLU(), nn.Linear(32, 3)))
    data = tiny_data([20, 12, 17, 20], dim=64, classes=3)
    plan = LocalPlan(torch.arange(4), torch.tensor([6, 6, 3, 0]), torch.tensor([0.1, 0.05, 0.1, 0.1]), 5)
    w0 = model.initial_params()
    expected = Engine(model, data, backend="sequential", seed=3).train(w0, plan, 1)
    got = Engine(model, data, backend="dense", seed=3, device="cuda").train(w0, plan, 1)
    assert True in used
    assert float((expected.params - w0).abs().max()) > 1e-2
    torch.testing.assert_close(got.params, expected.params, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(got.train_loss, expected.train_loss, atol=1e-5, rtol=1e-5, equal_nan=True)


def _flags() -> tuple[object, ...]:
    cudnn, matmul = torch.backends.cudnn, torch.backends.cuda.matmul
    return cudnn.conv.fp32_precision, matmul.fp32_precision, cudnn.deterministic, cudnn.benchmark


def test_exact_float32_holds_a_gpu_to_float32_and_gives_the_settings_back() -> None:
    """The flags are plain settings, readable without a GPU: TF32 off and deterministic cuDNN inside the block
    for a CUDA device, the user's own settings (here TF32 and autotuning on) back afterwards, also after an error;
    nothing changes for the CPU."""
    cudnn, matmul = torch.backends.cudnn, torch.backends.cuda.matmul
    before = _flags()
    try:
        cudnn.conv.fp32_precision, matmul.fp32_precision, cudnn.benchmark = "tf32", "tf32", True
        users = _flags()
        with exact_float32(torch.device("cpu")):
            assert _flags() == users
        with exact_float32(torch.device("cuda")):
            assert _flags() == ("ieee", "ieee", True, False)
        assert _flags() == users
        with pytest.raises(RuntimeError, match="inside"), exact_float32(torch.device("cuda:0")):
            raise RuntimeError("inside")
        assert _flags() == users
    finally:
        cudnn.conv.fp32_precision, matmul.fp32_precision, cudnn.deterministic, cudnn.benchmark = before


# GroupNorm at this tiny width amplifies rounding past 1e-5 on any two backends (tests/engine/test_conv.py), so it
# is checked for repeatability only
CUDA_VS_CPU = [(n, b) for n in ZOO if n != "vgg16_gn" for b in ("conv", "vectorised")]


@CUDA
@pytest.mark.parametrize("name,backend", CUDA_VS_CPU)
def test_cuda_cnns_give_the_cpu_numbers(name: str, backend: str) -> None:
    cpu = scaffold_rounds(name, "sequential", "cpu")
    gpu = scaffold_rounds(name, backend, "cuda")
    assert float((cpu[0] - zoo_model(name)[0].initial_params()).abs().max()) > 1e-2  # the clients moved
    for got, expected in zip(gpu, cpu, strict=True):
        assert got.device.type == "cpu"
        torch.testing.assert_close(got, expected, atol=1e-5, rtol=1e-5, equal_nan=True)


@CUDA
@pytest.mark.parametrize("name", list(ZOO))
@pytest.mark.parametrize("backend", ["conv", "vectorised"])
def test_cuda_runs_repeat_to_the_bit(name: str, backend: str) -> None:
    first, second = scaffold_rounds(name, backend, "cuda"), scaffold_rounds(name, backend, "cuda")
    for a, b in zip(first, second, strict=True):
        assert torch.equal(a.nan_to_num(), b.nan_to_num())


@CUDA
def test_cuda_chunks_follow_the_gpus_free_memory_and_bfloat16_stays_within_tolerance() -> None:
    """On a GPU: `fit_chunk` reads torch.cuda.mem_get_info (a cohort fits whole on an idle GPU), and bfloat16
    training under autocast is within its tolerance of float32's (docs/performance.md, "Mixed precision")."""
    from fedhet.engine.memory import fit_chunk, free_bytes
    from helpers.tiny import tiny_data

    gpu = torch.device("cuda")
    free = free_bytes(gpu)
    assert free is not None and 0 < free <= torch.cuda.mem_get_info(gpu)[1]
    assert fit_chunk(1000, 1 << 20, gpu) == 1000 and fit_chunk(10, free, gpu) == 1
    torch.manual_seed(0)
    model = FlatModel(nn.Sequential(nn.Linear(3, 8), nn.ReLU(), nn.Linear(8, 2)))
    data, plan = tiny_data([5, 7, 6, 4, 8, 5]), LocalPlan.uniform(torch.arange(6), 3, 0.1, 4)
    w = model.initial_params()
    trained = {
        p: Engine(model, data, backend="vectorised", device="cuda", precision=p).train(w, plan, 0).params.cpu()
        for p in ("float32", "bfloat16")
    }
    gap = (trained["bfloat16"] - trained["float32"]).abs().max().item()
    assert 0 < gap < 5e-3
