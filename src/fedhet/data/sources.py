"""Dataset sources: where a `Dataset` comes from (generated, shipped with a package, or files on disk)."""

from __future__ import annotations

from abc import abstractmethod
from pathlib import Path

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


DATASETS: Registry[DatasetSource] = Registry("dataset")
