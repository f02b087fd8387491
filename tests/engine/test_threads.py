"""torch_threads sets torch's thread count for a block and restores it, also after an error."""

from __future__ import annotations

import pytest
import torch

from fedhet.engine.threads import few_threads, requested_threads, torch_threads


def test_sets_and_restores_the_thread_count() -> None:
    before = torch.get_num_threads()
    with torch_threads(1):
        assert torch.get_num_threads() == 1
    assert torch.get_num_threads() == before
    with torch_threads(None), torch_threads(0):
        assert torch.get_num_threads() == before
    with pytest.raises(RuntimeError), torch_threads(1):
        raise RuntimeError("boom")
    assert torch.get_num_threads() == before


def test_few_threads_gives_way_to_a_requested_count() -> None:
    """DP-SGD's steps run on one thread unless the user asked for a count (--threads: an outer torch_threads)."""
    before = torch.get_num_threads()
    assert requested_threads() is None
    with few_threads():
        assert torch.get_num_threads() == 1
    assert torch.get_num_threads() == before and requested_threads() is None
    with torch_threads(3):
        assert requested_threads() == 3
        with few_threads():
            assert torch.get_num_threads() == 3
    assert requested_threads() is None and torch.get_num_threads() == before
