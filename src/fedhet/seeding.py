"""Deterministic random streams.

Every random draw comes from a stream derived from (seed, purpose, *keys) such as (seed, "batches", round,
client). Streams do not depend on the order in which they are created, so the two engine backends and a resumed
run draw exactly the same numbers.
"""

from __future__ import annotations

import hashlib

import numpy as np
import torch


def derive_seed(seed: int, purpose: str, *keys: int) -> int:
    """A 63-bit integer seed from a base seed, a purpose string and integer keys (stable across runs)."""
    text = f"{seed}/{purpose}/" + "/".join(str(int(k)) for k in keys)
    return int.from_bytes(hashlib.blake2b(text.encode(), digest_size=8).digest(), "little") >> 1


def numpy_rng(seed: int, purpose: str, *keys: int) -> np.random.Generator:
    """A NumPy generator for (seed, purpose, keys)."""
    return np.random.default_rng(derive_seed(seed, purpose, *keys))


def torch_gen(seed: int, purpose: str, *keys: int) -> torch.Generator:
    """A CPU torch generator for (seed, purpose, keys)."""
    gen = torch.Generator()
    gen.manual_seed(derive_seed(seed, purpose, *keys))
    return gen
