"""Mini-batch indices for local training, drawn from per-(round, client) streams shared by all backends.

Permutations come from a counter-based hash (SplitMix64 of (seed, stream, round, client, epoch, position)),
so they are computed for the whole cohort at once with NumPy and do not depend on which other clients are in
the cohort or in which order they are processed.
"""

from __future__ import annotations

import numpy as np
import torch
from torch import Tensor

from fedhet.seeding import derive_seed

_GOLDEN = np.uint64(0x9E3779B97F4A7C15)
_M1 = np.uint64(0xBF58476D1CE4E5B9)
_M2 = np.uint64(0x94D049BB133111EB)
_MAX_KEYS = 1 << 22  # keys hashed at once (bounds memory for large cohorts)


def splitmix64(x: np.ndarray) -> np.ndarray:
    """The SplitMix64 finaliser, element-wise on uint64 (wrapping arithmetic)."""
    with np.errstate(over="ignore"):
        z = x + _GOLDEN
        z = (z ^ (z >> np.uint64(30))) * _M1
        z = (z ^ (z >> np.uint64(27))) * _M2
        return z ^ (z >> np.uint64(31))


def _permutations(base: int, clients: np.ndarray, epochs: int, sizes: np.ndarray) -> np.ndarray:
    """(m, epochs, n_max) permutations: row [i, e, :sizes[i]] is a random order of 0..sizes[i]-1."""
    n_max = int(sizes.max())
    with np.errstate(over="ignore"):
        key = splitmix64(np.uint64(base) ^ (clients.astype(np.uint64) * np.uint64(0xD1B54A32D192ED03)))
        key = key[:, None, None] + np.arange(epochs, dtype=np.uint64)[None, :, None] * np.uint64(0x8CB92BA72F3D8DD7)
        key = splitmix64(key + np.arange(n_max, dtype=np.uint64)[None, None, :])
    pad = np.broadcast_to(np.arange(n_max)[None, None, :] >= sizes[:, None, None], key.shape)
    key[pad] = np.iinfo(np.uint64).max  # padding sorts last
    return np.argsort(key, axis=2, kind="stable")


def local_batches(
    offsets: Tensor, clients: Tensor, steps: Tensor, batch_size: int, seed: int, round_: int, stream: str = "train"
) -> tuple[Tensor, Tensor]:
    """Row indices (m, T, b) into the concatenated training data, and weights (m, T, b).

    Client k walks through successive random permutations of its own n_k samples (epochs without
    replacement), b_k = min(b, n_k) per step; a client with fewer than b samples pads its batch with
    weight-0 rows. T = max steps; steps past a client's own count are zero-weight padding.
    """
    m, t_max, b = len(clients), int(steps.max()) if len(steps) else 0, batch_size
    index = np.zeros((m, t_max, b), dtype=np.int64)
    weight = np.zeros((m, t_max, b), dtype=np.float32)
    if m == 0 or t_max == 0:
        return torch.from_numpy(index), torch.from_numpy(weight)
    ids = clients.numpy()
    lo = offsets.numpy()[ids]
    n = offsets.numpy()[ids + 1] - lo
    tau = steps.numpy()
    eff = np.minimum(b, np.maximum(n, 1))
    per_epoch = np.maximum(n // eff, 1)
    epochs = -(-tau // per_epoch)
    base = derive_seed(seed, f"batches/{stream}", round_)
    group = max(1, _MAX_KEYS // max(1, int(n.max()) * max(1, int(epochs.max()))))
    t = np.arange(t_max)[None, :, None]
    s = np.arange(b)[None, None, :]
    for start in range(0, m, group):
        sl = slice(start, start + group)
        perms = _permutations(base, ids[sl], max(1, int(epochs[sl].max())), n[sl])
        e_k, p_k = eff[sl][:, None, None], per_epoch[sl][:, None, None]
        position = t * e_k + np.where(s < e_k, s, 0)  # padded slots repeat the batch's first row (weight 0)
        epoch, within = position // (p_k * e_k), position % (p_k * e_k)
        epoch = np.minimum(epoch, perms.shape[1] - 1)
        flat = (epoch * perms.shape[2] + within).reshape(len(perms), -1)
        rows = np.take_along_axis(perms.reshape(len(perms), -1), flat, 1)
        index[sl] = rows.reshape(-1, t_max, b) + lo[sl][:, None, None]
        valid = (s < e_k) & (t < tau[sl][:, None, None]) & (n[sl][:, None, None] > 0)
        weight[sl] = valid
    return torch.from_numpy(index), torch.from_numpy(weight)


def gather_rows(x: Tensor, rows: Tensor) -> Tensor:
    """x[rows] for an index tensor of any shape, with `index_select` (a row copy, faster than advanced indexing:
    docs/performance.md, "Why the engine's constants")."""
    return torch.index_select(x, 0, rows.reshape(-1)).view(*rows.shape, *x.shape[1:])


def stats_samples(offsets: Tensor, clients: Tensor, count: int, seed: int, round_: int) -> tuple[Tensor, Tensor]:
    """Row indices (m, B) and weights (m, B) of B random samples per client for gradient statistics."""
    ids = clients.numpy()
    lo = offsets.numpy()[ids]
    n = offsets.numpy()[ids + 1] - lo
    m = len(ids)
    if m == 0:
        return torch.zeros((0, count), dtype=torch.long), torch.zeros((0, count))
    perms = _permutations(derive_seed(seed, "grad-stats", round_), ids, 1, np.maximum(n, 1))[:, 0, :]
    take = np.minimum(count, n)
    s = np.arange(count)[None, :]
    cols = np.where(s < take[:, None], s, 0)
    cols = np.minimum(cols, perms.shape[1] - 1)
    index = np.take_along_axis(perms, cols, 1) + lo[:, None]
    weight = (s < take[:, None]).astype(np.float32)
    return torch.from_numpy(index.astype(np.int64)), torch.from_numpy(weight)
