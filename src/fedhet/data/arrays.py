"""Your own arrays as a `Dataset`: checks and conversion shared by every user-data format, and the ``arrays``
source (``.npz`` / ``.npy`` files).

Features must be numbers of one shape per sample; labels are class ids (non-negative integers) or class names
(strings, numbered in sorted order); optional per-sample user ids (any values) give the ``natural`` partition.
Every problem is a one-line `DataError` naming the input and how to fix it.
"""

from __future__ import annotations

import math
import zipfile
import zlib
from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any, ClassVar, Literal

import numpy as np
import torch
from pydantic import Field, ValidationInfo, field_validator

from fedhet.data.dataset import ClientData, Dataset, FederatedData, TargetScale
from fedhet.data.sources import DATASETS, DatasetSource
from fedhet.errors import DataError

ArrayLike = Any  # a NumPy array, a torch tensor, or a (nested) sequence of numbers
TaskName = Literal["auto", "classification", "binary", "regression"]  # a user-data source's `task` option


def data_task(option: str) -> str:
    """The `Dataset.task` of a source's ``task`` option (auto: classification, unless the run asks for regression:
    `fedhet.data.sources.DatasetSource.for_task`)."""
    return "classification" if option == "auto" else option


def as_numpy(values: ArrayLike, what: str) -> np.ndarray:
    """`values` (array, tensor or nested sequence) as a NumPy array; mixed shapes are a DataError."""
    if isinstance(values, torch.Tensor):
        return values.detach().cpu().numpy()
    try:
        return np.asarray(values)
    except ValueError as err:  # NumPy's "inhomogeneous shape" for ragged input
        raise DataError(
            f"{what}: samples have mixed shapes ({str(err).splitlines()[0]}); give every sample the same shape "
            "(resize images, pad sequences)"
        ) from None


def _first_bad_row(mask: np.ndarray) -> int:
    return int(np.argwhere(mask.reshape(len(mask), -1).any(axis=1))[0, 0])


def check_features(x: ArrayLike, what: str, tokens: bool = False) -> torch.Tensor:
    """Features (N, ...) as float32 (or int64 token ids with `tokens`); a 1-D array is one feature per sample."""
    arr = as_numpy(x, what)
    if arr.dtype == object:
        raise DataError(
            f"{what}: features are not one numeric array (mixed shapes or non-numbers); give every sample the "
            "same shape and numeric values"
        )
    if arr.ndim == 0 or len(arr) == 0:
        raise DataError(f"{what}: no samples (features of shape {arr.shape})")
    if not (np.issubdtype(arr.dtype, np.number) or arr.dtype == np.bool_):
        raise DataError(
            f"{what}: features are not numeric (dtype {arr.dtype}); encode them as numbers "
            "(tables: list such columns under 'categorical')"
        )
    if np.iscomplexobj(arr):
        raise DataError(f"{what}: features are complex numbers; give real-valued features")
    if arr.ndim == 1:
        arr = arr.reshape(-1, 1)
    if tokens:
        if not (np.issubdtype(arr.dtype, np.integer) or arr.dtype == np.bool_):
            raise DataError(f"{what}: token features must be integers (got dtype {arr.dtype}); unset 'tokens'")
        if arr.size and arr.min() < 0:
            raise DataError(f"{what}: token ids must be non-negative (row {_first_bad_row(arr < 0)} has one below 0)")
        return torch.from_numpy(arr.astype(np.int64))
    out = np.ascontiguousarray(arr.astype(np.float32, copy=False))  # float32 arrays are shared, not copied
    if not out.flags.writeable:  # a read-only array (np.load's memory map): torch needs its own
        out = out.copy()
    if out.size and not (np.isfinite(out.min()) and np.isfinite(out.max())):  # NaN or ±inf, without an (N, ...) mask
        raise DataError(
            f"{what}: row {_first_bad_row(~np.isfinite(out))} holds a missing or infinite value (NaN/inf); fill or "
            "drop such rows"
        )
    return torch.from_numpy(out)


MANY_CLASSES = 50  # more whole-number labels than this, not numbered 0..C−1 (or 1..C), look like a numeric target


def check_not_a_target(values: np.ndarray, what: str) -> None:
    """Refuse whole-number labels that look like a numeric target (a count, an age, a price) rather than class ids:
    more than `MANY_CLASSES` distinct values that are not the consecutive ids 0..C−1 or 1..C (scikit-learn's
    diabetes targets: 214 values from 25 to 346). Called only where the task is a guess (a source's ``task: auto``
    and a run that names none); naming either task decides."""
    distinct = np.unique(values)
    if len(distinct) <= MANY_CLASSES or (distinct[0] in (0, 1) and distinct[-1] - distinct[0] == len(distinct) - 1):
        return
    raise DataError(
        f"{what}: the labels are {len(distinct)} different whole numbers from {distinct[0]:g} to {distinct[-1]:g}, "
        "like a numeric target rather than class ids 0..C-1; for a regression set task: regression "
        f"(--set task=regression), or task: classification to train {len(distinct)} classes"
    )


def check_labels(
    y: ArrayLike, n: int, what: str, num_classes: int | None = None, guessed: bool = False
) -> tuple[torch.Tensor, int]:
    """Labels as int64 class ids and the number of classes.

    Integers (or whole floats) are class ids 0..C-1 (C = `num_classes`, or the largest id + 1); strings and
    booleans are class names, numbered in sorted order. Fractions, negatives and NaN are DataErrors, and so, when
    the task is `guessed` and `num_classes` not given, are whole numbers that look like a target
    (`check_not_a_target`).
    """
    arr = as_numpy(y, what)
    if arr.ndim == 2 and arr.shape[1] == 1:
        arr = arr[:, 0]
    if arr.ndim != 1:
        raise DataError(
            f"{what}: labels must be one class per sample, shape ({n},), got {arr.shape}; one-hot labels: pass "
            "their argmax"
        )
    if len(arr) != n:
        raise DataError(f"{what}: {len(arr)} labels for {n} samples; give exactly one label per sample")
    if arr.dtype == np.bool_ or arr.dtype.kind in "USO":
        if arr.dtype.kind == "O" and not all(isinstance(v, str) for v in arr):
            raise DataError(f"{what}: labels mix names and other values; give class ids or class names only")
        names, ids = np.unique(arr.astype(str) if arr.dtype.kind == "O" else arr, return_inverse=True)
        return _classes(torch.from_numpy(ids.astype(np.int64)), len(names), what, num_classes)
    if not np.issubdtype(arr.dtype, np.number) or np.iscomplexobj(arr):
        raise DataError(f"{what}: labels of dtype {arr.dtype} are not classes; give integer ids or names")
    if np.issubdtype(arr.dtype, np.floating):
        bad = ~np.isfinite(arr) | (arr != np.round(arr))
        if bad.any():
            row = int(np.argmax(bad))
            raise DataError(
                f"{what}: label {float(arr[row]):g} (row {row}) is not a class; labels must be integer class ids "
                "or names (for numeric targets set task: regression)"
            )
    if guessed and num_classes is None:
        check_not_a_target(arr, what)
    ids = arr.astype(np.int64)
    if ids.min() < 0:
        row = int(np.argmax(ids < 0))
        raise DataError(f"{what}: label {ids[row]} (row {row}) is negative; class ids start at 0")
    return _classes(torch.from_numpy(ids), int(ids.max()) + 1, what, num_classes)


def _classes(ids: torch.Tensor, found: int, what: str, num_classes: int | None) -> tuple[torch.Tensor, int]:
    if max(found, num_classes or 0) > MAX_CLASSES:
        row = int(torch.argmax(ids))
        raise DataError(
            f"{what}: label {int(ids[row])} (row {row}) would make {max(found, num_classes or 0):,} classes; fedhet "
            f"trains classifiers of at most {MAX_CLASSES:,} classes: renumber the labels 0..C-1"
        )
    if num_classes is not None:
        if found > num_classes:
            raise DataError(f"{what}: labels need {found} classes but num_classes is {num_classes}; raise it")
        return ids, num_classes
    if found < 2:
        raise DataError(f"{what}: every label is the same class; a classifier needs at least two classes")
    return ids, found


def check_targets(y: ArrayLike, n: int, what: str) -> tuple[torch.Tensor, int]:
    """Regression targets as float32 (N,) (or (N, d) for d targets) and d; NaN, infinities and non-numbers are
    DataErrors."""
    arr = as_numpy(y, what)
    if arr.ndim not in (1, 2) or len(arr) != n:
        raise DataError(f"{what}: targets must be one number (or one row of numbers) per sample, got shape {arr.shape}")
    if not np.issubdtype(arr.dtype, np.number) or np.iscomplexobj(arr):
        raise DataError(f"{what}: regression targets of dtype {arr.dtype} are not numbers")
    out = arr.astype(np.float32)
    bad = ~np.isfinite(out)
    if bad.any():
        raise DataError(f"{what}: target of row {_first_bad_row(bad)} is missing or infinite (NaN/inf)")
    width = 1 if out.ndim == 1 else out.shape[1]
    return torch.from_numpy(np.ascontiguousarray(out[:, 0] if out.ndim == 2 and width == 1 else out)), width


def named_users(users: ArrayLike, n: int, what: str) -> tuple[torch.Tensor, tuple[str, ...]]:
    """Per-sample user ids (any values: numbers or names) numbered 0..U-1 in sorted order, and each id's name."""
    arr = as_numpy(users, what)
    if arr.ndim != 1 or len(arr) != n:
        raise DataError(f"{what}: users must give one id per sample, shape ({n},), got {arr.shape}")
    if arr.dtype.kind == "f" and np.isnan(arr).any():
        raise DataError(f"{what}: user id of row {int(np.argmax(np.isnan(arr)))} is missing (NaN)")
    if arr.dtype.kind == "O":
        arr = arr.astype(str)
    names, ids = np.unique(arr, return_inverse=True)
    return torch.from_numpy(ids.astype(np.int64).reshape(-1)), tuple(str(v) for v in names.tolist())


def check_users(users: ArrayLike, n: int, what: str) -> torch.Tensor:
    """Per-sample user ids (any values: numbers or names) numbered 0..U-1 in sorted order."""
    return named_users(users, n, what)[0]


def to_dataset(
    name: str,
    x: ArrayLike,
    y: ArrayLike,
    users: ArrayLike | None = None,
    *,
    num_classes: int | None = None,
    tokens: bool = False,
    where: str | None = None,
    task: str = "classification",
    standardize: bool = False,
) -> Dataset:
    """A checked `Dataset` from features `x` (N, ...), labels `y` (N,) and optional users (N,).

    `task` "regression" takes `y` as numeric targets (N,) or (N, d); "auto" as classes unless they look like a
    numeric target (`check_not_a_target`: refused); any other task as classes. `standardize`
    z-scores every feature over the samples (not token ids). `where` names the input in error messages (a file, a
    column); it defaults to `name`."""
    what = where or name
    features = check_features(x, what, tokens)
    if task == "regression":
        labels, classes = check_targets(y, len(features), what)
    else:
        labels, classes = check_labels(y, len(features), what, num_classes, guessed=task == "auto")
    if standardize and not tokens:
        features = standardise(features)
    owners, names = named_users(users, len(features), what) if users is not None else (None, None)
    return Dataset(name, features, labels, classes, users=owners, task=data_task(task), user_names=names)


def standardise(x: torch.Tensor, dims: Sequence[int] = (0,)) -> torch.Tensor:
    """Zero mean, unit variance over `dims` (columns with no spread are only centred)."""
    mean = x.mean(dim=tuple(dims), keepdim=True)
    std = x.std(dim=tuple(dims), keepdim=True, unbiased=False)
    return (x - mean) / torch.where(std > 0, std, torch.ones_like(std))


def standardise_targets(data: FederatedData) -> FederatedData:
    """`data` with its regression targets standardised for training (`TargetScale`): each column centred on its
    mean and divided by one scale s, both from the training samples of the clients that train (never the
    validation, test or unseen clients' samples); s is 1 for targets with no spread."""
    train = data.train.select(data.seen_ids).y.double()
    columns = train.reshape(len(train), -1)
    mean = columns.mean(0) if len(columns) else torch.zeros(columns.shape[1], dtype=torch.float64)
    spread = float(columns.var(0, unbiased=False).mean().sqrt()) if len(columns) else 0.0
    scale = TargetScale(mean.float(), spread if spread > 0 and math.isfinite(spread) else 1.0)

    def standardised(part: ClientData) -> ClientData:
        y = (part.y.double() - mean) / scale.scale  # (N,) or (N, d) minus (d,)
        return ClientData(part.x, y.to(part.y.dtype), part.offsets)

    val = standardised(data.val) if data.val is not None else None
    return replace(data, train=standardised(data.train), test=standardised(data.test), val=val, target_scale=scale)


def absolute(path: str | None) -> str | None:
    """A user-given path as an absolute one when it names something that exists from here (so that a run folder's
    config.yaml works from any directory); otherwise as given (the error, when it is loaded, names it)."""
    if path is None or not path:
        return path
    given = Path(path).expanduser()
    return str(given.resolve()) if given.exists() else path


def resolve(path: str, what: str) -> Path:
    """A user-given file path (relative to the current directory) that must exist."""
    resolved = Path(path).expanduser()
    if not resolved.exists():
        raise DataError(f"{what}: no such file or folder '{path}' (relative paths start at '{Path.cwd()}')")
    return resolved


MAX_CLASSES = 100_000  # a label id above it is a mistake (a sample id, a timestamp), not a class


MAX_NPY_HEADER = 10_000  # bytes: NumPy's own limit (np.save writes headers of about a hundred)


def _npy_problem(err: ValueError) -> str:
    """What NumPy's ValueError about a .npy file (or an array of a .npz archive) means, for a one-line error."""
    text = str(err)
    if "Header info length" in text:
        return f"its header is longer than a NumPy file's ({MAX_NPY_HEADER:,} bytes at most): a crafted or damaged file"
    if "allow_pickle" in text or "Object arrays" in text:
        return "it holds Python objects, which fedhet does not unpickle; save numbers"
    return f"it is damaged ({text.splitlines()[0] if text else type(err).__name__})"


def _read_npy(path: Path, what: str) -> np.ndarray:
    """One ``.npy`` file, checked before its data is read: the magic string (a ``.npz`` archive under a ``.npy``
    name is refused), a header of NumPy's size, numbers only, and as many bytes as the header's shape claims."""
    fmt = np.lib.format
    try:
        with path.open("rb") as f:
            try:
                version = fmt.read_magic(f)
            except ValueError:
                f.seek(0)
                zipped = f.read(2) == b"PK"
                kind = "a .npz archive: give it as 'path' (its arrays by key)" if zipped else "not a NumPy .npy file"
                raise DataError(f"{what}: '{path}' is {kind}") from None
            read_header = fmt.read_array_header_1_0 if version == (1, 0) else fmt.read_array_header_2_0
            shape, _, dtype = read_header(f, max_header_size=MAX_NPY_HEADER)
            if dtype.hasobject:
                raise ValueError("Object arrays cannot be loaded when allow_pickle=False")
            claimed = int(np.prod(shape, dtype=object)) * dtype.itemsize
            held = path.stat().st_size - f.tell()
            if claimed > held:
                raise DataError(
                    f"{what}: '{path}' is truncated or damaged: its header claims shape {tuple(shape)} "
                    f"({claimed:,} bytes), it holds {held:,}"
                )
            f.seek(0)
            return np.asarray(np.load(f, allow_pickle=False))
    except ValueError as err:
        raise DataError(f"{what}: '{path}': {_npy_problem(err)}") from None
    except (OSError, EOFError) as err:
        raise DataError(f"{what}: cannot read '{path}' ({str(err).splitlines()[0]})") from None


@DATASETS.register
class Arrays(DatasetSource):
    """Arrays from NumPy files: a ``.npz`` archive (``path``) whose arrays ``x``, ``y`` and optional ``users``
    are named by key, or, without ``path``, one ``.npy`` file each.

    ``x`` holds the features (N, ...): integers become float32 unless ``tokens`` (then int64 ids for an
    embedding), z-scored with ``standardize``; ``y`` the labels (N,): class ids 0..C-1 or class names, or numeric
    targets (N,) or (N, d) with ``task: regression`` (or the run's ``task: regression``; at ``auto``, whole numbers
    that look like a target are refused: `check_not_a_target`); ``users`` each sample's
    owner (any ids), for ``partition: natural`` (which a run takes when ``users`` is set and its config names no
    partition). Files are read without unpickling (``allow_pickle=False``). Relative paths start at the current
    directory, and are kept absolute in a run folder's config.yaml.
    """

    name: ClassVar[str] = "arrays"
    description: ClassVar[str] = "your NumPy arrays: an .npz file (or .npy files) with features, labels, optional users"
    path: str | None = Field(None, description="a .npz file; without it, x, y and users are paths to .npy files")
    x: str = Field("x", description="the features: a key of the .npz file, or a .npy file")
    y: str = Field("y", description="the labels (class ids or names): a key of the .npz file, or a .npy file")
    users: str | None = Field(None, description="per-sample user ids for partition 'natural' (key or .npy file)")
    tokens: bool = Field(False, description="integer features are token ids (kept as int64 for an embedding)")
    num_classes: int | None = Field(None, ge=2, description="number of classes (default: largest label id + 1)")
    task: TaskName = Field(
        "auto", description="what y is: classes (auto, classification, binary) or regression targets"
    )
    standardize: bool = Field(False, description="z-score every feature over all samples (zero mean, unit variance)")

    @field_validator("path", "x", "y", "users")
    @classmethod
    def _absolute(cls, value: str | None, info: ValidationInfo) -> str | None:
        if info.field_name == "path" or (value is not None and value.endswith(".npy")):
            return absolute(value)
        return value

    def user_column(self) -> str | None:
        return self.users

    def load(self, data_dir: Path, download: bool = False) -> Dataset:
        keys = {"x": self.x, "y": self.y, **({"users": self.users} if self.users is not None else {})}
        arrays: dict[str, np.ndarray] = {}
        where = self.path or self.x
        if self.path is not None:
            file = resolve(self.path, "dataset 'arrays'")
            try:
                archive = np.load(file, allow_pickle=False)
            except (ValueError, OSError, EOFError, zipfile.BadZipFile) as err:
                raise DataError(
                    f"dataset 'arrays': '{file}' is not a NumPy .npz file ({str(err).splitlines()[0]})"
                ) from None
            if not hasattr(archive, "files"):
                raise DataError(f"dataset 'arrays': '{file}' is one array (.npy); give x and y as .npy files instead")
            with archive:
                for role, key in keys.items():
                    if key not in archive.files:
                        raise DataError(
                            f"dataset 'arrays': '{file}' has no array '{key}' (for {role}); it holds: "
                            f"{', '.join(archive.files)}"
                        )
                    try:
                        arrays[role] = archive[key]
                    except ValueError as err:
                        raise DataError(f"dataset 'arrays': array '{key}' of '{file}': {_npy_problem(err)}") from None
                    except (OSError, EOFError, zipfile.BadZipFile, zlib.error) as err:  # truncated, a bad CRC
                        reason = (str(err).strip().splitlines() or [type(err).__name__])[0]
                        raise DataError(f"dataset 'arrays': array '{key}' of '{file}' is damaged ({reason})") from None
        else:
            for role, key in keys.items():
                if not key.endswith(".npy"):
                    raise DataError(
                        f"dataset 'arrays': {role} '{key}' is not a .npy file; give 'path: file.npz' to name arrays "
                        "by key"
                    )
                arrays[role] = _read_npy(resolve(key, f"dataset 'arrays' ({role})"), "dataset 'arrays'")
        return to_dataset(
            Path(where).stem,
            arrays["x"],
            arrays["y"],
            arrays.get("users"),
            num_classes=self.num_classes,
            tokens=self.tokens,
            where=f"dataset 'arrays' ({where})",
            task=self.task,
            standardize=self.standardize,
        )
