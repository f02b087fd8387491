"""Deterministic random streams.

Every random draw comes from a stream derived from (seed, purpose, *keys) such as (seed, "batches", round,
client). Streams do not depend on the order in which they are created, so the two engine backends and a resumed
run draw exactly the same numbers.
"""

from __future__ import annotations

import hashlib
from typing import ClassVar

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


class RunAware:
    """Mixin of components that a run sets up with its number of clients and its seed (availability processes,
    metric plugins): their `setup` stores them in `_num_clients` and `_seed`, read as `num_clients` and `seed`.

    ``self.rng(purpose, *keys)`` (NumPy) and ``self.torch_rng(purpose, *keys)`` (a CPU torch generator) give the
    stream (seed, purpose, keys): name the purpose after your component (e.g. ``"my-availability"``) so that its
    draws are independent of every other stream, and pass the round (and client) as keys, so that the draws do not
    depend on the order of calls and a resumed run draws the same numbers.
    """

    name: ClassVar[str]
    _num_clients: int | None
    _seed: int | None

    @property
    def num_clients(self) -> int:
        """K: the run's clients, seen and unseen."""
        return self._set_up(self._num_clients, "num_clients")

    @property
    def seed(self) -> int:
        """The run's seed."""
        return self._set_up(self._seed, "seed")

    def _set_up(self, value: int | None, what: str) -> int:
        if value is None:
            raise RuntimeError(
                f"{self.name or type(self).__name__}: {what} is known once the run has set it up (an override of "
                "setup() must call super().setup() first)"
            )
        return value

    def rng(self, purpose: str, *keys: int) -> np.random.Generator:
        """A NumPy generator for (run seed, `purpose`, `keys`)."""
        return numpy_rng(self.seed, purpose, *keys)

    def torch_rng(self, purpose: str, *keys: int) -> torch.Generator:
        """A CPU torch generator for (run seed, `purpose`, `keys`)."""
        return torch_gen(self.seed, purpose, *keys)
