"""Real datasets read from their standard files in ``data_dir/<name>/``.

Each source loads the whole dataset (the official train and test parts together); fedhet makes its own
per-client train/test split. Sources with an official download (MNIST, Fashion-MNIST, EMNIST, CIFAR-10,
CIFAR-100, Adult) fetch missing files when ``load(..., download=True)`` (``fedhet run --download``) and verify the
published checksums listed in their ``files`` table. Every file with a published checksum (those tables, and the
CIFAR batches of ``members``) is also checked the first time it is used when it was already on disk, and the
result is remembered (`fedhet.data.checksums`). Set ``FEDHET_MIRROR`` to a base URL to fetch every file as
``<FEDHET_MIRROR>/<file name>`` instead (offline mirrors, tests); see `fedhet.data.files`.

LEAF datasets (``femnist``, ``shakespeare``, ``sent140``, ``leaf_synthetic``) have no single download: generate
them with LEAF's scripts and copy the JSON files in.
"""

from __future__ import annotations

import re
from abc import abstractmethod
from array import array
from collections.abc import Sequence
from pathlib import Path
from typing import Any, ClassVar, Literal

import numpy as np
import torch
from pydantic import Field
from scipy import sparse

from fedhet.data.checksums import KnownFile, verify_known
from fedhet.data.dataset import Dataset
from fedhet.data.files import (
    REDOWNLOAD,
    RemoteFile,
    extract_tar,
    extract_zip,
    fetch,
    find,
    not_a_file,
    present,
    read_idx,
    read_json,
    read_pickle,
    read_text,
)
from fedhet.data.sources import DATASETS, DatasetSource, random_dataset
from fedhet.errors import DataError

# ---------------------------------------------------------------------------------------------- IDX images

MNIST_FILES = ("train-images-idx3-ubyte", "train-labels-idx1-ubyte", "t10k-images-idx3-ubyte", "t10k-labels-idx1-ubyte")


def _idx_table(base: str, md5s: tuple[str, str, str, str]) -> tuple[RemoteFile, ...]:
    return tuple(RemoteFile(f"{f}.gz", f"{base}/{f}.gz", md5=m) for f, m in zip(MNIST_FILES, md5s, strict=True))


def _check_labels(labels: np.ndarray, classes: int, where: Path | str) -> np.ndarray:
    """`labels` as int64, or a DataError when one falls outside 0..classes-1."""
    out = np.asarray(labels).astype(np.int64)
    if out.size and (out.min() < 0 or out.max() >= classes):
        raise DataError(
            f"'{where}' holds labels {int(out.min())}..{int(out.max())}, expected 0..{classes - 1}; "
            "the file is corrupt or belongs to another dataset"
        )
    return out


def _gray_images(
    name: str,
    parts: list[tuple[Path, np.ndarray, Path, np.ndarray]],
    classes: int,
    mean: float,
    std: float,
    flatten: bool,
    label_shift: int = 0,
) -> Dataset:
    """(image file, images, label file, labels) pairs → one normalised 28×28 grayscale Dataset."""
    images, labels = [], []
    for image_path, x, label_path, y in parts:
        if x.ndim != 3 or x.shape[1:] != (28, 28):
            raise DataError(f"'{image_path}' holds an array of shape {x.shape}, expected (N, 28, 28) images")
        if x.dtype != np.uint8:
            raise DataError(f"'{image_path}' holds {x.dtype.name} pixels, expected unsigned bytes (IDX type 0x08)")
        if y.ndim != 1 or len(y) != len(x):
            raise DataError(
                f"'{label_path}' holds labels of shape {y.shape} for {len(x)} images in '{image_path.name}'; "
                "the files do not belong together"
            )
        if y.dtype.kind not in "iu":
            raise DataError(f"'{label_path}' holds {y.dtype.name} labels, expected integers")
        images.append(x)
        labels.append(_check_labels(y.astype(np.int64) - label_shift, classes, label_path))
    pixels = torch.from_numpy(np.concatenate(images).astype(np.float32)).div_(255.0).sub_(mean).div_(std)
    x_all = pixels.reshape(len(pixels), -1) if flatten else pixels.reshape(len(pixels), 1, 28, 28)
    return Dataset(name, x_all, torch.from_numpy(np.concatenate(labels)), classes)


class _MNISTLike(DatasetSource):
    """The four MNIST-format IDX files (each optionally ``.gz``) in ``data_dir/<name>/``."""

    title: ClassVar[str] = ""
    page: ClassVar[str] = ""
    files: ClassVar[tuple[RemoteFile, ...]] = ()
    mean: ClassVar[float] = 0.0
    std: ClassVar[float] = 1.0
    flatten: bool = Field(False, description="flat (784,) features instead of (1, 28, 28) images")

    def stand_in(self, scale: float = 1.0) -> Dataset:
        return random_dataset(self.name, 70_000, (784,) if self.flatten else (1, 28, 28), 10, scale)

    def load(self, data_dir: Path, download: bool = False) -> Dataset:
        folder = data_dir / self.name
        if download:
            for remote in self.files:
                if not present(folder, remote.filename.removesuffix(".gz")):
                    fetch(remote, folder)
        hint = f"download the four IDX files of {self.title} from {self.page} into that folder or rerun with --download"
        paths = [find(folder, f, hint) for f in MNIST_FILES]
        for path in paths:
            verify_known(path, self.files)  # the published digests are those of the .gz files
        arrays = [read_idx(p) for p in paths]
        parts = [(paths[0], arrays[0], paths[1], arrays[1]), (paths[2], arrays[2], paths[3], arrays[3])]
        return _gray_images(self.name, parts, 10, self.mean, self.std, self.flatten)


@DATASETS.register
class MNIST(_MNISTLike):
    """MNIST (LeCun et al. 1998), 60,000 + 10,000 digits. Pixels are scaled to [0, 1], then normalised with
    the training-set mean 0.1307 and standard deviation 0.3081."""

    name: ClassVar[str] = "mnist"
    description: ClassVar[str] = "MNIST handwritten digits (IDX files; 70,000 images, 10 classes)"
    title: ClassVar[str] = "MNIST"
    page: ClassVar[str] = "Yann LeCun's MNIST page (mirror: https://ossci-datasets.s3.amazonaws.com/mnist/)"
    files: ClassVar[tuple[RemoteFile, ...]] = _idx_table(
        "https://ossci-datasets.s3.amazonaws.com/mnist",
        (
            "f68b3c2dcbeaaa9fbdd348bbdeb94873",
            "d53e105ee54ea40749a09fcbcd1e9432",
            "9fb629c4189551a2d022fa330f9573f3",
            "ec29112dd5afa0611ce80d1b7f02629c",
        ),
    )
    mean: ClassVar[float] = 0.1307
    std: ClassVar[float] = 0.3081


@DATASETS.register
class FashionMNIST(_MNISTLike):
    """Fashion-MNIST (Xiao et al. 2017), 60,000 + 10,000 clothing images. Pixels are scaled to [0, 1], then
    normalised with the training-set mean 0.2860 and standard deviation 0.3530."""

    name: ClassVar[str] = "fashion_mnist"
    description: ClassVar[str] = "Fashion-MNIST clothing images (IDX files; 70,000 images, 10 classes)"
    title: ClassVar[str] = "Fashion-MNIST"
    page: ClassVar[str] = "the Fashion-MNIST GitHub page (https://github.com/zalandoresearch/fashion-mnist)"
    files: ClassVar[tuple[RemoteFile, ...]] = _idx_table(
        "http://fashion-mnist.s3-website.eu-central-1.amazonaws.com",
        (
            "8d4fb7e6c68d591d4c3dfef9ec88bf0d",
            "25c81989df183df01b3e8a0aad5dffbe",
            "bef4ecab320f06d8554ea6380940ec79",
            "bb300cfdad3c16e7a12a480ee83cd310",
        ),
    )
    mean: ClassVar[float] = 0.2860
    std: ClassVar[float] = 0.3530


EMNIST_SIZES: dict[str, int] = {  # train + test samples per split (Cohen et al. 2017, Table II)
    "byclass": 814_255,
    "bymerge": 814_255,
    "balanced": 131_600,
    "letters": 145_600,
    "digits": 280_000,
    "mnist": 70_000,
}
EMNIST_CLASSES: dict[str, int] = {
    "byclass": 62,
    "bymerge": 47,
    "balanced": 47,
    "letters": 26,
    "digits": 10,
    "mnist": 10,
}


@DATASETS.register
class EMNIST(DatasetSource):
    """EMNIST (Cohen et al. 2017) from ``emnist-<split>-{train,test}-{images-idx3,labels-idx1}-ubyte[.gz]``.

    The images are stored transposed and are turned upright; ``letters`` labels 1..26 become 0..25. Pixels
    are scaled to [0, 1], then normalised with mean 0.1736 and standard deviation 0.3317 (EMNIST byclass
    training-set statistics, used for every split). ``--download`` fetches NIST's gzip.zip (about 560 MB,
    kept for the other splits) and unpacks the split's four files.
    """

    name: ClassVar[str] = "emnist"
    description: ClassVar[str] = "EMNIST handwritten letters and digits (IDX files; 10 to 62 classes by split)"
    files: ClassVar[tuple[RemoteFile, ...]] = (
        RemoteFile(
            "gzip.zip", "https://biometrics.nist.gov/cs_links/EMNIST/gzip.zip", md5="58c8d27c78d21e728a6bc7b3cc06412e"
        ),
    )
    mean: ClassVar[float] = 0.1736
    std: ClassVar[float] = 0.3317
    split: Literal["byclass", "bymerge", "balanced", "letters", "digits", "mnist"] = Field(
        "byclass", description="EMNIST split (byclass 62, bymerge 47, balanced 47, letters 26, digits/mnist 10)"
    )
    flatten: bool = Field(False, description="flat (784,) features instead of (1, 28, 28) images")

    def filenames(self) -> list[str]:
        """The split's four IDX file names (without .gz): train images, train labels, test images, test labels."""
        return [
            f"emnist-{self.split}-{part}-{kind}-ubyte"
            for part in ("train", "test")
            for kind in ("images-idx3", "labels-idx1")
        ]

    def stand_in(self, scale: float = 1.0) -> Dataset:
        shape = (784,) if self.flatten else (1, 28, 28)
        return random_dataset(self.name, EMNIST_SIZES[self.split], shape, EMNIST_CLASSES[self.split], scale)

    def load(self, data_dir: Path, download: bool = False) -> Dataset:
        folder = data_dir / self.name
        names = self.filenames()
        if download and not all(present(folder, n) for n in names):
            archive = fetch(self.files[0], folder)
            extract_zip(archive, folder, [f"{n}.gz" for n in names] + names)
        hint = (
            "download gzip.zip from NIST's EMNIST page (https://www.nist.gov/itl/products-and-services/emnist-dataset) "
            f"and put its emnist-{self.split}-* files into that folder, or rerun with --download"
        )
        paths = [find(folder, n, hint) for n in names]
        arrays = [read_idx(p) for p in paths]
        for i in (0, 2):
            if arrays[i].ndim == 3:
                arrays[i] = np.ascontiguousarray(arrays[i].transpose(0, 2, 1))
        parts = [(paths[0], arrays[0], paths[1], arrays[1]), (paths[2], arrays[2], paths[3], arrays[3])]
        shift = 1 if self.split == "letters" else 0
        return _gray_images(self.name, parts, EMNIST_CLASSES[self.split], self.mean, self.std, self.flatten, shift)


# ---------------------------------------------------------------------------------------------- CIFAR-10 and CIFAR-100

CIFAR10_BATCHES = (*(f"data_batch_{i}" for i in range(1, 6)), "test_batch")
CIFAR100_FILES = ("train", "test")


class _Cifar(DatasetSource):
    """The CIFAR python pickles: ``files`` with ``b"data"`` (N, 3072) uint8 and ``label_key`` labels, in
    ``data_dir/<name>/<folder>/`` or directly in ``data_dir/<name>/``; pixels scaled to [0, 1], then
    normalised per channel (R, G, B) with the training set's ``mean`` and ``std``."""

    folder: ClassVar[str]
    pickles: ClassVar[tuple[str, ...]]
    label_key: ClassVar[bytes]
    classes: ClassVar[int]
    files: ClassVar[tuple[RemoteFile, ...]]
    members: ClassVar[tuple[KnownFile, ...]]  # the archive's pickles with their published md5s
    mean: ClassVar[tuple[float, float, float]]
    std: ClassVar[tuple[float, float, float]]

    def stand_in(self, scale: float = 1.0) -> Dataset:
        return random_dataset(self.name, 60_000, (3, 32, 32), self.classes, scale)

    def load(self, data_dir: Path, download: bool = False) -> Dataset:
        root = data_dir / self.name
        nested = root / self.folder
        folder = nested if nested.is_dir() else root
        if download and not all((folder / n).is_file() for n in self.pickles):
            extract_tar(fetch(self.files[0], root), root)
            folder = nested
        hint = (
            f"download {self.files[0].filename} from Alex Krizhevsky's CIFAR page "
            "(https://www.cs.toronto.edu/~kriz/cifar.html) and unpack it into "
            f"'{root}', or rerun with --download"
        )
        kind = "CIFAR-10 batch" if self.classes == 10 else "CIFAR-100 file"
        xs, ys = [], []
        for n in self.pickles:
            path = find(folder, n, hint, gz=False)
            verify_known(path, self.members)
            batch = read_pickle(path)
            if b"data" not in batch or self.label_key not in batch:
                raise DataError(f"'{path}' is not a {kind} (no b'data' and {self.label_key!r} keys)")
            try:
                data = np.asarray(batch[b"data"])
                labels = np.asarray(batch[self.label_key])
            except (ValueError, TypeError, OverflowError, RecursionError):
                raise DataError(f"'{path}' holds data or labels that are not arrays of numbers; {REDOWNLOAD}") from None
            if labels.dtype.kind not in "iu":
                raise DataError(f"'{path}' holds labels of type {labels.dtype.name}, expected integers")
            if data.dtype != np.uint8 or data.ndim != 2 or data.shape[1] != 3072:
                raise DataError(f"'{path}' holds data of shape {data.shape} ({data.dtype}), expected (N, 3072) uint8")
            if labels.shape != (len(data),):
                raise DataError(f"'{path}' holds {labels.size} labels for {len(data)} images")
            xs.append(data.reshape(-1, 3, 32, 32))
            ys.append(_check_labels(labels, self.classes, path))
        x = torch.from_numpy(np.concatenate(xs).astype(np.float32)).div_(255.0)
        x = (x - torch.tensor(self.mean).view(1, 3, 1, 1)) / torch.tensor(self.std).view(1, 3, 1, 1)
        return Dataset(self.name, x, torch.from_numpy(np.concatenate(ys)), self.classes)


@DATASETS.register
class CIFAR10(_Cifar):
    """CIFAR-10 (Krizhevsky 2009): python batches ``data_batch_1..5`` and ``test_batch`` in
    ``data_dir/cifar10/cifar-10-batches-py/`` or ``data_dir/cifar10/``; normalised with the training-set means
    (0.4914, 0.4822, 0.4465) and standard deviations (0.2470, 0.2435, 0.2616)."""

    name: ClassVar[str] = "cifar10"
    description: ClassVar[str] = "CIFAR-10 colour images (python pickle batches; 60,000 images, 10 classes)"
    folder: ClassVar[str] = "cifar-10-batches-py"
    pickles: ClassVar[tuple[str, ...]] = CIFAR10_BATCHES
    label_key: ClassVar[bytes] = b"labels"
    classes: ClassVar[int] = 10
    files: ClassVar[tuple[RemoteFile, ...]] = (
        RemoteFile(
            "cifar-10-python.tar.gz",
            "https://www.cs.toronto.edu/~kriz/cifar-10-python.tar.gz",
            md5="c58f30108f718f92721af3b95e74349a",
        ),
    )
    # md5s of the unpacked batches, as torchvision lists them (pytorch/vision, torchvision/datasets/cifar.py)
    members: ClassVar[tuple[KnownFile, ...]] = (
        KnownFile("data_batch_1", md5="c99cafc152244af753f735de768cd75f"),
        KnownFile("data_batch_2", md5="d4bba439e000b95fd0a9bffe97cbabec"),
        KnownFile("data_batch_3", md5="54ebc095f3ab1f0389bbae665268c751"),
        KnownFile("data_batch_4", md5="634d18415352ddfa80567beed471001a"),
        KnownFile("data_batch_5", md5="482c414d41f54cd18b22e5b47cb7c3cb"),
        KnownFile("test_batch", md5="40351d587109b95175f43aff81a1287e"),
    )
    mean: ClassVar[tuple[float, float, float]] = (0.4914, 0.4822, 0.4465)
    std: ClassVar[tuple[float, float, float]] = (0.2470, 0.2435, 0.2616)


@DATASETS.register
class CIFAR100(_Cifar):
    """CIFAR-100 (Krizhevsky 2009): python pickles ``train`` and ``test`` with their 100 fine labels, in
    ``data_dir/cifar100/cifar-100-python/`` or ``data_dir/cifar100/``; normalised with the training-set means
    (0.5071, 0.4865, 0.4409) and standard deviations (0.2673, 0.2564, 0.2762)."""

    name: ClassVar[str] = "cifar100"
    description: ClassVar[str] = "CIFAR-100 colour images (python pickles; 60,000 images, 100 fine classes)"
    folder: ClassVar[str] = "cifar-100-python"
    pickles: ClassVar[tuple[str, ...]] = CIFAR100_FILES
    label_key: ClassVar[bytes] = b"fine_labels"
    classes: ClassVar[int] = 100
    files: ClassVar[tuple[RemoteFile, ...]] = (
        RemoteFile(
            "cifar-100-python.tar.gz",
            "https://www.cs.toronto.edu/~kriz/cifar-100-python.tar.gz",
            md5="eb9058c3a382ffc7106e4002c42a8d85",
        ),
    )
    # md5s of the unpacked pickles, as torchvision lists them (pytorch/vision, torchvision/datasets/cifar.py)
    members: ClassVar[tuple[KnownFile, ...]] = (
        KnownFile("train", md5="16019d7e3df5f24257cddd939b257f8d"),
        KnownFile("test", md5="f0ef6b0ae62326f3e7ffdfab6717acfc"),
    )
    mean: ClassVar[tuple[float, float, float]] = (0.5071, 0.4865, 0.4409)
    std: ClassVar[tuple[float, float, float]] = (0.2673, 0.2564, 0.2762)


# ---------------------------------------------------------------------------------------------- LEAF JSON

# LEAF's Shakespeare vocabulary (leaf/models/utils/language_utils.py): 80 printable characters.
ALL_LETTERS = "\n !\"&'(),-.0123456789:;>?ABCDEFGHIJKLMNOPQRSTUVWXYZ[]abcdefghijklmnopqrstuvwxyz}"
assert len(ALL_LETTERS) == 80 and len(set(ALL_LETTERS)) == 80
UNKNOWN_LETTER = ALL_LETTERS.index(" ")  # characters outside the vocabulary map to the space (LEAF gives -1)
_LETTER_TABLE = np.full(128, UNKNOWN_LETTER, dtype=np.int64)
_LETTER_TABLE[[ord(c) for c in ALL_LETTERS]] = np.arange(len(ALL_LETTERS))


def encode_chars(texts: list[str]) -> np.ndarray:
    """The vocabulary index of every character of the concatenated `texts` (unknown characters → space)."""
    codes = np.frombuffer("".join(texts).encode("utf-32-le"), dtype=np.uint32)
    return np.where(codes < 128, _LETTER_TABLE[np.minimum(codes, 127)], UNKNOWN_LETTER)


class _Leaf(DatasetSource):
    """LEAF JSON files (``users``, ``num_samples``, ``user_data: {user: {"x": [...], "y": [...]}}``) anywhere
    under ``data_dir/<name>/``. LEAF writes ``train/`` and ``test/`` folders: both are read and the same user's
    samples are concatenated; when such folders exist, other JSON files (LEAF's ``all_data/``,
    ``sampled_data/``, which repeat the same samples) are ignored. ``Dataset.users`` gives each sample's user,
    users numbered in sorted id order."""

    leaf_folder: ClassVar[str] = ""  # the dataset's folder in LEAF's data/

    @abstractmethod
    def _convert(self, xs: list[Any], ys: list[Any], path: Path) -> tuple[np.ndarray, np.ndarray]:
        """One user's samples from the file `path` → (inputs, int64 labels); DataError when malformed."""

    def _json_files(self, folder: Path) -> list[Path]:
        found = folder.rglob("*.json") if folder.is_dir() else []
        files = sorted(p for p in found if not p.name.startswith(".") and p.is_file())  # not fedhet's own records
        if not files:
            raise DataError(
                f"missing dataset files: no LEAF JSON file under '{folder}'; --download cannot fetch LEAF data: "
                f"clone https://github.com/TalwalkarLab/leaf, run data/{self.leaf_folder}/preprocess.sh "
                f"(see its README) and copy its data/train and data/test folders into '{folder}'"
            )

        def part(path: Path) -> int:  # 0 train, 1 test, 2 other: a user's train samples come first
            folders = path.relative_to(folder).parts[:-1]
            return 0 if "train" in folders else 1 if "test" in folders else 2

        split = sorted((p for p in files if part(p) < 2), key=lambda p: (part(p), p))
        return split or files

    def _records(self, data_dir: Path) -> tuple[np.ndarray, np.ndarray, torch.Tensor]:
        """Every sample's (inputs, labels, user index), users sorted by id."""
        folder = data_dir / self.name
        per_user: dict[str, list[tuple[np.ndarray, np.ndarray]]] = {}
        for path in self._json_files(folder):
            data = read_json(path)
            user_data = data.get("user_data")
            if not isinstance(user_data, dict):
                raise DataError(f"'{path}' is not a LEAF file (no 'user_data' object)")
            for user, samples in user_data.items():
                if not isinstance(samples, dict) or not isinstance(samples.get("x"), list):
                    raise DataError(f"'{path}': user '{user}' has no 'x' list")
                if not isinstance(samples.get("y"), list) or len(samples["y"]) != len(samples["x"]):
                    raise DataError(f"'{path}': user '{user}' needs a 'y' list as long as its 'x' list")
                if samples["y"]:
                    try:
                        converted = self._convert(samples["x"], samples["y"], path)
                    except RecursionError:
                        raise DataError(f"'{path}': user '{user}' has samples nested too deeply") from None
                    per_user.setdefault(str(user), []).append(converted)
        if not per_user:
            raise DataError(f"the LEAF files under '{folder}' hold no samples")
        users = sorted(per_user)
        chunks = [chunk for u in users for chunk in per_user[u]]
        try:
            x = np.concatenate([c[0] for c in chunks])
        except ValueError:
            shapes = sorted({c[0].shape[1:] for c in chunks})
            raise DataError(f"the LEAF files under '{folder}' mix samples of different shapes {shapes}") from None
        y = np.concatenate([c[1] for c in chunks])
        owner = torch.repeat_interleave(
            torch.arange(len(users)), torch.tensor([sum(len(c[1]) for c in per_user[u]) for u in users])
        )
        return x, y, owner


def _int_labels(ys: list[Any], path: Path) -> np.ndarray:
    try:
        labels = np.asarray(ys, dtype=np.float64)
    except (TypeError, ValueError, OverflowError):
        raise DataError(f"'{path}' holds non-numeric labels") from None
    if labels.ndim != 1 or not np.all(labels == np.round(labels)) or not np.all(np.abs(labels) < 2**53):
        raise DataError(f"'{path}' holds labels that are not integers")
    return labels.astype(np.int64)


def _float_rows(xs: list[Any], width: int | None, path: Path) -> np.ndarray:
    try:
        with np.errstate(over="ignore"):  # a value beyond float32 becomes inf, refused below
            rows = np.asarray(xs, dtype=np.float32)
    except (TypeError, ValueError, OverflowError):
        raise DataError(f"'{path}' holds inputs that are not equal-length lists of numbers") from None
    if rows.ndim != 2 or (width is not None and rows.shape[1] != width):
        expected = f"(N, {width})" if width is not None else "(N, D)"
        raise DataError(f"'{path}' holds inputs of shape {rows.shape}, expected {expected}")
    if not np.all(np.isfinite(rows)):
        raise DataError(f"'{path}' holds inputs that are NaN or infinite (or too large for float32)")
    return rows


@DATASETS.register
class FEMNIST(_Leaf):
    """LEAF FEMNIST (Caldas et al. 2018): 28×28 handwritten characters grouped by writer. The pixels are used
    as stored by LEAF (floats in [0, 1], 1 = background)."""

    name: ClassVar[str] = "femnist"
    description: ClassVar[str] = "LEAF FEMNIST: handwritten characters by writer (JSON files, 62 classes)"
    leaf_folder: ClassVar[str] = "femnist"

    def _convert(self, xs: list[Any], ys: list[Any], path: Path) -> tuple[np.ndarray, np.ndarray]:
        return _float_rows(xs, 784, path), _check_labels(_int_labels(ys, path), 62, path)

    def stand_in(self, scale: float = 1.0) -> Dataset:  # LEAF: 805,263 characters of 3,550 writers
        return random_dataset(self.name, 805_263, (1, 28, 28), 62, scale, users=3_550)

    def load(self, data_dir: Path, download: bool = False) -> Dataset:
        x, y, owner = self._records(data_dir)
        return Dataset(self.name, torch.from_numpy(x).reshape(-1, 1, 28, 28), torch.from_numpy(y), 62, owner)


@DATASETS.register
class Shakespeare(_Leaf):
    """LEAF Shakespeare: predict the next character of an 80-character line; one user per speaking role.
    Characters are indexed in LEAF's 80-character vocabulary `ALL_LETTERS` (others map to the space)."""

    name: ClassVar[str] = "shakespeare"
    description: ClassVar[str] = "LEAF Shakespeare: next character by speaking role (JSON files, 80 symbols)"
    leaf_folder: ClassVar[str] = "shakespeare"

    def _convert(self, xs: list[Any], ys: list[Any], path: Path) -> tuple[np.ndarray, np.ndarray]:
        if not all(isinstance(s, str) and len(s) == 80 for s in xs):
            raise DataError(f"'{path}' holds an input that is not an 80-character string")
        if not all(isinstance(c, str) and len(c) == 1 for c in ys):
            raise DataError(f"'{path}' holds a label that is not a single character")
        return encode_chars(xs).reshape(-1, 80), encode_chars(ys)

    def stand_in(self, scale: float = 1.0) -> Dataset:  # LEAF: 4,226,158 lines of 1,129 roles
        return random_dataset(self.name, 4_226_158, (80,), len(ALL_LETTERS), scale, 1_129, len(ALL_LETTERS))

    def load(self, data_dir: Path, download: bool = False) -> Dataset:
        x, y, owner = self._records(data_dir)
        return Dataset(self.name, torch.from_numpy(x), torch.from_numpy(y), len(ALL_LETTERS), owner)


TOKEN = re.compile(r"[\w']+|[.,!?;]")  # LEAF's split_line (leaf/models/utils/language_utils.py)


def tokenize(text: str) -> list[str]:
    """Lower-cased words and the punctuation marks . , ! ? ; of a tweet, as LEAF splits them."""
    return TOKEN.findall(text.lower())


def read_glove(path: Path, vocabulary: set[str]) -> tuple[dict[str, np.ndarray], int]:
    """The vectors of the `vocabulary` words in a GloVe text file (``word v1 ... vd`` per line), and d."""
    vectors: dict[str, np.ndarray] = {}
    dim = 0
    try:
        with path.open(encoding="utf-8", errors="replace") as f:
            for number, line in enumerate(f, 1):
                parts = line.rstrip("\r\n ").split(" ")
                if dim == 0:
                    if len(parts) <= 2:  # blank line or a word2vec-style "count dim" header
                        continue
                    dim = len(parts) - 1
                if len(parts) < dim + 1:
                    raise DataError(f"'{path}' line {number} has {len(parts) - 1} numbers, expected {dim}")
                word = " ".join(parts[: len(parts) - dim])
                if word in vocabulary:
                    try:
                        vectors[word] = np.asarray(parts[len(parts) - dim :], dtype=np.float32)
                    except ValueError:
                        raise DataError(f"'{path}' line {number} holds a value that is not a number") from None
    except OSError as err:
        raise DataError(f"cannot read the GloVe file '{path}' ({err})") from None
    if dim == 0:
        raise DataError(
            f"'{path}' holds no word vectors; it should be a GloVe text file such as glove.twitter.27B.200d.txt"
        )
    return vectors, dim


def mean_embeddings(tokens: Sequence[list[str]] | np.ndarray, vectors: dict[str, np.ndarray], dim: int) -> np.ndarray:
    """Row i: the mean of the vectors of the words of `tokens[i]` found in `vectors` (zeros when none), float32."""
    words = sorted(vectors)
    index = {w: i for i, w in enumerate(words)}
    word_ids = array("q")
    counts = np.zeros(len(tokens), dtype=np.int64)
    for row, ws in enumerate(tokens):
        found = [index[w] for w in ws if w in index]
        counts[row] = len(found)
        word_ids.extend(found)
    table = np.stack([vectors[w] for w in words]) if words else np.zeros((0, dim), dtype=np.float32)
    weights = np.repeat(1.0 / np.maximum(counts, 1), counts).astype(np.float32)
    indptr = np.concatenate([[0], np.cumsum(counts)])
    averaging = sparse.csr_matrix((weights, np.frombuffer(word_ids, dtype=np.int64), indptr), (len(tokens), len(words)))
    return np.asarray(averaging @ table, dtype=np.float32).reshape(len(tokens), dim)


@DATASETS.register
class Sent140(_Leaf):
    """LEAF Sent140 (Go et al. 2009): tweet sentiment grouped by user. Each tweet (the 5th item of a LEAF
    sample) becomes the mean GloVe vector of its tokens found in the vocabulary (`tokenize`; a zero vector
    when none is), so the features are float32 (N, d)."""

    name: ClassVar[str] = "sent140"
    description: ClassVar[str] = "LEAF Sent140: tweet sentiment by user as mean GloVe vectors (JSON + GloVe, 2 classes)"
    leaf_folder: ClassVar[str] = "sent140"
    glove_file: str | None = Field(None, description="GloVe text file (default: <data_dir>/sent140/glove.txt)")

    def _convert(self, xs: list[Any], ys: list[Any], path: Path) -> tuple[np.ndarray, np.ndarray]:
        texts = np.empty(len(xs), dtype=object)
        for i, sample in enumerate(xs):
            if isinstance(sample, list) and len(sample) > 4:
                texts[i] = tokenize(str(sample[4]))
            elif isinstance(sample, str):
                texts[i] = tokenize(sample)
            else:
                raise DataError(f"'{path}' holds a sample that is neither a tweet string nor a LEAF record of 5 items")
        return texts, _check_labels(_int_labels(ys, path), 2, path)

    def stand_in(self, scale: float = 1.0) -> Dataset:
        # the 927 users with at least 50 tweets that MaxFL uses, about 80 tweets each (assumed), 200-d GloVe means
        return random_dataset(self.name, 927 * 80, (200,), 2, scale, users=927)

    def load(self, data_dir: Path, download: bool = False) -> Dataset:
        glove = Path(self.glove_file) if self.glove_file else data_dir / self.name / "glove.txt"
        if glove.exists() and not glove.is_file():
            raise not_a_file(glove)
        if not glove.is_file():
            raise DataError(
                f"missing GloVe file '{glove}': download glove.twitter.27B.zip from Stanford's GloVe page "
                "(https://nlp.stanford.edu/projects/glove/), unzip glove.twitter.27B.200d.txt and save it as that "
                "file, or point dataset.glove_file at it"
            )
        tokens, y, owner = self._records(data_dir)
        vectors, dim = read_glove(glove, {w for words in tokens for w in words})
        return Dataset(
            self.name, torch.from_numpy(mean_embeddings(tokens, vectors, dim)), torch.from_numpy(y), 2, owner
        )


MAX_INFERRED_CLASSES = 100_000  # a larger label is far more likely a corrupt file than a real class count


@DATASETS.register
class LeafSyntheticFiles(_Leaf):
    """LEAF's synthetic dataset read from its JSON files (the ``synthetic`` source generates it instead)."""

    name: ClassVar[str] = "leaf_synthetic"
    description: ClassVar[str] = "LEAF synthetic data from its JSON files (see 'synthetic' for the generator)"
    leaf_folder: ClassVar[str] = "synthetic"
    num_classes: int | None = Field(
        None, ge=2, description="number of classes (default: largest label + 1, at least 2)"
    )

    def _convert(self, xs: list[Any], ys: list[Any], path: Path) -> tuple[np.ndarray, np.ndarray]:
        labels = _int_labels(ys, path)
        if self.num_classes is not None:
            _check_labels(labels, self.num_classes, path)
        elif labels.size and labels.min() < 0:
            raise DataError(f"'{path}' holds negative labels")
        return _float_rows(xs, None, path), labels

    def load(self, data_dir: Path, download: bool = False) -> Dataset:
        x, y, owner = self._records(data_dir)
        classes = self.num_classes or max(int(y.max()) + 1, 2)
        if self.num_classes is None and classes > MAX_INFERRED_CLASSES:
            raise DataError(
                f"the LEAF files under '{data_dir / self.name}' hold label {classes - 1}; set dataset.num_classes "
                f"if the task really has more than {MAX_INFERRED_CLASSES} classes"
            )
        return Dataset(self.name, torch.from_numpy(x), torch.from_numpy(y), classes, owner)


# ---------------------------------------------------------------------------------------------- UCI Adult

ADULT_COLUMNS = (
    "age",
    "workclass",
    "fnlwgt",
    "education",
    "education-num",
    "marital-status",
    "occupation",
    "relationship",
    "race",
    "sex",
    "capital-gain",
    "capital-loss",
    "hours-per-week",
    "native-country",
    "income",
)
ADULT_NUMERIC = (0, 2, 4, 10, 11, 12)
ADULT_EDUCATION = ADULT_COLUMNS.index("education")
ADULT_URL = "https://archive.ics.uci.edu/ml/machine-learning-databases/adult"
ADULT_MAX_CATEGORIES = 1000  # the real files have at most 42 values per categorical column (native-country)


@DATASETS.register
class Adult(DatasetSource):
    """UCI Adult census income (``adult.data`` + ``adult.test``, 45,222 rows without missing values).

    Rows with a ``?`` are dropped. The features are the six numeric columns standardised over both files, then
    the eight categorical columns one-hot encoded (categories sorted), in `ADULT_COLUMNS` order; y = income > 50K.
    ``users`` is the domain of AFL and q-FFL: 1 for a doctorate (education = Doctorate), 0 otherwise. UCI
    publishes no checksums; the digests below (3,974,305 and 2,003,153 bytes) are those other projects' dataset
    registries pin for these two files.
    """

    name: ClassVar[str] = "adult"
    description: ClassVar[str] = "UCI Adult census income with PhD vs non-PhD domains (CSV files, 2 classes)"
    # md5: catboost/catboost, python-package/catboost/datasets.py (adult); sha256: GruAna/PreprocessData.jl,
    # src/datasets/tabular/adult.jl, and several other public registries that agree on both values.
    files: ClassVar[tuple[RemoteFile, ...]] = (
        RemoteFile(
            "adult.data",
            f"{ADULT_URL}/adult.data",
            md5="5d7c39d7b8804f071cdd1f2a7c460872",
            sha256="5b00264637dbfec36bdeaab5676b0b309ff9eb788d63554ca0a249491c86603d",
        ),
        RemoteFile(
            "adult.test",
            f"{ADULT_URL}/adult.test",
            md5="35238206dfdf7f1fe215bbb874adecdc",
            sha256="a2a9044bc167a35b2361efbabec64e89d69ce82d9790d2980119aac5fd7e9c05",
        ),
    )

    def _rows(self, path: Path) -> list[list[str]]:
        rows = []
        for number, line in enumerate(read_text(path).splitlines(), 1):
            if not line.strip() or line.startswith("|"):  # blank lines; adult.test opens with "|1x3 Cross validator"
                continue
            parts = [p.strip() for p in line.split(",")]
            if len(parts) != len(ADULT_COLUMNS):
                raise DataError(f"'{path}' line {number} has {len(parts)} fields, expected {len(ADULT_COLUMNS)}")
            if parts[-1].rstrip(".") not in (">50K", "<=50K"):
                raise DataError(f"'{path}' line {number} has income '{parts[-1]}', expected '>50K' or '<=50K'")
            if "?" not in parts:
                rows.append(parts)
        return rows

    def stand_in(self, scale: float = 1.0) -> Dataset:  # 45,222 complete rows, 6 numeric + 98 one-hot columns
        data = random_dataset(self.name, 45_222, (104,), 2, scale)
        phd = torch.rand(len(data), generator=torch.Generator().manual_seed(1)) < 0.012  # ≈ 1.2% doctorates
        return Dataset(self.name, data.x, data.y, 2, phd.long())

    def load(self, data_dir: Path, download: bool = False) -> Dataset:
        folder = data_dir / self.name
        hint = (
            "download adult.data and adult.test from the Adult page of the UCI Machine Learning Repository "
            "(https://archive.ics.uci.edu/dataset/2/adult) into that folder, or rerun with --download"
        )
        rows: list[list[str]] = []
        for remote in self.files:
            if download and not present(folder, remote.filename):
                fetch(remote, folder)
            path = find(folder, remote.filename, hint)
            verify_known(path, self.files)
            rows.extend(self._rows(path))
        if not rows:
            raise DataError(f"'{folder}/adult.data' and 'adult.test' hold no complete rows")
        table = np.asarray(rows, dtype=object)
        columns = []
        for c in ADULT_NUMERIC:
            try:
                values = table[:, c].astype(np.float64)
            except ValueError:
                raise DataError(
                    f"column '{ADULT_COLUMNS[c]}' in '{folder}' holds a value that is not a number"
                ) from None
            if not np.all(np.isfinite(values)):
                raise DataError(f"column '{ADULT_COLUMNS[c]}' in '{folder}' holds a value that is NaN or infinite")
            columns.append(((values - values.mean()) / (values.std() or 1.0))[:, None])
        for c in range(len(ADULT_COLUMNS) - 1):
            if c not in ADULT_NUMERIC:
                categories = np.asarray(sorted(set(table[:, c])), dtype=object)
                if len(categories) > ADULT_MAX_CATEGORIES:
                    raise DataError(
                        f"column '{ADULT_COLUMNS[c]}' in '{folder}' holds {len(categories)} different values, "
                        f"more than {ADULT_MAX_CATEGORIES}: these are not the UCI Adult files"
                    )
                columns.append((table[:, c][:, None] == categories[None, :]).astype(np.float64))
        x = torch.from_numpy(np.concatenate(columns, axis=1).astype(np.float32))
        y = torch.tensor([label.rstrip(".") == ">50K" for label in table[:, -1]], dtype=torch.long)
        users = torch.from_numpy((table[:, ADULT_EDUCATION] == "Doctorate").astype(np.int64))
        return Dataset(self.name, x, y, 2, users)
