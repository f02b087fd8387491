"""torch's intra-op thread count for a block of code.

The papers' models are small: a team of OpenMP threads per operation costs more than the operation, and on a busy
machine (threads spinning for cores that other processes hold) ten times more. Code that runs many tiny operations
holds torch to one thread per operation for its duration and gives the previous setting back afterwards, unless
the user asked for a number of threads (`requested_threads`: ``--threads``, which `torch_threads` records).
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar

import torch

_REQUESTED: ContextVar[int | None] = ContextVar("fedhet_torch_threads", default=None)


@contextmanager
def torch_threads(count: int | None) -> Iterator[None]:
    """Run the block with `count` torch threads (None or 0: leave the setting as it is), then restore it; `count`
    is the block's `requested_threads`."""
    before = torch.get_num_threads()
    token = _REQUESTED.set(count) if count else None
    if count:
        torch.set_num_threads(count)
    try:
        yield
    finally:
        torch.set_num_threads(before)
        if token is not None:
            _REQUESTED.reset(token)


def requested_threads() -> int | None:
    """The thread count the innermost `torch_threads` block set (None: none did, torch's default is in force)."""
    return _REQUESTED.get()


@contextmanager
def few_threads(count: int = 1) -> Iterator[None]:
    """Run the block with `count` torch threads unless a thread count was asked for (`requested_threads`)."""
    with torch_threads(None if requested_threads() else count):
        yield
