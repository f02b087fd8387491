"""The availability contract: the run's clients and seed after set-up, seeded streams, arrays to save."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from fedhet.availability.base import Always, Bernoulli
from fedhet.catalog import AVAILABILITY
from fedhet.seeding import numpy_rng, torch_gen


def test_num_clients_seed_and_streams_after_setup() -> None:
    process = Bernoulli(p=0.5)
    with pytest.raises(RuntimeError, match=r"bernoulli: num_clients is known once the run has set it up"):
        _ = process.num_clients
    process.setup(7, 11)
    assert process.num_clients == 7 and process.seed == 11
    assert process.rng("mine", 3).random() == numpy_rng(11, "mine", 3).random()
    expected = torch.rand(7, generator=torch_gen(11, "availability", 2), dtype=torch.float64) < 0.5
    assert torch.equal(process.available(2), expected)  # Bernoulli draws from the stream (seed, "availability", t)
    assert torch.equal(process.torch_rng("x").get_state(), torch_gen(11, "x").get_state())


def test_only_processes_that_describe_their_clients_save_arrays() -> None:
    always = Always()
    always.setup(4, 0)
    assert always.saved_arrays() == {}
    chains = AVAILABILITY.build({"name": "markov", "pi": [0.2, 0.4, 0.6, 0.8], "lam": 0.5})
    chains.setup(4, 0)
    saved = chains.saved_arrays()
    assert list(saved) == ["pi", "lambda", "chain"]
    np.testing.assert_allclose(saved["pi"], [0.2, 0.4, 0.6, 0.8])
    np.testing.assert_allclose(saved["lambda"], 0.5)
    classes = AVAILABILITY.build({"name": "cafed_classes"})
    classes.setup(8, 0)
    assert list(classes.saved_arrays()) == ["pi", "lambda", "chain", "group", "more_available", "correlated"]
