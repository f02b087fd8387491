"""Local training alone: each client continues its own model; the global model never moves."""

from __future__ import annotations

import pytest
import torch

from fedhet.strategies.local_only import LocalOnly
from helpers.personal import STEPS, TOL, personal_models, run_round, setup, sgd


@pytest.mark.parametrize("backend", ["dense", "vectorised", "sequential"])
def test_each_client_continues_its_own_model(backend: str) -> None:
    strategy = LocalOnly()
    engine = setup(strategy, backend)
    model = engine.model
    w0 = model.initial_params()
    own = [w0, w0]
    w = w0
    for t in range(2):
        own = [sgd(model, own[k], k, STEPS) for k in range(2)]
        result, w = run_round(strategy, engine, w, t)
        torch.testing.assert_close(w, w0)  # nothing shared
        torch.testing.assert_close(result.params, w0.expand(2, -1))  # only the (empty) shared part comes back
        torch.testing.assert_close(personal_models(strategy, engine, w, t + 1), torch.stack(own), **TOL)
