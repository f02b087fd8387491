"""The checkpoint file: plain values only, loaded with ``torch.load(weights_only=True)``, and checksummed.

A checkpoint holds tensors, numbers, strings, None, and lists/tuples/dicts of them; nothing in it can run code when
it is read (torch's weights-only unpickler refuses every other type). NumPy arrays and scalars in a component's
state are stored as tagged tensors and given back as NumPy (same dtype and shape). The payload carries a format
tag, its version and a SHA-256 of its canonical content, so a truncated, edited or bit-flipped file is refused
instead of silently changing a run.
"""

from __future__ import annotations

import hashlib
import io
import pickle
import re
import warnings
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import Tensor

from fedhet.errors import FedhetError

FORMAT = "fedhet-checkpoint"
VERSION = 2  # 1: the pickled checkpoints of fedhet ≤ 0.2 (not loadable safely)
_ARRAY, _SCALAR = "__fedhet_ndarray__", "__fedhet_npscalar__"


class CheckpointError(FedhetError):
    """A checkpoint (or a node's state file) is corrupt, from another run, or not a fedhet file."""


def encode(value: Any, where: str = "state") -> Any:
    """`value` with NumPy arrays/scalars replaced by tagged tensors; any type a weights-only load would refuse
    raises TypeError naming where it is (a component whose state cannot be checkpointed)."""
    if isinstance(value, np.ndarray):
        return {_ARRAY: _array_tensor(value, where)}
    if isinstance(value, np.generic):
        return {_SCALAR: _array_tensor(np.asarray(value), where)}
    if value is None or isinstance(value, bool | int | float | str | Tensor):
        return value.detach() if isinstance(value, Tensor) else value
    if isinstance(value, list | tuple):
        items = [encode(v, f"{where}[{i}]") for i, v in enumerate(value)]
        return items if isinstance(value, list) else tuple(items)
    if isinstance(value, dict):
        out = {}
        for key, item in value.items():
            if not isinstance(key, str | int):
                raise TypeError(f"{where}: cannot checkpoint a mapping key of type {type(key).__name__}")
            out[key] = encode(item, f"{where}.{key}")
        return out
    raise TypeError(f"{where}: cannot checkpoint a value of type {type(value).__name__}")


def decode(value: Any) -> Any:
    """The inverse of `encode`: tagged tensors become NumPy arrays/scalars again."""
    if isinstance(value, dict):
        if len(value) == 1 and _ARRAY in value and isinstance(value[_ARRAY], Tensor):
            return value[_ARRAY].numpy()
        if len(value) == 1 and _SCALAR in value and isinstance(value[_SCALAR], Tensor):
            return value[_SCALAR].numpy()[()]
        return {k: decode(v) for k, v in value.items()}
    if isinstance(value, list):
        return [decode(v) for v in value]
    if isinstance(value, tuple):
        return tuple(decode(v) for v in value)
    return value


def _array_tensor(array: np.ndarray, where: str) -> Tensor:
    try:
        return torch.from_numpy(np.array(array, order="C", copy=True))
    except TypeError:
        raise TypeError(f"{where}: cannot checkpoint a NumPy array of dtype {array.dtype}") from None


def digest(value: Any) -> str:
    """SHA-256 of `value`'s canonical form (types, structure, tensor dtypes/shapes/bytes, exact floats)."""
    h = hashlib.sha256()
    _feed(h, value)
    return h.hexdigest()


def _feed(h: Any, value: Any) -> None:
    if value is None:
        h.update(b"N")
    elif isinstance(value, bool):
        h.update(b"B1" if value else b"B0")
    elif isinstance(value, int):
        h.update(b"I%d;" % value)
    elif isinstance(value, float):
        h.update(b"F" + value.hex().encode() + b";")
    elif isinstance(value, str):
        data = value.encode("utf-8", "surrogatepass")
        h.update(b"S%d;" % len(data) + data)
    elif isinstance(value, Tensor):
        t = value.detach().cpu().contiguous().reshape(-1)
        h.update(f"T{t.dtype};{tuple(value.shape)};".encode())
        if t.numel():
            h.update(t.view(torch.uint8).numpy().data)
    elif isinstance(value, list | tuple):
        h.update(b"%s%d;" % (b"L" if isinstance(value, list) else b"U", len(value)))
        for item in value:
            _feed(h, item)
    elif isinstance(value, dict):
        h.update(b"D%d;" % len(value))
        for key, item in value.items():
            _feed(h, key)
            _feed(h, item)
    else:
        raise TypeError(f"cannot checkpoint a value of type {type(value).__name__}")


def dumps(payload: dict[str, Any]) -> bytes:
    """The bytes of a checkpoint holding `payload` (a mapping of plain values, tensors and NumPy arrays)."""
    return bytes(dump_view(payload))


def dump_view(payload: dict[str, Any]) -> memoryview:
    """`dumps` as a view of the serialised buffer, without the copy into `bytes` (a checkpoint of a large model's
    client state can take gigabytes)."""
    body = {"format": FORMAT, "version": VERSION, **encode(payload)}
    body["sha256"] = digest(body)
    buffer = io.BytesIO()
    torch.save(body, buffer)
    return buffer.getbuffer()


def loads(source: Path | bytes, what: str) -> dict[str, Any]:
    """Read a checkpoint written by `dumps`, safely (weights only), checking its format, version and checksum.

    `what` names it in errors (e.g. ``checkpoint 'runs/a/checkpoint.pt'``); every problem raises `CheckpointError`
    with a one-line reason.
    """
    body = _load(source, what)
    if not isinstance(body, dict) or body.get("format") != FORMAT:
        raise CheckpointError(f"{what} is not a fedhet checkpoint")
    if body.get("version") != VERSION:
        raise CheckpointError(
            f"{what} has format version {body.get('version')!r}; this fedhet reads version {VERSION} only"
        )
    stored = body.pop("sha256", None)
    try:
        actual = digest(body)
        if stored != actual:
            raise CheckpointError(f"{what} is corrupt (its checksum does not match its content)")
        del body["format"], body["version"]
        return dict(decode(body))
    except TypeError:
        raise CheckpointError(f"{what} is corrupt (its checksum does not match its content)") from None
    except RecursionError:  # a crafted file: fedhet's own state nests a few levels deep
        raise CheckpointError(f"{what} is corrupt (its content is nested too deeply)") from None


def _load(source: Path | bytes, what: str) -> Any:
    try:
        if isinstance(source, Path):
            if source.is_dir():
                raise CheckpointError(f"{what} is a folder, not a file")
            if source.stat().st_size == 0:
                raise CheckpointError(f"{what} is corrupt (empty file)")
        with warnings.catch_warnings():  # torch warns about odd pickle protocols: the error below says it all
            warnings.simplefilter("ignore")
            return torch.load(
                source if isinstance(source, Path) else io.BytesIO(source), map_location="cpu", weights_only=True
            )
    except CheckpointError:
        raise
    except OSError as err:
        if err.filename is not None:  # the file could not be read (permissions, the disk): not its content
            raise
        raise CheckpointError(f"{what} is corrupt or truncated ({err.strerror or err})") from None
    except Exception as err:  # any failure to parse the file means it is not a usable checkpoint
        text = str(err)
        found = re.search(r"GLOBAL ([\w.]+)", text) if isinstance(err, pickle.UnpicklingError) else None
        if found:
            raise CheckpointError(
                f"{what} holds a Python object ({found.group(1)}) that fedhet refuses to load, since loading it "
                "could run code (a file from an older fedhet, or a crafted one)"
            ) from None
        if isinstance(err, pickle.UnpicklingError):
            reason = "not a torch checkpoint"
        else:  # torch's first sentence, e.g. "PytorchStreamReader failed reading zip archive: failed finding ..."
            reason = text.strip().split(". ")[0].splitlines()[0][:100] if text.strip() else type(err).__name__
        raise CheckpointError(f"{what} is corrupt or truncated ({reason})") from None


def save_state(state: dict[str, Any]) -> bytes:
    """A component's state (e.g. a Flower node's client state) as checkpoint bytes (see `dumps`)."""
    return dumps({"state": state})


def load_state(source: Path | bytes, what: str) -> dict[str, Any]:
    """The state saved by `save_state`, read safely: a crafted or corrupt file raises `CheckpointError`."""
    state = loads(source, what).get("state")
    if not isinstance(state, dict):
        raise CheckpointError(f"{what} holds no state mapping")
    return state
