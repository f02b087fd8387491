"""FedRep: personal heads fitted first with the representation frozen, then the representation (Collins et al.
2021, Algorithm 1)."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from fedhet.engine.personal import parameter_mask
from fedhet.errors import ConfigError
from fedhet.experiments.config import parse_config
from fedhet.experiments.runner import run
from fedhet.strategies.base import STRATEGIES
from fedhet.strategies.fedrep import FedRep
from helpers.personal import STEPS, TOL, personal_models, run_round, setup, sgd, weighted


@pytest.mark.parametrize("backend", ["dense", "vectorised", "sequential"])
def test_two_rounds_match_the_hand_computed_updates(backend: str) -> None:
    strategy = FedRep(head_factor=1.5)  # τ_h = ⌈1.5 τ⌉ = 3 head steps, τ = 2 body steps
    engine = setup(strategy, backend)
    model = engine.model
    head = parameter_mask(model, ["head"], "test")
    w0 = model.initial_params()
    heads = [w0, w0]
    w = w0
    for t in range(2):
        fitted = [sgd(model, torch.where(head, heads[k], w), k, 3, frozen=~head) for k in range(2)]
        bodies = [sgd(model, fitted[k], k, STEPS, frozen=head) for k in range(2)]
        heads = fitted
        expected = torch.where(head, w, weighted(bodies))
        _, w = run_round(strategy, engine, w, t)
        torch.testing.assert_close(w, expected, **TOL)
        got = personal_models(strategy, engine, w, t + 1)
        torch.testing.assert_close(got[:, head], torch.stack(heads)[:, head], **TOL)


def test_fedrep_with_everything_shared_is_fedavg(tmp_path: Path) -> None:
    config = {"model": "mlp", "num_clients": 5, "rounds": 3, "local": {"steps": 3, "batch_size": 8}, "seed": 1}
    rep = run(parse_config({**config, "algorithm": {"name": "fedrep", "personal": []}}), tmp_path / "rep")
    avg = run(parse_config({**config, "algorithm": "fedavg"}), tmp_path / "avg")
    torch.testing.assert_close(rep.params, avg.params)
    assert (tmp_path / "rep" / "metrics.csv").read_text() == (tmp_path / "avg" / "metrics.csv").read_text()


def test_unknown_personal_parameters_and_too_many_head_steps_are_refused_at_setup() -> None:
    with pytest.raises(ConfigError, match=r"algorithm\.personal of fedrep: 'nope' matches none"):
        setup(FedRep(personal=["nope"]), "sequential")
    with pytest.raises(ConfigError, match="1,001,000 local steps per client, more than 1,000,000"):
        setup(FedRep(head_factor=1000), "sequential", steps=1001)  # τ_h = ⌈1000 · 1001⌉
    setup(FedRep(head_factor=1000), "sequential", steps=1000)  # τ_h = 10⁶: accepted (2 clients, tiny batches)
    for bad in (float("inf"), 1e12, 0.0):
        with pytest.raises(ConfigError, match=r"algorithm\.head_factor"):
            STRATEGIES.build({"name": "fedrep", "head_factor": bad}, where="algorithm")
