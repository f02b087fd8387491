"""Plans and results travel to Flower nodes as arrays and scalars: components by registered name, tensors as
arrays, so a plugin's term round-trips without the codec knowing it."""

from __future__ import annotations

import math
from dataclasses import replace
from typing import ClassVar

import numpy as np
import torch

from fedhet.engine.objective import TERMS, Aligned, ParameterTerm, Proximal
from fedhet.engine.optimizers import Adam
from fedhet.engine.plan import LocalPlan, LocalResult
from fedhet.engine.privacy import ExampleDP, UpdateClip
from fedhet.flower.codec import decode_plan, decode_result, encode_plan, encode_result
from fedhet.strategies.pfedme import PFedMeRule
from fedhet.strategies.scaffold import ControlVariates


@TERMS.register
class Pull(ParameterTerm):
    """A test term with a tensor field and a scalar, registered like a plugin's."""

    name: ClassVar[str] = "test_pull"
    towards: torch.Tensor
    weight: float = 1.0

    def gradient(self, w: torch.Tensor, at: Aligned) -> torch.Tensor:
        return self.weight * (w - at.server["towards"])


def test_a_plan_round_trips_with_terms_optimiser_and_rule() -> None:
    plan = LocalPlan(
        torch.tensor([4, 1, 7]),
        torch.tensor([2, 0, 3]),
        torch.tensor([0.1, 0.2, 0.3]),
        5,
        terms=(Proximal(mu=0.3), ControlVariates(c=torch.arange(4.0)), Pull(towards=torch.ones(4), weight=0.5)),
        optimizer=Adam(beta1=0.5, persistent=True),
        rule=PFedMeRule(lam=2.0, inner_steps=3, inner_lr=0.1),
        stream="finetune",
    )
    arrays, config = encode_plan(plan, torch.tensor([0, 2]))
    assert all(isinstance(a, np.ndarray) for a in arrays.values())
    assert all(isinstance(v, int | float | str | bool) for v in config.values())
    back = decode_plan(arrays, config)
    assert back.clients.tolist() == [4, 7] and back.steps.tolist() == [2, 3] and back.batch_size == 5
    assert back.stream == "finetune" and back.optimizer == plan.optimizer and back.rule == plan.rule
    assert [t.name for t in back.terms] == ["proximal", "scaffold", "test_pull"]
    assert back.terms[0] == Proximal(mu=0.3)
    torch.testing.assert_close(back.terms[1].server_tensors()["c"], torch.arange(4.0))
    pull = back.terms[2]
    assert isinstance(pull, Pull) and pull.weight == 0.5
    torch.testing.assert_close(pull.towards, torch.ones(4))


def test_a_result_round_trips_with_its_state_changes() -> None:
    result = LocalResult(
        torch.tensor([3, 5]),
        torch.randn(2, 4),
        torch.tensor([0.5, float("nan")]),
        torch.tensor([2, 0]),
        torch.tensor([0.1, 0.1]),
        state_delta={"scaffold.c_i": torch.randn(2, 4)},
    )
    back = decode_result(encode_result(result))
    torch.testing.assert_close(back.params, result.params)
    torch.testing.assert_close(back.train_loss, result.train_loss, equal_nan=True)
    torch.testing.assert_close(back.state_delta["scaffold.c_i"], result.state_delta["scaffold.c_i"])


def test_a_plan_carries_its_differential_privacy_and_a_result_its_clipped_updates() -> None:
    plan = LocalPlan.uniform(torch.tensor([3, 5]), 2, 0.1, 4)
    for clip in (UpdateClip(0.7, noise=0.2), UpdateClip(math.inf)):
        private = replace(plan, clip=clip, dp_sgd=ExampleDP(1.5, 0.9, "shuffle"))
        back = decode_plan(*encode_plan(private))
        assert back.clip == clip and back.dp_sgd == ExampleDP(1.5, 0.9, "shuffle")
    assert decode_plan(*encode_plan(plan)).clip is None and decode_plan(*encode_plan(plan)).dp_sgd is None
    result = LocalResult(
        torch.tensor([3, 5]), torch.zeros(2, 4), torch.zeros(2), torch.tensor([2, 2]), torch.full((2,), 0.1)
    )
    assert decode_result(encode_result(result)).clipped is None
    result.clipped = torch.tensor([True, False])
    assert torch.equal(decode_result(encode_result(result)).clipped, torch.tensor([True, False]))
