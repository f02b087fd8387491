"""Readers for the standard dataset file formats, and a checksummed downloader.

Every problem with a file (missing, truncated, wrong magic number, unparsable) raises `DataError` with one line
that names the file and says what to do.
"""

from __future__ import annotations

import gzip
import hashlib
import json
import os
import pickle
import shutil
import tempfile
import urllib.request
from pathlib import Path
from typing import Any

import numpy as np

from fedhet.errors import DataError

IDX_TYPES: dict[int, str] = {0x08: "u1", 0x09: "i1", 0x0B: ">i2", 0x0C: ">i4", 0x0D: ">f4", 0x0E: ">f8"}


def find(folder: Path, name: str, hint: str) -> Path:
    """`folder/name` or `folder/name.gz`; DataError naming the file and how to get it when neither exists."""
    for candidate in (folder / name, folder / f"{name}.gz"):
        if candidate.is_file():
            return candidate
    raise DataError(f"missing dataset file '{name}' in '{folder}': {hint}")


def _open_bytes(path: Path) -> bytes:
    try:
        if path.suffix == ".gz":
            with gzip.open(path, "rb") as f:
                return f.read()
        return path.read_bytes()
    except (OSError, EOFError) as err:
        raise DataError(f"cannot read '{path}': {err}; delete it and download it again") from None


def read_idx(path: Path) -> np.ndarray:
    """An IDX file (MNIST, Fashion-MNIST, EMNIST) as a NumPy array."""
    raw = _open_bytes(path)
    if len(raw) < 4 or raw[0] != 0 or raw[1] != 0 or raw[2] not in IDX_TYPES:
        raise DataError(f"'{path}' is not an IDX file (bad magic number); delete it and download it again")
    dims = raw[3]
    header = 4 + 4 * dims
    if len(raw) < header:
        raise DataError(f"'{path}' is truncated (incomplete IDX header); delete it and download it again")
    shape = tuple(int.from_bytes(raw[4 + 4 * i : 8 + 4 * i], "big") for i in range(dims))
    dtype = np.dtype(IDX_TYPES[raw[2]])
    expected = int(np.prod(shape)) * dtype.itemsize
    if len(raw) - header != expected:
        raise DataError(
            f"'{path}' is truncated or corrupt ({len(raw) - header} data bytes, expected {expected}); "
            "delete it and download it again"
        )
    return np.frombuffer(raw, dtype=dtype, offset=header).reshape(shape)


def read_pickle(path: Path) -> dict[Any, Any]:
    """A CIFAR python batch (a pickled dict)."""
    try:
        with path.open("rb") as f:
            data = pickle.load(f, encoding="bytes")
    except (OSError, pickle.UnpicklingError, EOFError, ValueError) as err:
        raise DataError(f"'{path}' is not a readable CIFAR pickle batch ({err}); download it again") from None
    if not isinstance(data, dict):
        raise DataError(f"'{path}' does not hold a CIFAR batch dictionary")
    return data


def read_json(path: Path) -> dict[str, Any]:
    try:
        data = json.loads(path.read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as err:
        raise DataError(f"'{path}' is not valid JSON ({err})") from None
    if not isinstance(data, dict):
        raise DataError(f"'{path}' must hold a JSON object")
    return data


def digest(path: Path, algorithm: str) -> str:
    h = hashlib.new(algorithm)
    with path.open("rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def mirror(url: str) -> str:
    """`url`, or the same file name under ``$FEDHET_MIRROR`` when that is set (tests, offline mirrors)."""
    base = os.environ.get("FEDHET_MIRROR")
    return f"{base.rstrip('/')}/{url.rsplit('/', 1)[-1]}" if base else url


def download(url: str, dest: Path, *, md5: str | None = None, sha256: str | None = None, timeout: float = 60) -> Path:
    """Fetch `url` to `dest` through a temporary file, verify the checksum, then move it into place."""
    dest.parent.mkdir(parents=True, exist_ok=True)
    source = mirror(url)
    with tempfile.NamedTemporaryFile(dir=dest.parent, delete=False, suffix=".part") as tmp:
        tmp_path = Path(tmp.name)
        try:
            with urllib.request.urlopen(source, timeout=timeout) as response:
                shutil.copyfileobj(response, tmp)
        except OSError as err:
            tmp_path.unlink(missing_ok=True)
            raise DataError(
                f"cannot download '{source}': {err}; check the network or place the file in '{dest.parent}'"
            ) from None
    for algorithm, expected in (("md5", md5), ("sha256", sha256)):
        if expected is not None and digest(tmp_path, algorithm) != expected:
            tmp_path.unlink(missing_ok=True)
            raise DataError(f"'{source}' failed its {algorithm} check (corrupt download); try again")
    tmp_path.replace(dest)
    return dest
