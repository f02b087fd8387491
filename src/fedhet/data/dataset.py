"""In-memory datasets and their federated layout.

A `Dataset` is a whole dataset as two tensors. A `FederatedData` holds every client's samples concatenated in
one contiguous tensor (sorted by client, with offsets), so the engine gathers mini-batches for many clients
with one indexing operation and evaluates all clients in a few large batches.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from functools import cached_property

import torch
from torch import Tensor


@dataclass(frozen=True)
class Dataset:
    """A whole dataset: inputs `x` (float features or long tokens) and integer labels `y` (or, for a regression
    task, float targets (N,) or (N, d) with `num_classes` = d).

    `users` optionally gives each sample's natural owner (LEAF users, speaking roles, domains) as ids 0..U−1; the
    `natural` partitioner uses it; `user_names` names them (a table's site or user column). `task` is the task the
    data is for (`fedhet.engine.task`: ``classification``, ``binary``, ``regression``), which a run takes unless its
    config names another.
    """

    name: str
    x: Tensor
    y: Tensor
    num_classes: int
    users: Tensor | None = None
    task: str = "classification"
    user_names: tuple[str, ...] | None = None

    def __post_init__(self) -> None:
        if len(self.x) != len(self.y):
            raise ValueError(f"{self.name}: {len(self.x)} inputs but {len(self.y)} labels")

    def __len__(self) -> int:
        return len(self.y)

    @property
    def input_shape(self) -> tuple[int, ...]:
        return tuple(self.x.shape[1:])


@dataclass(frozen=True)
class ClientData:
    """Samples of many clients, concatenated client after client; client k owns rows offsets[k]:offsets[k+1]."""

    x: Tensor
    y: Tensor
    offsets: Tensor  # (K + 1,) int64, offsets[0] == 0

    @staticmethod
    def from_parts(xs: list[Tensor], ys: list[Tensor]) -> ClientData:
        sizes = torch.tensor([len(y) for y in ys], dtype=torch.long)
        offsets = torch.cat([torch.zeros(1, dtype=torch.long), sizes.cumsum(0)])
        return ClientData(torch.cat(xs).contiguous(), torch.cat(ys).contiguous(), offsets)

    @property
    def num_clients(self) -> int:
        return len(self.offsets) - 1

    @cached_property
    def sizes(self) -> Tensor:
        """Each client's number of rows (K,), computed once (a round reads it for its cohort only)."""
        return self.offsets[1:] - self.offsets[:-1]

    @property
    def owner(self) -> Tensor:
        """The client index of every row (N,)."""
        return torch.repeat_interleave(torch.arange(self.num_clients), self.sizes)

    def client(self, k: int) -> tuple[Tensor, Tensor]:
        lo, hi = int(self.offsets[k]), int(self.offsets[k + 1])
        return self.x[lo:hi], self.y[lo:hi]

    def select(self, clients: Tensor) -> ClientData:
        """The data of `clients` only, in that order (one gather of their rows)."""
        clients = torch.as_tensor(clients, dtype=torch.long).reshape(-1)
        sizes = self.offsets[clients + 1] - self.offsets[clients]
        offsets = torch.cat([torch.zeros(1, dtype=torch.long), sizes.cumsum(0)])
        rows = torch.arange(int(offsets[-1])) + torch.repeat_interleave(self.offsets[clients] - offsets[:-1], sizes)
        return ClientData(self.x.index_select(0, rows), self.y.index_select(0, rows), offsets)  # faster than x[rows]


@dataclass(frozen=True)
class TargetScale:
    """How a regression's targets were standardised for training: y' = (y − mean) / scale, with `mean` (d,) each
    target column's and one `scale` s for every column (the root of their mean variance: a column's std when
    there is one). The training loss is then the squared error in the targets' units divided by s², so a model
    minimises the same error, better conditioned; a loss in the targets' units is s² times the standardised one,
    an MAE or RMSE s times, R² the same (`fedhet.engine.task.Task.target_powers`)."""

    mean: Tensor  # (d,)
    scale: float

    def original(self, y: Tensor) -> Tensor:
        """Standardised targets or predictions (..., d) or (N,) back in the targets' units."""
        return y * self.scale + self.mean.to(y.dtype)


@dataclass
class FederatedData:
    """Every client's train, test and (optionally) validation data, and which clients take part in training (seen)
    or not (unseen)."""

    name: str
    train: ClientData
    test: ClientData
    num_classes: int
    seen: Tensor  # (K,) bool: True for clients that may be sampled for training
    info: dict[str, Tensor] = field(default_factory=dict)  # per-client tags, e.g. "flipped" (K,) bool
    val: ClientData | None = None  # each client's validation samples (``val_fraction``; None: no validation split)
    task: str = "classification"  # the dataset's task (`Dataset.task`)
    client_names: tuple[str, ...] | None = None  # each client's user (site) name, when a client is one user
    target_scale: TargetScale | None = None  # regression targets standardised for training (None: as given)

    def __post_init__(self) -> None:
        if self.train.num_clients != self.test.num_clients or len(self.seen) != self.train.num_clients:
            raise ValueError("train, test and seen must describe the same clients")
        if self.val is not None and self.val.num_clients != self.train.num_clients:
            raise ValueError("the validation data must describe the same clients as train and test")

    @property
    def num_clients(self) -> int:
        return self.train.num_clients

    @property
    def seen_ids(self) -> Tensor:
        return torch.nonzero(self.seen).flatten()

    @property
    def unseen_ids(self) -> Tensor:
        return torch.nonzero(~self.seen).flatten()

    @property
    def input_shape(self) -> tuple[int, ...]:
        return tuple(self.train.x.shape[1:])

    @property
    def input_is_tokens(self) -> bool:
        return not torch.is_floating_point(self.train.x)

    def summary(self) -> dict[str, float]:
        sizes = self.train.sizes.double()
        return {
            "clients": float(self.num_clients),
            "seen_clients": float(self.seen.sum()),
            "train_samples": float(sizes.sum()),
            "test_samples": float(self.test.sizes.sum()),
            **({"val_samples": float(self.val.sizes.sum())} if self.val is not None else {}),
            "min_train_per_client": float(sizes.min()),
            "max_train_per_client": float(sizes.max()),
        }
