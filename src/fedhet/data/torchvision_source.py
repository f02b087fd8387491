"""torchvision's datasets as a `Dataset`, when torchvision is installed (it is not a dependency of fedhet)."""

from __future__ import annotations

import inspect
from pathlib import Path
from typing import Any, ClassVar

import numpy as np
import torch
from pydantic import Field

from fedhet.data.arrays import check_labels
from fedhet.data.dataset import Dataset
from fedhet.data.images import pil_pixels, pixels_to_tensor, stack_pixels
from fedhet.data.sources import DATASETS, DatasetSource
from fedhet.errors import DataError
from fedhet.registry import closest

WHAT = "dataset 'torchvision'"


def _nchw(data: Any) -> np.ndarray | None:
    """A torchvision ``.data`` array (N, H, W), (N, H, W, C) or (N, C, H, W) of uint8 as (N, C, H, W), else None."""
    arr = data.numpy() if isinstance(data, torch.Tensor) else np.asarray(data) if isinstance(data, np.ndarray) else None
    if arr is None or arr.dtype != np.uint8:
        return None
    if arr.ndim == 3:
        return arr[:, None]
    if arr.ndim == 4 and arr.shape[-1] in (1, 3) and arr.shape[1] not in (1, 3):
        return arr.transpose(0, 3, 1, 2)
    if arr.ndim == 4 and arr.shape[1] in (1, 3):
        return arr
    return None


@DATASETS.register
class Torchvision(DatasetSource):
    """A dataset class of ``torchvision.datasets`` (``MNIST``, ``FashionMNIST``, ``CIFAR10``, ``SVHN``, ...),
    stored under ``root`` (default ``<data_dir>/torchvision``); ``--download`` lets torchvision fetch it.

    When the class takes a ``train`` flag and ``kwargs`` does not set it, the train and test parts are
    concatenated (fedhet makes its own per-client split). Images are read from the dataset's ``data`` array
    when it has one (MNIST, CIFAR, SVHN), else decoded one by one; they are scaled to [0, 1] and standardised
    per channel (``normalize``).
    """

    name: ClassVar[str] = "torchvision"
    description: ClassVar[str] = "a torchvision.datasets class (MNIST, CIFAR10, ...) when torchvision is installed"
    dataset: str = Field(..., description="class name in torchvision.datasets, e.g. MNIST or CIFAR10")
    root: str | None = Field(None, description="torchvision's root folder (default: <data_dir>/torchvision)")
    kwargs: dict[str, Any] = Field(default_factory=dict, description="more constructor arguments, e.g. split")
    normalize: bool = Field(True, description="standardise each channel")

    def _class(self) -> Any:
        try:
            import torchvision.datasets as tv
        except ImportError:
            raise DataError(f"{WHAT} needs torchvision: pip install torchvision (matching your torch)") from None
        except Exception as err:  # e.g. a build made for another torch: "operator torchvision::nms does not exist"
            first = (str(err).strip().splitlines() or [""])[0]
            raise DataError(
                f"{WHAT}: torchvision is installed but does not load ({type(err).__name__}: {first}); "
                f"install the torchvision release made for torch {torch.__version__.split('+')[0]}"
            ) from None
        names = [n for n in dir(tv) if n[:1].isupper()]
        if self.dataset not in names:
            raise DataError(f"{WHAT}: torchvision has no dataset '{self.dataset}'{closest(self.dataset, names)}")
        return getattr(tv, self.dataset)

    def _parts(self, cls: Any, root: Path, download: bool) -> list[Any]:
        takes = inspect.signature(cls).parameters
        extra = {"download": download} if "download" in takes else {}
        flags = [{"train": True}, {"train": False}] if "train" in takes and "train" not in self.kwargs else [{}]
        parts = []
        for flag in flags:
            try:
                parts.append(cls(str(root), **flag, **extra, **self.kwargs))
            except RuntimeError as err:  # torchvision: "Dataset not found. You can use download=True ..."
                hint = "" if download else "; rerun with --download"
                raise DataError(f"{WHAT}: {self.dataset} in '{root}': {str(err).splitlines()[0]}{hint}") from None
            except TypeError as err:
                raise DataError(f"{WHAT}: {self.dataset}(...) rejects kwargs ({err})") from None
        return parts

    @staticmethod
    def _arrays(part: Any) -> tuple[np.ndarray, np.ndarray]:
        """(uint8 pixels (N, C, H, W), labels (N,)) of one torchvision dataset."""
        targets = getattr(part, "targets", getattr(part, "labels", None))
        fast = _nchw(getattr(part, "data", None))
        if fast is not None and targets is not None and len(targets) == len(fast):
            return fast, np.asarray(targets)
        pixels, labels = [], []
        for i in range(len(part)):
            image, label = part[i]
            if not hasattr(image, "convert"):
                raise DataError(f"{WHAT}: item {i} is a {type(image).__name__}, not a PIL image; set no transform")
            pixels.append(pil_pixels(image, image.mode in ("L", "1", "I", "F"), None))
            labels.append(label)
        return stack_pixels(pixels, [f"item {i}" for i in range(len(pixels))], WHAT), np.asarray(labels)

    def load(self, data_dir: Path, download: bool = False) -> Dataset:
        cls = self._class()
        root = Path(self.root).expanduser() if self.root is not None else data_dir / "torchvision"
        parts = self._parts(cls, root, download)
        arrays = [self._arrays(part) for part in parts]
        shapes = {a[0].shape[1:] for a in arrays}
        if len(shapes) > 1:
            raise DataError(f"{WHAT}: the parts of {self.dataset} differ in image shape ({sorted(shapes)})")
        pixels = np.concatenate([a[0] for a in arrays])
        classes = getattr(parts[0], "classes", None)
        labels, num_classes = check_labels(
            np.concatenate([a[1] for a in arrays]),
            len(pixels),
            f"{WHAT} ({self.dataset})",
            len(classes) if classes else None,
        )
        return Dataset(self.dataset.lower(), pixels_to_tensor(pixels, self.normalize), labels, num_classes)
