"""Secure aggregation, simulated: SecAgg (Bonawitz et al., CCS 2017) on a sparse k-regular graph as in SecAgg+
(Bell et al., CCS 2020), as a wrapper around a base strategy (``base:``).

Each round, every selected client u

1. folds its public weight into its update and quantises it: x_u = Q(p_u Δ_u) ∈ Z_{2^b}, coordinates clipped to
   [−c, c] and scaled by L = (2^(b−1) − 1)/(n c) so that the sum of n of them cannot wrap (`quantise`);
2. agrees a pair seed s_uv with each neighbour v of a k-regular graph (a Harary graph with randomly relabelled
   nodes, Bell et al. §4) by Diffie–Hellman, s_uv = g^(sk_u sk_v) mod P (`pair_seed`);
3. Shamir-shares (threshold t) its self-mask seed b_u and its secret key sk_u among its k neighbours (`share`);
4. sends y_u = x_u + PRG(b_u) + Σ_{v ∈ N(u)} ±PRG(s_uv) mod 2^b, + for v > u and − for v < u (Bonawitz et al.,
   eq. (1); `masked_inputs`).

Clients lost before y_u arrives (``LocalResult.dropped``: late for a deadline, a lost node) are the dropouts: the
server asks each survivor's neighbours for shares of b_u and each dropout's neighbours for shares of sk_v, rebuilds
them with any t shares, and removes the self-masks and the pairwise masks left unmatched (`unmask`). If some secret
has fewer than t surviving share holders (or fewer than t clients survive) the round fails: ``secagg_failed`` is 1
and the model does not change. The server then divides the exact sum by Σ_u p_u over the survivors: the base's
weighted mean of the survivors' updates for weights proportional to public numbers (FedAvg's sample counts or 1).

What is simulated: the integer arithmetic, the graph, the key agreement (over the Mersenne prime 2^127 − 1, no
real security), Shamir's scheme (exact integers over the same prime field), the dropouts and the recovery. What is
not: encryption of the shares, signatures, a malicious server, dropouts during unmasking. The PRG is NumPy's
SFC64 (`prg`), not a cryptographic one. With ``protocol: flower`` the round runs Flower's own SecAgg+ between the
nodes of ``--engine flower`` instead (`SecureMean`, `fedhet.flower.secagg`).

With differential privacy (``dp_clip: C``, ``noise_multiplier: z`` or a target ε through ``privacy.target_epsilon``:
distributed DP, Kairouz et al., ICML 2021, in its simplest form): before step 1 each client clips its update to L2
norm C, Δ_u · min(1, C/‖Δ_u‖), and adds its own Gaussian noise N(0, σ_u² I) with σ_u = z·C/√t, t the threshold
(`dp_noise`; the draws from (seed, "secagg-dp-noise", round, client)); the weights are uniform, as in DP-FedAvg.
A round that succeeds has ≥ t survivors, so the noise in the unmasked sum has standard deviation √s·σ_u ≥ z·C on
each coordinate: the sum is at least as private as central DP-FedAvg's Σ_u Δ_u + N(0, (zC)² I), and the run's
ledger accounts exactly that (conservatively): one Gaussian release of noise multiplier z on the sum, sensitivity
C, each round, with the run's sampling (the base's m of the K clients; `release`). Not accounted: the quantisation
after the noise (stochastic rounding, and the coordinate clip to [−c, c], which a large enough c leaves idle), and
a server that lies about who dropped (with fewer than t honest survivors the noise is below z·C).
"""

from __future__ import annotations

import functools
import math
import warnings
from collections.abc import Callable, Sequence
from dataclasses import replace
from typing import Any, ClassVar, Literal, Protocol, runtime_checkable

import numpy as np
import torch
from pydantic import Field, PrivateAttr, model_validator
from torch import Tensor

from fedhet.engine.plan import LocalPlan, LocalResult, Upload
from fedhet.errors import ConfigError, FedhetNote
from fedhet.privacy.accounting import Release
from fedhet.privacy.mechanisms import Mechanism, RunShape, Unit
from fedhet.privacy.settings import PrivacyConfig
from fedhet.privacy.strategy import uniform_by_default, weights_of
from fedhet.seeding import derive_seed, numpy_rng, torch_gen
from fedhet.strategies.base import STRATEGIES, ServerContext, Strategy, Train
from fedhet.strategies.wrapper import Wrapper

PRIME = 2**127 - 1  # the field of Shamir's shares and the group of the simulated Diffie-Hellman
GENERATOR = 3
FIELD_BYTES = 16  # one field element (a share, a public key) on the wire
EXTRA_TRIPS = 3  # the protocol's message round trips besides the masked input: advertise keys, share keys, unmask


# --- quantisation -------------------------------------------------------------------------------------------------


def levels(bits: int, clip: float, n: int) -> float:
    """L = (2^(b−1) − 1)/(n c): the scale of `quantise`, so that n values in [−c, c] sum without wrapping mod 2^b."""
    return (2 ** (bits - 1) - 1) / (n * clip)


def uniform(stream: np.random.SFC64, shape: tuple[int, ...], out: np.ndarray | None = None) -> np.ndarray:
    """Stochastic rounding's U, float64 in [0, 1): j·2^−32 for j the 32-bit halves of SFC64's raw 64-bit output (the
    masks' fast bits, `_expand`), each row of P numbers from the next ⌈P/2⌉ draws of `stream` (an odd P leaves the
    last half unused), row after row; `out` (contiguous, of `shape`) receives them."""
    out = np.empty(shape) if out is None else out
    for row in out.reshape(-1, shape[-1]):
        np.multiply(stream.random_raw((len(row) + 1) // 2).view(np.uint32)[: len(row)], 2.0**-32, out=row)
    return out


def quantise(
    x: Tensor,
    bits: int,
    clip: float,
    n: int,
    rounding: Literal["stochastic", "deterministic"],
    gen: np.random.SFC64 | None = None,
    overwrite: bool = False,
    noise: np.ndarray | None = None,
    reduce: bool = True,
) -> np.ndarray:
    """x (…, P) clipped to [−c, c], scaled by `levels`, rounded (stochastic: ⌊v + U⌋ with U from `gen`, `uniform`,
    unbiased to within 2^−32 of a level; deterministic: to the nearest) and taken mod 2^b (two's complement), as
    uint64. One float64 workspace, reused for the integers (`overwrite`: a contiguous float64 x is that workspace,
    and is lost); `noise`, a contiguous float64 array of x's shape, holds the U (a buffer kept across rounds: fresh
    memory for 10^7 numbers costs more than drawing them). Without `reduce` (b ≤ 51) the values are left as
    v + K mod 2^64 for a constant K ≡ 0 mod 2^b, the same numbers mod 2^b (for a sum reduced once at its end)."""
    v = x.detach().to(torch.float64)  # x's own memory when x is float64
    if x.dtype == torch.float64 and not (overwrite and x.is_contiguous()):
        v = v.clone(memory_format=torch.contiguous_format)
    work = v.clamp_(-clip, clip).mul_(levels(bits, clip, n)).numpy()
    if rounding == "stochastic":  # 2^-32 of a level is ample
        np.add(work, uniform(gen if gen is not None else np.random.SFC64(), work.shape, noise), out=work)
        np.floor(work, out=work)
    if bits <= 51:  # |v| < 2^50: adding 1.5·2^52 rounds to an integer (half to even) and leaves v mod 2^b in the bits
        work += 1.5 * 2.0**52  # its bits are K + v, K = 0x4338 << 48 ≡ 0 mod 2^b
        values = work.view(np.uint64)
        if not reduce:
            return values
    else:
        values = work.view(np.uint64)  # the same memory, element for element
        np.rint(work, out=values.view(np.int64), casting="unsafe")
    values &= np.uint64(2**bits - 1)
    return values


def dequantise(total: np.ndarray, bits: int, clip: float, n: int) -> Tensor:
    """The signed value of a sum mod 2^b (≥ 2^(b−1): negative), over the scale L: Σ x_u within n/L (deterministic
    rounding: n/(2L)) per coordinate."""
    signed = total.astype(np.int64) - np.where(total >= 2 ** (bits - 1), np.int64(2**bits), np.int64(0))
    return torch.from_numpy(signed.astype(np.float64) / levels(bits, clip, n))


# --- PRG, graph, key agreement, Shamir ----------------------------------------------------------------------------


def _expand(seed: int, size: int, bits: int) -> np.ndarray:
    """PRG(seed): `size` numbers uniform mod 2^b, the raw output of NumPy's SFC64 seeded by `seed` (the fastest of
    NumPy's bit generators here), one 64-bit draw split into two numbers for b ≤ 32: uint32 for b ≤ 32, else
    uint64."""
    raw = np.random.SFC64(int(seed)).random_raw((size + 1) // 2 if bits <= 32 else size)
    out = raw.view(np.uint32)[:size] if bits <= 32 else raw
    out &= out.dtype.type(2**bits - 1)
    return out


def prg(seeds: np.ndarray, size: int, bits: int) -> np.ndarray:
    """(len(seeds), size) uint64 values, uniform mod 2^b, one row per seed (`_expand`; a real deployment would use a
    cryptographic PRG such as AES in counter mode)."""
    out = np.empty((len(seeds), size), dtype=np.uint64)
    for row, seed in zip(out, np.asarray(seeds, dtype=np.uint64).tolist(), strict=True):
        row[:] = _expand(seed, size, bits)
    return out


def prg_sum(seeds: Sequence[int], size: int, bits: int) -> np.ndarray:
    """Σ_i PRG(seeds_i) as uint64, mod 2^64, or mod 2^32 for b ≤ 32 (added in uint32: a multiple of 2^b all the
    same; reduce mod 2^b after), the rows of `prg` added as they are made."""
    total: np.ndarray = np.zeros(size, dtype=np.uint32 if bits <= 32 else np.uint64)
    for seed in seeds:
        total += _expand(int(seed), size, bits)
    return total.astype(np.uint64)


def default_degree(n: int) -> int:
    """k = O(log n) (Bell et al. 2020): the even number 2⌈1.5 log₂ n⌉, at most n − 1 (then the complete graph,
    i.e. SecAgg); n = 100 → 20."""
    return min(n - 1, 2 * math.ceil(1.5 * math.log2(max(n, 2))))


def default_threshold(degree: int) -> int:
    """t = ⌊k/2⌋ + 1: a strict majority of a client's k share holders (Bell et al.; Bonawitz et al. need t > n/2
    against an honest-but-curious server)."""
    return degree // 2 + 1


def harary_graph(n: int, degree: int, rng: np.random.Generator) -> list[list[int]]:
    """The neighbours of each of n nodes in the Harary graph H(n, k) with randomly relabelled nodes: node i is joined
    to i ± 1, …, i ± k/2 (mod n), k even; k ≥ n − 1 gives the complete graph."""
    if degree >= n - 1:
        return [[v for v in range(n) if v != u] for u in range(n)]
    if degree % 2:
        raise ValueError(f"a Harary graph on any n needs an even degree, not {degree}")
    label = rng.permutation(n)
    out: list[set[int]] = [set() for _ in range(n)]
    for i in range(n):
        for j in range(1, degree // 2 + 1):
            a, b = int(label[i]), int(label[(i + j) % n])
            out[a].add(b)
            out[b].add(a)
    return [sorted(s) for s in out]


def public_key(secret: int) -> int:
    """g^sk mod P (simulated Diffie–Hellman)."""
    return pow(GENERATOR, secret, PRIME)


def pair_seed(secret: int, other_public: int) -> int:
    """s_uv = (g^sk_v)^sk_u mod P, the same from either side, reduced to a 64-bit PRG seed."""
    return pow(other_public, secret, PRIME) % 2**64


def share(secret: int, holders: int, threshold: int, rng: np.random.Generator) -> list[tuple[int, int]]:
    """Shamir's t-of-n shares (x, f(x)) for x = 1…holders of f(z) = s + a₁z + … + a_{t−1}z^(t−1) over GF(P)."""
    raw = rng.bytes(16 * (threshold - 1)) if threshold > 1 else b""  # the bytes of t − 1 draws of 16, in one call
    return _shares(secret, holders, raw)


def _shares(secret: int, holders: int, raw: bytes) -> list[tuple[int, int]]:
    """`share` with the coefficients a₁, …, a_{t−1} from `raw`, 16 bytes each."""
    coeffs = [secret % PRIME] + [int.from_bytes(raw[i : i + 16], "little") % PRIME for i in range(0, len(raw), 16)]
    out = []
    for x in range(1, holders + 1):
        y = 0
        for c in reversed(coeffs):  # Horner's rule, reduced once: y stays below P·(holders + 1)^t
            y = y * x + c
        out.append((x, y % PRIME))
    return out


def reconstruct(shares: list[tuple[int, int]], threshold: int) -> int:
    """f(0) by Lagrange interpolation from `threshold` of the shares; ValueError with fewer."""
    if len(shares) < threshold:
        raise ValueError(f"{len(shares)} shares cannot rebuild a secret of threshold {threshold}")
    picked = shares[:threshold]
    basis = _lagrange_at_zero(tuple(x for x, _ in picked))
    return sum(y * c for (_, y), c in zip(picked, basis, strict=True)) % PRIME


@functools.lru_cache(maxsize=256)
def _lagrange_at_zero(xs: tuple[int, ...]) -> tuple[int, ...]:
    """ℓ_j(0) = Π_{m ≠ j} −x_m / (x_j − x_m) mod P for the points `xs` (they depend on which holders answered, not
    on the secret: one computation serves a round's secrets)."""
    out = []
    for j, xj in enumerate(xs):
        num, den = 1, 1
        for m, xm in enumerate(xs):
            if m != j:
                num, den = num * -xm % PRIME, den * (xj - xm) % PRIME
        out.append(num * pow(den, -1, PRIME) % PRIME)
    return tuple(out)


# --- one round ----------------------------------------------------------------------------------------------------


class Keys:
    """A cohort's secrets for one round: the graph, secret keys sk_u, self-mask seeds b_u, and their shares (the
    i-th share of u's secrets is held by u's i-th neighbour)."""

    def __init__(self, n: int, degree: int, threshold: int, rng: np.random.Generator) -> None:
        self.n, self.degree, self.threshold = n, min(degree, n - 1), threshold
        self.graph = harary_graph(n, self.degree, rng)
        # the bytes of every draw of 16 (a secret key, a coefficient of `share`) in one call: Generator.bytes gives
        # the same stream in one call as in many of multiples of 4 bytes (tested), at a fraction of the calls' cost
        raw = rng.bytes(16 * n)
        self.secret = [1 + int.from_bytes(raw[i : i + 16], "little") % (PRIME - 2) for i in range(0, 16 * n, 16)]
        self.public = [public_key(s) for s in self.secret]
        self.self_seed = [int(s) for s in rng.integers(0, 2**63, size=n)]
        self.secret_shares = self._share_all(self.secret, threshold, rng)
        self.seed_shares = self._share_all(self.self_seed, threshold, rng)
        self._self_masks: tuple[tuple[tuple[int, ...], int, int], np.ndarray] | None = None
        self._pair_masks: tuple[tuple[tuple[tuple[int, bool], ...], int, int], np.ndarray] | None = None

    def _share_all(self, secrets: list[int], threshold: int, rng: np.random.Generator) -> list[list[tuple[int, int]]]:
        """`share` of each secret among its owner's neighbours, one after another (the coefficients' bytes in one
        draw)."""
        width = 16 * (threshold - 1)
        raw = rng.bytes(width * len(secrets)) if width else b""
        return [
            _shares(secret, len(g), raw[i * width : (i + 1) * width])
            for i, (secret, g) in enumerate(zip(secrets, self.graph, strict=True))
        ]

    def self_masks(self, seeds: Sequence[int], size: int, bits: int) -> np.ndarray:
        """Σ_u PRG(b_u) over the self-mask seeds `seeds` (mod 2^64), expanded once a round: the survivors add it, and
        the server, having rebuilt the same seeds from their shares, removes the same deterministic array (other
        seeds, e.g. a wrong reconstruction, are expanded afresh). Read-only."""
        key = (tuple(int(s) for s in seeds), size, bits)
        if self._self_masks is None or self._self_masks[0] != key:
            self._self_masks = (key, prg_sum(key[0], size, bits))
        return self._self_masks[1]

    def pair_masks(self, signed: tuple[tuple[int, bool], ...], size: int, bits: int) -> np.ndarray:
        """Σ ±PRG(s) over (s, +) pairs of `signed` (mod 2^64), expanded once a round like `self_masks`: other seeds
        (a wrong reconstruction) are expanded afresh. Read-only."""
        key = (signed, size, bits)
        if self._pair_masks is None or self._pair_masks[0] != key:
            total = np.zeros(size, dtype=np.uint64)
            for seed, plus in signed:
                mask = _expand(seed, size, bits)
                if plus:
                    total += mask
                else:
                    total -= mask
            self._pair_masks = (key, total)
        return self._pair_masks[1]

    def pairs(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Every edge (u < v) and its seed s_uv, agreed from u's side."""
        us, vs = zip(*[(u, v) for u in range(self.n) for v in self.graph[u] if u < v], strict=True)
        seeds = [pair_seed(self.secret[u], self.public[v]) for u, v in zip(us, vs, strict=True)]
        return np.array(us), np.array(vs), np.array(seeds, dtype=np.uint64)

    def surviving_shares(self, owner: int, alive: np.ndarray, of: Literal["secret", "seed"]) -> list[tuple[int, int]]:
        """The shares of `owner`'s secret key or self-mask seed that its surviving neighbours reveal."""
        shares = self.secret_shares[owner] if of == "secret" else self.seed_shares[owner]
        return [s for s, holder in zip(shares, self.graph[owner], strict=True) if alive[holder]]


def masked_inputs(x: np.ndarray, keys: Keys, bits: int) -> np.ndarray:
    """y_u = x_u + PRG(b_u) + Σ_{v ∈ N(u), v > u} PRG(s_uv) − Σ_{v ∈ N(u), v < u} PRG(s_uv) mod 2^b, for all n."""
    mod = np.uint64(2**bits - 1)
    y = (x + prg(np.array(keys.self_seed, dtype=np.uint64), x.shape[1], bits)) & mod
    if keys.n > 1:
        us, vs, seeds = keys.pairs()
        for u, v, seed in zip(us, vs, seeds, strict=True):
            mask = prg(seed[None], x.shape[1], bits)[0]
            y[u] += mask  # uint64 wraps mod 2^64, a multiple of 2^b
            y[v] -= mask
        y &= mod
    return y


def masked_sum(x: np.ndarray, alive: np.ndarray, keys: Keys, bits: int) -> np.ndarray:
    """Σ_{u alive} y_u mod 2^b without forming each y_u: the survivors' inputs, self-masks, and only the pair masks
    that do not cancel (towards a dropout); the same integers as summing `masked_inputs`' rows, at a fraction of
    the cost (the pair masks between survivors cancel exactly, as the tests check)."""
    inputs = x if alive.all() else x[np.flatnonzero(alive)]
    return masked_total(inputs.sum(axis=0, dtype=np.uint64), alive, keys, bits)


def masked_total(inputs: np.ndarray, alive: np.ndarray, keys: Keys, bits: int) -> np.ndarray:
    """`masked_sum` from the survivors' inputs already summed, Σ_{u alive} x_u (uint64, mod 2^64): plus their
    self-masks and the pair masks towards the dropouts, mod 2^b (a new array)."""
    total = inputs + keys.self_masks([keys.self_seed[u] for u in np.flatnonzero(alive)], len(inputs), bits)
    total += _unmatched(alive, keys, len(inputs), bits, lambda u, v: pair_seed(keys.secret[u], keys.public[v]))
    total &= np.uint64(2**bits - 1)
    return total


def _unmatched(alive: np.ndarray, keys: Keys, size: int, bits: int, seed: Callable[[int, int], int]) -> np.ndarray:
    """Σ over edges (u alive, v dropped) of the mask survivor u added for v: +PRG(s_uv) for u < v, −PRG(s_uv) for
    u > v (mod 2^64); `seed(u, v)` gives s_uv. Expanded once a round, as the self-masks are (`Keys.pair_masks`): the
    survivors add it and the server, having rebuilt the dropouts' keys and so the same seeds, removes it."""
    signed = tuple((seed(u, v), u < v) for v in map(int, np.flatnonzero(~alive)) for u in keys.graph[v] if alive[u])
    return keys.pair_masks(signed, size, bits)


def unmask(total: np.ndarray, alive: np.ndarray, keys: Keys, bits: int) -> np.ndarray | None:
    """Σ_{u alive} x_u mod 2^b from the masked sum Σ_{u alive} y_u: the survivors' self-masks rebuilt from shares of
    b_u, the pair masks towards each dropout v from sk_v rebuilt from its neighbours' shares. None when a secret
    has fewer than t surviving share holders, or fewer than t clients survive (the round fails)."""
    mod = np.uint64(2**bits - 1)
    survivors = np.flatnonzero(alive)
    if len(survivors) < keys.threshold:
        return None
    seeds, secrets = [], {}
    for u in map(int, survivors):
        held = keys.surviving_shares(u, alive, "seed")
        if len(held) < keys.threshold:
            return None
        seeds.append(reconstruct(held, keys.threshold))
    for v in map(int, np.flatnonzero(~alive)):
        held = keys.surviving_shares(v, alive, "secret")
        if len(held) < keys.threshold:
            return None
        secrets[v] = reconstruct(held, keys.threshold)
    out = total - keys.self_masks(seeds, len(total), bits)
    out -= _unmatched(alive, keys, len(total), bits, lambda u, v: pair_seed(secrets[v], keys.public[u]))
    out &= mod
    return out


def client_bytes(size: int, bits: int, degree: int) -> int:
    """Bytes a client sends and receives in a round: its masked vector ⌈P b/8⌉, two shares (of b_u and of sk_u) to
    each of its k neighbours, and k + 1 public keys (its own and its neighbours'), 16-byte field elements; O(k + P),
    i.e. O(log n + P) with SecAgg+'s degree (Bell et al. 2020, Table 1) against SecAgg's O(n + P)."""
    return math.ceil(size * bits / 8) + 2 * degree * FIELD_BYTES + (degree + 1) * FIELD_BYTES


def dp_noise(
    updates: Tensor, clients: Tensor, clip: float, std: float, seed: int, round_: int
) -> tuple[Tensor, Tensor]:
    """Each client's side of distributed DP: its update (a float64 row of `updates`) clipped to L2 norm `clip`, plus
    N(0, std² I) drawn from (seed, "secagg-dp-noise", round, client); the rows, and which were clipped."""
    out = updates.to(torch.float64, copy=True)
    norms = torch.linalg.vector_norm(out, dim=1)
    clipped = norms > clip
    out[clipped] *= (clip / norms[clipped]).unsqueeze(1)
    if std > 0:
        for row, client in zip(out, clients.tolist(), strict=True):
            gen = torch_gen(seed, "secagg-dp-noise", round_, int(client))
            row += torch.randn(row.shape, generator=gen, dtype=torch.float64).mul_(std)
    return out, clipped


@runtime_checkable
class SecureMean(Protocol):
    """An engine that aggregates by a real secure aggregation protocol (`fedhet.flower.remote.RemoteEngine`: Flower's
    SecAgg+ between its nodes)."""

    def secure_mean(
        self,
        round_: int,
        clients: Tensor,
        weights: Tensor,
        sizes: Callable[[int], tuple[int, int]],
        clip: float,
        bits: int,
    ) -> tuple[Tensor | None, Tensor]:
        """Σ_u p_u Δ_u / Σ_u p_u over `clients` (None: the protocol failed) and the clients it includes."""
        ...


# --- the wrapper --------------------------------------------------------------------------------------------------


@STRATEGIES.register
class SecAgg(Wrapper, Mechanism):
    """The base's weighted mean computed by secure aggregation (SecAgg+): quantised, masked updates whose masks
    cancel in the sum, dropouts recovered from Shamir shares; a round with too few survivors fails
    (``secagg_failed``) and leaves the model unchanged. With ``dp_clip`` it is also a privacy mechanism (distributed
    DP, module docstring), which the run's ledger accounts (`Mechanism.active`)."""

    model_config = Strategy.model_config
    name: ClassVar[str] = "secagg"
    level: ClassVar[str] = "client"
    prefix: ClassVar[str] = "dp"
    noise_key: ClassVar[str | None] = "algorithm.noise_multiplier"
    description: ClassVar[str] = "secure aggregation (SecAgg+, simulated): masked, quantised updates of a weighted mean"
    base: str | dict[str, Any] = Field(
        "fedavg", validate_default=True, description="the strategy whose weighted mean is aggregated securely"
    )
    bits: int = Field(32, ge=8, le=62, description="b: updates are quantised to integers mod 2^b")
    clip: float = Field(1.0, gt=0, description="c: each coordinate of p_k Δ_k is clipped to [-c, c] before quantising")
    rounding: Literal["stochastic", "deterministic"] = Field(
        "stochastic", description="stochastic (unbiased) or deterministic (nearest) rounding"
    )
    degree: int | None = Field(
        None, ge=2, description="k: neighbours per client, made even, at most n-1 (None: 2*ceil(1.5 log2 n))"
    )
    threshold: int | None = Field(
        None, ge=1, description="t: shares needed to rebuild a secret, at most k (None: k // 2 + 1)"
    )
    masks: Literal["net", "all"] = Field(
        "net", description="net: only the masks that do not cancel; all: every client's masked vector (slower)"
    )
    protocol: Literal["fedhet", "flower"] = Field(
        "fedhet",
        description="fedhet: simulated on the server; flower: Flower's SecAgg+ mod and workflow between the Flower "
        "nodes (--engine flower; bits <= 32, stochastic rounding, no dp_clip)",
    )

    dp_clip: float | None = Field(
        None,
        gt=0,
        allow_inf_nan=True,
        description="distributed DP: C, each update is clipped to L2 norm <= C before its noise (None: no DP)",
    )
    noise_multiplier: float | None = Field(
        None,
        ge=0,
        description="distributed DP: z, each client adds N(0, (zC)^2/t) (None: from privacy.target_epsilon, else 1.0)",
    )

    _cohort: Tensor | None = PrivateAttr(None)
    _last: dict[str, float] = PrivateAttr(default_factory=dict)
    _noted: bool = PrivateAttr(False)  # the first failed round of a run is a note
    _buffers: dict[str, Tensor] = PrivateAttr(default_factory=dict)  # workspaces reused across rounds

    @model_validator(mode="before")
    @classmethod
    def _uniform_with_dp(cls, data: Any) -> Any:
        if isinstance(data, dict) and data.get("dp_clip") is not None:
            return {**data, "base": uniform_by_default(data.get("base", "fedavg"))}
        return data

    @model_validator(mode="after")
    def _consistent(self) -> SecAgg:
        if self.protocol == "flower":
            unsupported = [
                what
                for what, bad in (
                    (f"bits {self.bits} (Flower's masks are at most 32 bits)", self.bits > 32),
                    ("rounding: deterministic (Flower rounds stochastically)", self.rounding != "stochastic"),
                    ("masks: all", self.masks != "net"),
                    ("dp_clip (the noise would be added on the nodes)", self.dp_clip is not None),
                )
                if bad
            ]
            if unsupported:
                raise ValueError(f"protocol: flower runs Flower's own SecAgg+, without {'; '.join(unsupported)}")
        if self.dp_clip is None:
            if self.noise_multiplier is not None:
                raise ValueError(
                    "algorithm.noise_multiplier is the noise over the clipping bound: set algorithm.dp_clip too"
                )
            return self
        if math.isinf(self.dp_clip) and self.noise_multiplier != 0:
            raise ValueError(
                "the noise is z times the clipping bound: give a finite dp_clip (an infinite one only with "
                "noise_multiplier: 0)"
            )
        weighting = getattr(self.inner, "weighting", None)
        if weighting != "uniform":
            raise ValueError(
                f"distributed DP weighs every clipped update equally (DP-FedAvg), and the base weighs them by "
                f"{weighting or 'its own rule'}: set algorithm.base.weighting: uniform"
            )
        return self

    @classmethod
    def check_base(cls, built: Strategy) -> None:
        super().check_base(built)
        if built.asynchronous or not weights_of(built):
            raise ValueError(
                f"secure aggregation sums weighted updates, and '{built.name}' does not aggregate by a weighted sum "
                "with declared weights: choose a base such as fedavg, fedprox or maxfl"
            )

    def setup(self, ctx: ServerContext) -> None:
        super().setup(ctx)
        self._last, self._noted, self._buffers = {}, False, {}
        if self.protocol == "flower" and not isinstance(ctx.engine, SecureMean):
            raise ConfigError(
                "algorithm.protocol: flower runs Flower's SecAgg+ between Flower nodes: run with --engine flower, "
                "or leave algorithm.protocol at fedhet (simulated)"
            )
        if self.protocol == "flower" and getattr(ctx.attack, "update", "none") != "none":
            raise ConfigError(
                "algorithm.protocol: flower keeps each client's update on its node (the server learns their sum "
                "only), so the attack's update corruption has nothing to act on: set attack.update: none, or leave "
                "algorithm.protocol at fedhet"
            )
        if 2 ** (self.bits - 1) - 1 < 2 * ctx.clients_per_round * 2**7:
            raise ConfigError(
                f"algorithm.bits {self.bits} leaves too few quantisation levels for {ctx.clients_per_round} clients "
                "a round; raise algorithm.bits"
            )

    def sizes(self, n: int) -> tuple[int, int]:
        """(k, t) for a cohort of n clients."""
        k = min(n - 1, self.degree if self.degree is not None else default_degree(n))
        k += k % 2 if k < n - 1 else 0  # a Harary graph on any n needs an even degree
        k = min(k, n - 1)
        return k, min(self.threshold if self.threshold is not None else default_threshold(k), max(k, 1))

    def local_training(self, round_: int, clients: Tensor, global_params: Tensor, train: Train) -> LocalResult:
        upload = Upload(client_bytes(global_params.numel(), self.bits, self.sizes(len(clients))[0]), EXTRA_TRIPS)

        def plain(plan: LocalPlan) -> LocalResult:
            reported = [t.name for t in plan.terms if t.reports_state]
            if reported:
                raise ConfigError(
                    f"secure aggregation hides the model updates, but '{self.inner.name}' also sends the state of "
                    f"{', '.join(reported)} in the clear; choose another base strategy"
                )
            return train(replace(plan, upload=upload))  # the protocol's bytes and round trips on the clock

        result = self.inner.local_training(round_, clients, global_params, plain)
        self._cohort = result.clients.clone()
        lost = result.dropped if result.dropped is not None else torch.zeros(len(result.clients), dtype=torch.bool)
        k, t = self.sizes(len(result.clients))
        self._last = self._columns(global_params.numel(), k, t, int(lost.sum()), failed=bool(lost.all()))
        return result

    def _columns(self, size: int, k: int, t: int, lost: int, failed: bool) -> dict[str, float]:
        return {
            "secagg_failed": float(failed),
            "secagg_dropouts": float(lost),
            "secagg_degree": float(k),
            "secagg_threshold": float(t),
            "secagg_client_bytes": float(client_bytes(size, self.bits, k)),
        }

    def aggregate(self, round_: int, global_params: Tensor, result: LocalResult) -> Tensor:
        if self.protocol == "flower":
            return self._aggregate_on_flower(round_, global_params, result)
        cohort = self._cohort if self._cohort is not None else result.clients
        index = {c: i for i, c in enumerate(cohort.tolist())}
        order = np.array([index[c] for c in result.clients.tolist()], dtype=np.int64)  # survivors' cohort rows
        n = len(cohort)
        alive = np.zeros(n, dtype=bool)
        alive[order] = True
        k, t = self.sizes(n)
        rng = numpy_rng(self.ctx.seed, "secagg", round_)
        keys = Keys(n, k, t, rng)
        weights = self.inner.aggregation_weights(round_, result)
        assert weights is not None  # check_base refused bases without them
        gen = np.random.SFC64(derive_seed(self.ctx.seed, "secagg-rounding", round_))
        updates: Tensor | None = None  # Δ_u row by row (`_quantised`) unless DP changes them first
        dp: dict[str, float] = {}
        if self.dp_clip is not None:
            updates = result.updates(global_params)
            std = self.z * self.dp_clip / math.sqrt(t) if self.z > 0 else 0.0
            updates, clipped = dp_noise(updates, result.clients, self.dp_clip, std, self.ctx.seed, round_)
            share = float(clipped.double().mean()) if len(clipped) else float("nan")
            dp = {"dp_noise_std": std, "dp_noise_multiplier": self.z, "dp_clipped_share": share}
        inputs, x = self._quantised(
            global_params, result, updates, weights, n, gen, order if self.masks == "all" else None
        )
        if x is not None:
            masked = masked_inputs(x, keys, self.bits)[alive].sum(axis=0, dtype=np.uint64) & np.uint64(2**self.bits - 1)
        else:
            masked = masked_total(inputs, alive, keys, self.bits)
        total = unmask(masked, alive, keys, self.bits)
        self._last = {**self._columns(global_params.numel(), k, t, int((~alive).sum()), failed=total is None), **dp}
        if total is None:
            self._note_failure(round_, int((~alive).sum()), n, t)
            return global_params
        direction = dequantise(total, self.bits, self.clip, n) / float(weights.double().sum())
        return self.inner.server_step(global_params, direction.to(global_params.dtype))

    def _aggregate_on_flower(self, round_: int, global_params: Tensor, result: LocalResult) -> Tensor:
        """The base's weighted mean of the survivors by Flower's SecAgg+ between the nodes that trained them
        (`fedhet.flower.secagg`); the engine is a `SecureMean`."""
        engine = self.ctx.engine
        assert isinstance(engine, SecureMean)  # setup refused other engines
        n = len(self._cohort) if self._cohort is not None else len(result.clients)
        weights = self.inner.aggregation_weights(round_, result)
        assert weights is not None  # check_base refused bases without them
        mean, included = engine.secure_mean(round_, result.clients, weights, self.sizes, self.clip, self.bits)
        k, t = self.sizes(n)
        lost = n - (len(included) if mean is not None else 0)
        self._last = self._columns(global_params.numel(), k, t, lost, failed=mean is None)
        if mean is None:
            self._note_failure(round_, lost, n, t)
            return global_params
        return self.inner.server_step(global_params, mean.to(global_params.dtype))

    def _note_failure(self, round_: int, lost: int, n: int, t: int) -> None:
        """The first failed round of a run is a note."""
        if self._noted:
            return
        self._noted = True
        warnings.warn(
            f"round {round_ + 1}: secure aggregation failed ({lost} of {n} clients dropped, "
            f"and some secret kept fewer than t = {t} share holders), so the model did not change; "
            "metrics.csv marks such rounds (secagg_failed); lower algorithm.threshold or the dropouts",
            FedhetNote,
            stacklevel=3,
        )

    def _quantised(
        self,
        global_params: Tensor,
        result: LocalResult,
        updates: Tensor | None,
        weights: Tensor,
        n: int,
        gen: np.random.SFC64,
        rows: np.ndarray | None,
    ) -> tuple[np.ndarray, np.ndarray | None]:
        """Σ_u x_u, x_u = Q(p_u Δ_u) (`quantise`, Δ_u a row of `updates`, else w − w_u), mod 2^b once reduced;
        with `rows` (the survivors' rows of the cohort) also every x_u, zeros for the dropouts. One survivor at a
        time, in the survivors' order, through a workspace of one row: the same integers as `quantise` on all the
        rows at once (the stochastic rounding's U are the same draws of `gen`, taken row after row), without a
        cohort-sized array in memory."""
        size = global_params.numel()
        work = self._buffer("work", torch.Size([1, size]), torch.float64)
        noise = (
            self._buffer("noise", torch.Size([1, size]), torch.float64).numpy()
            if self.rounding == "stochastic"
            else None
        )
        kind = torch.promote_types(global_params.dtype, result.params.dtype)
        delta = self._buffer("delta", global_params.shape, kind) if updates is None else None
        total = np.zeros(size, dtype=np.uint64)
        every = np.zeros((n, size), dtype=np.uint64) if rows is not None else None
        for i, p in enumerate(weights.double().tolist()):
            if updates is None:
                assert delta is not None
                row = torch.sub(global_params, result.params[i], out=delta)  # `LocalResult.updates`, one row
            else:
                row = updates[i]
            work[0].copy_(row)
            work.mul_(p)  # p_u Δ_u in float64, Δ_u's float32 values exactly
            x = quantise(
                work, self.bits, self.clip, n, self.rounding, gen, overwrite=True, noise=noise, reduce=rows is not None
            )[0]
            total += x
            if every is not None and rows is not None:
                every[rows[i]] = x
        return total, every

    def _buffer(self, name: str, shape: torch.Size, dtype: torch.dtype) -> Tensor:
        """A workspace kept across rounds (one row of the quantisation)."""
        held = self._buffers.get(name)
        if held is None or held.shape != shape or held.dtype != dtype:
            held = self._buffers[name] = torch.empty(shape, dtype=dtype)
        return held

    def personalization(self, clients: Tensor) -> LocalPlan | None:
        return self.inner.personalization(clients)

    def round_metrics(self) -> dict[str, float]:
        return {**self.inner.round_metrics(), **self._last}

    def state_dict(self) -> dict[str, Any]:
        return {"base": self.inner.state_dict(), "last": dict(self._last)}

    # -- distributed DP's release (`fedhet.privacy.ledger`) -----------------------------------------------------------
    def active(self) -> bool:
        return self.dp_clip is not None

    def unit(self) -> Unit:
        return "round"

    def release(self, z: float, n: int, shape: RunShape, settings: PrivacyConfig) -> Release:
        """Central DP-FedAvg's release, which the ≥ t survivors' noise bounds (module docstring): a Gaussian of
        multiplier z on the sum of the base's fixed-size sample of m of the K seen clients (replace-one), in full
        without amplification."""
        if not settings.amplification:
            return Release(z, "none", replace=True)
        population = int(shape.seen.sum())
        return Release(z, "fixed", population=population, sample=min(shape.clients_per_round, population))

    def assumes_uniform_cohort(self, settings: PrivacyConfig) -> bool:
        return settings.amplification

    def noise_limit(self, shape: RunShape) -> tuple[float, str]:
        """Beyond z = m√T the noise on one coordinate of the mean over T rounds exceeds what T clipped means move."""
        m = max(1, min(shape.clients_per_round, int(shape.seen.sum())))
        return m * math.sqrt(max(1, shape.rounds)), f"m·√T, m = {shape.clients_per_round}, T = {shape.rounds} rounds"

    def report(self, rounds: int) -> dict[str, Any]:
        return {"noise_multiplier": self.z, "noise": "distributed", "sampling": "fixed", "clip": self.dp_clip}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.inner.load_state_dict(state["base"])
        self._last = {str(k): float(v) for k, v in state["last"].items()}
