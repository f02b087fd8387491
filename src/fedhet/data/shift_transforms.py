"""The built-in shifts' transforms, in torch ops (`fedhet.data.shift_config` names them): each takes one split's
samples and the clients' `Assignment` and returns the shifted samples; the input is left as it was. Also the
``domain`` shift's split (`ByDomain`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import ClassVar

import numpy as np
import torch
import torch.nn.functional as F
from torch import Tensor

from fedhet.data.dataset import ClientData
from fedhet.data.partition import Partitioner
from fedhet.errors import DataError
from fedhet.seeding import numpy_rng, torch_gen

SPLITS = ("train", "test", "val")


@dataclass(frozen=True)
class Assignment:
    """What a shift's transform gets besides the data: each client's group and level, and the run's streams."""

    groups: Tensor  # (K,) long: each client's group
    levels: Tensor | None  # (K,) float64: each client's level (None: the shift has none)
    num_groups: int  # G
    classes: int  # the dataset's number of classes
    seed: int
    split: str = "train"  # which split `transform` is shifting: train, test or val

    def rows(self, part: ClientData) -> Tensor:
        """(N,) each sample's group."""
        return torch.repeat_interleave(self.groups, part.offsets.diff())

    def row_levels(self, part: ClientData) -> Tensor:
        """(N,) each sample's level (float32)."""
        if self.levels is None:
            raise DataError("this shift has no levels")
        return torch.repeat_interleave(self.levels.float(), part.offsets.diff())

    def rng(self, purpose: str = "shift") -> np.random.Generator:
        """A NumPy stream of the run's seed, the same for every split (label tables, colour directions)."""
        return numpy_rng(self.seed, purpose)

    def torch_rng(self, purpose: str = "shift-noise") -> torch.Generator:
        """A torch stream of the run's seed, its own for each split (noise)."""
        return torch_gen(self.seed, purpose, SPLITS.index(self.split))


class ByDomain(Partitioner):
    """The ``domain`` shift's split: client k's samples come from domain ``groups[k]`` only (the dataset's `users`),
    each domain's samples split among its clients by the run's partitioner (`inner`)."""

    name: ClassVar[str] = "domain"
    by_label: ClassVar[bool] = False
    inner: Partitioner
    groups: tuple[int, ...]

    def split(
        self, labels: np.ndarray, num_clients: int, rng: np.random.Generator, users: np.ndarray | None = None
    ) -> list[np.ndarray]:
        if users is None:
            raise DataError("shift 'domain': the dataset has no domains")
        groups = np.asarray(self.groups, dtype=np.int64)
        parts = [np.zeros(0, dtype=np.int64) for _ in range(num_clients)]
        for domain in np.unique(groups).tolist():
            clients = np.flatnonzero(groups == domain)
            rows = np.flatnonzero(users == domain)
            inner = self.inner.split(labels[rows], len(clients), rng, users=None)
            if len(inner) != len(clients):
                raise DataError(f"partitioner '{self.inner.name}' made {len(inner)} clients in domain {domain}")
            for k, part in zip(clients.tolist(), inner, strict=True):
                parts[k] = rows[np.asarray(part, dtype=np.int64)]
        return parts


def square_images(x: Tensor) -> Tensor:
    """`x` as (N, ..., s, s) images: flat (N, s²) inputs are one-channel s×s images; a `DataError` otherwise."""
    if not torch.is_floating_point(x):
        raise DataError("shift 'rotation' rotates images; this dataset's inputs are tokens: use another shift")
    if x.dim() == 2:
        side = math.isqrt(x.shape[1])
        if side * side == x.shape[1]:
            return x.view(len(x), side, side)
    elif x.shape[-1] == x.shape[-2]:
        return x
    raise DataError(
        f"shift 'rotation' rotates square images; this dataset's inputs are {tuple(x.shape[1:])}: use another shift"
    )


def as_images(x: Tensor, shift: str) -> Tensor:
    """`x` as (N, C, H, W) images (a view): flat (N, s²) inputs are one-channel s×s images, (N, H, W) one-channel
    images; a `DataError` for tokens or other features."""
    if not torch.is_floating_point(x):
        raise DataError(f"shift '{shift}' changes images; this dataset's inputs are tokens: use another shift")
    if x.dim() == 2 and math.isqrt(x.shape[1]) ** 2 == x.shape[1] and x.shape[1] > 1:
        side = math.isqrt(x.shape[1])
        return x.view(len(x), 1, side, side)
    if x.dim() in (3, 4):
        return x.view(len(x), -1, *x.shape[-2:])
    raise DataError(
        f"shift '{shift}' changes images; this dataset's inputs are {tuple(x.shape[1:])}, not images: use shift "
        "noise or labels"
    )


def _per_image(values: Tensor) -> Tensor:
    return values.view(-1, 1, 1, 1)


def rotate(part: ClientData, who: Assignment) -> ClientData:
    """Each sample of group g rotated by g·90° (`torch.rot90`: exact, a permutation of the pixels)."""
    images = square_images(part.x)
    rows = who.rows(part)
    out = images.clone()
    for g in range(1, who.num_groups):
        mine = rows == g
        out[mine] = torch.rot90(images[mine], g, dims=(-2, -1))
    return ClientData(out.reshape(part.x.shape), part.y, part.offsets)


def _map_labels(part: ClientData, who: Assignment, tables: list[Tensor], shift: str) -> ClientData:
    """Each label y of group g replaced by ``tables[g][y]`` (group 0 keeps its labels)."""
    if torch.is_floating_point(part.y):
        raise DataError(f"shift '{shift}' changes class labels; a regression dataset has none: use another shift")
    rows = who.rows(part)
    y = part.y.clone()
    for g in range(1, who.num_groups):
        mine = rows == g
        y[mine] = tables[g][part.y[mine]]
    return ClientData(part.x, y, part.offsets)


def permute_labels(part: ClientData, who: Assignment) -> ClientData:
    """Each label y of group g replaced by π_g(y): π_0 the identity, π_1.. seeded permutations of the classes."""
    rng = who.rng()  # the same tables for every split
    tables = [torch.arange(who.classes)]
    tables += [torch.as_tensor(rng.permutation(who.classes), dtype=torch.long) for _ in range(1, who.num_groups)]
    return _map_labels(part, who, tables, "labels")


def swap_tables(classes: int, groups: int, pairs: int, rng: np.random.Generator) -> list[Tensor]:
    """Group g's class table: the identity for g = 0, else `pairs` disjoint random label pairs swapped."""
    if 2 * pairs > classes:
        raise DataError(
            f"shift 'labels' swaps {pairs} disjoint label pairs, which needs {2 * pairs} classes, not {classes}"
        )
    tables = [torch.arange(classes)]
    for _ in range(1, groups):
        table = torch.arange(classes)
        for a, b in rng.choice(classes, size=(pairs, 2), replace=False).tolist():
            table[a], table[b] = b, a
        tables.append(table)
    return tables


def swap_labels(part: ClientData, who: Assignment, pairs: int) -> ClientData:
    """Each label y of group g ≥ 1 swapped within `pairs` seeded disjoint pairs of classes of its own."""
    return _map_labels(part, who, swap_tables(who.classes, who.num_groups, pairs, who.rng("shift-swap")), "labels")


def add_noise(part: ClientData, who: Assignment) -> ClientData:
    """x + σ ε, ε ~ N(0, I) of the split's own seeded stream, σ the sample's level (any float features)."""
    if not torch.is_floating_point(part.x):
        raise DataError("shift 'noise' adds noise to features; this dataset's inputs are tokens: use another shift")
    noise = torch.randn(part.x.shape, generator=who.torch_rng(), dtype=part.x.dtype)
    std = who.row_levels(part).to(part.x.dtype).view(-1, *[1] * (part.x.dim() - 1))
    return ClientData(part.x + std * noise, part.y, part.offsets)


def contrast(part: ClientData, who: Assignment) -> ClientData:
    """x' = μ + (1 − c)(x − μ): μ each image's mean per channel, c the sample's level."""
    images = as_images(part.x, "contrast")
    mean = images.mean(dim=(2, 3), keepdim=True)
    keep = 1.0 - _per_image(who.row_levels(part).to(images.dtype))
    return ClientData((mean + keep * (images - mean)).reshape(part.x.shape), part.y, part.offsets)


def colour_directions(groups: int, channels: int, rng: np.random.Generator) -> Tensor:
    """(G, C) each group's colour cast, uniform in [−1, 1]^C scaled to a largest entry of ±1."""
    d = torch.as_tensor(rng.uniform(-1.0, 1.0, (groups, channels)))
    return d / d.abs().amax(dim=1, keepdim=True).clamp_min(1e-12)


def colour(part: ClientData, who: Assignment) -> ClientData:
    """x'_c = x_c + b d_{g,c}: b the sample's level, d_g its group's seeded colour direction."""
    images = as_images(part.x, "colour")
    d = colour_directions(who.num_groups, images.shape[1], who.rng("shift-colour")).to(images.dtype)
    cast = d[who.rows(part)] * who.row_levels(part).to(images.dtype)[:, None]  # (N, C)
    return ClientData((images + cast[:, :, None, None]).reshape(part.x.shape), part.y, part.offsets)


def gaussian_kernel(sigma: float) -> Tensor:
    """The normalised 1-d Gaussian of std `sigma` over −⌈3σ⌉..⌈3σ⌉."""
    radius = max(1, math.ceil(3 * sigma))
    t = torch.arange(-radius, radius + 1, dtype=torch.float64)
    k = torch.exp(-(t**2) / (2 * sigma**2))
    return k / k.sum()


def gaussian_blur(images: Tensor, sigma: float) -> Tensor:
    """(n, C, H, W) images blurred by a separable Gaussian of std `sigma` (edge pixels repeated); as they are at 0."""
    if sigma <= 0:
        return images
    k = gaussian_kernel(sigma).to(images.dtype)
    r, c = len(k) // 2, images.shape[1]
    across = F.conv2d(F.pad(images, (r, r, 0, 0), mode="replicate"), k.view(1, 1, 1, -1).repeat(c, 1, 1, 1), groups=c)
    return F.conv2d(F.pad(across, (0, 0, r, r), mode="replicate"), k.view(1, 1, -1, 1).repeat(c, 1, 1, 1), groups=c)


def blur(part: ClientData, who: Assignment) -> ClientData:
    """Each image blurred by a Gaussian of std σ pixels, σ its sample's level."""
    images = as_images(part.x, "blur")
    sigma = who.row_levels(part)
    out = images.clone()
    for level in torch.unique(sigma).tolist():
        mine = sigma == level
        out[mine] = gaussian_blur(images[mine], level)
    return ClientData(out.reshape(part.x.shape), part.y, part.offsets)
