"""torch's intra-op thread count for a block of code.

The papers' models are small: a team of OpenMP threads per operation costs more than the operation, and on a busy
machine (threads spinning for cores that other processes hold) ten times more. Code that runs many tiny operations
holds torch to one thread per operation for its duration and gives the previous setting back afterwards.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import torch


@contextmanager
def torch_threads(count: int | None) -> Iterator[None]:
    """Run the block with `count` torch threads (None or 0: leave the setting as it is), then restore it."""
    before = torch.get_num_threads()
    if count:
        torch.set_num_threads(count)
    try:
        yield
    finally:
        torch.set_num_threads(before)
