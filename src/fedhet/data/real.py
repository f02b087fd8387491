"""Real datasets from their standard files in ``data_dir/<name>/``; ``--download`` fetches missing files.

The whole dataset (official train and test parts together) is loaded; fedhet makes its own per-client
train/test split. Set ``FEDHET_MIRROR`` to a base URL to download from a mirror instead.
"""

from __future__ import annotations

import re
import tarfile
import zipfile
from pathlib import Path
from typing import ClassVar, Literal

import numpy as np
import torch
from pydantic import Field

from fedhet.data.dataset import Dataset
from fedhet.data.files import download, find, read_idx, read_json, read_pickle
from fedhet.data.sources import DATASETS, DatasetSource
from fedhet.errors import DataError

MNIST_FILES = ("train-images-idx3-ubyte", "train-labels-idx1-ubyte", "t10k-images-idx3-ubyte", "t10k-labels-idx1-ubyte")


def _images(
    images: list[np.ndarray], labels: list[np.ndarray], name: str, classes: int, mean: float, std: float, flatten: bool
) -> Dataset:
    x = torch.tensor(np.concatenate(images), dtype=torch.float32).div_(255.0).sub_(mean).div_(std)
    x = x.reshape(len(x), -1) if flatten else x.reshape(len(x), 1, 28, 28)
    y = torch.tensor(np.concatenate(labels).astype(np.int64))
    if len(x) != len(y):
        raise DataError(f"{name}: {len(x)} images but {len(y)} labels; the files do not belong together")
    return Dataset(name, x, y, classes)


class _IDXDataset(DatasetSource):
    """MNIST-style IDX files (optionally .gz)."""

    url: ClassVar[str] = ""
    md5: ClassVar[dict[str, str]] = {}
    mean: ClassVar[float] = 0.0
    std: ClassVar[float] = 1.0
    flatten: bool = Field(False, description="flat 784 features instead of (1, 28, 28) images")

    def load(self, data_dir: Path, download: bool = False) -> Dataset:
        folder = data_dir / self.name
        hint = f"download the four IDX files into '{folder}' or rerun with --download"
        if download:
            for f in MNIST_FILES:
                if not (folder / f).is_file() and not (folder / f"{f}.gz").is_file():
                    fetch(f"{self.url}/{f}.gz", folder / f"{f}.gz", md5=self.md5.get(f))
        paths = [find(folder, f, hint) for f in MNIST_FILES]
        arrays = [read_idx(p) for p in paths]
        return _images([arrays[0], arrays[2]], [arrays[1], arrays[3]], self.name, 10, self.mean, self.std, self.flatten)


def fetch(url: str, dest: Path, md5: str | None = None) -> Path:
    return download(url, dest, md5=md5)


@DATASETS.register
class MNIST(_IDXDataset):
    name: ClassVar[str] = "mnist"
    description: ClassVar[str] = "MNIST handwritten digits (IDX files; 70,000 images, 10 classes)"
    url: ClassVar[str] = "https://ossci-datasets.s3.amazonaws.com/mnist"
    md5: ClassVar[dict[str, str]] = {
        "train-images-idx3-ubyte": "f68b3c2dcbeaaa9fbdd348bbdeb94873",
        "train-labels-idx1-ubyte": "d53e105ee54ea40749a09fcbcd1e9432",
        "t10k-images-idx3-ubyte": "9fb629c4189551a2d022fa330f9573f3",
        "t10k-labels-idx1-ubyte": "ec29112dd5afa0611ce80d1b7f02629c",
    }
    mean: ClassVar[float] = 0.1307
    std: ClassVar[float] = 0.3081


@DATASETS.register
class FashionMNIST(_IDXDataset):
    name: ClassVar[str] = "fashion_mnist"
    description: ClassVar[str] = "Fashion-MNIST clothing images (IDX files; 70,000 images, 10 classes)"
    url: ClassVar[str] = "http://fashion-mnist.s3-website.eu-central-1.amazonaws.com"
    md5: ClassVar[dict[str, str]] = {
        "train-images-idx3-ubyte": "8d4fb7e6c68d591d4c3dfef9ec88bf0d",
        "train-labels-idx1-ubyte": "25c81989df183df01b3e8a0aad5dffbe",
        "t10k-images-idx3-ubyte": "bef4ecab320f06d8554ea6380940ec79",
        "t10k-labels-idx1-ubyte": "bb300cfdad3c16e7a12a480ee83cd310",
    }
    mean: ClassVar[float] = 0.2860
    std: ClassVar[float] = 0.3530


EMNIST_CLASSES = {"byclass": 62, "bymerge": 47, "balanced": 47, "letters": 26, "digits": 10, "mnist": 10}


@DATASETS.register
class EMNIST(DatasetSource):
    """EMNIST (Cohen et al. 2017) from ``emnist-<split>-{train,test}-{images-idx3,labels-idx1}-ubyte[.gz]``.
    Images are stored transposed and are turned upright; ``letters`` labels 1–26 become 0–25."""

    name: ClassVar[str] = "emnist"
    description: ClassVar[str] = "EMNIST letters and digits (IDX files; byclass has 62 classes)"
    url: ClassVar[str] = "https://biometrics.nist.gov/cs_links/EMNIST/gzip.zip"
    split: Literal["byclass", "bymerge", "balanced", "letters", "digits", "mnist"] = "byclass"
    flatten: bool = False

    def load(self, data_dir: Path, download: bool = False) -> Dataset:
        folder = data_dir / self.name
        names = [
            f"emnist-{self.split}-{part}-{kind}-ubyte"
            for part in ("train", "test")
            for kind in ("images-idx3", "labels-idx1")
        ]
        if download and not all((folder / n).is_file() or (folder / f"{n}.gz").is_file() for n in names):
            archive = fetch(self.url, folder / "gzip.zip", md5="58c8d27c78d21e728a6bc7b3cc06412e")
            with zipfile.ZipFile(archive) as z:
                for member in z.namelist():
                    if Path(member).name in {f"{n}.gz" for n in names}:
                        (folder / Path(member).name).write_bytes(z.read(member))
        hint = (
            f"download EMNIST's gzip.zip from NIST and unpack the {self.split} IDX files into '{folder}', "
            "or use --download"
        )
        arrays = [read_idx(find(folder, n, hint)) for n in names]
        images = [np.ascontiguousarray(a.transpose(0, 2, 1)) for a in (arrays[0], arrays[2])]
        labels = [arrays[1], arrays[3]]
        if self.split == "letters":
            labels = [lab.astype(np.int64) - 1 for lab in labels]
        return _images(images, labels, self.name, EMNIST_CLASSES[self.split], 0.1736, 0.3317, self.flatten)


@DATASETS.register
class CIFAR10(DatasetSource):
    """CIFAR-10 python batches (``data_batch_1..5``, ``test_batch``) in ``cifar10/`` or
    ``cifar10/cifar-10-batches-py/``; normalised per channel."""

    name: ClassVar[str] = "cifar10"
    description: ClassVar[str] = "CIFAR-10 colour images (python pickle batches; 60,000 images, 10 classes)"
    url: ClassVar[str] = "https://www.cs.toronto.edu/~kriz/cifar-10-python.tar.gz"
    mean: ClassVar[tuple[float, float, float]] = (0.4914, 0.4822, 0.4465)
    std: ClassVar[tuple[float, float, float]] = (0.2470, 0.2435, 0.2616)

    def load(self, data_dir: Path, download: bool = False) -> Dataset:
        root = data_dir / self.name
        folder = root / "cifar-10-batches-py" if (root / "cifar-10-batches-py").is_dir() else root
        names = [f"data_batch_{i}" for i in range(1, 6)] + ["test_batch"]
        if download and not all((folder / n).is_file() for n in names):
            archive = fetch(self.url, root / "cifar-10-python.tar.gz", md5="c58f30108f718f92721af3b95e74349a")
            with tarfile.open(archive) as tar:
                tar.extractall(root, filter="data")
            folder = root / "cifar-10-batches-py"
        hint = (
            f"download cifar-10-python.tar.gz (Krizhevsky's CIFAR page) and unpack it into '{root}', or use --download"
        )
        xs, ys = [], []
        for n in names:
            batch = read_pickle(find(folder, n, hint))
            try:
                xs.append(np.asarray(batch[b"data"], dtype=np.uint8).reshape(-1, 3, 32, 32))
                ys.append(np.asarray(batch[b"labels"], dtype=np.int64))
            except (KeyError, ValueError) as err:
                raise DataError(f"'{folder / n}' is not a CIFAR-10 batch ({err})") from None
        x = torch.tensor(np.concatenate(xs), dtype=torch.float32).div_(255.0)
        x = (x - torch.tensor(self.mean).view(1, 3, 1, 1)) / torch.tensor(self.std).view(1, 3, 1, 1)
        return Dataset(self.name, x, torch.tensor(np.concatenate(ys)), 10)


SHAKESPEARE_LETTERS = "\n !\"&'(),-.0123456789:;>?ABCDEFGHIJKLMNOPQRSTUVWXYZ[]abcdefghijklmnopqrstuvwxyz}"


def encode_chars(text: str) -> list[int]:
    """LEAF's 80-character vocabulary; unknown characters map to the space."""
    space = SHAKESPEARE_LETTERS.index(" ")
    return [SHAKESPEARE_LETTERS.find(c) if c in SHAKESPEARE_LETTERS else space for c in text]


class _LeafDataset(DatasetSource):
    """LEAF JSON files (``users``, ``num_samples``, ``user_data``) anywhere under ``data_dir/<name>/``;
    train/ and test/ parts of the same user are merged. ``users`` holds each sample's user."""

    def _records(self, data_dir: Path) -> tuple[list[object], list[object], np.ndarray]:
        folder = data_dir / self.name
        files = sorted(folder.rglob("*.json")) if folder.is_dir() else []
        if not files:
            raise DataError(
                f"missing dataset files: no LEAF JSON under '{folder}'; generate them with LEAF's "
                f"data/{self.name.replace('leaf_', '')}/preprocess.sh and copy the JSON files there"
            )
        per_user: dict[str, tuple[list[object], list[object]]] = {}
        for path in files:
            data = read_json(path)
            if "user_data" not in data:
                raise DataError(f"'{path}' is not a LEAF file (no 'user_data')")
            for user, samples in data["user_data"].items():
                xs, ys = per_user.setdefault(str(user), ([], []))
                xs.extend(samples["x"])
                ys.extend(samples["y"])
        users = sorted(per_user)
        x = [v for u in users for v in per_user[u][0]]
        y = [v for u in users for v in per_user[u][1]]
        owner = np.repeat(np.arange(len(users)), [len(per_user[u][1]) for u in users])
        return x, y, owner


@DATASETS.register
class FEMNIST(_LeafDataset):
    name: ClassVar[str] = "femnist"
    description: ClassVar[str] = "LEAF FEMNIST: handwritten characters by writer (JSON, 62 classes)"

    def load(self, data_dir: Path, download: bool = False) -> Dataset:
        x, y, owner = self._records(data_dir)
        images = torch.tensor(np.asarray(x, dtype=np.float32)).reshape(-1, 1, 28, 28)
        return Dataset(self.name, images, torch.tensor(np.asarray(y, dtype=np.int64)), 62, torch.tensor(owner))


@DATASETS.register
class Shakespeare(_LeafDataset):
    name: ClassVar[str] = "shakespeare"
    description: ClassVar[str] = "LEAF Shakespeare: next character by speaking role (JSON, 80 symbols)"

    def load(self, data_dir: Path, download: bool = False) -> Dataset:
        x, y, owner = self._records(data_dir)
        tokens = torch.tensor([encode_chars(str(s)) for s in x], dtype=torch.long)
        targets = torch.tensor([encode_chars(str(c))[0] for c in y], dtype=torch.long)
        return Dataset(self.name, tokens, targets, len(SHAKESPEARE_LETTERS), torch.tensor(owner))


@DATASETS.register
class Sent140(_LeafDataset):
    """LEAF Sent140 tweets by user; each tweet is the mean GloVe vector of its known words."""

    name: ClassVar[str] = "sent140"
    description: ClassVar[str] = "LEAF Sent140: tweet sentiment by user, averaged GloVe embeddings (JSON + GloVe)"
    glove_file: str | None = Field(None, description="GloVe text file (default: data_dir/sent140/glove.txt)")

    def load(self, data_dir: Path, download: bool = False) -> Dataset:
        glove = Path(self.glove_file) if self.glove_file else data_dir / self.name / "glove.txt"
        if not glove.is_file():
            raise DataError(
                f"missing GloVe file '{glove}': download glove.twitter.27B (Stanford NLP GloVe page), and pass the "
                "200-d file with --set dataset.glove_file=PATH"
            )
        vectors: dict[str, np.ndarray] = {}
        for line in glove.read_text(errors="replace").splitlines():
            parts = line.rstrip().split(" ")
            if len(parts) > 2:
                vectors[parts[0]] = np.asarray(parts[1:], dtype=np.float32)
        if not vectors:
            raise DataError(f"'{glove}' holds no word vectors")
        dim = len(next(iter(vectors.values())))
        x, y, owner = self._records(data_dir)
        rows = []
        for sample in x:
            text = str(sample[4]) if isinstance(sample, list) and len(sample) > 4 else str(sample)
            found = [vectors[w] for w in re.findall(r"[a-z0-9']+", text.lower()) if w in vectors]
            rows.append(np.mean(found, axis=0) if found else np.zeros(dim, dtype=np.float32))
        labels = torch.tensor(np.asarray(y, dtype=np.float64).astype(np.int64))
        return Dataset(self.name, torch.tensor(np.stack(rows)), labels, 2, torch.tensor(owner))


@DATASETS.register
class LeafSyntheticFiles(_LeafDataset):
    name: ClassVar[str] = "leaf_synthetic"
    description: ClassVar[str] = "LEAF synthetic data from its JSON files (see 'synthetic' for the generator)"
    num_classes: int | None = Field(None, ge=2)

    def load(self, data_dir: Path, download: bool = False) -> Dataset:
        x, y, owner = self._records(data_dir)
        labels = np.asarray(y, dtype=np.int64)
        classes = self.num_classes or int(labels.max()) + 1
        return Dataset(
            self.name, torch.tensor(np.asarray(x, dtype=np.float32)), torch.tensor(labels), classes, torch.tensor(owner)
        )


ADULT_COLUMNS = 15
ADULT_NUMERIC = (0, 2, 4, 10, 11, 12)
ADULT_EDUCATION = 3


@DATASETS.register
class Adult(DatasetSource):
    """UCI Adult (``adult.data``, ``adult.test``): one-hot categoricals, standardised numbers, label
    income > 50K; ``users`` is the domain PhD (education = Doctorate) vs the rest (AFL, q-FFL)."""

    name: ClassVar[str] = "adult"
    description: ClassVar[str] = "UCI Adult census income, PhD vs non-PhD domains (CSV files, 2 classes)"
    url: ClassVar[str] = "https://archive.ics.uci.edu/ml/machine-learning-databases/adult"

    def load(self, data_dir: Path, download: bool = False) -> Dataset:
        folder = data_dir / self.name
        rows: list[list[str]] = []
        for name in ("adult.data", "adult.test"):
            if download and not (folder / name).is_file():
                fetch(f"{self.url}/{name}", folder / name)
            path = find(folder, name, f"download adult.data and adult.test (UCI repository) into '{folder}'")
            for line in path.read_text(errors="replace").splitlines():
                parts = [p.strip() for p in line.split(",")]
                if len(parts) != ADULT_COLUMNS or "?" in parts:
                    continue
                rows.append(parts)
        if not rows:
            raise DataError(f"no usable rows in '{folder}/adult.data' and 'adult.test'")
        table = np.asarray(rows, dtype=object)
        columns = []
        for c in range(ADULT_COLUMNS - 1):
            if c in ADULT_NUMERIC:
                values = table[:, c].astype(np.float64)
                columns.append(((values - values.mean()) / (values.std() or 1.0))[:, None])
            else:
                categories = sorted(set(table[:, c]))
                columns.append((table[:, c][:, None] == np.asarray(categories)[None, :]).astype(np.float64))
        x = torch.tensor(np.concatenate(columns, axis=1), dtype=torch.float32)
        y = torch.tensor([1 if ">50K" in v else 0 for v in table[:, -1]], dtype=torch.long)
        users = torch.tensor((table[:, ADULT_EDUCATION] == "Doctorate").astype(np.int64))
        return Dataset(self.name, x, y, 2, users)
