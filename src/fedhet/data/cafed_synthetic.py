"""CA-Fed's datasets (Rodio et al. 2023, Sec. V-A and Appendix F): two data groups of clients.

* ``cafed_synthetic`` (App. F): a shared w* ~ N(0, I_d); every client draws x ~ N(0, I_d); group-1 clients label
  y ~ Bernoulli(σ(⟨w*, x⟩)), group-2 clients y ~ Bernoulli(0.8 σ + 0.2 (1 − σ)) (20% label noise).
* ``swapped_groups`` (MNIST, after Sattler et al.): a base dataset shuffled into equal random client chunks;
  the chunks of the second group have two random pairs of labels swapped.

Both give every sample its client as natural user (``partition: natural``): clients 0..K/2−1 form group 1 and
the rest group 2, the layout that ``cafed_classes`` availability splits into classes. The data are generated
from their own `seed` (42 by default, the authors' data seed), so runs with different seeds share them.
"""

from __future__ import annotations

from pathlib import Path
from typing import ClassVar

import numpy as np
import torch
from pydantic import Field

from fedhet.data.dataset import Dataset
from fedhet.data.labels import LabelNoise, label_map
from fedhet.data.partition import block_groups
from fedhet.data.sources import DATASETS, DatasetSource
from fedhet.errors import ConfigError
from fedhet.seeding import numpy_rng


def sigmoid(z: np.ndarray) -> np.ndarray:
    return 1.0 / (1.0 + np.exp(-z))


@DATASETS.register
class CAFedSynthetic(DatasetSource):
    """App. F's binary task: clients of group 2 see 20% of their labels flipped in distribution.

    The paper draws each client's group from Bernoulli(1/2); here the first half of the clients is group 1
    and the second half group 2 (r_1 = r_2 = 1/2 exactly, Sec. V-A; the authors' code does the same).
    ``samples`` per client are drawn; the run's ``test_fraction`` keeps a share of them for testing.
    """

    name: ClassVar[str] = "cafed_synthetic"
    description: ClassVar[str] = "CA-Fed App. F synthetic binary task: two client groups, 20% label noise in one"
    embedded: bool = True
    clients: int = Field(24, ge=2, description="number of clients (natural users)")
    dim: int = Field(10, ge=1, description="input dimension d")
    samples: int = Field(200, ge=2, description="samples per client (train + test)")
    noise: float = Field(0.2, ge=0, le=1, description="label-flip probability of group 2")
    groups: int = Field(2, ge=1, description="data groups (contiguous client blocks); the last one is noisy")
    seed: int = Field(42, description="data seed")

    def group_of_clients(self) -> np.ndarray:
        return block_groups(self.clients, self.groups)

    def load(self, data_dir: Path, download: bool = False) -> Dataset:
        rng = numpy_rng(self.seed, "cafed-synthetic")
        w_star = rng.normal(0.0, 1.0, self.dim)
        x = rng.normal(0.0, 1.0, (self.clients, self.samples, self.dim))
        prob = sigmoid(x @ w_star)
        noisy = (self.group_of_clients() == self.groups - 1) & (self.groups > 1)
        prob = np.where(noisy[:, None], (1 - self.noise) * prob + self.noise * (1 - prob), prob)
        y = (rng.random(prob.shape) < prob).astype(np.int64)
        users = np.repeat(np.arange(self.clients), self.samples)
        return Dataset(
            self.name,
            torch.tensor(x.reshape(-1, self.dim), dtype=torch.float32),
            torch.tensor(y.reshape(-1)),
            2,
            users=torch.tensor(users),
        )


@DATASETS.register
class SwappedGroups(DatasetSource):
    """A base dataset in equal random client chunks; the clients of the `swapped` groups (default: the second
    one, as in the paper) have `pairs` random label pairs swapped, each group its own pairs (the authors' code
    swaps in both groups: ``swapped: [0, 1]``). Labels are swapped in train and test data alike.
    """

    name: ClassVar[str] = "swapped_groups"
    description: ClassVar[str] = "base dataset in random equal client chunks, label pairs swapped in some groups"
    base: str = Field("mnist", description="the dataset to split (e.g. mnist, or the embedded digits)")
    clients: int = Field(24, ge=2, description="number of clients (natural users)")
    groups: int = Field(2, ge=1, description="data groups: contiguous blocks of client ids")
    swapped: list[int] = Field(default_factory=lambda: [1], description="groups whose labels are swapped")
    pairs: int = Field(2, ge=0, description="random label pairs swapped per swapped group")
    seed: int = Field(42, description="data seed (chunks and swapped pairs)")

    def base_source(self) -> DatasetSource:
        spec = {"name": self.base, "flatten": True} if self.base in ("mnist", "fashion_mnist") else self.base
        return DATASETS.build(spec, where="dataset.base")

    def swap_tables(self, num_classes: int) -> dict[int, np.ndarray]:
        """Group → class table (identity except the swapped pairs)."""
        rng = numpy_rng(self.seed, "swapped-groups-pairs")
        tables: dict[int, np.ndarray] = {}
        for g in sorted(set(self.swapped)):
            if not 0 <= g < self.groups:
                raise ConfigError(f"dataset.swapped: group {g} does not exist (groups 0..{self.groups - 1})")
            if 2 * self.pairs > num_classes:
                raise ConfigError(f"dataset.pairs: {self.pairs} disjoint pairs need {2 * self.pairs} classes")
            pairs = [(int(a), int(b)) for a, b in rng.choice(num_classes, size=(self.pairs, 2), replace=False)]
            table = label_map(LabelNoise(mapping="pairs", pairs=pairs), num_classes, rng)
            assert table is not None
            tables[g] = table.numpy()
        return tables

    def load(self, data_dir: Path, download: bool = False) -> Dataset:
        return self._swap(self.base_source().load(data_dir, download))

    def stand_in(self, scale: float = 1.0) -> Dataset | None:
        base = self.base_source().stand_in(scale)
        return None if base is None else self._swap(base)

    def _swap(self, data: Dataset) -> Dataset:
        rng = numpy_rng(self.seed, "swapped-groups")
        users = np.empty(len(data), dtype=np.int64)
        for k, chunk in enumerate(np.array_split(rng.permutation(len(data)), self.clients)):
            users[chunk] = k
        group = block_groups(self.clients, self.groups)[users]
        y = data.y.numpy().copy()
        for g, table in self.swap_tables(data.num_classes).items():
            rows = group == g
            y[rows] = table[y[rows]]
        return Dataset(f"{data.name}-swapped", data.x, torch.tensor(y), data.num_classes, users=torch.tensor(users))
