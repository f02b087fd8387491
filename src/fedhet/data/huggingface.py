"""Hugging Face `datasets` as a `Dataset` (the ``hf`` extra): a dataset saved with ``save_to_disk``, or one in
the local Hugging Face cache by its Hub name, with its columns mapped to features, labels and users."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any, ClassVar

import numpy as np
import torch
from pydantic import Field, model_validator

from fedhet.data.arrays import check_features, check_labels, check_users, resolve
from fedhet.data.dataset import Dataset
from fedhet.data.images import MAX_SIDE, SizeOption, pil_pixels, pixels_to_tensor, stack_pixels
from fedhet.data.sources import DATASETS, DatasetSource
from fedhet.errors import ConfigError, DataError
from fedhet.registry import closest

WHAT = "dataset 'huggingface'"


def _reason(err: BaseException) -> str:
    text = str(err).strip().splitlines()
    return f"{type(err).__name__}: {text[0][:160]}" if text else type(err).__name__


def require_datasets() -> Any:
    try:
        import datasets
    except ImportError:
        raise DataError("reading Hugging Face datasets needs the datasets package: pip install 'fedhet[hf]'") from None
    return datasets


@contextmanager
def _quiet(offline: bool) -> Iterator[None]:
    """No progress bars or cache warnings; with `offline`, no network access (the Hub cache only)."""
    import datasets
    import huggingface_hub.constants as hub_constants
    from datasets import config

    saved = (config.HF_HUB_OFFLINE, hub_constants.HF_HUB_OFFLINE, datasets.logging.get_verbosity())
    bars = not datasets.are_progress_bars_disabled()
    if offline:
        config.HF_HUB_OFFLINE = hub_constants.HF_HUB_OFFLINE = True
    datasets.logging.set_verbosity_error()
    datasets.disable_progress_bars()
    try:
        yield
    finally:
        config.HF_HUB_OFFLINE, hub_constants.HF_HUB_OFFLINE = saved[0], saved[1]
        datasets.logging.set_verbosity(saved[2])
        if bars:
            datasets.enable_progress_bars()


def column(part: Any, name: str) -> np.ndarray:
    """One column of a datasets.Dataset as a NumPy array."""
    return np.asarray(part.select_columns([name]).with_format("numpy")[:][name])


@DATASETS.register
class HuggingFace(DatasetSource):
    """A Hugging Face dataset: ``path``, a folder written by ``save_to_disk`` (a Dataset or a DatasetDict), or
    ``hub``, a Hub name (``ylecun/mnist``) read from the local cache; with ``--download`` (``download: true``)
    a missing one is fetched from the Hub.

    ``split`` picks splits (default: all, concatenated; fedhet makes its own train/test split per client).
    ``label`` names the class column (a ClassLabel, integers or names), ``features`` the input columns
    (default: every other column but ``user``): numeric scalars, arrays or lists of equal length (concatenated
    when several), or one image column, decoded as the ``image_folder`` source does (``size``, ``grayscale``,
    ``normalize``). ``user`` names a column of sample owners for ``partition: natural``.
    """

    name: ClassVar[str] = "huggingface"
    description: ClassVar[str] = "a Hugging Face dataset saved to disk or in the local cache (extra: hf)"
    path: str | None = Field(None, description="folder written by Dataset.save_to_disk / DatasetDict.save_to_disk")
    hub: str | None = Field(None, description="Hub dataset name, read from the local cache (fetched with download)")
    subset: str | None = Field(None, description="the Hub dataset's configuration (subset) name")
    split: str | list[str] | None = Field(None, description="split(s) to use (default: all, concatenated)")
    cache_dir: str | None = Field(None, description="Hugging Face datasets cache (default: HF_DATASETS_CACHE)")
    label: str = Field("label", description="the class column")
    features: list[str] | None = Field(None, description="input columns (default: all but label and user)")
    user: str | None = Field(None, description="column of sample owners, for partition 'natural'")
    tokens: bool = Field(False, description="integer features are token ids (kept as int64)")
    size: SizeOption | None = Field(None, description=f"resize images to [height, width] (1 to {MAX_SIDE} each)")
    grayscale: bool = Field(False, description="images: one grey channel instead of RGB")
    normalize: bool = Field(True, description="images: standardise each channel")

    @model_validator(mode="after")
    def _one_source(self) -> HuggingFace:
        if (self.path is None) == (self.hub is None):
            raise ValueError("give exactly one of 'path' (a save_to_disk folder) and 'hub' (a Hub dataset name)")
        return self

    def _open(self, download: bool) -> dict[str, Any]:
        """The chosen splits, by name."""
        datasets = require_datasets()
        with _quiet(offline=not download):
            if self.path is not None:
                folder = resolve(self.path, WHAT)
                try:
                    loaded = datasets.load_from_disk(str(folder))
                except FileNotFoundError as err:
                    raise DataError(
                        f"{WHAT}: '{folder}' is not a folder written by save_to_disk ({str(err).splitlines()[0]})"
                    ) from None
                except Exception as err:  # a damaged state.json, dataset_info.json or arrow file
                    raise DataError(f"{WHAT}: '{folder}' is damaged ({_reason(err)})") from None
            else:
                try:
                    loaded = datasets.load_dataset(self.hub, self.subset, cache_dir=self.cache_dir)
                except (ConnectionError, FileNotFoundError) as err:
                    if download:
                        raise DataError(f"{WHAT}: cannot load '{self.hub}' ({str(err).splitlines()[0]})") from None
                    raise DataError(
                        f"{WHAT}: '{self.hub}' is not in the local Hugging Face cache; rerun with --download "
                        "(download: true) to fetch it"
                    ) from None
                except ValueError as err:
                    raise DataError(f"{WHAT}: cannot load '{self.hub}' ({str(err).splitlines()[0]})") from None
        splits = dict(loaded) if isinstance(loaded, datasets.DatasetDict) else {"all": loaded}
        wanted = [self.split] if isinstance(self.split, str) else self.split
        if wanted is None:
            return splits
        if not isinstance(loaded, datasets.DatasetDict):
            raise DataError(f"{WHAT} is one dataset without splits; leave out split (given: {', '.join(wanted)})")
        for name in wanted:
            if name not in splits:
                raise DataError(f"{WHAT}: no split '{name}'{closest(name, list(splits))}; it has: {', '.join(splits)}")
        return {name: splits[name] for name in wanted}

    def _features(self, part: Any, columns: list[str]) -> torch.Tensor:
        datasets = require_datasets()
        images = [c for c in columns if isinstance(part.features[c], datasets.Image)]
        if images:
            if len(columns) > 1:
                raise DataError(f"{WHAT}: image column '{images[0]}' must be the only feature column")
            pixels = [pil_pixels(image, self.grayscale, self.size) for image in part[images[0]]]
            return pixels_to_tensor(
                stack_pixels(pixels, [f"row {i}" for i in range(len(pixels))], WHAT), self.normalize
            )
        blocks = []
        for name in columns:
            try:
                values = column(part, name)
            except (ValueError, TypeError) as err:
                raise DataError(f"{WHAT}: column '{name}' has mixed shapes ({str(err).splitlines()[0]})") from None
            blocks.append(check_features(values, f"{WHAT}, column '{name}'", self.tokens))
        if len(blocks) == 1:
            return blocks[0]
        return torch.cat([b.reshape(len(b), -1) for b in blocks], dim=1)

    def load(self, data_dir: Path, download: bool = False) -> Dataset:
        try:
            return self._load(download)
        except (DataError, ConfigError, MemoryError):
            raise
        except Exception as err:  # the library's reading of a damaged file (arrow data, an image that is a bomb)
            where = self.path or self.hub
            raise DataError(f"{WHAT}: cannot read '{where}' ({_reason(err)})") from None

    def _load(self, download: bool) -> Dataset:
        datasets = require_datasets()
        splits = self._open(download)
        first = next(iter(splits.values()))
        names = list(first.column_names)
        wanted = [(self.label, "label"), *((c, "feature") for c in self.features or []), (self.user, "user")]
        for name, role in wanted:
            if name is not None and name not in names:
                raise DataError(
                    f"{WHAT} has no {role} column '{name}'{closest(name, names)}; it has: {', '.join(names)}"
                )
        columns = self.features or [c for c in names if c not in (self.label, self.user)]
        if not columns:
            raise DataError(f"{WHAT} has no feature column (only '{self.label}')")
        xs, ys, us = [], [], []
        for part in splits.values():
            xs.append(self._features(part, columns))
            ys.append(column(part, self.label))
            if self.user is not None:
                us.append(column(part, self.user))
        shapes = {tuple(x.shape[1:]) for x in xs}
        if len(shapes) > 1:
            raise DataError(f"{WHAT}: the splits' features differ in shape ({', '.join(map(str, sorted(shapes)))})")
        x = torch.cat(xs)
        label_feature = first.features[self.label]
        num_classes = label_feature.num_classes if isinstance(label_feature, datasets.ClassLabel) else None
        y, classes = check_labels(np.concatenate(ys), len(x), f"{WHAT}, column '{self.label}'", num_classes)
        users = check_users(np.concatenate(us), len(x), f"{WHAT}, column '{self.user}'") if us else None
        return Dataset(self.hub or Path(self.path or "huggingface").name, x, y, classes, users=users)
