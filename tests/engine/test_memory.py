"""Chunks sized from the device's free memory (GPU: torch.cuda.mem_get_info; CPU: MemAvailable)."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from fedhet.engine import memory
from fedhet.engine.dense import dense_layers, memory_chunk
from fedhet.engine.engine import Engine
from fedhet.engine.functional import FlatModel
from fedhet.engine.memory import fit_chunk, free_bytes, training_bytes
from fedhet.engine.plan import LocalPlan
from helpers.tiny import tiny_data


def test_a_chunk_holds_what_half_the_free_memory_fits(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(memory, "free_bytes", lambda device: 1000)
    assert fit_chunk(50, 100, torch.device("cpu")) == 5  # 500 bytes of 1000 free, 100 per client
    assert fit_chunk(3, 100, torch.device("cpu")) == 3  # never more than the cohort
    assert fit_chunk(50, 10_000, torch.device("cpu")) == 1  # at least one client
    monkeypatch.setattr(memory, "free_bytes", lambda device: None)
    assert fit_chunk(50, 10_000, torch.device("cpu")) == 50  # unknown: the whole cohort
    assert training_bytes(100, 10, 7) == 4 * (500 + 140)


def test_on_a_gpu_the_free_memory_is_the_drivers_and_torchs_cached_blocks(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(torch.cuda, "mem_get_info", lambda device=None: (3 << 30, 80 << 30))
    monkeypatch.setattr(torch.cuda, "memory_reserved", lambda device=None: 5 << 30)
    monkeypatch.setattr(torch.cuda, "memory_allocated", lambda device=None: 4 << 30)
    assert free_bytes(torch.device("cuda")) == 4 << 30  # 3 GiB free + 1 GiB reserved by torch but unused
    assert free_bytes(torch.device("cpu")) == memory.available_bytes()


@pytest.mark.parametrize("backend", ["dense", "vectorised"])
def test_a_cohort_larger_than_memory_trains_in_chunks_to_the_same_numbers(
    monkeypatch: pytest.MonkeyPatch, backend: str
) -> None:
    torch.manual_seed(0)
    model = FlatModel(nn.Sequential(nn.Linear(3, 8), nn.ReLU(), nn.Linear(8, 2)))
    engine = Engine(model, tiny_data([5, 7, 6, 4, 8, 5]), backend=backend)  # type: ignore[arg-type]
    plan = LocalPlan.uniform(torch.arange(6), 3, 0.1, 4)
    w = model.initial_params()
    whole = engine.train(w, plan, 0).params.clone()
    per_client = training_bytes(model.size, 4, 3 + 8 + 2)
    monkeypatch.setattr(memory, "free_bytes", lambda device: 2 * per_client * 2)  # two clients fit
    layers = dense_layers(model)
    assert layers is not None and memory_chunk(model, layers, 6, 1, 4, torch.device("cpu")) == 2
    chunked = engine.train(w, plan, 0).params
    torch.testing.assert_close(chunked, whole, rtol=1e-6, atol=1e-7)
