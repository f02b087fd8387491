"""Partitioners: how a dataset's samples are split among clients.

Every partitioner is deterministic given its `numpy.random.Generator` and returns one int64 index array per
client; the arrays are disjoint. Impossible requests raise `fedhet.errors.DataError` with a one-line message.
"""

from __future__ import annotations

from abc import abstractmethod
from typing import ClassVar, Literal

import numpy as np
from pydantic import Field, field_validator

from fedhet.errors import ConfigError, DataError
from fedhet.registry import Component, Registry


class Partitioner(Component):
    """Splits sample indices among `num_clients` clients.

    `split` returns one int64 index array per client (disjoint; their union need not be the whole dataset).
    It must terminate for every input and raise `fedhet.errors.DataError` with a clear message when the
    requested split is impossible. `by_label`: whether it splits by class (a regression dataset has none).
    """

    by_label: ClassVar[bool] = True

    @abstractmethod
    def split(
        self,
        labels: np.ndarray,
        num_clients: int,
        rng: np.random.Generator,
        users: np.ndarray | None = None,
    ) -> list[np.ndarray]: ...


PARTITIONERS: Registry[Partitioner] = Registry("partitioner")


def block_groups(count: int, groups: int) -> np.ndarray:
    """Group of each of `count` items cut into `groups` contiguous blocks of (nearly) equal size.

    The layout shared by the CA-Fed datasets (clients 0..K/2−1 form data group 1, the rest group 2) and by
    ``cafed_classes`` / ``markov_clusters``, which split each group into availability classes.
    """
    if groups < 1 or groups > count:
        raise ConfigError(f"cannot cut {count} clients into {groups} groups")
    out = np.empty(count, dtype=np.int64)
    for g, block in enumerate(np.array_split(np.arange(count), groups)):
        out[block] = g
    return out


# ----------------------------------------------------------------------------------------------------------------
# Shared helpers
# ----------------------------------------------------------------------------------------------------------------


def _check_clients(num_clients: int, what: str) -> None:
    if num_clients < 1:
        raise DataError(f"{what}: the number of clients must be at least 1 (got {num_clients})")


def _check_room(num_clients: int, min_size: int, total: int, what: str) -> None:
    """Raise when `num_clients` clients of at least `min_size` samples cannot fit in `total` samples."""
    if num_clients * min_size > total:
        raise DataError(
            f"{what}: {num_clients} clients × min_size {min_size} needs {num_clients * min_size} samples but the "
            f"dataset has {total}; lower partition.min_size or the number of clients"
        )


def _round_shares(proportions: np.ndarray, totals: np.ndarray | int) -> np.ndarray:
    """Integer counts ≈ `proportions` × `totals` along the last axis, summing exactly to `totals`.

    Cuts at the rounded cumulative proportions (the usual "split by cumulative proportions"), so every count is
    within one of its exact share, and exact shares (e.g. equal weights) come out exactly despite float error.
    Works on one vector or on a (rows, k) matrix with one total per row.
    """
    totals_arr = np.asarray(totals, dtype=np.int64)
    cum = np.rint(np.cumsum(proportions, axis=-1) * totals_arr[..., None]).astype(np.int64)
    cum = np.minimum(cum, totals_arr[..., None])
    cum[..., -1] = totals_arr
    return np.diff(cum, axis=-1, prepend=0)


def _sizes_from_log_weights(log_weights: np.ndarray, total: int, min_size: int, what: str) -> np.ndarray:
    """Client sizes: `min_size` each plus the rest of `total` shared ∝ exp(`log_weights`); they sum to `total`.

    Working with log-weights keeps heavy tails (e.g. Pareto with a tiny index) free of overflow.
    """
    _check_room(len(log_weights), min_size, total, what)
    weights = np.exp(log_weights - log_weights.max())
    return _round_shares(weights / weights.sum(), total - len(log_weights) * min_size) + min_size


def _cut(indices: np.ndarray, sizes: np.ndarray) -> list[np.ndarray]:
    """Consecutive pieces of `indices` with the given `sizes` (as int64 arrays)."""
    return [part.astype(np.int64) for part in np.split(indices, np.cumsum(sizes)[:-1])]


def _split_evenly(indices: np.ndarray, parts: int) -> list[np.ndarray]:
    """`parts` consecutive pieces of `indices` whose sizes differ by at most one."""
    return [p.astype(np.int64) for p in np.array_split(indices, parts)]


def _by_class(labels: np.ndarray, rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(class index of each sample, all indices grouped by class and shuffled within, samples per class).

    Class indices are 0..C-1 in the order of `np.unique(labels)`; one sort instead of a scan per class.
    """
    _, y = np.unique(labels, return_inverse=True)
    y = y.reshape(-1).astype(np.int64)
    shuffled = rng.permutation(len(y))
    order = shuffled[np.argsort(y[shuffled], kind="stable")]
    return y, order, np.bincount(y)


def _group(owner: np.ndarray, order: np.ndarray, k: int) -> list[np.ndarray]:
    """Indices of each of `k` clients given each sample's `owner`, listed in the (shuffled) `order`."""
    shuffled_owner = owner[order]
    sort = np.argsort(shuffled_owner, kind="stable")
    return _cut(order[sort], np.bincount(shuffled_owner, minlength=k))


def _fit_margins(q: np.ndarray, rows: np.ndarray, cols: np.ndarray, sweeps: int = 500) -> np.ndarray:
    """Iterative proportional fitting: a_i b_j q_ij with row sums ≈ `rows` and column sums `cols`; returned as
    shares of each column (columns sum to 1). Zero entries get a tiny floor so every margin can be met."""
    fitted = np.maximum(q.astype(np.float64), 1e-12)
    for _ in range(sweeps):
        fitted *= (cols / fitted.sum(axis=0))[None, :]
        if np.abs(fitted.sum(axis=1) - rows).max() < 0.5:
            break
        fitted *= (rows / fitted.sum(axis=1))[:, None]
    return fitted / fitted.sum(axis=0, keepdims=True)


def _water_fill(sizes: np.ndarray, need: int, floor: int) -> np.ndarray:
    """How many samples each client gives so that `need` samples come from the largest clients only.

    Donors are cut down to a common level L ≥ `floor` (the largest that still frees `need` samples), a few of them
    to L + 1 so that exactly `need` are given. Requires ``sum(max(sizes - floor, 0)) >= need``.
    """

    def freed(level: int) -> int:
        return int(np.maximum(sizes - level, 0).sum())

    lo, hi = floor, int(sizes.max())  # freed(lo) >= need > freed(hi) = 0 when need > 0
    while hi - lo > 1:
        mid = (lo + hi) // 2
        lo, hi = (mid, hi) if freed(mid) >= need else (lo, mid)
    give = np.maximum(sizes - lo, 0)
    excess = int(give.sum()) - need  # < number of clients above lo, since freed(lo + 1) < need
    give[np.flatnonzero(sizes > lo)[:excess]] -= 1
    return give


# ----------------------------------------------------------------------------------------------------------------
# Partitioners
# ----------------------------------------------------------------------------------------------------------------


@PARTITIONERS.register
class IID(Partitioner):
    """Shuffle and split as evenly as possible (sizes differ by at most one)."""

    name: ClassVar[str] = "iid"
    by_label: ClassVar[bool] = False
    description: ClassVar[str] = "independent and identically distributed: a random even split"

    def split(
        self, labels: np.ndarray, num_clients: int, rng: np.random.Generator, users: np.ndarray | None = None
    ) -> list[np.ndarray]:
        _check_clients(num_clients, self.name)
        if num_clients > len(labels):
            raise DataError(f"iid: {num_clients} clients but only {len(labels)} samples; use fewer clients")
        return _split_evenly(rng.permutation(len(labels)), num_clients)


@PARTITIONERS.register
class Dirichlet(Partitioner):
    """Label skew with class proportions from Dir(α) (Hsu et al. 2019, "Measuring the effects of non-identical
    data distribution"), at least `min_size` samples per client.

    Two schemes (`scheme`):

    * ``per_class`` (default; the common "Dirichlet over clients" of NIID-Bench): for each class, p ~ Dir(α·1_K)
      over the K clients and the class's samples are cut at the cumulative proportions. Client sizes vary.
    * ``per_client`` (Hsu et al.'s own definition): each client draws its class distribution q_k ~ Dir(α·1_C)
      and clients have equal sizes. So that the finite classes suffice, the matrix (q_kc) is scaled to those
      sizes and to the class counts by iterative proportional fitting (the closest matrix with the same odds
      ratios), then every class is cut among the clients at its fitted shares.

    All classes are drawn at once; the draw is repeated (at most `retries` times) until every client has
    `min_size` samples. If no draw succeeds, the best one is repaired: the largest clients are cut down to a
    common level, giving their most frequent classes first, and the freed samples, sorted by class, are dealt in
    contiguous runs to the clients short of `min_size`. Most of the skew survives and the split always terminates.
    """

    name: ClassVar[str] = "dirichlet"
    description: ClassVar[str] = "label skew: class proportions per client from Dirichlet(alpha)"
    alpha: float = Field(0.5, gt=0, description="concentration: small α, strong label skew")
    min_size: int = Field(10, ge=0, description="minimum number of samples per client")
    retries: int = Field(100, ge=1, description="draws to try before repairing the best one")
    scheme: Literal["per_class", "per_client"] = Field(
        "per_class", description="Dir(α) over clients for each class, or over classes for each client (Hsu et al.)"
    )

    def split(
        self, labels: np.ndarray, num_clients: int, rng: np.random.Generator, users: np.ndarray | None = None
    ) -> list[np.ndarray]:
        _check_clients(num_clients, self.name)
        n = len(labels)
        _check_room(num_clients, self.min_size, n, self.name)
        y, order, per_class = _by_class(labels, rng)
        best: np.ndarray | None = None
        best_deficit = -1
        for _ in range(self.retries):
            if self.scheme == "per_client":
                q = rng.dirichlet(np.full(len(per_class), self.alpha), size=num_clients)
                p = _fit_margins(q, _round_shares(np.full(num_clients, 1 / num_clients), n), per_class).T
            else:
                p = rng.dirichlet(np.full(num_clients, self.alpha), size=len(per_class))
            counts = _round_shares(p, per_class)  # (classes, clients)
            deficit = int(np.maximum(self.min_size - counts.sum(axis=0), 0).sum())
            if best is None or deficit < best_deficit:
                best, best_deficit = counts, deficit
            if deficit == 0:
                break
        assert best is not None  # retries >= 1
        owner = np.empty(n, dtype=np.int64)
        owner[order] = np.repeat(np.tile(np.arange(num_clients), len(per_class)), best.ravel())
        if best_deficit > 0:
            self._repair(owner, y, num_clients, rng)
        return _group(owner, rng.permutation(n), num_clients)

    def _repair(self, owner: np.ndarray, y: np.ndarray, k: int, rng: np.random.Generator) -> None:
        """Move samples (in place) from the largest clients to those below `min_size`; vectorised."""
        sizes = np.bincount(owner, minlength=k)
        short = np.maximum(self.min_size - sizes, 0)
        give = _water_fill(sizes, int(short.sum()), self.min_size)
        rows = np.flatnonzero(give[owner] > 0)
        donor = owner[rows]
        # Within each donor: its most frequent class first (ties by class, then at random).
        _, pair, pair_count = np.unique(donor * (int(y.max()) + 1) + y[rows], return_inverse=True, return_counts=True)
        rank_key = (rng.random(len(rows)), y[rows], -pair_count[pair.reshape(-1)], donor)
        rows = rows[np.lexsort(rank_key)]
        donor = owner[rows]
        first = np.searchsorted(donor, donor, side="left")
        freed = rows[np.arange(len(rows)) - first < give[donor]]
        freed = freed[np.argsort(y[freed], kind="stable")]
        takers = rng.permutation(np.flatnonzero(short))
        owner[freed] = np.repeat(takers, short[takers])


@PARTITIONERS.register
class Shards(Partitioner):
    """McMahan et al. (2017) "pathological" non-IID: sort by label, cut into `num_clients × shards_per_client`
    equal shards, deal `shards_per_client` random shards to each client (FedMGDA+: 100 users × 5 shards).

    A client holds at most `shards_per_client` labels when shards do not straddle class boundaries.
    """

    name: ClassVar[str] = "shards"
    description: ClassVar[str] = "pathological non-IID: each client gets a few shards of label-sorted data"
    shards_per_client: int = Field(2, ge=1, description="shards (label-sorted blocks) per client")

    def split(
        self, labels: np.ndarray, num_clients: int, rng: np.random.Generator, users: np.ndarray | None = None
    ) -> list[np.ndarray]:
        _check_clients(num_clients, self.name)
        shards = num_clients * self.shards_per_client
        if shards > len(labels):
            raise DataError(
                f"shards: {num_clients} clients × {self.shards_per_client} shards needs {shards} samples but the "
                f"dataset has {len(labels)}; lower shards_per_client or the number of clients"
            )
        pieces = _split_evenly(np.argsort(labels, kind="stable"), shards)
        deal = rng.permutation(shards).reshape(num_clients, self.shards_per_client)
        return [np.concatenate([pieces[s] for s in row]) for row in deal]


@PARTITIONERS.register
class LabelK(Partitioner):
    """Each client holds exactly k classes ("Label-k"; FedGSNR's "Label 2", after Hsu et al. 2019).

    After a random permutation π of the C classes, client i holds π[(i·k + j) mod C] for j < k, so every class is
    used by as many clients as possible alike; a class's samples are split evenly among the clients holding it.
    A client has exactly k labels whenever every class has at least as many samples as holders.
    """

    name: ClassVar[str] = "label_k"
    description: ClassVar[str] = "each client holds k classes (e.g. Label 2)"
    labels_per_client: int = Field(2, ge=1, description="distinct classes per client (k)")

    def split(
        self, labels: np.ndarray, num_clients: int, rng: np.random.Generator, users: np.ndarray | None = None
    ) -> list[np.ndarray]:
        _check_clients(num_clients, self.name)
        _, order, per_class = _by_class(labels, rng)
        classes, k = len(per_class), self.labels_per_client
        if k > classes:
            raise DataError(
                f"label_k: {k} labels per client but the dataset has {classes} classes; "
                f"set labels_per_client to at most {classes}"
            )
        perm = rng.permutation(classes)
        held = perm[(np.arange(num_clients)[:, None] * k + np.arange(k)) % classes]  # (clients, k)
        return _deal_classes(list(held), order, per_class, num_clients)


def _deal_classes(
    held: list[np.ndarray], order: np.ndarray, per_class: np.ndarray, num_clients: int
) -> list[np.ndarray]:
    """Every class's samples split evenly among the clients holding it (`held[i]`: client i's classes).

    `order` and `per_class` come from `_by_class` (indices grouped by class, shuffled within). A class nobody
    holds is left out.
    """
    owner = np.repeat(np.arange(num_clients), [len(h) for h in held])
    flat = np.concatenate(held).astype(np.int64) if held else np.zeros(0, dtype=np.int64)
    by_class = np.argsort(flat, kind="stable")  # holders grouped by class, clients ascending
    holders = np.split(owner[by_class], np.cumsum(np.bincount(flat, minlength=len(per_class)))[:-1])
    parts: list[list[np.ndarray]] = [[] for _ in range(num_clients)]
    for members, samples in zip(holders, _cut(order, per_class), strict=True):
        if len(members):
            for client, piece in zip(members, _split_evenly(samples, len(members)), strict=True):
                parts[client].append(piece)
    return [np.concatenate(p) if p else np.zeros(0, dtype=np.int64) for p in parts]


def _random_classes(counts: np.ndarray, classes: int, rng: np.random.Generator) -> list[np.ndarray]:
    """For each client, `counts[i]` distinct classes drawn uniformly at random (sorted)."""
    keys = rng.random((len(counts), classes))
    ranked = np.argsort(keys, axis=1)
    return [np.sort(ranked[i, : int(c)]) for i, c in enumerate(counts)]


@PARTITIONERS.register
class LabelClusters(Partitioner):
    """MaxFL's cluster partition (Lee et al. 2023, "5 clusters × 2 labels"): clusters own disjoint label sets
    (a random permutation of the classes), clients are assigned to clusters at random by a shuffled round-robin
    (so each cluster has at least one client and cluster sizes differ by at most one), and each cluster's samples
    are split IID and evenly among its clients. Classes left over when C > clusters × labels are not used.
    """

    name: ClassVar[str] = "label_clusters"
    description: ClassVar[str] = "clusters of clients with disjoint label sets (MaxFL: 5 clusters x 2 labels)"
    num_clusters: int = Field(5, ge=1, description="number of client clusters")
    labels_per_cluster: int = Field(2, ge=1, description="classes owned by each cluster")

    def split(
        self, labels: np.ndarray, num_clients: int, rng: np.random.Generator, users: np.ndarray | None = None
    ) -> list[np.ndarray]:
        _check_clients(num_clients, self.name)
        _, order, per_class = _by_class(labels, rng)
        need = self.num_clusters * self.labels_per_cluster
        if need > len(per_class):
            raise DataError(
                f"label_clusters: {self.num_clusters} clusters × {self.labels_per_cluster} labels = {need} labels "
                f"needed but the dataset has {len(per_class)} classes; lower num_clusters or labels_per_cluster"
            )
        if num_clients < self.num_clusters:
            raise DataError(
                f"label_clusters: {num_clients} clients for {self.num_clusters} clusters; "
                "use at least one client per cluster"
            )
        by_class = _cut(order, per_class)
        label_sets = rng.permutation(len(per_class))[:need].reshape(self.num_clusters, self.labels_per_cluster)
        cluster_of = rng.permutation(np.arange(num_clients) % self.num_clusters)
        parts: list[np.ndarray] = [np.zeros(0, dtype=np.int64)] * num_clients
        for c, label_set in enumerate(label_sets):
            members = np.flatnonzero(cluster_of == c)
            rows = rng.permutation(np.concatenate([by_class[label] for label in label_set]))
            for client, piece in zip(members, _split_evenly(rows, len(members)), strict=True):
                parts[client] = piece
        return parts


@PARTITIONERS.register
class NonBalance(Partitioner):
    """FedGSNR's "NonBalance" (App. D.1): tiers of clients holding different numbers of classes.

    By default 10% of the clients ("abundant information") hold every class, 40% ("medium") a random 50% of
    the classes and 50% ("less") a random 20%: `tiers` lists (share of clients, share of classes). Clients are
    put in tiers at random (tier sizes rounded to sum to the number of clients), each draws its classes
    uniformly at random (at least one), and every class's samples are split evenly among the clients holding
    it (the paper: "distribute data randomly according to their chosen labels"), so a client with more classes
    also holds more samples.
    """

    name: ClassVar[str] = "nonbalance"
    description: ClassVar[str] = "FedGSNR NonBalance: 10%/40%/50% of clients hold 100%/50%/20% of the classes"
    tiers: list[tuple[float, float]] = Field(
        default_factory=lambda: [(0.1, 1.0), (0.4, 0.5), (0.5, 0.2)],
        description="(share of clients, share of classes) per tier",
    )

    @field_validator("tiers")
    @classmethod
    def _check_tiers(cls, value: list[tuple[float, float]]) -> list[tuple[float, float]]:
        if not value:
            raise ValueError("give at least one (share of clients, share of classes) tier")
        if any(c < 0 or not 0 < f <= 1 for c, f in value) or sum(c for c, _ in value) <= 0:
            raise ValueError("client shares must be >= 0 (not all 0) and class shares in (0, 1]")
        return value

    def split(
        self, labels: np.ndarray, num_clients: int, rng: np.random.Generator, users: np.ndarray | None = None
    ) -> list[np.ndarray]:
        _check_clients(num_clients, self.name)
        _, order, per_class = _by_class(labels, rng)
        classes = len(per_class)
        shares = np.array([c for c, _ in self.tiers], dtype=float)
        members = _round_shares(shares / shares.sum(), num_clients)
        per_tier = np.array([max(1, round(f * classes)) for _, f in self.tiers])
        counts = rng.permutation(np.repeat(per_tier, members))  # clients put in tiers at random
        return _deal_classes(_random_classes(counts, classes, rng), order, per_class, num_clients)


@PARTITIONERS.register
class Pareto(Partitioner):
    """FedGSNR's "Pareto" (App. D.1): the number of classes a client holds follows a Pareto law (80/20).

    Draw x_i ~ Pareto(shape, x_min) for the N clients, normalise x̃_i = x_i / max_j x_j ∈ (0, 1] (x_min cancels,
    so it is not a parameter), and give client i max(1, round(x̃_i · C)) classes drawn at random; every class's
    samples are split evenly among the clients holding it. The client with the largest draw holds every class.
    The default tail index 1.16 = log 5 / log 4 is the "80/20" (Two-Eight) Pareto law the paper names.
    """

    name: ClassVar[str] = "pareto"
    description: ClassVar[str] = "FedGSNR Pareto: classes per client from a Pareto (80/20) law, normalised by the max"
    shape: float = Field(1.16, gt=0, description="Pareto tail index k (small: few clients hold most classes)")

    def split(
        self, labels: np.ndarray, num_clients: int, rng: np.random.Generator, users: np.ndarray | None = None
    ) -> list[np.ndarray]:
        _check_clients(num_clients, self.name)
        _, order, per_class = _by_class(labels, rng)
        classes = len(per_class)
        log_x = rng.standard_exponential(num_clients) / self.shape  # log(x / x_min) of a Pareto draw
        ratio = np.exp(log_x - log_x.max())
        counts = np.clip(np.rint(ratio * classes), 1, classes).astype(np.int64)
        return _deal_classes(_random_classes(counts, classes, rng), order, per_class, num_clients)


@PARTITIONERS.register
class Quantity(Partitioner):
    """Quantity skew with IID labels: client sizes ∝ random weights, `min_size` each plus a share of the rest.

    Weights are log-normal(0, σ) (``law: lognormal``, the "unbalance" of NIID-Bench, Li et al. 2022; σ = 0 gives
    equal sizes) or Pareto with tail index `shape` (``law: pareto``, ``rng.pareto(shape) + 1``, drawn in log space
    so tiny indices cannot overflow).
    """

    name: ClassVar[str] = "quantity"
    by_label: ClassVar[bool] = False
    description: ClassVar[str] = "quantity skew: client sizes from a log-normal or Pareto law, labels IID"
    law: Literal["lognormal", "pareto"] = Field("lognormal", description="law of the client weights")
    sigma: float = Field(1.0, ge=0, description="log-normal σ (law lognormal; 0: equal sizes)")
    shape: float = Field(1.0, gt=0, description="Pareto tail index (law pareto; small: heavier skew)")
    min_size: int = Field(10, ge=0, description="minimum number of samples per client")

    def split(
        self, labels: np.ndarray, num_clients: int, rng: np.random.Generator, users: np.ndarray | None = None
    ) -> list[np.ndarray]:
        _check_clients(num_clients, self.name)
        if self.law == "pareto":
            log_weights = rng.standard_exponential(num_clients) / self.shape
        else:
            log_weights = rng.normal(0.0, self.sigma, num_clients)
        sizes = _sizes_from_log_weights(log_weights, len(labels), self.min_size, self.name)
        return _cut(rng.permutation(len(labels)), sizes)


@PARTITIONERS.register
class Natural(Partitioner):
    """One client per natural user (LEAF writers/users, speaking roles, domains), from the dataset's `users`.

    Users with fewer than `min_size` samples are dropped. If fewer clients are asked for than users remain, a
    uniformly random subset of `num_clients` users is taken (clients ordered by user id); more clients than
    users is an error.
    """

    name: ClassVar[str] = "natural"
    by_label: ClassVar[bool] = False
    description: ClassVar[str] = "one client per natural user of the dataset (LEAF users, roles, domains)"
    min_size: int = Field(0, ge=0, description="drop users with fewer samples than this")

    def split(
        self, labels: np.ndarray, num_clients: int, rng: np.random.Generator, users: np.ndarray | None = None
    ) -> list[np.ndarray]:
        _check_clients(num_clients, self.name)
        if users is None:
            raise DataError("natural: this dataset has no natural users; choose another partitioner (e.g. dirichlet)")
        ids, counts = np.unique(users, return_counts=True)
        eligible = ids[counts >= self.min_size]
        if num_clients > len(eligible):
            kept = f" with at least {self.min_size} samples" if self.min_size > 0 else ""
            raise DataError(
                f"natural: {num_clients} clients requested but the dataset has {len(eligible)} users{kept}; "
                f"set num_clients to at most {len(eligible)}"
            )
        chosen = eligible if num_clients == len(eligible) else np.sort(rng.choice(eligible, num_clients, replace=False))
        order = np.argsort(users, kind="stable")
        starts = np.searchsorted(users[order], chosen, side="left")
        ends = np.searchsorted(users[order], chosen, side="right")
        return [order[s:e].astype(np.int64) for s, e in zip(starts, ends, strict=True)]
