"""Shared fixtures: the digits data, federated, and a seeded generator (helper functions: the `helpers` package)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from fedhet.data.dataset import Dataset, FederatedData
from fedhet.data.embedded import Digits
from fedhet.data.federate import federate

# One torch thread for the whole suite: the tests' models are small (one thread is as fast) and a team of OpenMP
# threads slows a busy machine down by an order of magnitude; tests of thread-dependent choices set it themselves.
torch.set_num_threads(1)


@pytest.fixture(scope="session")
def digits() -> Dataset:
    return Digits().load(None)  # type: ignore[arg-type]


@pytest.fixture(scope="session")
def digits_fed(digits: Dataset) -> FederatedData:
    from fedhet.catalog import PARTITIONERS

    part = PARTITIONERS.build({"name": "dirichlet", "alpha": 0.5, "min_size": 20})
    return federate(digits, part, 12, test_fraction=0.25, seed=3)


@pytest.fixture
def rng() -> np.random.Generator:
    return np.random.default_rng(0)
