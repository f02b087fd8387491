"""Keep freed large buffers in the process, so that per-round tensors do not page-fault every round.

A round allocates a few tensors of (cohort × parameters) floats (the local models, the updates); for an MLP
784-200-10 and 100 clients each is 64 MB. glibc serves such sizes with fresh `mmap`s and returns them on
free, so every round pays a page fault per 4 KB touched (docs/performance.md, "Why the engine's constants").
Raising glibc's mmap and trim thresholds keeps the
freed memory in the heap for the next round. The process's peak memory is unchanged; it simply does not
shrink after a peak. Set ``FEDHET_KEEP_FREED_MEMORY=0`` to leave the allocator alone.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import os
import sys

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
