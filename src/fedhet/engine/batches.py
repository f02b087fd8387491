"""Mini-batch indices for local training, drawn from per-(round, client) streams shared by all backends."""

from __future__ import annotations

import torch
from torch import Tensor

from fedhet.seeding import torch_gen


def local_batches(
    offsets: Tensor, clients: Tensor, steps: Tensor, batch_size: int, seed: int, round_: int, stream: str = "train"
) -> tuple[Tensor, Tensor]:
    """Row indices (m, T, b) into the concatenated training data, and weights (m, T, b).

    Client k walks through successive random permutations of its own n_k samples (epochs without
    replacement). A client with fewer than b samples uses all of them each step, padded with weight-0 rows.
    T = max steps; steps past a client's own count are filled but never used.
    """
    m, t_max = len(clients), int(steps.max()) if len(steps) else 0
    b = batch_size
    index = torch.zeros((m, t_max, b), dtype=torch.long)
    weight = torch.zeros((m, t_max, b), dtype=torch.float32)
    for i, k in enumerate(clients.tolist()):
        lo, n = int(offsets[k]), int(offsets[k + 1] - offsets[k])
        tau = int(steps[i])
        if tau == 0 or n == 0:
            continue
        gen = torch_gen(seed, f"batches/{stream}", round_, k)
        eff = min(b, n)
        per_epoch = n // eff
        epochs = -(-tau // per_epoch)
        order = torch.cat([torch.randperm(n, generator=gen)[: per_epoch * eff] for _ in range(epochs)])
        rows = order[: tau * eff].view(tau, eff) + lo
        index[i, :tau, :eff] = rows
        index[i, :tau, eff:] = rows[:, :1]
        weight[i, :tau, :eff] = 1.0
    return index, weight


def stats_samples(offsets: Tensor, clients: Tensor, count: int, seed: int, round_: int) -> tuple[Tensor, Tensor]:
    """Row indices (m, B) and weights (m, B) of B random samples per client for gradient statistics."""
    m = len(clients)
    index = torch.zeros((m, count), dtype=torch.long)
    weight = torch.zeros((m, count), dtype=torch.float32)
    for i, k in enumerate(clients.tolist()):
        lo, n = int(offsets[k]), int(offsets[k + 1] - offsets[k])
        take = min(count, n)
        rows = torch.randperm(n, generator=torch_gen(seed, "grad-stats", round_, k))[:take] + lo
        index[i, :take] = rows
        index[i, take:] = rows[:1]
        weight[i, :take] = 1.0
    return index, weight
