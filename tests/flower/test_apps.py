"""fedhet's Flower apps (`fedhet.flower.apps`): how a payload travels in a Flower message, and the server's short
retries for a reply's objects on a deployment. (Whole runs: test_simulation.py, test_worker.py, test_deployment.py.)"""

from __future__ import annotations

import functools

import numpy as np
import pytest
from flwr.superlink.grid import http_grid

from fedhet.flower import apps


def test_a_payloads_small_arrays_travel_as_one_and_all_come_back_whole() -> None:
    arrays = {
        "weights": np.arange(12, dtype=np.float32).reshape(3, 4) / 7,
        "ids": np.array([5, 1, 9], dtype=np.int64),
        "mask": np.array([True, False]),
        "empty": np.zeros((0, 3)),
        "scalar": np.array(2.5),
        "strided": np.arange(10.0)[::3],  # not contiguous
        "model": np.linspace(0, 1, apps.PACK_BELOW // 4, dtype=np.float32),  # large: an object of its own
    }
    config = {"round": 3, "name": "maxfl", "lr": 0.1, "warm": True}
    record = apps._record(arrays, config)
    assert sorted(record["arrays"]) == ["model"]  # the small arrays are one bytes value of the config
    assert sorted(record) == ["arrays", "config"] and isinstance(record["config"][apps.PACKED], bytes)
    back, back_config = apps._payload(record)
    assert back_config == config
    assert sorted(back) == sorted(arrays)
    for name, a in arrays.items():
        assert back[name].dtype == a.dtype and back[name].shape == a.shape
        np.testing.assert_array_equal(back[name], a)
    back["ids"][0] = -1  # each array is its own copy
    assert apps._payload(record)[0]["ids"][0] == 5


def test_an_empty_payload_round_trips() -> None:
    assert apps._payload(apps._record({}, {})) == ({}, {})


def test_a_message_without_large_arrays_is_its_config_record_alone() -> None:
    """Each object of a message costs the SuperLink requests of its own: record dict and config record only."""
    record = apps._record({"steps": np.array([10, 0, 4]), "lr": np.full(3, 0.05, np.float32)}, {"round": 1})
    assert sorted(record) == ["config"]
    back, _ = apps._payload(record)
    np.testing.assert_array_equal(back["steps"], [10, 0, 4])


def test_packed_bytes_are_read_as_numbers_only() -> None:
    record = apps._record({"ids": np.array([1, 2])}, {})
    record["config"][apps.LAYOUT] = '[["ids", "|O", [2]]]'  # object references from bytes: refused
    with pytest.raises(ValueError, match="not a numeric one"):
        apps._payload(record)


def test_the_server_retries_missing_reply_objects_soon(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(http_grid, "pull_objects", http_grid.pull_objects)  # restored after the test
    original = http_grid.pull_objects
    apps.shorten_reply_pulls()
    apps.shorten_reply_pulls()  # once is enough: a second call leaves it as it is
    pull = http_grid.pull_objects
    assert isinstance(pull, functools.partial) and pull.func is original
    assert pull.keywords == {"initial_backoff": apps.POLL_S, "backoff_cap": apps.MAX_POLL_S}
