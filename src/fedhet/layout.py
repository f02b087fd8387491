"""Client layouts shared by several layers (data and availability), kept below both."""

from __future__ import annotations

import numpy as np

from fedhet.errors import ConfigError


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
