"""Keep freed large buffers in the process, so that per-round tensors do not page-fault every round.

A round allocates a few tensors of (cohort × parameters) floats (the local models, the updates); for an MLP
784-200-10 and 100 clients each is 64 MB. glibc serves such sizes with fresh `mmap`s and returns them on
free, so every round pays a page fault per 4 KB touched (docs/performance.md, "Why the engine's constants").
Raising glibc's mmap and trim thresholds keeps the
freed memory in the heap for the next round. The process's peak memory is unchanged; it simply does not
shrink after a peak. Set ``FEDHET_KEEP_FREED_MEMORY=0`` to leave the allocator alone.

`fit_chunk` sizes the batched backends' chunks (clients trained at once) from the device's free memory: on a GPU
``torch.cuda.mem_get_info``, on the CPU MemAvailable; a chunk's estimated bytes (`training_bytes`) stay within half
of it, so that a cohort too large for the device trains in several chunks instead of running out of memory.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import os
import sys

import torch

M_TRIM_THRESHOLD = -1
M_MMAP_THRESHOLD = -3
MMAP_THRESHOLD = 1 << 30  # allocations up to 1 GiB come from the heap ...
TRIM_THRESHOLD = 1 << 30  # ... and up to 1 GiB of free heap top stays in the process

_done = False


def keep_freed_memory() -> bool:
    """Tune glibc's malloc as the module docstring says (once per process). True if it is tuned."""
    global _done
    if _done:
        return True
    if not sys.platform.startswith("linux") or os.environ.get("FEDHET_KEEP_FREED_MEMORY", "1") == "0":
        return False
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        mallopt = libc.mallopt
    except (OSError, AttributeError):  # not glibc (musl, macOS)
        return False
    _done = bool(mallopt(M_MMAP_THRESHOLD, MMAP_THRESHOLD)) and bool(mallopt(M_TRIM_THRESHOLD, TRIM_THRESHOLD))
    return _done


# ---- how many clients a chunk may hold: from the free memory of the device it runs on -------------------------

CHUNK_MEMORY_SHARE = 0.5  # a chunk's tensors may take this share of the device's free memory


def available_bytes() -> int | None:
    """MemAvailable from /proc/meminfo: what the CPU may still allocate without swapping (None where unknown)."""
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        return None
    return None


def free_bytes(device: torch.device) -> int | None:
    """Free memory of `device`: ``torch.cuda.mem_get_info`` on a GPU (what the CUDA driver has free, beyond what
    torch's caching allocator already holds), `available_bytes` on the CPU; None where unknown."""
    if device.type == "cuda":
        free, _total = torch.cuda.mem_get_info(device)
        return int(free) + int(torch.cuda.memory_reserved(device) - torch.cuda.memory_allocated(device))
    return available_bytes()


def fit_chunk(clients: int, per_client: int, device: torch.device, share: float = CHUNK_MEMORY_SHARE) -> int:
    """Clients per chunk (at least 1, at most `clients`) whose `per_client` bytes each fit in `share` of the
    device's free memory (`free_bytes`); all of them where that is unknown."""
    free = free_bytes(device)
    if free is None:
        return max(clients, 1)
    return max(1, min(clients, int(share * free) // max(per_client, 1)))


def training_bytes(model_size: int, batch: int, activations: int) -> int:
    """An upper estimate of the bytes one client of a chunk holds while it trains: its weights, their gradient,
    two optimiser buffers and its update (5 float32 vectors of the model's size) and a local step's activations
    and their gradients (`activations` floats per sample, twice, for `batch` samples)."""
    return 4 * (5 * model_size + 2 * batch * activations)
