"""This process's resident memory from /proc (Linux): current, peak, and a reset of the peak."""

from __future__ import annotations

import contextlib
from pathlib import Path


def reset_peak() -> None:
    """Start measuring the peak (VmHWM) afresh (Linux ≥ 4.0; elsewhere nothing happens)."""
    with contextlib.suppress(OSError):
        Path("/proc/self/clear_refs").write_text("5")


def memory_mb(field_name: str) -> float:
    """VmRSS (current) or VmHWM (peak since the last reset) of this process, in MB (nan where unknown)."""
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith(field_name + ":"):
                return float(line.split()[1]) / 1024
    except OSError:
        pass
    return float("nan")
