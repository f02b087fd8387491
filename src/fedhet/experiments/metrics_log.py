"""The run folder's CSV files: ``metrics.csv`` appended round by round (`MetricsLog`), ``clients.csv`` at the end."""

from __future__ import annotations

import csv
import hashlib
import io
import math
from collections.abc import Mapping, Sequence
from pathlib import Path

import numpy as np

from fedhet.atomic import append_bytes, read_plain, truncate, write_bytes


class MetricsLog:
    """``metrics.csv``: one row per evaluated round, columns in first-seen order (a row without a column leaves
    it empty).

    A row is appended (I/O proportional to the row, not to the rounds so far); a row with a new column rewrites
    the file atomically with the wider header. The log knows its length and SHA-256, which the checkpoint records,
    so that a resume can check the file and cut it back to the checkpoint's round (`restore`).
    """

    def __init__(self, path: Path) -> None:
        self.path = path
        self.columns: list[str] = []
        self.rows: list[dict[str, float]] = []
        self.size = 0
        self._hash = hashlib.sha256()

    def start(self) -> None:
        """Begin an empty log (a new run)."""
        self.columns, self.rows = [], []
        self._rewrite()

    def append(self, row: dict[str, float]) -> None:
        self.rows.append(row)
        if any(c not in self.columns for c in row):
            self.columns.extend(c for c in row if c not in self.columns)
            self._rewrite()
            return
        data = _csv_text(self.columns, [row], header=False).encode()
        append_bytes(self.path, data)
        self.size += len(data)
        self._hash.update(data)

    def sha256(self) -> str:
        return self._hash.copy().hexdigest()

    def restore(self, columns: list[str], count: int, sha256: str) -> list[dict[str, float]]:
        """Bring the file back to what it held when the checkpoint was written (its `columns`, first `count` rows,
        hashing to `sha256`) and return those rows; raises ValueError when the file does not hold them.

        Rows past `count` (written after the checkpoint, perhaps half) are cut off; a header widened after the
        checkpoint (a new column) is narrowed back, so that the resumed run writes what an uninterrupted one does.
        """
        try:
            data = read_plain(self.path)
        except (FileNotFoundError, IsADirectoryError):
            data = b""
        lines = data.split(b"\r\n")
        if columns and len(lines) < count + 2:
            raise ValueError(f"it holds fewer rows than the checkpoint's {count}")
        try:
            text = b"".join(line + b"\r\n" for line in lines[: count + 1]).decode() if columns else ""
            reader = csv.DictReader(io.StringIO(text, newline=""))
            rows = [{k: float(v) for k, v in row.items() if v not in ("", None)} for row in reader]
        except (UnicodeDecodeError, ValueError, TypeError, csv.Error):
            raise ValueError("it was changed since the checkpoint") from None
        canonical = _csv_text(columns, rows, header=bool(columns)).encode()
        if hashlib.sha256(canonical).hexdigest() != sha256:
            raise ValueError("it was changed since the checkpoint")
        if data[: len(canonical)] == canonical:
            if len(data) > len(canonical):
                truncate(self.path, len(canonical))
        else:
            write_bytes(self.path, canonical)
        self.columns, self.rows = list(columns), rows
        self.size, self._hash = len(canonical), hashlib.sha256(canonical)
        return list(rows)

    def _rewrite(self) -> None:
        data = _csv_text(self.columns, self.rows, header=bool(self.columns)).encode()
        write_bytes(self.path, data)
        self.size, self._hash = len(data), hashlib.sha256(data)


def _csv_text(columns: list[str], rows: Sequence[Mapping[str, float | str]], header: bool) -> str:
    buffer = io.StringIO(newline="")
    writer = csv.DictWriter(buffer, fieldnames=columns, restval="")
    if header:
        writer.writeheader()
    for row in rows:
        writer.writerow({k: _fmt(v) for k, v in row.items()})
    return buffer.getvalue()


def csv_bytes(rows: Sequence[Mapping[str, float | str]]) -> bytes:
    """`rows` as CSV: all columns of all rows, in first-seen order."""
    columns: list[str] = []
    for row in rows:
        columns.extend(c for c in row if c not in columns)
    return _csv_text(columns, rows, header=True).encode()


def write_csv(path: Path, rows: Sequence[Mapping[str, float | str]]) -> None:
    """Write `rows` (`csv_bytes`) atomically."""
    write_bytes(path, csv_bytes(rows))


Table = Mapping[str, Sequence[float] | Sequence[str] | np.ndarray]


def write_columns(path: Path, table: Table) -> None:
    """Write `table` (`columns_bytes`) atomically."""
    write_bytes(path, columns_bytes(table))


def columns_bytes(table: Table, chunk: int = 1 << 16) -> bytes:
    """The CSV of `table` (equally long columns, in order): the bytes `csv_bytes` makes of its rows, made column by
    column, `chunk` rows at a time (a million rows in seconds, in memory about the file's size)."""
    header = io.StringIO(newline="")
    csv.writer(header).writerow(list(table))
    parts = [header.getvalue().encode()]
    rows = len(next(iter(table.values()), []))
    for start in range(0, rows, chunk):
        buffer = io.StringIO(newline="")
        columns = (_fmt_column(values[start : start + chunk]) for values in table.values())
        csv.writer(buffer).writerows(zip(*columns, strict=True))
        parts.append(buffer.getvalue().encode())
    return b"".join(parts)


def _fmt_column(values: Sequence[float] | Sequence[str] | np.ndarray) -> list[str]:
    """`_fmt` of every value of a column (text, or numbers as floats)."""
    if not isinstance(values, np.ndarray) and len(values) and isinstance(values[0], str):
        return list(map(str, values))
    numbers = np.asarray(values, dtype=np.float64)
    with np.errstate(invalid="ignore"):
        integral = (numbers == np.trunc(numbers)) & (np.abs(numbers) < 1e15) & ~np.signbit(numbers)
    whole = list(map(str, numbers[integral].astype(np.int64).tolist()))
    if len(whole) == len(numbers):
        return whole
    text = np.array(list(map(repr, numbers.tolist())), dtype=object)
    text[integral] = whole
    return list(text.tolist())


def _fmt(value: float | str) -> str:
    """Integers without a decimal point (below 1e15), other floats exactly (``repr`` reads back bit for bit); text
    as it is (clients.csv's user names)."""
    if isinstance(value, str):
        return value
    value = float(value)
    if value.is_integer() and abs(value) < 1e15 and math.copysign(1.0, value) > 0:
        return str(int(value))
    return repr(value)
