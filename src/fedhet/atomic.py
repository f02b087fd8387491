"""Crash-safe file writes: after a kill, a power-safe rename leaves a file with its old or its new content.

`write_bytes`/`write_text` write a hidden temporary file next to the target (``.NAME.<random>.tmp``) and rename
it over the target with `os.replace` (atomic on POSIX and Windows). Whatever goes wrong while writing (a full
disk, Ctrl-C), the temporary file is removed and the target keeps its old content. `append_bytes` appends to a
log whose reader knows how much of it is valid (metrics.csv: its length is recorded in the checkpoint).

Atomic against a killed process; durability after a power cut is up to the file system (fedhet does not fsync,
which would slow every round down; a checkpoint damaged that way fails its checksum and says so).
Every write of a run folder goes through `_write_file`, `_replace` and `_append`, so that tests can inject
failures and kills at the n-th write.
"""

from __future__ import annotations

import os
import secrets
from pathlib import Path

TEMP_SUFFIX = ".tmp"


def temp_path(path: Path) -> Path:
    """A fresh temporary name for `path`, hidden, in the same folder (so that the rename stays atomic)."""
    return path.with_name(f".{path.name}.{secrets.token_hex(4)}{TEMP_SUFFIX}")


def is_temp_of(name: str, target: str) -> bool:
    """Whether `name` is a temporary file left by a write of `target` (a killed process leaves one)."""
    return name.startswith(f".{target}.") and name.endswith(TEMP_SUFFIX)


def write_bytes(path: Path, data: bytes | bytearray | memoryview) -> None:
    """Replace `path` by `data` atomically; on any error the temporary file is removed and `path` is unchanged."""
    tmp = temp_path(path)
    try:
        _write_file(tmp, data)
        _replace(tmp, path)
    except BaseException as err:
        tmp.unlink(missing_ok=True)
        if isinstance(err, OSError) and err.filename in (None, str(tmp)):
            err.filename = str(path)  # name the file the user knows (a failed write() names none), not the temporary
        raise


def write_text(path: Path, text: str) -> None:
    """`write_bytes` of `text` in UTF-8 (no newline translation)."""
    write_bytes(path, text.encode("utf-8"))


def append_bytes(path: Path, data: bytes) -> None:
    """Append `data` to `path` (not atomic: the reader must know how much of the file is valid)."""
    try:
        _append(path, data)
    except OSError as err:
        if err.filename is None:
            err.filename = str(path)  # a failed write() names no file
        raise


def _write_file(path: Path, data: bytes | bytearray | memoryview) -> None:
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_BINARY", 0), 0o666)
    with os.fdopen(fd, "wb") as f:
        f.write(data)


def _replace(source: Path, target: Path) -> None:
    os.replace(source, target)


def _append(path: Path, data: bytes) -> None:
    with path.open("ab") as f:
        f.write(data)
