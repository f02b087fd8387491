"""Differential privacy on the clients' side: what a client does to its update before sending it (client-level DP),
and the per-sample clipping and noise of DP-SGD in its local steps (example-level DP).

Client level (`UpdateClip`, a `LocalPlan` field): after its local steps each client scales its update
Δ_k = w_k − w_start to norm at most C (Andrew et al., NeurIPS 2021, and McMahan et al., ICLR 2018: Δ_k ·
min(1, C/‖Δ_k‖)) and, for local DP, adds Gaussian noise N(0, σ² I) of its own. The engine applies it once, to the
update the client sends (the shared part of a personal model), so every backend and every Flower node does the
same (`clip_updates`; the dense backend clips as it writes the models, with the same numbers up to float rounding:
`TrainRequest.clip`); the noise comes from the stream (seed, "dp-noise/<stream>", round, phase, client), drawn
from the distribution the clip names (``gaussian``, or one a privacy mechanism registers: `UPDATE_NOISE`).

Example level (`ExampleDP`, DP-SGD, Abadi et al., CCS 2016, Algorithm 1): each local step clips every sample's
gradient g_i to norm at most C, sums them, adds N(0, (zC)² I) and divides by the client's expected batch size
b_k = min(B, n_k):  g̃ = (Σ_i g_i · min(1, C/‖g_i‖) + N(0, z²C² I)) / b_k. With ``sampling: poisson`` each sample
joins a step's batch independently with probability q_k = b_k/n_k (`poisson_batches`), the sampling the
accountant assumes; ``shuffle`` keeps the engine's shuffled batches (plain SGD's). The noise of client k's step t
comes from (seed, "dp-sgd/<stream>", round, phase, client, t). Parameter terms (weight decay, FedProx's proximal
term) do not read the data and are added after the noise.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Literal

import numpy as np
import torch
from torch import Tensor

from fedhet.errors import ConfigError
from fedhet.seeding import numpy_rng, torch_gen

NORM_BLOCK = 1 << 18  # entries of the (clients × parameters) update formed at a time (1 MiB of float32)


Sampler = Callable[[int, torch.Generator], Tensor]  # `size` standard draws (scale 1) from a generator
UPDATE_NOISE: dict[str, Sampler] = {"gaussian": lambda size, gen: torch.randn(size, generator=gen)}


def update_noise(name: str) -> Callable[[Sampler], Sampler]:
    """Decorator: register a distribution of local noise by name (a privacy mechanism's, such as Laplace's): a
    function of (size, generator) that draws `size` values of scale 1, which the engine scales by ``noise``."""

    def register(sampler: Sampler) -> Sampler:
        if name in UPDATE_NOISE:
            raise TypeError(f"local noise '{name}' is registered twice")
        UPDATE_NOISE[name] = sampler
        return sampler

    return register


@dataclass(frozen=True)
class UpdateClip:
    """Client-level DP on the client: clip the update to norm ``bound`` (inf: no clipping), then add ``noise``
    times a standard draw of ``distribution`` (`UPDATE_NOISE`; Gaussian: N(0, ``noise``²)) to each coordinate
    (0: none; local DP)."""

    bound: float
    noise: float = 0.0
    distribution: str = "gaussian"

    def __post_init__(self) -> None:
        if not self.bound > 0 or self.noise < 0 or math.isnan(self.noise):
            raise ValueError(f"an update clip needs bound > 0 and noise >= 0 (got {self.bound}, {self.noise})")
        if self.distribution not in UPDATE_NOISE:
            raise ValueError(f"unknown local noise '{self.distribution}' (registered: {', '.join(UPDATE_NOISE)})")


@dataclass(frozen=True)
class ExampleDP:
    """DP-SGD in local training: per-sample gradients clipped to ``clip``, N(0, (z·clip)²) on each step's sum."""

    clip: float
    noise_multiplier: float = 0.0
    sampling: Literal["poisson", "shuffle"] = "poisson"

    def __post_init__(self) -> None:
        if not self.clip > 0 or not self.noise_multiplier >= 0:
            raise ValueError(
                f"DP-SGD needs clip > 0 and noise_multiplier >= 0 (got {self.clip}, {self.noise_multiplier})"
            )
        if self.noise_multiplier > 0 and math.isinf(self.clip):
            raise ValueError("DP-SGD's noise is z times the clipping bound: give a finite clip")

    @property
    def noise_std(self) -> float:
        """σ = z·C, the standard deviation of the noise on a step's sum of clipped gradients."""
        return self.noise_multiplier * self.clip if self.noise_multiplier > 0 else 0.0


def _row_blocks(m: int, size: int) -> list[slice]:
    """Slices of rows of at most `NORM_BLOCK` entries (one row at least): a block's temporaries stay in cache."""
    rows = max(1, NORM_BLOCK // max(1, size))
    return [slice(lo, min(lo + rows, m)) for lo in range(0, m, rows)]


def update_norms(params: Tensor, start: Tensor) -> Tensor:
    """‖w_k − w_start‖ for each row of `params` (m, P), `start` (P,) or (m, P): a block of rows at a time through
    one buffer that stays in cache (no (m, P) temporary)."""
    m, size = params.shape
    norms = torch.empty(m, dtype=params.dtype, device=params.device)
    blocks = _row_blocks(m, size)
    rows = blocks[0].stop - blocks[0].start if blocks else 0
    buffer = torch.empty(rows, size, dtype=params.dtype, device=params.device)
    for block in blocks:
        base = start if start.dim() == 1 else start[block]
        update = torch.sub(params[block], base, out=buffer[: block.stop - block.start])
        torch.linalg.vector_norm(update, dim=1, out=norms[block])
    return norms


def clip_updates(
    params: Tensor, start: Tensor, clip: UpdateClip, clients: Tensor, seed: int, round_: int, key: str
) -> Tensor:
    """Clip each client's update w_k − w_start to norm ``clip.bound`` and add its local noise, in place on `params`
    (m, P); returns which updates were clipped (m,) bool (‖Δ_k‖ > C). Rows within the bound are left as they are
    (bit for bit), so an infinite bound without noise changes nothing. `key` names the noise stream."""
    clipped = clip_rows(params, start, clip.bound)
    add_noise(params, clip, clients, seed, round_, key)
    return clipped


def clip_rows(params: Tensor, start: Tensor, bound: float) -> Tensor:
    """Clip each row's update w_k − w_start to norm `bound` in place on `params` (m, P); which rows were clipped
    (m,) bool. One pass over `params` for the norms (`update_norms`; none for an infinite bound), and one over the
    clipped rows only: w_start + (w_k − w_start)·C/‖Δ_k‖ (lerp, in place); the other rows are left bit for bit."""
    if math.isinf(bound):
        return torch.zeros(len(params), dtype=torch.bool, device=params.device)
    norms = update_norms(params, start)
    clipped = norms > bound
    if bool(clipped.all()):
        torch.lerp(start, params, (bound / norms).unsqueeze(1), out=params)
    elif bool(clipped.any()):
        for i in torch.nonzero(clipped).flatten().tolist():
            base = start if start.dim() == 1 else start[i]
            torch.lerp(base, params[i], bound / float(norms[i]), out=params[i])
    return clipped


def add_noise(params: Tensor, clip: UpdateClip, clients: Tensor, seed: int, round_: int, key: str) -> None:
    """Local DP: ``clip.noise`` times a standard draw of ``clip.distribution`` (Gaussian: N(0, ``clip.noise``²)) on
    each coordinate of client k's row, from its stream (seed, key, round, k)."""
    if clip.noise > 0:
        size, draw = params.shape[1], UPDATE_NOISE[clip.distribution]
        for i, k in enumerate(clients.tolist()):
            params[i] += clip.noise * draw(size, torch_gen(seed, key, round_, k))


def noise_key(stream: str, phase: int) -> str:
    """The purpose of a plan's local noise streams (client-level local DP)."""
    return f"dp-noise/{stream}/{phase}"


def step_noise(clients: Tensor, size: int, seed: int, round_: int, key: str, step: int) -> Tensor:
    """(m, P) standard normal noise of local step `step` of each of `clients` (DP-SGD), from their own streams."""
    out = torch.empty(len(clients), size)
    for i, k in enumerate(clients.tolist()):
        out[i] = torch.randn(size, generator=torch_gen(seed, key, round_, k, step))
    return out


def sgd_noise_key(stream: str, phase: int) -> str:
    """The purpose of a plan's DP-SGD noise streams."""
    return f"dp-sgd/{stream}/{phase}"


def expected_batch(offsets: Tensor, clients: Tensor, batch_size: int) -> Tensor:
    """b_k = min(B, n_k) (at least 1): DP-SGD's denominator, the expected size of client k's batches (m,)."""
    sizes = offsets[clients + 1] - offsets[clients]
    return sizes.clamp(min=1, max=batch_size).float()


def poisson_batches(
    offsets: Tensor, clients: Tensor, steps: Tensor, batch_size: int, seed: int, round_: int, stream: str = "train"
) -> tuple[Tensor, Tensor]:
    """Poisson-sampled batches: row indices (m, T, S) and 0/1 weights (m, T, S), where each of client k's n_k samples
    is in step t's batch independently with probability q_k = min(1, B/n_k) (a binomial batch size, then a uniform
    subset of that size: the same law). S is the largest batch drawn (at least 1); steps past a client's own count
    are empty. Keyed by (seed, stream, round, client), so independent of the cohort's other clients."""
    m, t_max = len(clients), int(steps.max()) if len(steps) else 0
    lo = offsets[clients].numpy()
    n = (offsets[clients + 1] - offsets[clients]).numpy()
    picked: list[list[np.ndarray]] = []
    for i, k in enumerate(clients.tolist()):
        rng = numpy_rng(seed, f"batches-poisson/{stream}", round_, k)
        q = min(1.0, batch_size / max(int(n[i]), 1))
        tau = int(steps[i])
        sizes = rng.binomial(int(n[i]), q, size=tau) if n[i] > 0 else np.zeros(tau, dtype=np.int64)
        picked.append([rng.permutation(int(n[i]))[:s] for s in sizes])
    slots = max([1, *(len(rows) for client in picked for rows in client)])
    index = np.zeros((m, t_max, slots), dtype=np.int64)
    weight = np.zeros((m, t_max, slots), dtype=np.float32)
    for i, client in enumerate(picked):
        for t, rows in enumerate(client):
            index[i, t, : len(rows)] = rows + lo[i]
            index[i, t, len(rows) :] = lo[i]  # padding repeats a row of the client's own (weight 0)
            weight[i, t, : len(rows)] = 1.0
    return torch.from_numpy(index), torch.from_numpy(weight)


def refuse_with(dp: ExampleDP | None, data_terms: bool, rule: bool, dropout: bool) -> None:
    """DP-SGD clips each sample's gradient of the plain loss: a data-space term, a local rule or dropout (whose
    masks vmap over samples would share) have no such per-sample gradient here; one line says so."""
    if dp is None:
        return
    what = "a data-space term" if data_terms else "a local rule" if rule else "dropout" if dropout else None
    if what is not None:
        raise ConfigError(
            f"local.dp_sgd clips per-sample gradients of the loss and cannot run with {what}; use a strategy and "
            "model without it, or client-level DP (algorithm: {name: dp, ...})"
        )
