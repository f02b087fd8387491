"""Readers for the standard dataset file formats, and a checksummed downloader.

Every problem with a file (missing, truncated, wrong magic number, unparsable) raises `DataError` with one line
that names the file and says what to do; these readers never let a raw traceback through.

Downloads go through `fetch`, which honours ``$FEDHET_MIRROR``: when that variable is set to a base URL
(``http://host:port/some/path``), every file is requested as ``<FEDHET_MIRROR>/<file name>`` instead of its
official address, where ``<file name>`` is the last part of the official URL (e.g. ``train-images-idx3-ubyte.gz``,
``cifar-10-python.tar.gz``, ``gzip.zip``). Checksums are verified all the same.
"""

from __future__ import annotations

import gzip
import hashlib
import http.client
import json
import os
import pickle
import shutil
import tarfile
import tempfile
import urllib.request
import zipfile
from collections.abc import Iterable
from pathlib import Path
from typing import Any, NamedTuple

import numpy as np

from fedhet.errors import DataError

MIRROR_ENV = "FEDHET_MIRROR"

# IDX type byte → NumPy dtype (IDX stores multi-byte numbers big-endian).
IDX_TYPES: dict[int, str] = {0x08: "u1", 0x09: "i1", 0x0B: ">i2", 0x0C: ">i4", 0x0D: ">f4", 0x0E: ">f8"}

REDOWNLOAD = "delete it and download it again"


class RemoteFile(NamedTuple):
    """One file of a dataset's official distribution: its name on disk, its URL and its published digest(s)."""

    filename: str
    url: str
    md5: str | None = None
    sha256: str | None = None


def find(folder: Path, name: str, hint: str, gz: bool = True) -> Path:
    """`folder/name` or (when `gz`) `folder/name.gz`; a DataError naming the file, the folder and `hint` when
    neither exists."""
    for candidate in (folder / name, folder / f"{name}.gz") if gz else (folder / name,):
        if candidate.is_file():
            return candidate
    also = f" (or '{name}.gz')" if gz else ""
    raise DataError(f"missing dataset file '{name}'{also} in '{folder}': {hint}")


def present(folder: Path, name: str) -> bool:
    """Whether `folder/name` or `folder/name.gz` exists."""
    return (folder / name).is_file() or (folder / f"{name}.gz").is_file()


def read_bytes(path: Path) -> bytes:
    """The content of `path`, gunzipped when its name ends in ``.gz``."""
    try:
        if path.suffix == ".gz":
            with gzip.open(path, "rb") as f:
                return f.read()
        return path.read_bytes()
    except (OSError, EOFError, gzip.BadGzipFile) as err:
        raise DataError(f"cannot read '{path}' ({err}); {REDOWNLOAD}") from None


def read_text(path: Path) -> str:
    """A text file (optionally ``.gz``) decoded as UTF-8; undecodable bytes become U+FFFD."""
    return read_bytes(path).decode("utf-8", errors="replace")


def read_idx(path: Path) -> np.ndarray:
    """An IDX file (MNIST, Fashion-MNIST, EMNIST; optionally ``.gz``) as a NumPy array of its declared shape."""
    raw = read_bytes(path)
    if len(raw) < 4 or raw[0] != 0 or raw[1] != 0 or raw[2] not in IDX_TYPES:
        raise DataError(f"'{path}' is not an IDX file (bad magic number {raw[:4].hex() or 'none'}); {REDOWNLOAD}")
    dims = raw[3]
    header = 4 + 4 * dims
    if len(raw) < header:
        raise DataError(f"'{path}' is truncated (incomplete IDX header); {REDOWNLOAD}")
    shape = tuple(int.from_bytes(raw[4 + 4 * i : 8 + 4 * i], "big") for i in range(dims))
    dtype = np.dtype(IDX_TYPES[raw[2]])
    expected = int(np.prod(shape)) * dtype.itemsize
    if len(raw) - header != expected:
        state = "truncated" if len(raw) - header < expected else "corrupt (trailing bytes)"
        raise DataError(
            f"'{path}' is {state}: {len(raw) - header} data bytes for shape {shape}, expected {expected}; {REDOWNLOAD}"
        )
    return np.frombuffer(raw, dtype=dtype, offset=header).reshape(shape)


def read_pickle(path: Path) -> dict[Any, Any]:
    """A CIFAR python batch: a pickled dict with bytes keys (read with ``encoding="bytes"``).

    Only open pickles from a source you trust (the official archive): unpickling can run code.
    """
    try:
        with path.open("rb") as f:
            data = pickle.load(f, encoding="bytes")
    except Exception as err:  # unpickling garbage raises almost any exception type
        raise DataError(
            f"'{path}' is not a readable pickle batch ({type(err).__name__}: {err}); {REDOWNLOAD}"
        ) from None
    if not isinstance(data, dict):
        raise DataError(f"'{path}' holds a {type(data).__name__}, not a batch dictionary; {REDOWNLOAD}")
    return data


def read_json(path: Path) -> dict[str, Any]:
    """A JSON file whose top level is an object."""
    try:
        data = json.loads(read_bytes(path))
    except (UnicodeDecodeError, json.JSONDecodeError) as err:
        raise DataError(f"'{path}' is not valid JSON ({err})") from None
    if not isinstance(data, dict):
        raise DataError(f"'{path}' must hold a JSON object, not a {type(data).__name__}")
    return data


def digest(path: Path, algorithm: str) -> str:
    """The hex digest of a file (``"md5"``, ``"sha256"``, ...), read in 1 MiB blocks."""
    h = hashlib.new(algorithm)
    with path.open("rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def mirror_url(url: str) -> str:
    """`url`, or ``$FEDHET_MIRROR/<last part of url>`` when that variable is set (offline mirrors, tests)."""
    base = os.environ.get(MIRROR_ENV)
    return f"{base.rstrip('/')}/{url.rsplit('/', 1)[-1]}" if base else url


def download(url: str, dest: Path, sha256: str | None = None, timeout: float = 60, *, md5: str | None = None) -> Path:
    """Fetch `url` into `dest` through a temporary file in the same folder, verify the digest(s) given, then
    rename it into place; returns `dest`.

    A network error or a digest mismatch raises DataError and leaves nothing behind. `url` is used as given
    (see `fetch` for the ``$FEDHET_MIRROR`` redirection).
    """
    dest.parent.mkdir(parents=True, exist_ok=True)
    fd, name = tempfile.mkstemp(dir=dest.parent, prefix=f".{dest.name}.", suffix=".part")
    tmp = Path(name)
    try:
        try:
            with os.fdopen(fd, "wb") as out, urllib.request.urlopen(url, timeout=timeout) as response:
                shutil.copyfileobj(response, out, 1 << 20)
        except (OSError, ValueError, http.client.HTTPException) as err:
            raise DataError(
                f"cannot download '{url}' ({err}); check the network, or put '{dest.name}' in '{dest.parent}' yourself"
            ) from None
        for algorithm, expected in (("md5", md5), ("sha256", sha256)):
            if expected is not None and (got := digest(tmp, algorithm)) != expected.lower():
                raise DataError(
                    f"'{url}' failed its {algorithm} check (expected {expected}, got {got}): the download is corrupt "
                    "or the file changed; try again"
                )
        tmp.replace(dest)
    finally:
        tmp.unlink(missing_ok=True)
    return dest


def fetch(remote: RemoteFile, folder: Path, timeout: float = 60) -> Path:
    """`folder/remote.filename`, downloaded (from ``$FEDHET_MIRROR`` when set) and verified unless already there."""
    dest = folder / remote.filename
    if dest.is_file():
        return dest
    return download(mirror_url(remote.url), dest, remote.sha256, timeout, md5=remote.md5)


def extract_tar(archive: Path, dest: Path) -> None:
    """Unpack a (gzipped) tar archive into `dest`, refusing members that would land outside it."""
    try:
        with tarfile.open(archive) as tar:
            if hasattr(tarfile, "data_filter"):  # Python >= 3.11.4
                tar.extractall(dest, filter="data")
            else:  # pragma: no cover - older 3.11 patch releases
                root = dest.resolve()
                for member in tar.getmembers():
                    if not (root / member.name).resolve().is_relative_to(root) or member.issym() or member.islnk():
                        raise DataError(f"'{archive}' holds an unsafe member '{member.name}'; {REDOWNLOAD}")
                tar.extractall(dest)
    except (OSError, EOFError, tarfile.TarError) as err:
        raise DataError(f"cannot unpack '{archive}' ({err}); {REDOWNLOAD}") from None


def extract_zip(archive: Path, dest: Path, names: Iterable[str]) -> list[Path]:
    """Copy the members of a zip archive whose base names are in `names` into `dest` (flat); returns them."""
    wanted = set(names)
    written: list[Path] = []
    try:
        with zipfile.ZipFile(archive) as z:
            for member in z.infolist():
                base = member.filename.rsplit("/", 1)[-1]
                if base in wanted and not member.is_dir():
                    target = dest / base
                    part = dest / f".{base}.part"
                    try:
                        with z.open(member) as src, part.open("wb") as out:
                            shutil.copyfileobj(src, out, 1 << 20)
                        part.replace(target)
                    finally:
                        part.unlink(missing_ok=True)
                    written.append(target)
    except (OSError, EOFError, zipfile.BadZipFile) as err:
        raise DataError(f"cannot unpack '{archive}' ({err}); {REDOWNLOAD}") from None
    return written
