"""torch_threads sets torch's thread count for a block and restores it, also after an error."""

from __future__ import annotations

import pytest
import torch

from fedhet.engine.threads import torch_threads


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
