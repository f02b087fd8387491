"""Crash-safe file writes: after a kill, a power-safe rename leaves a file with its old or its new content.

`write_bytes`/`write_text` write a hidden temporary file next to the target (``.NAME.<random>.tmp``) and rename
it over the target with `os.replace` (atomic on POSIX and Windows). Whatever goes wrong while writing (a full
disk, Ctrl-C), the temporary file is removed and the target keeps its old content. `append_bytes` appends to a
log whose reader knows how much of it is valid (metrics.csv: its length is recorded in the checkpoint).

Atomic against a killed process; durability after a power cut is up to the file system (fedhet does not fsync,
which would slow every round down; a checkpoint damaged that way fails its checksum and says so).
Every write of a run folder goes through `_write_file`, `_replace` and `_append`, so that tests can inject
failures and kills at the n-th write.

Links: a rename replaces a link itself, never the file it leads to; what reads or changes a file in place
(`append_bytes`, `truncate`, `read_plain`) refuses a symbolic link or a file with other hard links (`LinkError`),
which could be a file outside the folder.
"""

from __future__ import annotations

import errno
import os
import secrets
import stat
from pathlib import Path

from fedhet.errors import FedhetError

TEMP_SUFFIX = ".tmp"
_NOFOLLOW = getattr(os, "O_NOFOLLOW", 0)
LINK_HINT = (
    "fedhet never reads or writes a folder of its own through a link (it could change a file elsewhere): replace it "
    "by a copy, or move it away"
)


class LinkError(FedhetError):
    """A file or folder of fedhet's is a symbolic or hard link, which may lead out of its folder."""


def refuse_link(path: Path) -> None:
    """Raise `LinkError` when `path` is a symbolic link (to a file or a folder) or a file with more than one name
    (a hard link: ``st_nlink`` > 1); a missing `path` is fine."""
    try:
        info = os.lstat(path)
    except (FileNotFoundError, NotADirectoryError):
        return
    if stat.S_ISLNK(info.st_mode):
        raise LinkError(f"'{path}' is a symbolic link (to '{os.readlink(path)}'); {LINK_HINT}")
    if stat.S_ISREG(info.st_mode) and info.st_nlink > 1:
        raise _hard_link(path, info.st_nlink)


def _hard_link(path: Path, names: int) -> LinkError:
    return LinkError(f"'{path}' is a hard link (its file has {names} names); {LINK_HINT}")


def open_plain(path: Path, flags: int, mode: int = 0o666) -> int:
    """`os.open` of `path` that refuses (`LinkError`) a symbolic link or a file with other hard links."""
    try:
        fd = os.open(path, flags | _NOFOLLOW | getattr(os, "O_BINARY", 0), mode)
    except OSError as err:
        if err.errno == errno.ELOOP:
            refuse_link(path)
        raise
    info = os.fstat(fd)
    if stat.S_ISREG(info.st_mode) and info.st_nlink > 1:
        os.close(fd)
        raise _hard_link(path, info.st_nlink)
    return fd


def read_plain(path: Path) -> bytes:
    """The bytes of `path`, refusing a link (`open_plain`)."""
    with os.fdopen(open_plain(path, os.O_RDONLY), "rb") as f:
        return f.read()


def truncate(path: Path, size: int) -> None:
    """Cut `path` to `size` bytes in place, refusing a link (`open_plain`)."""
    with os.fdopen(open_plain(path, os.O_RDWR), "r+b") as f:
        f.truncate(size)


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
    """Append `data` to `path` (not atomic: the reader must know how much of the file is valid); a link is refused
    (`open_plain`)."""
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
    with os.fdopen(open_plain(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT), "ab") as f:
        f.write(data)
