"""Datasets handed over from Python (`fedhet.run`, `fedhet.Config`): held in this process under a content key.

A config can only hold names and numbers, so an in-memory `Dataset` is kept in a table here and the config
names it ``{name: in_memory, ref: "<name>@<digest>"}``. The digest is a hash of the data, so the same arrays
give the same config (and a run folder made from them can be resumed by passing them again).
"""

from __future__ import annotations

import hashlib
from pathlib import Path
from typing import ClassVar

import numpy as np
from pydantic import Field

from fedhet.data.dataset import Dataset
from fedhet.data.sources import DATASETS, DatasetSource
from fedhet.errors import DataError

_HELD: dict[str, Dataset] = {}


def digest(dataset: Dataset) -> str:
    """A short hash of the dataset's tensors and class count."""
    task = "" if dataset.task == "classification" else f"|{dataset.task}"  # the digests of before tasks existed
    h = hashlib.sha256(f"{dataset.num_classes}|{tuple(dataset.x.shape)}|{dataset.x.dtype}{task}".encode())
    for tensor in (dataset.x, dataset.y, dataset.users):
        if tensor is not None:
            h.update(tensor.detach().cpu().contiguous().numpy().reshape(-1).view(np.uint8).data)  # no copy
        h.update(b"|")
    return h.hexdigest()[:16]


def hold(dataset: Dataset) -> str:
    """Keep `dataset` for this process; returns the ``ref`` that names it."""
    ref = f"{dataset.name}@{digest(dataset)}"
    _HELD.setdefault(ref, dataset)
    return ref


@DATASETS.register
class InMemory(DatasetSource):
    """A dataset given from Python (``fedhet.run({"dataset": fedhet.datasets.from_arrays(x, y)})``), named by a
    reference that only the process that received it can resolve."""

    name: ClassVar[str] = "in_memory"
    description: ClassVar[str] = "arrays or a Dataset given from Python (fedhet.run); lives in that process only"
    embedded: bool = True
    ref: str = Field(..., description="the '<name>@<digest>' reference fedhet.run gave the data")

    def load(self, data_dir: Path, download: bool = False) -> Dataset:
        if self.ref not in _HELD:
            raise DataError(
                f"dataset 'in_memory' refers to data given from Python ({self.ref}) that this process does not hold; "
                "pass the arrays again: fedhet.run(config, ...) with dataset=fedhet.datasets.from_arrays(x, y)"
            )
        return _HELD[self.ref]
