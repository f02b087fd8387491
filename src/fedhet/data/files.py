"""Readers for the standard dataset file formats, and a checksummed downloader.

Every problem with a file (missing, a folder instead of a file, empty, truncated, wrong magic number, not UTF-8,
unparsable, nested too deeply) raises `DataError` with one line that names the file and says what to do; these
readers never let a raw traceback through, and nothing they read can run code (pickles go through
`fedhet.data.safe_pickle`).

Downloads go through `fetch`, which honours ``$FEDHET_MIRROR``: when that variable is set to a base URL
(``http://host:port/some/path``), every file is requested as ``<FEDHET_MIRROR>/<file name>`` instead of its
official address, where ``<file name>`` is the last part of the official URL (e.g. ``train-images-idx3-ubyte.gz``,
``cifar-10-python.tar.gz``, ``gzip.zip``). Checksums are verified all the same: downloads always, and a file
already on disk the first time it is used (`fedhet.data.checksums`).
"""

from __future__ import annotations

import gzip
import http.client
import json
import os
import shutil
import tarfile
import tempfile
import urllib.request
import zipfile
import zlib
from collections.abc import Iterable
from pathlib import Path
from typing import Any, NamedTuple

import numpy as np

from fedhet.data.checksums import RECORD, digests, remember, verify
from fedhet.data.safe_pickle import RefusedGlobal, load_data_pickle
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


def one_line(err: BaseException, limit: int = 200) -> str:
    """An exception's message on one line, at most `limit` characters (for embedding in a DataError)."""
    text = " ".join(str(err).split()) or type(err).__name__
    return text if len(text) <= limit else text[: limit - 3] + "..."


def not_a_file(path: Path) -> DataError:
    """The error for something other than a regular file (a folder, a device, a pipe) where a file is expected."""
    kind = "a folder" if path.is_dir() else "not a regular file"
    return DataError(f"'{path}' is {kind}, where a dataset file is expected; move it away and put the file there")


def find(folder: Path, name: str, hint: str, gz: bool = True) -> Path:
    """`folder/name` or (when `gz`) `folder/name.gz`; a DataError naming the file, the folder and `hint` when
    neither exists, or saying that what is there is not a file."""
    candidates = (folder / name, folder / f"{name}.gz") if gz else (folder / name,)
    for candidate in candidates:
        if candidate.is_file():
            return candidate
    for candidate in candidates:
        if candidate.exists():
            raise not_a_file(candidate)
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
    except IsADirectoryError:
        raise not_a_file(path) from None
    except (OSError, EOFError, gzip.BadGzipFile, zlib.error) as err:
        raise DataError(f"cannot read '{path}' ({one_line(err)}); {REDOWNLOAD}") from None


def read_text(path: Path) -> str:
    """A UTF-8 text file (optionally ``.gz``; a leading byte-order mark is dropped); a DataError saying where the
    first byte that is not UTF-8 is."""
    raw = read_bytes(path)
    try:
        return raw.decode("utf-8-sig")
    except UnicodeDecodeError as err:
        raise DataError(
            f"'{path}' is not UTF-8 text (byte 0x{raw[err.start]:02x} at offset {err.start}); save it as UTF-8, "
            "e.g. with 'iconv -f latin1 -t utf-8 OLD > NEW', or download it again"
        ) from None


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

    Only plain data and NumPy arrays are rebuilt (`fedhet.data.safe_pickle`): a pickle that refers to any other
    function or class (``os.system``, ``builtins.eval``, ...) is refused before anything in it is called.
    """
    raw = read_bytes(path)
    try:
        data = load_data_pickle(raw)
    except RefusedGlobal as err:
        raise DataError(
            f"'{path}' is not a plain data pickle: it refers to '{err.qualified}', which fedhet refuses to load "
            f"(only dicts, lists, strings, numbers and NumPy arrays); {REDOWNLOAD} from the official archive"
        ) from None
    except Exception as err:  # unpickling garbage raises almost any exception type
        raise DataError(
            f"'{path}' is not a readable pickle batch ({type(err).__name__}: {one_line(err)}); {REDOWNLOAD}"
        ) from None
    if not isinstance(data, dict):
        raise DataError(f"'{path}' holds a {type(data).__name__}, not a batch dictionary; {REDOWNLOAD}")
    return data


def read_json(path: Path) -> dict[str, Any]:
    """A JSON file whose top level is an object."""
    raw = read_bytes(path)
    try:
        data = json.loads(raw)
    except RecursionError:
        raise DataError(f"'{path}' is not usable JSON: its lists or objects are nested too deeply") from None
    except (UnicodeDecodeError, ValueError) as err:  # ValueError: bad JSON, or an integer of over 4300 digits
        raise DataError(f"'{path}' is not valid JSON ({one_line(err)})") from None
    if not isinstance(data, dict):
        raise DataError(f"'{path}' must hold a JSON object, not a {type(data).__name__}")
    return data


def digest(path: Path, algorithm: str) -> str:
    """The hex digest of a file (``"md5"``, ``"sha256"``, ...), read in 1 MiB blocks."""
    return digests(path, [algorithm])[algorithm]


def mirror_url(url: str) -> str:
    """`url`, or ``$FEDHET_MIRROR/<last part of url>`` when that variable is set (offline mirrors, tests)."""
    base = os.environ.get(MIRROR_ENV)
    return f"{base.rstrip('/')}/{url.rsplit('/', 1)[-1]}" if base else url


def download(url: str, dest: Path, sha256: str | None = None, timeout: float = 60, *, md5: str | None = None) -> Path:
    """Fetch `url` into `dest` through a temporary file in the same folder, verify the digest(s) given, then
    rename it into place; returns `dest`.

    A network error or a digest mismatch raises DataError and leaves nothing behind. `url` is used as given
    (see `fetch` for the ``$FEDHET_MIRROR`` redirection). The digests checked are remembered next to `dest`
    (`fedhet.data.checksums`), so the file is not hashed again when it is first used.
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
                f"cannot download '{url}' ({one_line(err)}); check the network, or put '{dest.name}' in "
                f"'{dest.parent}' yourself"
            ) from None
        expected = {a: v.lower() for a, v in (("md5", md5), ("sha256", sha256)) if v is not None}
        found = digests(tmp, expected) if expected else {}
        for algorithm, want in expected.items():
            if found[algorithm] != want:
                raise DataError(
                    f"'{url}' failed its {algorithm} check (expected {want}, got {found[algorithm]}): the download is "
                    "corrupt or the file changed; try again"
                )
        tmp.replace(dest)
    finally:
        tmp.unlink(missing_ok=True)
    if found:
        remember(dest, found)
    return dest


def fetch(remote: RemoteFile, folder: Path, timeout: float = 60) -> Path:
    """`folder/remote.filename`, verified: downloaded (from ``$FEDHET_MIRROR`` when set) when missing, checked
    against its published digests (`fedhet.data.checksums.verify`) when already there."""
    dest = folder / remote.filename
    if dest.is_file():
        verify(dest, remote.md5, remote.sha256)
        return dest
    if dest.exists():
        raise not_a_file(dest)
    return download(mirror_url(remote.url), dest, remote.sha256, timeout, md5=remote.md5)


def _data_member(member: tarfile.TarInfo, dest: str) -> tarfile.TarInfo | None:
    """tarfile's "data" filter (absolute names made relative; no ``..``, links out of `dest` or devices), and never
    a checksum record (`fedhet.data.checksums.RECORD`): an archive must not vouch for the files it brings."""
    if member.name.rsplit("/", 1)[-1] == RECORD:
        return None
    return tarfile.data_filter(member, dest)


def extract_tar(archive: Path, dest: Path) -> None:
    """Unpack a (gzipped) tar archive into `dest`, refusing members that would land outside it."""
    try:
        with tarfile.open(archive) as tar:
            if hasattr(tarfile, "data_filter"):  # Python >= 3.11.4
                tar.extractall(dest, filter=_data_member)
            else:  # pragma: no cover - older 3.11 patch releases
                root = dest.resolve()
                members = tar.getmembers()
                for member in members:
                    if not (root / member.name).resolve().is_relative_to(root) or member.issym() or member.islnk():
                        raise DataError(f"'{archive}' holds an unsafe member '{member.name}'; {REDOWNLOAD}")
                tar.extractall(dest, [m for m in members if m.name.rsplit("/", 1)[-1] != RECORD])
    except (OSError, EOFError, tarfile.TarError, zlib.error) as err:
        raise DataError(f"cannot unpack '{archive}' ({one_line(err)}); {REDOWNLOAD}") from None


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
    except (OSError, EOFError, zipfile.BadZipFile, zlib.error, NotImplementedError, RuntimeError, ValueError) as err:
        # NotImplementedError: unsupported compression; RuntimeError: encrypted member
        raise DataError(f"cannot unpack '{archive}' ({one_line(err)}); {REDOWNLOAD}") from None
    return written
