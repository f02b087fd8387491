"""Float32 as the CPU computes it, on a GPU, for a block of code.

By default PyTorch lets cuDNN compute float32 convolutions in TF32 (10 bits of mantissa: relative errors up to
about 1e-3) and choose its algorithms by timing them; the choice can change from run to run, and some algorithms
add with atomics. The engine holds a GPU to full float32 and deterministic algorithms while it trains and scores,
so that a run on `cuda` gives the CPU's numbers (to 1e-5) and the same numbers every time, and gives the previous
settings back afterwards.

`mixed_precision` is the opposite choice, made on purpose (``precision: bfloat16`` or ``float16``): local
training's matrix products and convolutions run under ``torch.autocast`` in that type (the weights, the optimiser's
state and the updates stay float32); docs/performance.md states the tolerance against float32.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any, Literal

import torch


def _tf32_switches() -> list[tuple[Any, str, object]]:
    """(object, attribute, full-float32 value) of cuDNN's convolutions and cuBLAS's products: torch >= 2.9's
    `fp32_precision` where it exists (mixing it with the older `allow_tf32` flags is an error there), else those."""
    cudnn, matmul = torch.backends.cudnn, torch.backends.cuda.matmul
    conv = getattr(cudnn, "conv", None)
    if conv is not None and hasattr(conv, "fp32_precision"):
        return [(conv, "fp32_precision", "ieee"), (matmul, "fp32_precision", "ieee")]
    return [(cudnn, "allow_tf32", False), (matmul, "allow_tf32", False)]  # pragma: no cover - torch < 2.9


@contextmanager
def exact_float32(device: torch.device) -> Iterator[None]:
    """On a CUDA `device`: no TF32 in matrix products or cuDNN convolutions, deterministic cuDNN algorithms,
    no autotuning; the settings are restored after the block. Elsewhere: nothing changes."""
    if device.type != "cuda":
        yield
        return
    cudnn = torch.backends.cudnn
    switches = [*_tf32_switches(), (cudnn, "deterministic", True), (cudnn, "benchmark", False)]
    saved = [getattr(obj, name) for obj, name, _ in switches]
    for obj, name, value in switches:
        setattr(obj, name, value)
    try:
        yield
    finally:
        for (obj, name, _), value in zip(switches, saved, strict=True):
            setattr(obj, name, value)


Precision = Literal["float32", "bfloat16", "float16"]
AUTOCAST: dict[str, torch.dtype] = {"bfloat16": torch.bfloat16, "float16": torch.float16}


@contextmanager
def mixed_precision(device: torch.device, precision: Precision) -> Iterator[None]:
    """``torch.autocast`` to `precision` on `device` for the block (float32: nothing changes)."""
    if precision == "float32":
        yield
        return
    with torch.autocast(device.type, dtype=AUTOCAST[precision]):
        yield
