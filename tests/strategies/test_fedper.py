"""FedPer and LG-FedAvg: FedAvg of the shared part; the personal part stays with each client."""

from __future__ import annotations

import pytest
import torch

from fedhet.engine.personal import parameter_mask
from fedhet.errors import ConfigError
from fedhet.strategies.base import STRATEGIES
from fedhet.strategies.fedper import FedPer, LGFedAvg
from helpers.personal import STEPS, TOL, personal_models, run_round, setup, sgd, weighted


@pytest.mark.parametrize("backend", ["dense", "vectorised", "sequential"])
@pytest.mark.parametrize("kind", [FedPer, LGFedAvg])
def test_two_rounds_match_the_hand_computed_updates(backend: str, kind: type[FedPer]) -> None:
    strategy = kind()
    engine = setup(strategy, backend)
    model = engine.model
    mine = parameter_mask(model, strategy.personal, "test")
    w0 = model.initial_params()
    own = [w0, w0]  # the personal part starts as initialised
    w = w0
    for t in range(2):
        trained = [sgd(model, torch.where(mine, own[k], w), k, STEPS) for k in range(2)]
        own = trained
        expected = torch.where(mine, w, weighted(trained))  # the personal coordinates are not averaged
        _, w = run_round(strategy, engine, w, t)
        torch.testing.assert_close(w, expected, **TOL)
        got = personal_models(strategy, engine, w, t + 1)
        torch.testing.assert_close(got[:, mine], torch.stack(own)[:, mine], **TOL)
        torch.testing.assert_close(got[:, ~mine], w[~mine].expand(2, -1))


def test_a_personal_pattern_must_name_parameters() -> None:
    strategy = STRATEGIES.build({"name": "fedper", "personal": ["classifier.*"]})
    with pytest.raises(ConfigError, match=r"'classifier\.\*' matches none of the model's parameters"):
        setup(strategy, "dense")  # at setup: before a run writes anything
    with pytest.raises(ConfigError, match="personal"):
        STRATEGIES.build({"name": "fedper", "personal": []})
