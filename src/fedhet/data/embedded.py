"""Datasets that need no file: generated (LEAF Synthetic) or shipped with an installed package (scikit-learn)."""

from __future__ import annotations

import importlib.util
from pathlib import Path
from typing import ClassVar

import numpy as np
import torch
from pydantic import Field

from fedhet.data.dataset import Dataset
from fedhet.data.sources import DATASETS, DatasetSource
from fedhet.errors import DataError
from fedhet.seeding import numpy_rng


def _sklearn_file(name: str) -> Path:
    """A data file scikit-learn ships (``sklearn/datasets/data/<name>``), found without importing scikit-learn
    (its import takes seconds; these files are plain CSV)."""
    spec = importlib.util.find_spec("sklearn")
    if spec is None or spec.origin is None:
        raise DataError(f"the embedded dataset needs scikit-learn, which ships {name}: pip install scikit-learn")
    path = Path(spec.origin).parent / "datasets" / "data" / name
    if not path.is_file():
        raise DataError(f"scikit-learn no longer ships {path}; install a scikit-learn that has it (>= 1.4)")
    return path


def _standardise(x: np.ndarray) -> np.ndarray:
    std = x.std(axis=0)
    return (x - x.mean(axis=0)) / np.where(std > 0, std, 1.0)


@DATASETS.register
class Digits(DatasetSource):
    """scikit-learn's bundled handwritten digits: 1,797 real 8×8 images, 10 classes."""

    name: ClassVar[str] = "digits"
    description: ClassVar[str] = "handwritten digits shipped with scikit-learn (1,797 real 8x8 images, 10 classes)"
    embedded: bool = True
    image: bool = Field(False, description="shape (1, 8, 8) instead of flat 64 features")

    def load(self, data_dir: Path, download: bool = False) -> Dataset:
        table = np.loadtxt(_sklearn_file("digits.csv.gz"), delimiter=",")  # 64 pixels (0..16), then the label
        x = torch.tensor(table[:, :-1] / 16.0, dtype=torch.float32)
        x = (x - x.mean()) / x.std()
        if self.image:
            x = x.reshape(-1, 1, 8, 8)
        return Dataset(self.name, x, torch.tensor(table[:, -1], dtype=torch.long), 10)


@DATASETS.register
class BreastCancer(DatasetSource):
    """scikit-learn's bundled Wisconsin breast-cancer table: 569 real samples, 30 features, 2 classes."""

    name: ClassVar[str] = "breast_cancer"
    description: ClassVar[str] = "Wisconsin breast cancer table shipped with scikit-learn (569 samples, 2 classes)"
    embedded: bool = True

    def load(self, data_dir: Path, download: bool = False) -> Dataset:
        # a header line (569,30,malignant,benign), then 30 features and the label (0 malignant, 1 benign)
        table = np.loadtxt(_sklearn_file("breast_cancer.csv"), delimiter=",", skiprows=1)
        x = torch.tensor(_standardise(table[:, :-1]), dtype=torch.float32)
        return Dataset(self.name, x, torch.tensor(table[:, -1], dtype=torch.long), 2)


@DATASETS.register
class LeafSynthetic(DatasetSource):
    """LEAF's Synthetic(α, β) generator (Li et al., FedProx 2020, §5.1; after Shamir et al.).

    User k draws u_k ~ N(0, α), B_k ~ N(0, β); W_k, b_k ~ N(u_k, 1); v_k ~ N(B_k, 1); x ~ N(v_k, Σ) with
    Σ_jj = j^-1.2; y = argmax softmax(W_k x + b_k). With ``iid`` every user shares one W, b and v = 0.
    Sample counts per user follow LEAF's log-normal law. The natural partition is by user.
    """

    name: ClassVar[str] = "synthetic"
    description: ClassVar[str] = "LEAF Synthetic(alpha, beta) generator, one natural user per client"
    embedded: bool = True
    alpha: float = Field(1.0, ge=0)
    beta: float = Field(1.0, ge=0)
    iid: bool = False
    num_users: int = Field(100, ge=1)
    dim: int = Field(60, ge=1)
    num_classes: int = Field(10, ge=2)
    mean_log_samples: float = 4.0
    min_samples: int = Field(50, ge=1)
    seed: int = 0

    def load(self, data_dir: Path, download: bool = False) -> Dataset:
        rng = numpy_rng(self.seed, "leaf-synthetic")
        sizes = rng.lognormal(self.mean_log_samples, 2.0, self.num_users).astype(int) + self.min_samples
        sizes = np.minimum(sizes, 5000)
        cov = np.array([(j + 1) ** -1.2 for j in range(self.dim)])
        w_shared = rng.normal(0, 1, (self.dim, self.num_classes))
        b_shared = rng.normal(0, 1, self.num_classes)
        xs, ys, users = [], [], []
        for k, n in enumerate(sizes):
            if self.iid:
                w, b, v = w_shared, b_shared, np.zeros(self.dim)
            else:
                u = rng.normal(0, np.sqrt(self.alpha))
                big_b = rng.normal(0, np.sqrt(self.beta))
                w = rng.normal(u, 1, (self.dim, self.num_classes))
                b = rng.normal(u, 1, self.num_classes)
                v = rng.normal(big_b, 1, self.dim)
            x = rng.normal(v, np.sqrt(cov), (n, self.dim))
            y = np.argmax(x @ w + b, axis=1)
            xs.append(x)
            ys.append(y)
            users.append(np.full(n, k))
        return Dataset(
            self.name,
            torch.tensor(np.concatenate(xs), dtype=torch.float32),
            torch.tensor(np.concatenate(ys), dtype=torch.long),
            self.num_classes,
            users=torch.tensor(np.concatenate(users), dtype=torch.long),
        )
