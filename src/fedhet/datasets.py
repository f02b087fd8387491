"""Datasets from Python: your arrays as a `Dataset`, or any registered source loaded by its spec.

>>> import numpy as np, fedhet
>>> data = fedhet.datasets.from_arrays(np.random.rand(100, 4), np.arange(100) % 2)
>>> result = fedhet.run({"dataset": data, "num_clients": 5, "clients_per_round": 5, "rounds": 2})  # doctest: +SKIP
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

from fedhet.data.arrays import ArrayLike, TaskName, to_dataset
from fedhet.data.dataset import Dataset

__all__ = ["Dataset", "from_arrays", "load", "names"]


def from_arrays(
    x: ArrayLike,
    y: ArrayLike,
    users: ArrayLike | None = None,
    *,
    name: str = "arrays",
    num_classes: int | None = None,
    tokens: bool = False,
    task: TaskName = "auto",
) -> Dataset:
    """A checked `Dataset` from NumPy arrays, torch tensors or nested lists.

    `x` holds the features (N, ...) (integers become float32 unless `tokens`), `y` the labels (N,): class ids
    0..C-1 or class names (numbered in sorted order), or with ``task="regression"`` numeric targets (N,) or (N, d)
    (a run trains on them standardised and reports in their units: ``task: {name: regression, standardize: ...}``);
    `users` (N,), optional, each sample's owner for ``partition: natural``. Raises `fedhet.errors.DataError` (one
    line) on mixed shapes, non-numeric features, or labels that are not classes (with ``task="auto"``, also whole
    numbers that look like a numeric target: more than 50 values that are not 0..C-1; ``task="classification"``
    keeps them as classes).
    """
    return to_dataset(name, x, y, users, num_classes=num_classes, tokens=tokens, task=task)


def load(spec: str | Mapping[str, Any], data_dir: str | Path = "data", download: bool = False) -> Dataset:
    """Load any registered dataset source by name or ``{"name": ..., **params}`` (as the ``dataset:`` key of a
    config), e.g. ``load({"name": "table", "path": "data.csv", "label": "y"})``."""
    from fedhet.catalog import DATASETS

    return DATASETS.build(spec, where="dataset").load(Path(data_dir), download=download)


def names() -> list[str]:
    """The names of every registered dataset source (``fedhet list datasets``)."""
    from fedhet.catalog import DATASETS

    return DATASETS.names()
