"""Image folders as a `Dataset`: one subfolder per class (as torchvision's ImageFolder), PNG/JPEG files decoded
once into one float tensor (N, C, H, W). Decoding needs Pillow (the ``images`` extra).

Also the image helpers the Hugging Face and torchvision sources share: resizing, equal-size checks and
scaling to [0, 1] with per-channel standardisation.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Annotated, Any, ClassVar

import numpy as np
import torch
from pydantic import Field, model_validator

from fedhet.data.arrays import check_users, resolve, standardise
from fedhet.data.dataset import Dataset
from fedhet.data.sources import DATASETS, DatasetSource
from fedhet.errors import DataError

IMAGE_SUFFIXES = frozenset({".png", ".jpg", ".jpeg", ".bmp", ".gif", ".webp", ".tif", ".tiff"})
Size = tuple[int, int]
MAX_SIDE = 4096  # pixels: a larger resize is a typo (and its images would not fit in memory)
Side = Annotated[int, Field(ge=1, le=MAX_SIDE)]
SizeOption = tuple[Side, Side]  # a source's ``size`` option: [height, width], each 1 to `MAX_SIDE`


def require_pillow() -> Any:
    """The PIL.Image module, or a DataError naming the extra to install."""
    try:
        from PIL import Image
    except ImportError:
        raise DataError("reading images needs Pillow: pip install 'fedhet[images]'") from None
    return Image


def pil_pixels(image: Any, grayscale: bool, size: Size | None) -> np.ndarray:
    """A PIL image as uint8 (H, W, C) in L or RGB mode, resized to `size` (h, w) when given."""
    Image = require_pillow()
    converted = image.convert("L" if grayscale else "RGB")
    if size is not None and converted.size != (size[1], size[0]):
        converted = converted.resize((size[1], size[0]), Image.Resampling.BILINEAR)
    pixels = np.asarray(converted, dtype=np.uint8)
    return pixels[:, :, None] if pixels.ndim == 2 else pixels


def stack_pixels(images: list[np.ndarray], names: list[str], what: str) -> np.ndarray:
    """(H, W, C) images of one size as (N, C, H, W); different sizes are a DataError naming two files."""
    if not images:
        raise DataError(f"{what}: no images")
    first = images[0].shape
    for image, name in zip(images, names, strict=True):
        if image.shape != first:
            raise DataError(
                f"{what}: images differ in size: '{names[0]}' is {first[0]}x{first[1]}, '{name}' is "
                f"{image.shape[0]}x{image.shape[1]} (height x width); set size: [h, w] to resize them all"
            )
    return np.stack(images).transpose(0, 3, 1, 2)


def pixels_to_tensor(pixels: np.ndarray, normalize: bool) -> torch.Tensor:
    """uint8 (N, C, H, W) pixels → float32 in [0, 1], then per-channel zero mean and unit variance if
    `normalize` (statistics of the whole dataset)."""
    x = torch.from_numpy(np.ascontiguousarray(pixels)).float().div_(255.0)
    return standardise(x, dims=(0, 2, 3)) if normalize else x


@DATASETS.register
class ImageFolder(DatasetSource):
    """A folder of images with one subfolder per class (``path/cat/1.png``, ``path/dog/2.jpg``, ...).

    Classes are the subfolder names in sorted order; files with an image suffix (png, jpg, jpeg, bmp, gif,
    webp, tif, tiff) anywhere below a class folder are decoded once into a float tensor (N, C, H, W), scaled to
    [0, 1] and standardised per channel (``normalize``). Every image must have the same size unless ``size``
    resizes them (bilinear). ``user_pattern``, a regular expression whose first group is taken from each
    file's path below its class folder (e.g. ``'^([^_]+)_'`` for ``alice_001.png``), gives each image's owner for
    ``partition: natural``. Relative paths start at the current directory.
    """

    name: ClassVar[str] = "image_folder"
    description: ClassVar[str] = "your images: a folder with one subfolder of PNG/JPEG files per class"
    path: str = Field(..., description="the folder holding one subfolder per class")
    size: SizeOption | None = Field(None, description=f"resize every image to [height, width] (1 to {MAX_SIDE} each)")
    grayscale: bool = Field(False, description="one grey channel instead of RGB")
    normalize: bool = Field(True, description="standardise each channel to zero mean, unit variance")
    user_pattern: str | None = Field(None, description="regex; its first group of the file path gives the user")

    def files(self, root: Path) -> tuple[list[Path], list[int], list[str]]:
        """Image files, their class ids and the class names (sorted subfolder names)."""
        if not root.is_dir():
            raise DataError(f"dataset 'image_folder': '{root}' is not a folder")
        classes = sorted(p.name for p in root.iterdir() if p.is_dir() and not p.name.startswith("."))
        if len(classes) < 2:
            raise DataError(
                f"dataset 'image_folder': '{root}' has {len(classes)} class subfolder(s); put each class's images "
                "in a subfolder named after the class (two classes at least)"
            )
        files: list[Path] = []
        labels: list[int] = []
        for k, cls in enumerate(classes):
            found = sorted(p for p in (root / cls).rglob("*") if p.is_file() and p.suffix.lower() in IMAGE_SUFFIXES)
            if not found:
                raise DataError(f"dataset 'image_folder': class folder '{root / cls}' holds no PNG/JPEG image")
            files += found
            labels += [k] * len(found)
        return files, labels, classes

    def users(self, root: Path, files: list[Path]) -> torch.Tensor | None:
        if self.user_pattern is None:
            return None
        try:
            pattern = re.compile(self.user_pattern)
        except re.error as err:
            raise DataError(f"dataset 'image_folder': user_pattern is not a regular expression ({err})") from None
        owners = []
        for file in files:
            relative = Path(*file.relative_to(root).parts[1:]).as_posix()
            match = pattern.search(relative)
            if match is None:
                raise DataError(f"dataset 'image_folder': user_pattern finds no user in '{file.relative_to(root)}'")
            owners.append(match.group(1) if pattern.groups else match.group(0))
        return check_users(np.asarray(owners), len(files), "dataset 'image_folder'")

    def decode(self, root: Path, files: list[Path]) -> torch.Tensor:
        """The image `files` (below `root`) as one float tensor (N, C, H, W)."""
        Image = require_pillow()
        pixels = []
        for file in files:
            try:
                with Image.open(file) as image:
                    pixels.append(pil_pixels(image, self.grayscale, self.size))
            except (OSError, ValueError, Image.DecompressionBombError) as err:  # a bomb: more pixels than PIL allows
                reason = (str(err).strip().splitlines() or [type(err).__name__])[0]
                raise DataError(f"dataset '{self.name}': cannot decode '{file}' ({reason})") from None
        stacked = stack_pixels(pixels, [str(f.relative_to(root)) for f in files], f"dataset '{self.name}' ({root})")
        return pixels_to_tensor(stacked, self.normalize)

    def load(self, data_dir: Path, download: bool = False) -> Dataset:
        require_pillow()
        root = resolve(self.path, "dataset 'image_folder'")
        files, labels, classes = self.files(root)
        x = self.decode(root, files)
        return Dataset(root.name, x, torch.tensor(labels, dtype=torch.long), len(classes), self.users(root, files))


@DATASETS.register
class ImageDomains(ImageFolder):
    """Images of several domains (Digit5, PACS, Office style): ``path/<domain>/<class>/*.png``, each domain folder
    an ``image_folder``. Classes are the class folder names of all domains, in sorted order (a domain may lack
    some); each image's domain is its user (``user_pattern`` is not taken), so that ``shift: domain`` gives each
    client the data of one domain (group = domain), and ``partition: natural`` one client per domain.
    """

    name: ClassVar[str] = "image_domains"
    description: ClassVar[str] = "your images by domain: a folder per domain, in it a subfolder per class"
    path: str = Field(..., description="the folder holding one subfolder per domain, each with one per class")

    @model_validator(mode="after")
    def _domains_are_users(self) -> ImageDomains:
        if self.user_pattern is not None:
            raise ValueError("each image's user is its domain here: leave user_pattern out")
        return self

    def load(self, data_dir: Path, download: bool = False) -> Dataset:
        require_pillow()
        root = resolve(self.path, "dataset 'image_domains'")
        if not root.is_dir():
            raise DataError(f"dataset 'image_domains': '{root}' is not a folder")
        domains = sorted(p.name for p in root.iterdir() if p.is_dir() and not p.name.startswith("."))
        if len(domains) < 2:
            raise DataError(
                f"dataset 'image_domains': '{root}' has {len(domains)} domain subfolder(s); put each domain's "
                "class folders in a subfolder named after the domain (two domains at least)"
            )
        found = [self.files(root / domain) for domain in domains]
        classes = sorted({name for _, _, names in found for name in names})
        files = [file for domain_files, _, _ in found for file in domain_files]
        labels = [classes.index(names[k]) for _, domain_labels, names in found for k in domain_labels]
        owners = [d for d, (domain_files, _, _) in enumerate(found) for _ in domain_files]
        x = self.decode(root, files)
        y, users = torch.tensor(labels, dtype=torch.long), torch.tensor(owners, dtype=torch.long)
        return Dataset(root.name, x, y, len(classes), users, user_names=tuple(domains))
