"""Dataset sources: where a `Dataset` comes from (generated, shipped with a package, or files on disk)."""

from __future__ import annotations

from abc import abstractmethod
from pathlib import Path

import torch

from fedhet.data.dataset import Dataset
from fedhet.registry import Component, Registry


class DatasetSource(Component):
    """A named dataset. `load` returns the whole dataset in memory.

    Sources backed by files look in ``data_dir / <name>``; with ``download=True`` they fetch missing files and
    verify their checksums. Generated and embedded sources ignore both arguments.
    """

    embedded: bool = False  # True when the data needs no file (generated or shipped with a package)

    @abstractmethod
    def load(self, data_dir: Path, download: bool = False) -> Dataset: ...

    def user_column(self) -> str | None:
        """The user's own column (or array) of sample owners when the config names one (a table's ``user``): a run
        whose config names no partition then splits by it, one client per user. None: the source has none, or its
        users are not the user's choice (LEAF's writers keep the partition the config names)."""
        return None

    def for_task(self, numeric: bool | None) -> DatasetSource:
        """This source reading its labels as the run's task needs them where the source has a ``task`` option left
        at ``auto`` (tables, arrays): numeric targets for a task without classes (regression), classes for one with
        (`numeric` False: whole numbers stay classes however many); otherwise (None: the run names no task) itself."""
        if numeric is not None and getattr(self, "task", None) == "auto":
            return self.model_copy(update={"task": "regression" if numeric else "classification"})
        return self

    def stand_in(self, scale: float = 1.0) -> Dataset | None:
        """Random tensors of this dataset's real shapes, class count and size (× `scale`), for ``--estimate``
        when its files are absent; None for a source that has none (its files are needed)."""
        del scale
        return None


def random_dataset(
    name: str,
    size: int,
    shape: tuple[int, ...],
    classes: int,
    scale: float = 1.0,
    users: int = 0,
    vocabulary: int = 0,
) -> Dataset:
    """`size` × `scale` random samples of `shape` (standard normal floats, or token ids below `vocabulary`),
    uniform labels of `classes`, and owners among `users` × `scale` users when `users` (a stand-in)."""
    gen = torch.Generator().manual_seed(0)
    n = max(2 * classes, round(size * scale))
    tokens = torch.randint(vocabulary, (n, *shape), generator=gen) if vocabulary else None
    x = tokens if tokens is not None else torch.randn(n, *shape, generator=gen)
    owners = torch.randint(max(1, round(users * scale)), (n,), generator=gen) if users else None
    return Dataset(name, x, torch.randint(classes, (n,), generator=gen), classes, owners)


DATASETS: Registry[DatasetSource] = Registry("dataset")
