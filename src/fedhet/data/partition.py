"""Partitioners: how a dataset's samples are split among clients."""

from __future__ import annotations

from abc import abstractmethod
from typing import ClassVar

import numpy as np
from pydantic import Field

from fedhet.errors import DataError
from fedhet.registry import Component, Registry


class Partitioner(Component):
    """Splits sample indices among `num_clients` clients.

    `split` returns one int64 index array per client (disjoint; their union need not be the whole dataset).
    It must terminate for every input and raise `fedhet.errors.DataError` with a clear message when the
    requested split is impossible.
    """

    @abstractmethod
    def split(
        self,
        labels: np.ndarray,
        num_clients: int,
        rng: np.random.Generator,
        users: np.ndarray | None = None,
    ) -> list[np.ndarray]: ...


PARTITIONERS: Registry[Partitioner] = Registry("partitioner")


def _sizes_from_weights(weights: np.ndarray, total: int, min_size: int, what: str) -> np.ndarray:
    """Integer client sizes ∝ `weights`, summing to `total`, each ≥ `min_size` (largest remainders)."""
    k = len(weights)
    if k * min_size > total:
        raise DataError(
            f"{what}: {k} clients × min_size {min_size} needs {k * min_size} samples but the dataset has {total}; "
            "lower min_size or the number of clients"
        )
    spare = total - k * min_size
    share = weights / weights.sum() * spare
    sizes = np.floor(share).astype(np.int64)
    remainder = spare - int(sizes.sum())
    sizes[np.argsort(share - sizes)[::-1][:remainder]] += 1
    return sizes + min_size


def _cut(indices: np.ndarray, sizes: np.ndarray) -> list[np.ndarray]:
    return [part.astype(np.int64) for part in np.split(indices, np.cumsum(sizes)[:-1])]


def _split_evenly(indices: np.ndarray, parts: int) -> list[np.ndarray]:
    return [p.astype(np.int64) for p in np.array_split(indices, parts)]


@PARTITIONERS.register
class IID(Partitioner):
    """Shuffle and split as evenly as possible."""

    name: ClassVar[str] = "iid"
    description: ClassVar[str] = "independent and identically distributed: a random even split"

    def split(
        self, labels: np.ndarray, num_clients: int, rng: np.random.Generator, users: np.ndarray | None = None
    ) -> list[np.ndarray]:
        if num_clients > len(labels):
            raise DataError(f"iid: {num_clients} clients but only {len(labels)} samples; use fewer clients")
        return _split_evenly(rng.permutation(len(labels)), num_clients)


@PARTITIONERS.register
class Dirichlet(Partitioner):
    """Label proportions per client from Dir(α) (Hsu et al. 2019), at least `min_size` samples per client.

    Each class is split among clients by proportions p ~ Dir(α·1). Draws are repeated (at most `retries`
    times) until every client has `min_size` samples; if none succeeds, samples move from the largest clients
    to the smallest (the largest client's most frequent class first), which keeps most of the skew and always
    terminates.
    """

    name: ClassVar[str] = "dirichlet"
    description: ClassVar[str] = "label skew: class proportions per client from Dirichlet(alpha)"
    alpha: float = Field(0.5, gt=0, description="concentration: small α, strong label skew")
    min_size: int = Field(10, ge=0, description="minimum number of samples per client")
    retries: int = Field(20, ge=1)

    def split(
        self, labels: np.ndarray, num_clients: int, rng: np.random.Generator, users: np.ndarray | None = None
    ) -> list[np.ndarray]:
        n = len(labels)
        if num_clients * self.min_size > n:
            raise DataError(
                f"dirichlet: {num_clients} clients × min_size {self.min_size} needs {num_clients * self.min_size} "
                f"samples but the dataset has {n}; lower partition.min_size or the number of clients"
            )
        classes = np.unique(labels)
        by_class = [rng.permutation(np.flatnonzero(labels == c)) for c in classes]
        owner = np.empty(n, dtype=np.int64)
        for _ in range(self.retries):
            for idx in by_class:
                p = rng.dirichlet(np.full(num_clients, self.alpha))
                counts = np.floor(p * len(idx)).astype(np.int64)
                counts[np.argsort(p * len(idx) - counts)[::-1][: len(idx) - int(counts.sum())]] += 1
                owner[idx] = np.repeat(np.arange(num_clients), counts)
            sizes = np.bincount(owner, minlength=num_clients)
            if sizes.min() >= self.min_size:
                break
        else:
            owner = self._repair(owner, labels, num_clients, rng)
        order = rng.permutation(n)
        return _group(owner, order, num_clients)

    def _repair(self, owner: np.ndarray, labels: np.ndarray, k: int, rng: np.random.Generator) -> np.ndarray:
        sizes = np.bincount(owner, minlength=k)
        for small in np.flatnonzero(sizes < self.min_size):
            while sizes[small] < self.min_size:
                big = int(np.argmax(sizes))
                rows = np.flatnonzero(owner == big)
                common = np.bincount(labels[rows]).argmax()
                pick = rows[labels[rows] == common]
                take = min(self.min_size - sizes[small], len(pick), sizes[big] - self.min_size)
                chosen = rng.choice(pick, size=take, replace=False)
                owner[chosen] = small
                sizes[big] -= take
                sizes[small] += take
        return owner


def _group(owner: np.ndarray, order: np.ndarray, k: int) -> list[np.ndarray]:
    """Indices of each client, in the shuffled `order` (one sort instead of k scans)."""
    shuffled_owner = owner[order]
    sort = np.argsort(shuffled_owner, kind="stable")
    counts = np.bincount(shuffled_owner, minlength=k)
    return _cut(order[sort], counts)


@PARTITIONERS.register
class Shards(Partitioner):
    """McMahan et al. (2017) "pathological" non-IID: sort by label, cut into equal shards, deal
    `shards_per_client` random shards to each client (FedMGDA+: 100 users × 5 shards)."""

    name: ClassVar[str] = "shards"
    description: ClassVar[str] = "pathological non-IID: each client gets a few shards of label-sorted data"
    shards_per_client: int = Field(2, ge=1)

    def split(
        self, labels: np.ndarray, num_clients: int, rng: np.random.Generator, users: np.ndarray | None = None
    ) -> list[np.ndarray]:
        shards = num_clients * self.shards_per_client
        if shards > len(labels):
            raise DataError(f"shards: {shards} shards but only {len(labels)} samples; lower shards_per_client")
        order = np.argsort(labels, kind="stable")
        pieces = _split_evenly(order, shards)
        deal = rng.permutation(shards).reshape(num_clients, self.shards_per_client)
        return [np.concatenate([pieces[s] for s in row]) for row in deal]


@PARTITIONERS.register
class LabelK(Partitioner):
    """Each client holds exactly k classes ("Label-k", FedGSNR's "Label 2"); classes are dealt so that each is
    used as evenly as possible, and a class's samples are split evenly among the clients holding it."""

    name: ClassVar[str] = "label_k"
    description: ClassVar[str] = "each client holds k classes (e.g. Label 2)"
    labels_per_client: int = Field(2, ge=1)

    def split(
        self, labels: np.ndarray, num_clients: int, rng: np.random.Generator, users: np.ndarray | None = None
    ) -> list[np.ndarray]:
        classes = np.unique(labels)
        k = self.labels_per_client
        if k > len(classes):
            raise DataError(f"label_k: {k} labels per client but the dataset has {len(classes)} classes")
        order = rng.permutation(classes)
        held = [[order[(i * k + j) % len(classes)] for j in range(k)] for i in range(num_clients)]
        holders: dict[int, list[int]] = {int(c): [] for c in classes}
        for client, cs in enumerate(held):
            for c in cs:
                holders[int(c)].append(client)
        parts: list[list[np.ndarray]] = [[] for _ in range(num_clients)]
        for c, owners in holders.items():
            if owners:
                for client, piece in zip(
                    owners, _split_evenly(rng.permutation(np.flatnonzero(labels == c)), len(owners)), strict=True
                ):
                    parts[client].append(piece)
        return [np.concatenate(p) for p in parts]


@PARTITIONERS.register
class LabelClusters(Partitioner):
    """MaxFL's cluster partition: clusters own disjoint label sets; clients are assigned to clusters at random
    (each cluster at least one client) and share their cluster's samples IID."""

    name: ClassVar[str] = "label_clusters"
    description: ClassVar[str] = "clusters of clients with disjoint label sets (MaxFL: 5 clusters x 2 labels)"
    num_clusters: int = Field(5, ge=1)
    labels_per_cluster: int = Field(2, ge=1)

    def split(
        self, labels: np.ndarray, num_clients: int, rng: np.random.Generator, users: np.ndarray | None = None
    ) -> list[np.ndarray]:
        classes = np.unique(labels)
        need = self.num_clusters * self.labels_per_cluster
        if need > len(classes):
            raise DataError(f"label_clusters: {need} labels needed but the dataset has {len(classes)} classes")
        if num_clients < self.num_clusters:
            raise DataError(f"label_clusters: {num_clients} clients for {self.num_clusters} clusters; use more clients")
        label_sets = rng.permutation(classes)[:need].reshape(self.num_clusters, self.labels_per_cluster)
        cluster_of = rng.permutation(np.arange(num_clients) % self.num_clusters)
        parts: list[np.ndarray] = [np.zeros(0, dtype=np.int64)] * num_clients
        for c in range(self.num_clusters):
            members = np.flatnonzero(cluster_of == c)
            rows = rng.permutation(np.flatnonzero(np.isin(labels, label_sets[c])))
            for client, piece in zip(members, _split_evenly(rows, len(members)), strict=True):
                parts[client] = piece
        return parts


class _QuantitySkew(Partitioner):
    """Client sizes from random weights (rescaled, each ≥ `min_size`); samples assigned IID."""

    min_size: int = Field(10, ge=0)

    def weights(self, num_clients: int, rng: np.random.Generator) -> np.ndarray:
        raise NotImplementedError

    def split(
        self, labels: np.ndarray, num_clients: int, rng: np.random.Generator, users: np.ndarray | None = None
    ) -> list[np.ndarray]:
        sizes = _sizes_from_weights(self.weights(num_clients, rng), len(labels), self.min_size, self.name)
        return _cut(rng.permutation(len(labels)), sizes)


@PARTITIONERS.register
class Pareto(_QuantitySkew):
    """Quantity skew with client sizes ∝ Pareto(shape) draws (FedGSNR App. D "Pareto")."""

    name: ClassVar[str] = "pareto"
    description: ClassVar[str] = "quantity skew: client sizes from a Pareto law, labels IID"
    shape: float = Field(1.0, gt=0, description="Pareto tail index (small: heavier skew)")

    def weights(self, num_clients: int, rng: np.random.Generator) -> np.ndarray:
        return rng.pareto(self.shape, num_clients) + 1.0


@PARTITIONERS.register
class NonBalance(_QuantitySkew):
    """Quantity skew with client sizes ∝ LogNormal(0, σ) draws (FedGSNR App. D "NonBalance"; the common
    "unbalanced" convention of NIID-Bench/FedLab)."""

    name: ClassVar[str] = "nonbalance"
    description: ClassVar[str] = "quantity skew: client sizes from a log-normal law, labels IID"
    sigma: float = Field(1.0, ge=0, description="log-normal σ (0: equal sizes)")

    def weights(self, num_clients: int, rng: np.random.Generator) -> np.ndarray:
        return rng.lognormal(0.0, self.sigma, num_clients)


@PARTITIONERS.register
class Natural(Partitioner):
    """One client per natural user (LEAF users, speaking roles, domains). With fewer clients than users, a
    random subset of the users with at least `min_size` samples is taken."""

    name: ClassVar[str] = "natural"
    description: ClassVar[str] = "one client per natural user of the dataset (LEAF users, roles, domains)"
    min_size: int = Field(0, ge=0)

    def split(
        self, labels: np.ndarray, num_clients: int, rng: np.random.Generator, users: np.ndarray | None = None
    ) -> list[np.ndarray]:
        if users is None:
            raise DataError("natural: this dataset has no natural users; choose another partitioner (e.g. dirichlet)")
        ids, counts = np.unique(users, return_counts=True)
        eligible = ids[counts >= self.min_size]
        if num_clients > len(eligible):
            raise DataError(
                f"natural: {num_clients} clients requested but the dataset has {len(eligible)} users with at least "
                f"{self.min_size} samples; set num_clients to at most {len(eligible)}"
            )
        chosen = eligible if num_clients == len(eligible) else np.sort(rng.choice(eligible, num_clients, replace=False))
        order = np.argsort(users, kind="stable")
        starts = np.searchsorted(users[order], chosen, side="left")
        ends = np.searchsorted(users[order], chosen, side="right")
        return [order[s:e].astype(np.int64) for s, e in zip(starts, ends, strict=True)]
