"""Published checksums of dataset files, checked the first time fedhet uses a file and remembered afterwards.

`verify` hashes a file whose expected digest(s) it is given (from a dataset's table of known files) and compares.
The digests it computes are remembered in ``.fedhet-checksums.json`` in the file's folder, keyed by file name and
valid while the file keeps the same size and modification time (nanoseconds); a file that changed is hashed
again. The record is written atomically (temporary file + rename) and only ever caches digests: a missing,
unreadable or garbled record just means hashing again, and a folder fedhet cannot write to means hashing at
every load. Files without a known digest are not checked here (see docs/reliability.md, "Dataset files").

Set ``FEDHET_SKIP_CHECKSUMS=1`` to use files already on disk without checking them (test fixtures written under
the official names, a copy changed on purpose); downloads are verified all the same.
"""

from __future__ import annotations

import hashlib
import json
import os
import tempfile
from collections.abc import Iterable
from pathlib import Path
from typing import Any, NamedTuple, Protocol

from fedhet.errors import DataError

__all__ = ["RECORD", "SKIP_ENV", "KnownFile", "digests", "remember", "verify", "verify_known"]

RECORD = ".fedhet-checksums.json"
SKIP_ENV = "FEDHET_SKIP_CHECKSUMS"
ALGORITHMS = ("md5", "sha256")


class KnownFile(NamedTuple):
    """A file of a dataset (not necessarily downloadable on its own, e.g. a member of an archive) and its
    published digest(s)."""

    filename: str
    md5: str | None = None
    sha256: str | None = None


class HasDigests(Protocol):
    @property
    def filename(self) -> str: ...
    @property
    def md5(self) -> str | None: ...
    @property
    def sha256(self) -> str | None: ...


def digests(path: Path, algorithms: Iterable[str] = ALGORITHMS) -> dict[str, str]:
    """The hex digests of a file for each of `algorithms`, computed in one pass over 1 MiB blocks."""
    hashes = {a: hashlib.new(a) for a in algorithms}
    with path.open("rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            for h in hashes.values():
                h.update(block)
    return {a: h.hexdigest() for a, h in hashes.items()}


def _expected(md5: str | None, sha256: str | None) -> dict[str, str]:
    return {a: v.lower() for a, v in (("md5", md5), ("sha256", sha256)) if v}


def _load_record(folder: Path) -> dict[str, Any]:
    """The remembered entries of `folder` (file name → {size, mtime_ns, md5?, sha256?}); {} when unusable."""
    try:
        data = json.loads((folder / RECORD).read_bytes())
    except (OSError, ValueError, RecursionError):
        return {}
    files = data.get("files") if isinstance(data, dict) and data.get("version") == 1 else None
    return files if isinstance(files, dict) else {}


def _remembered(path: Path, stat: os.stat_result) -> dict[str, str]:
    """The digests remembered for `path` when its size and modification time still match."""
    entry = _load_record(path.parent).get(path.name)
    if not isinstance(entry, dict) or entry.get("size") != stat.st_size or entry.get("mtime_ns") != stat.st_mtime_ns:
        return {}
    return {a: entry[a] for a in ALGORITHMS if isinstance(entry.get(a), str)}


def remember(path: Path, found: dict[str, str], stat: os.stat_result | None = None) -> None:
    """Record the digests `found` for `path` (as it is now, or as `stat` saw it) in its folder's record.

    Atomic (temporary file + rename); silently does nothing when the folder cannot be written."""
    try:
        stat = stat or path.stat()
        files = _load_record(path.parent)
        files[path.name] = {"size": stat.st_size, "mtime_ns": stat.st_mtime_ns, **found}
        fd, name = tempfile.mkstemp(dir=path.parent, prefix=f"{RECORD}.", suffix=".part")
    except OSError:
        return
    tmp = Path(name)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as out:
            json.dump({"version": 1, "files": files}, out, indent=1, sort_keys=True)
        tmp.replace(path.parent / RECORD)
    except OSError:
        pass
    finally:
        tmp.unlink(missing_ok=True)


def skipped() -> bool:
    """Whether ``FEDHET_SKIP_CHECKSUMS`` asks to use files on disk unchecked."""
    return os.environ.get(SKIP_ENV, "").strip().lower() in ("1", "true", "yes")


def verify(path: Path, md5: str | None = None, sha256: str | None = None) -> None:
    """Check `path` against the digest(s) given (nothing to do when none is), hashing it only when its remembered
    digests are missing or stale; a DataError saying which file, expected vs found, and how to fix it."""
    expected = _expected(md5, sha256)
    if not expected or skipped():
        return
    try:
        before = path.stat()
        found = _remembered(path, before)
        if missing := [a for a in expected if a not in found]:
            found |= digests(path, missing)
            if (after := path.stat()).st_size == before.st_size and after.st_mtime_ns == before.st_mtime_ns:
                remember(path, found, after)
    except OSError as err:
        raise DataError(f"cannot read '{path}' to check it ({err.strerror or err})") from None
    for algorithm, want in expected.items():
        if found[algorithm] != want:
            raise DataError(
                f"'{path}' failed its {algorithm} check (expected {want[:12]}..., found {found[algorithm][:12]}...): "
                f"the file is corrupt, incomplete or not the official one; delete it and rerun with --download "
                f"(or download it again yourself), or set {SKIP_ENV}=1 to use a copy you changed on purpose"
            )


def verify_known(path: Path, table: Iterable[HasDigests]) -> None:
    """`verify` `path` against the entry of `table` with the same file name, if there is one."""
    for entry in table:
        if entry.filename == path.name:
            verify(path, entry.md5, entry.sha256)
