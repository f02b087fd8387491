"""Tables (CSV or Parquet) as a `Dataset`: a label column (classes, or numbers for a regression), feature columns
(numeric, or categorical one-hot encoded) and an optional user column for natural partitions; empty cells refused,
dropped or filled, id columns left out, each with a line saying so.

CSV files are read with Python's `csv` module (no extra dependency); Parquet files need pyarrow (the
``parquet`` extra).
"""

from __future__ import annotations

import csv
import math
import re
import warnings
from pathlib import Path
from typing import Any, ClassVar, Literal

import numpy as np
import torch
from pydantic import Field, field_validator

from fedhet.data.arrays import (
    TaskName,
    absolute,
    check_not_a_target,
    check_targets,
    data_task,
    named_users,
    resolve,
    standardise,
)
from fedhet.data.dataset import Dataset
from fedhet.data.sources import DATASETS, DatasetSource
from fedhet.errors import DataError, FedhetNote
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


MISSING_HINT = "fill or drop it (dataset.missing: drop, mean or median)"


def _check_present(values: list[Any], column: str, path: Path) -> None:
    for i, value in enumerate(values):
        if _missing(value):
            raise DataError(f"table '{path}': column '{column}' has no value in data row {i + 1}; {MISSING_HINT}")


def numeric(values: list[Any], column: str, path: Path) -> np.ndarray | None:
    """The column as float64, or None when some value is not a number."""
    _check_present(values, column, path)
    if all(isinstance(v, bool | int | float) for v in values):
        return np.asarray(values, dtype=np.float64)
    try:
        return np.asarray([float(v) for v in values], dtype=np.float64)
    except (TypeError, ValueError):
        return None


MAX_CATEGORIES = 1_000  # one-hot columns of one categorical column (the Adult loader's bound too)
FLOAT32_MAX = float(np.finfo(np.float32).max)


def one_hot(values: list[Any], column: str, path: Path) -> np.ndarray:
    """(N, V) indicator columns, one per distinct value in sorted order (V at most `MAX_CATEGORIES`)."""
    _check_present(values, column, path)
    text = np.asarray([str(v) for v in values])
    distinct, ids = np.unique(text, return_inverse=True)
    if len(distinct) > MAX_CATEGORIES:
        raise DataError(
            f"table '{path}': categorical column '{column}' has {len(distinct):,} distinct values, more than the "
            f"{MAX_CATEGORIES:,} one-hot columns fedhet makes of one column; group its rare values, or leave it out "
            "of 'features' and 'categorical'"
        )
    out = np.zeros((len(values), int(ids.max()) + 1 if len(values) else 0), dtype=np.float64)
    out[np.arange(len(values)), ids.reshape(-1)] = 1.0
    return out


def _check_finite(numbers: np.ndarray, values: list[Any], column: str, path: Path) -> None:
    """Refuse a feature cell that is not a finite float32 number: a NaN or inf written as text, or a number beyond
    float32's range (1e400 reads as inf, 1e39 becomes inf as float32)."""
    bad = ~np.isfinite(numbers) | (np.abs(numbers) > FLOAT32_MAX)
    if bad.any():
        row = int(np.argmax(bad))
        value = float(numbers[row])
        written = str(values[row]).strip().lower().lstrip("+-")
        what = "NaN" if math.isnan(value) else "infinite" if written in ("inf", "infinity") else "out of range"
        raise DataError(
            f"table '{path}': column '{column}' holds {values[row]!r} in data row {row + 1}, which is {what} "
            f"(features are finite float32 numbers, at most {FLOAT32_MAX:.3g} in size); fix or drop that row"
        )


def label_ids(values: list[Any], column: str, path: Path, guessed: bool = False) -> tuple[torch.Tensor, int]:
    """Class ids of a label column: its distinct values (names, or whole numbers) numbered in sorted order; when the
    task is `guessed`, whole numbers that look like a numeric target are refused (`check_not_a_target`)."""
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
                "labels must be class ids or names, or, for a regression on this column, set task: regression"
            )
        if guessed:
            check_not_a_target(as_numbers, f"table '{path}' (column '{column}')")
        keys = as_numbers
    distinct, ids = np.unique(keys, return_inverse=True)
    if len(distinct) < 2:
        raise DataError(f"table '{path}': column '{column}' holds one class only; a classifier needs two or more")
    return torch.from_numpy(ids.astype(np.int64).reshape(-1)), len(distinct)


def targets(values: list[Any], column: str, path: Path) -> tuple[torch.Tensor, int]:
    """A label column as regression targets (float32)."""
    as_numbers = numeric(values, column, path)
    if as_numbers is None:
        example = next(v for v in values if numeric([v], column, path) is None)
        raise DataError(
            f"table '{path}': target column '{column}' is not numeric (e.g. {example!r}); a regression "
            "needs numbers (for classes, leave task at auto or classification)"
        )
    return check_targets(as_numbers, len(values), f"table '{path}' (column '{column}')")


ID_NAME = re.compile(r"(^|[^a-z])(id|uuid|guid|index|key)$|^unnamed[: ]|^$", re.IGNORECASE)
ID_MIN_ROWS = 10  # below this, text columns whose values all differ are too common to be taken for ids


def id_like(values: list[Any], column: str) -> bool:
    """Whether a column looks like row identifiers rather than a feature: every value present and different, and a
    name such as ``id``, ``patient_id``, ``PatientID`` or ``Unnamed: 0`` (pandas' saved index), or text (names,
    codes) in a table of at least `ID_MIN_ROWS` rows. Such a column lets a model memorise rows instead of learning."""
    texts = [str(v) for v in values]
    if len(values) < 2 or any(_missing(v) for v in values) or len(set(texts)) < len(values):
        return False
    name = column.strip()
    if ID_NAME.search(name) or re.search(r"[a-z]ID$", name):
        return True
    if len(values) < ID_MIN_ROWS:
        return False
    try:
        [float(v) for v in values]
    except (TypeError, ValueError):
        return True
    return False


def _note(text: str) -> None:
    warnings.warn(text, FedhetNote, stacklevel=3)


@DATASETS.register
class Table(DatasetSource):
    """A CSV or Parquet table: one row per sample.

    ``label`` names the class column (names or integers; its distinct values are numbered in sorted order), or,
    with ``task: regression`` (or the run's ``task: regression``), the numeric target; when neither names a task, a
    label of whole numbers that looks like a target (more than 50 values, not 0..C−1) is refused, naming both
    choices (`fedhet.data.arrays.check_not_a_target`). ``features`` lists the
    input columns (default: every other column but ``user``, leaving out columns that look like row ids, with a
    line saying so); numeric columns are standardised (zero mean, unit variance over the whole table) unless
    ``standardize: false``, and columns listed in ``categorical`` are one-hot encoded (one 0/1 column per distinct
    value, in sorted order). A non-numeric feature column not listed in ``categorical`` is an error. ``user``
    names a column of sample owners (sites, patients): a run whose config names no partition splits by it, one
    client per user (``partition: natural``), and clients.csv names each client's user. Empty cells are errors
    unless ``missing`` says to drop their rows or fill them (numeric columns with the column's mean or median,
    categorical ones with a category of their own; rows without a label or user are dropped). Relative paths
    start at the current directory, and are kept absolute in a run folder's config.yaml.
    """

    name: ClassVar[str] = "table"
    description: ClassVar[str] = "your CSV or Parquet table: a label column, feature columns, optional user column"
    path: str = Field(..., description="the .csv/.tsv or .parquet file")
    label: str = Field(..., description="the column holding each row's class (names or integers) or target")
    features: list[str] | None = Field(
        None, description="feature columns (default: all but label and user, and but columns that look like ids)"
    )
    categorical: list[str] = Field(default_factory=list, description="feature columns to one-hot encode")
    user: str | None = Field(None, description="column with each row's owner (site, patient): one client each")
    standardize: bool = Field(True, description="z-score the numeric feature columns")
    delimiter: str | None = Field(None, description="CSV field separator (default ',' or tab for .tsv)")
    task: TaskName = Field(
        "auto", description="what the label is: classes (auto, classification, binary) or a regression target"
    )
    missing: Literal["error", "drop", "mean", "median"] = Field(
        "error", description="empty cells: an error, drop their rows, or fill with the column's mean or median"
    )

    @field_validator("path")
    @classmethod
    def _absolute(cls, value: str) -> str:
        return absolute(value) or value

    def user_column(self) -> str | None:
        return self.user

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
        features = self.features or self._default_features(columns, path)
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
        if len(columns[self.label]) == 0:
            raise DataError(f"table '{path}' has no data rows")
        columns = self._fill_or_drop(columns, features, path)
        n = len(columns[self.label])
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
            _check_finite(values, columns[column], column, path)
            blocks.append(values.reshape(-1, 1))
            numeric_mask.append(True)
        x = torch.from_numpy(np.concatenate(blocks, axis=1).astype(np.float32))
        if self.standardize and any(numeric_mask):
            cols = torch.tensor(numeric_mask)
            x[:, cols] = standardise(x[:, cols])
        if not bool(torch.isfinite(x).all()):  # finite values too far apart for float32 once standardised
            raise DataError(
                f"table '{path}': standardising its numeric features overflows float32 (values too far apart); "
                "rescale the columns, or set dataset.standardize: false"
            )
        task = data_task(self.task)
        if task == "regression":
            labels, classes = targets(columns[self.label], self.label, path)
        else:
            labels, classes = label_ids(columns[self.label], self.label, path, guessed=self.task == "auto")
        users, user_names = None, None
        if self.user is not None:
            _check_present(columns[self.user], self.user, path)
            users, user_names = named_users(np.asarray([str(u) for u in columns[self.user]]), n, f"table '{path}'")
        if self.standardize and any(numeric_mask):  # said once the table is read without an error
            _note(
                f"table '{path.name}': standardised {sum(numeric_mask)} numeric feature columns (zero mean, unit "
                "variance over the whole table; dataset.standardize: false keeps them as they are)"
            )
        return Dataset(path.stem, x, labels, classes, users=users, task=task, user_names=user_names)

    def _default_features(self, columns: Columns, path: Path) -> list[str]:
        """Every column but the label and user, without those that look like row ids (`id_like`), said in a line."""
        others = [c for c in columns if c not in (self.label, self.user)]
        ids = [c for c in others if c not in self.categorical and id_like(columns[c], c)]
        if ids:
            quoted = ", ".join(f"'{c}'" for c in ids)
            _note(
                f"table '{path.name}': left out column{'s' if len(ids) > 1 else ''} {quoted}: every value is "
                "different, like a row id (a model would memorise rows); name the columns to use in dataset.features "
                "to keep it"
            )
        return [c for c in others if c not in ids]

    def _fill_or_drop(self, columns: Columns, features: list[str], path: Path) -> Columns:
        """The columns with empty cells handled as ``missing`` says (an error is raised where they are read)."""
        used = [*features, self.label, *([self.user] if self.user is not None else [])]
        gaps = {c: np.asarray([_missing(v) for v in columns[c]], dtype=bool) for c in dict.fromkeys(used)}
        if self.missing == "error" or not any(g.any() for g in gaps.values()):
            return columns
        fill = self.missing in ("mean", "median")
        must_have = [self.label, *([self.user] if self.user is not None else [])] if fill else list(gaps)
        drop = np.zeros(len(columns[self.label]), dtype=bool)
        for column in must_have:
            drop |= gaps[column]
        if drop.all():
            raise DataError(f"table '{path}': every row has an empty cell in {', '.join(must_have)}; nothing is left")
        keep = np.flatnonzero(~drop)
        out = {c: [v[i] for i in keep] for c, v in columns.items()}
        said: list[str] = []
        if drop.any():
            why = "an empty cell" if not fill else f"no {' or '.join(must_have)}"
            said.append(f"dropped {int(drop.sum())} of {len(drop)} rows with {why}")
        if fill:
            for column in features:
                holes = gaps[column][keep]
                if not holes.any():
                    continue
                said.append(self._fill(out, column, holes, path))
        _note(f"table '{path.name}': " + "; ".join(said) + f" (dataset.missing: {self.missing})")
        return out

    def _fill(self, columns: Columns, column: str, holes: np.ndarray, path: Path) -> str:
        """Fill the empty cells of one feature column in place; what was done, in words."""
        values = columns[column]
        present = [v for v, hole in zip(values, holes, strict=True) if not hole]
        if column in self.categorical:
            columns[column] = ["(missing)" if hole else v for v, hole in zip(values, holes, strict=True)]
            return f"filled {int(holes.sum())} empty cells of '{column}' with a category '(missing)'"
        numbers = numeric(present, column, path) if present else None
        if numbers is None:
            raise DataError(
                f"table '{path}': column '{column}' has empty cells and is not numeric; list it under 'categorical' "
                "or use dataset.missing: drop"
            )
        value = float(np.mean(numbers) if self.missing == "mean" else np.median(numbers))
        columns[column] = [value if hole else v for v, hole in zip(values, holes, strict=True)]
        return f"filled {int(holes.sum())} empty cells of '{column}' with its {self.missing} {value:.4g}"
