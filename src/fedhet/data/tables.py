"""Tables (CSV or Parquet) as a `Dataset`: a label column, feature columns (numeric, or categorical one-hot
encoded) and an optional user column for natural partitions.

CSV files are read with Python's `csv` module (no extra dependency); Parquet files need pyarrow (the
``parquet`` extra).
"""

from __future__ import annotations

import csv
import math
from pathlib import Path
from typing import Any, ClassVar

import numpy as np
import torch
from pydantic import Field, field_validator

from fedhet.data.arrays import check_users, resolve, standardise
from fedhet.data.dataset import Dataset
from fedhet.data.sources import DATASETS, DatasetSource
from fedhet.errors import DataError
from fedhet.registry import closest

CSV_SUFFIXES = (".csv", ".tsv", ".txt")
PARQUET_SUFFIXES = (".parquet", ".pq")
Columns = dict[str, list[Any]]


def read_csv(path: Path, delimiter: str | None) -> Columns:
    """Every column of a CSV file as a list of strings (the first row holds the column names)."""
    sep = delimiter or ("\t" if path.suffix == ".tsv" else ",")
    try:
        with path.open(newline="", encoding="utf-8-sig") as f:
            rows = list(csv.reader(f, delimiter=sep))
    except (UnicodeDecodeError, csv.Error) as err:
        raise DataError(f"table '{path}' is not a readable CSV file ({err})") from None
    if not rows or not any(rows[0]):
        raise DataError(f"table '{path}' is empty; its first line must name the columns")
    header, body = rows[0], [r for r in rows[1:] if r]
    for i, row in enumerate(body):
        if len(row) != len(header):
            raise DataError(
                f"table '{path}': line {i + 2} has {len(row)} fields but the header has {len(header)}; "
                f"check the delimiter (now {sep!r})"
            )
    duplicated = sorted({c for c in header if header.count(c) > 1})
    if duplicated:
        raise DataError(f"table '{path}': column '{duplicated[0]}' appears twice in the header")
    return {name: [row[j] for row in body] for j, name in enumerate(header)}


def read_parquet(path: Path) -> Columns:
    """Every column of a Parquet file as a list of Python values."""
    try:
        import pyarrow.parquet as pq
    except ImportError:
        raise DataError("reading Parquet needs pyarrow: pip install 'fedhet[parquet]'") from None
    try:
        table = pq.read_table(path)
    except Exception as err:  # pyarrow raises its own ArrowInvalid / OSError kinds
        raise DataError(f"table '{path}' is not a readable Parquet file ({str(err).splitlines()[0]})") from None
    return {name: table.column(name).to_pylist() for name in table.column_names}


def _missing(value: Any) -> bool:
    return value is None or value == "" or (isinstance(value, float) and math.isnan(value))


def _check_present(values: list[Any], column: str, path: Path) -> None:
    for i, value in enumerate(values):
        if _missing(value):
            raise DataError(f"table '{path}': column '{column}' has no value in data row {i + 1}; fill or drop it")


def numeric(values: list[Any], column: str, path: Path) -> np.ndarray | None:
    """The column as float64, or None when some value is not a number."""
    _check_present(values, column, path)
    if all(isinstance(v, bool | int | float) for v in values):
        return np.asarray(values, dtype=np.float64)
    try:
        return np.asarray([float(v) for v in values], dtype=np.float64)
    except (TypeError, ValueError):
        return None


def one_hot(values: list[Any], column: str, path: Path) -> np.ndarray:
    """(N, V) indicator columns, one per distinct value in sorted order."""
    _check_present(values, column, path)
    text = np.asarray([str(v) for v in values])
    _, ids = np.unique(text, return_inverse=True)
    out = np.zeros((len(values), int(ids.max()) + 1 if len(values) else 0), dtype=np.float64)
    out[np.arange(len(values)), ids.reshape(-1)] = 1.0
    return out


def label_ids(values: list[Any], column: str, path: Path) -> tuple[torch.Tensor, int]:
    """Class ids of a label column: its distinct values (names, or whole numbers) numbered in sorted order."""
    _check_present(values, column, path)
    as_numbers = numeric(values, column, path)
    if as_numbers is None:
        keys: np.ndarray = np.asarray([str(v) for v in values])
    else:
        bad = ~np.isfinite(as_numbers) | (as_numbers != np.round(as_numbers))
        if bad.any():
            row = int(np.argmax(bad))
            raise DataError(
                f"table '{path}': label {values[row]!r} (column '{column}', data row {row + 1}) is not a class; "
                "labels must be class ids or names (fedhet trains classifiers)"
            )
        keys = as_numbers
    distinct, ids = np.unique(keys, return_inverse=True)
    if len(distinct) < 2:
        raise DataError(f"table '{path}': column '{column}' holds one class only; a classifier needs two or more")
    return torch.from_numpy(ids.astype(np.int64).reshape(-1)), len(distinct)


@DATASETS.register
class Table(DatasetSource):
    """A CSV or Parquet table: one row per sample.

    ``label`` names the class column (names or integers; its distinct values are numbered in sorted order).
    ``features`` lists the input columns (default: every other column but ``user``); numeric columns are
    standardised (zero mean, unit variance over the whole table) unless ``standardize: false``, and columns
    listed in ``categorical`` are one-hot encoded (one 0/1 column per distinct value, in sorted order). A
    non-numeric feature column not listed in ``categorical`` is an error. ``user`` names a column of sample
    owners for ``partition: natural``. Empty cells are errors. Relative paths start at the current directory.
    """

    name: ClassVar[str] = "table"
    description: ClassVar[str] = "your CSV or Parquet table: a label column, feature columns, optional user column"
    path: str = Field(..., description="the .csv/.tsv or .parquet file")
    label: str = Field(..., description="the column holding each row's class (names or integers)")
    features: list[str] | None = Field(None, description="feature columns (default: all but label and user)")
    categorical: list[str] = Field(default_factory=list, description="feature columns to one-hot encode")
    user: str | None = Field(None, description="column with each row's owner, for partition 'natural'")
    standardize: bool = Field(True, description="z-score the numeric feature columns")
    delimiter: str | None = Field(None, description="CSV field separator (default ',' or tab for .tsv)")

    @field_validator("delimiter")
    @classmethod
    def _one_character(cls, value: str | None) -> str | None:
        if value is not None and (len(value) != 1 or value in '\r\n"' or value.isalnum()):
            raise ValueError("must be one character that is not a letter, digit, quote or line break, e.g. ';'")
        return value

    def read(self, path: Path) -> Columns:
        suffix = path.suffix.lower()
        if suffix in PARQUET_SUFFIXES:
            return read_parquet(path)
        if suffix in CSV_SUFFIXES:
            return read_csv(path, self.delimiter)
        raise DataError(f"table '{path}': unknown file type '{suffix}'; use .csv, .tsv or .parquet")

    def load(self, data_dir: Path, download: bool = False) -> Dataset:
        path = resolve(self.path, "dataset 'table'")
        columns = self.read(path)
        names = list(columns)

        def need(column: str, role: str) -> None:
            if column not in columns:
                raise DataError(
                    f"table '{path}' has no {role} column '{column}'{closest(column, names)}; its columns: "
                    f"{', '.join(names)}"
                )

        need(self.label, "label")
        if self.user is not None:
            need(self.user, "user")
        features = self.features or [c for c in names if c not in (self.label, self.user)]
        for column in [*features, *self.categorical]:
            need(column, "feature")
            if column == self.label:
                raise DataError(
                    f"table '{path}': the label column '{column}' is listed among the features; a model that sees its "
                    "label learns nothing; leave it out of 'features'"
                )
        for column in self.categorical:
            if column not in features:
                raise DataError(f"table '{path}': categorical column '{column}' is not among the features")
        if not features:
            raise DataError(f"table '{path}' has no feature column (only '{self.label}')")
        n = len(columns[self.label])
        if n == 0:
            raise DataError(f"table '{path}' has no data rows")
        blocks: list[np.ndarray] = []
        numeric_mask: list[bool] = []
        for column in features:
            if column in self.categorical:
                block = one_hot(columns[column], column, path)
                blocks.append(block)
                numeric_mask += [False] * block.shape[1]
                continue
            values = numeric(columns[column], column, path)
            if values is None:
                example = next(v for v in columns[column] if numeric([v], column, path) is None)
                raise DataError(
                    f"table '{path}': column '{column}' is not numeric (e.g. {example!r}); list it under "
                    "'categorical' to one-hot encode it, or leave it out of 'features'"
                )
            blocks.append(values.reshape(-1, 1))
            numeric_mask.append(True)
        x = torch.from_numpy(np.concatenate(blocks, axis=1).astype(np.float32))
        if self.standardize and any(numeric_mask):
            cols = torch.tensor(numeric_mask)
            x[:, cols] = standardise(x[:, cols])
        if not bool(torch.isfinite(x).all()):
            raise DataError(f"table '{path}' holds an infinite feature value; fill or drop such rows")
        labels, classes = label_ids(columns[self.label], self.label, path)
        users = None
        if self.user is not None:
            _check_present(columns[self.user], self.user, path)
            users = check_users(np.asarray([str(u) for u in columns[self.user]]), n, f"table '{path}'")
        return Dataset(path.stem, x, labels, classes, users=users)
