"""The checkpoint format: plain values only (weights-only load), NumPy kept, checksummed; crafted files do not run."""

from __future__ import annotations

import builtins
import io
import os
import pickle
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

from fedhet.catalog import AVAILABILITY, STRATEGIES
from fedhet.experiments.checkpoint import (
    CheckpointError,
    decode,
    digest,
    dumps,
    encode,
    load_state,
    loads,
    save_state,
)
from fedhet.experiments.config import parse_config
from fedhet.experiments.runner import run
from fedhet.metrics.base import METRIC_PLUGINS

STATE: dict[str, Any] = {
    "tensor": torch.arange(6, dtype=torch.float64).reshape(2, 3),
    "ints": {3: [(0, torch.ones(2)), (2, torch.zeros(2))]},  # the engine's client store: int keys, tuples
    "bool_array": np.array([True, False, True]),
    "float_array": np.linspace(0, 1, 5),
    "int_matrix": np.arange(6, dtype=np.int64).reshape(3, 2),
    "empty": np.zeros((0, 4)),
    "scalar": np.float64(0.25),
    "log": [np.ones(2, dtype=bool), np.zeros(3)],
    "none": None,
    "flag": True,
    "text": "ünïcode",
    "nan": float("nan"),
}


def _same(a: Any, b: Any) -> None:
    assert type(a) is type(b), (a, b)
    if isinstance(a, dict):
        assert list(a) == list(b)
        for key in a:
            _same(a[key], b[key])
    elif isinstance(a, list | tuple):
        assert len(a) == len(b)
        for x, y in zip(a, b, strict=True):
            _same(x, y)
    elif isinstance(a, np.ndarray):
        assert a.dtype == b.dtype and a.shape == b.shape and np.array_equal(a, b)
    elif isinstance(a, torch.Tensor):
        assert a.dtype == b.dtype and torch.equal(a, b)
    elif isinstance(a, float) and a != a:
        assert b != b
    else:
        assert a == b


def test_round_trip_keeps_types_dtypes_and_order() -> None:
    back = loads(dumps({"state": STATE}), "test")
    _same(back["state"], STATE)
    _same(decode(encode(STATE)), STATE)


def test_the_file_loads_weights_only_without_numpy_globals() -> None:
    body = torch.load(io.BytesIO(dumps({"state": STATE})), weights_only=True)
    assert body["format"] == "fedhet-checkpoint" and isinstance(body["state"]["bool_array"], dict)


def test_digest_sees_every_change() -> None:
    base = digest(encode(STATE))
    changed = dict(STATE, tensor=STATE["tensor"].clone())
    changed["tensor"][0, 0] = 1e-300
    assert digest(encode(changed)) != base
    assert digest(encode(dict(STATE, flag=1))) != base  # True and 1 differ
    assert digest(encode(dict(STATE, scalar=np.float32(0.25)))) != base
    assert digest([1, 2]) != digest((1, 2)) and digest(-0.0) != digest(0.0)


def test_unsupported_values_are_refused_when_saving() -> None:
    with pytest.raises(TypeError, match=r"state.bad: cannot checkpoint a value of type set"):
        encode({"bad": {1, 2}})
    with pytest.raises(TypeError, match="dtype object"):
        encode(np.array([object()]))


class Evil:
    """Unpickling this would create a file (a stand-in for any code)."""

    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self) -> tuple[Any, ...]:
        return (builtins.open, (str(self.marker), "w"))


def _crafted(tmp_path: Path) -> dict[str, bytes]:
    marker = tmp_path / "pwned"
    evil_torch = io.BytesIO()
    torch.save({"format": "fedhet-checkpoint", "version": 2, "params": Evil(marker)}, evil_torch)
    good = dumps({"round": 1, "params": torch.ones(3)})
    flipped = bytearray(good)
    flipped[good.index(b"\x00\x00\x80\x3f")] ^= 0x01  # a byte of the tensor data (1.0 as float32)
    return {
        "a torch file with a code-running object": evil_torch.getvalue(),
        "a plain pickle with a code-running object": pickle.dumps({"params": Evil(marker)}),
        "a flipped byte in the tensors": bytes(flipped),
        "a truncated file": good[: len(good) // 2],
        "random bytes": os.urandom(4096),
        "zeros": bytes(1000),
        "one byte": b"x",
        "a torch file that is not a fedhet checkpoint": _torch_bytes({"params": torch.ones(3)}),
        "a checkpoint of another format version": _torch_bytes({"format": "fedhet-checkpoint", "version": 1}),
        "a checkpoint with its checksum removed": _torch_bytes({"format": "fedhet-checkpoint", "version": 2}),
        "a list instead of a mapping": _torch_bytes([1, 2, 3]),
    }


def _torch_bytes(value: Any) -> bytes:
    buffer = io.BytesIO()
    torch.save(value, buffer)
    return buffer.getvalue()


def test_crafted_and_corrupt_files_are_refused_in_one_line_and_run_nothing(tmp_path: Path) -> None:
    cases = _crafted(tmp_path)
    for name, data in cases.items():
        path = tmp_path / "checkpoint.pt"
        path.write_bytes(data)
        for source in (path, data):
            with pytest.raises(CheckpointError) as info:
                loads(source, "checkpoint 'x'")
            message = str(info.value)
            assert message.startswith("checkpoint 'x' ") and "\n" not in message, (name, message)
    assert not (tmp_path / "pwned").exists()
    with pytest.raises(CheckpointError, match=r"refuses to load.*could run code"):
        loads(cases["a torch file with a code-running object"], "checkpoint 'x'")
    with pytest.raises(CheckpointError, match="checksum"):
        loads(cases["a flipped byte in the tensors"], "checkpoint 'x'")


def test_empty_file_and_folder(tmp_path: Path) -> None:
    (tmp_path / "empty.pt").write_bytes(b"")
    with pytest.raises(CheckpointError, match="empty file"):
        loads(tmp_path / "empty.pt", "c")
    (tmp_path / "dir.pt").mkdir()
    with pytest.raises(CheckpointError, match="is a folder"):
        loads(tmp_path / "dir.pt", "c")


def test_node_state_round_trip_and_crafted_node_state(tmp_path: Path) -> None:
    state = {"client_state": {"scaffold/c_i": {0: [(1, torch.ones(3))]}}}
    _same(load_state(save_state(state), "node state"), state)
    evil = _torch_bytes({"client_state": Evil(tmp_path / "pwned")})
    with pytest.raises(CheckpointError, match="node state file"):
        load_state(evil, "node state file 'n.pt'")
    with pytest.raises(CheckpointError, match="holds no state mapping"):
        load_state(dumps({"state": [1]}), "node state")
    assert not (tmp_path / "pwned").exists()


TINY = {
    "dataset": "digits",
    "partition": {"name": "dirichlet", "alpha": 0.5, "min_size": 20},
    "model": {"name": "mlp", "hidden": [8]},
    "num_clients": 6,
    "clients_per_round": 3,
    "rounds": 2,
    "local": {"steps": 2, "lr": 0.1, "batch_size": 8},
    "seed": 1,
}
ARCHITECTURES = {"model": {"name": "architectures", "members": [{"name": "mlp", "hidden": [8]}]}}
NEEDS: dict[str, dict[str, Any]] = {  # what a strategy needs beside TINY (several architectures, held-out clients)
    "fedproto": ARCHITECTURES,
    "fedgh": ARCHITECTURES,
    "feddf": {**ARCHITECTURES, "unseen_clients": 2},
    "depthfl": {"model": {"name": "mlp_exits", "hidden": [8, 8, 8, 8]}},
    **{
        name: {
            "dataset": {"name": "markov_text", "vocab": 6, "seq_len": 4, "num_users": 6, "samples_per_user": 20},
            "partition": {"name": "natural"},
            "model": {"name": "transformer", "d_model": 8, "heads": 2, "layers": 1, "lora": {"rank": 2}},
        }
        for name in ("flexlora", "hetlora")
    },
}
COMPONENTS = (
    [{"algorithm": c.name, **NEEDS.get(c.name, {})} for c in STRATEGIES]
    + [{"availability": c.name} for c in AVAILABILITY]
    + [{"metrics": [c.name]} for c in METRIC_PLUGINS]
)


@pytest.mark.parametrize("change", COMPONENTS, ids=lambda c: str(next(iter(c.values()))))
def test_every_component_state_checkpoints_weights_only(tmp_path: Path, change: dict[str, Any]) -> None:
    """The checkpoint of every strategy, availability process and metric plugin loads with weights_only=True
    (CA-Fed's NumPy state used to need a full pickle)."""
    run(parse_config({**TINY, **change}), tmp_path / "r")
    body = torch.load(tmp_path / "r" / "checkpoint.pt", weights_only=True)
    assert body["round"] == 2
    loads(tmp_path / "r" / "checkpoint.pt", "c")  # and its checksum holds


def test_a_read_that_fails_on_the_files_content_is_corrupt_not_an_access_error(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """torch reads some truncated files into an OSError that names no file (EINVAL from a seek): that is the file's
    content (before, the message asked to run --resume again); an OSError naming the file is an access error."""
    path = tmp_path / "checkpoint.pt"
    path.write_bytes(dumps({"round": 1}))

    def cut(*args: Any, **kwargs: Any) -> None:
        raise OSError(22, "Invalid argument")

    monkeypatch.setattr(torch, "load", cut)
    with pytest.raises(CheckpointError, match=r"^checkpoint '.*' is corrupt or truncated \(Invalid argument\)$"):
        loads(path, f"checkpoint '{path}'")

    def denied(*args: Any, **kwargs: Any) -> None:
        raise PermissionError(13, "Permission denied", str(path))

    monkeypatch.setattr(torch, "load", denied)
    with pytest.raises(PermissionError):
        loads(path, f"checkpoint '{path}'")
