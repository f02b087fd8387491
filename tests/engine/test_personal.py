"""Per-client start points, frozen parameters, personal parts kept by the engine, phases and stateful rules: the
same numbers on every backend that runs them."""

from __future__ import annotations

from typing import Any, ClassVar

import pytest
import torch
from torch import nn

from fedhet.engine.conv import conv_layers, train_conv
from fedhet.engine.dense import dense_layers, train_dense
from fedhet.engine.engine import Engine
from fedhet.engine.functional import FlatModel
from fedhet.engine.local import train_sequential, train_vectorised
from fedhet.engine.objective import Proximal
from fedhet.engine.optimizers import SGD
from fedhet.engine.personal import Personal, head_names, parameter_mask, parameter_names
from fedhet.engine.plan import LocalPlan
from fedhet.engine.request import Trained, TrainRequest
from fedhet.engine.rules import GradFn, LocalRule, Tree
from fedhet.errors import ConfigError
from helpers.tiny import cohort, tiny_data
from helpers.zoo_cnns import image_data, image_federated, zoo_model

TOL = {"atol": 1e-6, "rtol": 1e-5}


def _mlp() -> FlatModel:
    torch.manual_seed(0)
    return FlatModel(nn.Sequential(nn.Flatten(), nn.Linear(5, 8), nn.ReLU(), nn.Linear(8, 3)))


def _plan(**extra: Any) -> LocalPlan:
    return LocalPlan(
        clients=torch.tensor([0, 1, 2, 3]),
        steps=torch.tensor([4, 0, 6, 2]),
        lr=torch.tensor([0.1, 0.1, 0.05, 0.2]),
        batch_size=4,
        **extra,
    )


def _starts(model: FlatModel, m: int) -> torch.Tensor:
    return model.initial_params() + 0.02 * torch.randn(m, model.size, generator=torch.Generator().manual_seed(3))


def _all_backends(model: FlatModel, request: TrainRequest) -> dict[str, Trained]:
    out = {"sequential": train_sequential(request), "vectorised": train_vectorised(request)}
    layers, spec = dense_layers(model), conv_layers(model)
    if layers is not None:
        out["dense"] = train_dense(request, layers)
    if spec is not None:
        out["conv"] = train_conv(request, spec)
    return out


@pytest.mark.parametrize("terms", [(), (Proximal(mu=0.3),)])  # without terms: the dense backend's Gram path
@pytest.mark.parametrize("optimizer", [SGD(), SGD(momentum=0.9)])
@pytest.mark.parametrize("model_name", ["mlp", "lenet"])
def test_start_points_and_frozen_parameters_agree_on_every_backend(
    optimizer: SGD, model_name: str, terms: tuple[Proximal, ...]
) -> None:
    if model_name == "mlp":
        model, data = _mlp(), tiny_data([9, 3, 14, 2], dim=5, classes=3).train
    else:
        model, shape = zoo_model("lenet")
        data = image_data(shape, [9, 3, 14, 2])
    anchor = model.initial_params()
    starts = _starts(model, 4)
    frozen = parameter_mask(model, ["body"], "test")
    plan = _plan(terms=terms, optimizer=optimizer)
    model.module.train()
    for mask in (None, frozen):
        request = TrainRequest(model, data, anchor, plan, cohort(plan, anchor), 3, 2, starts=starts, frozen=mask)
        results = _all_backends(model, request)
        assert len(results) == 3
        reference = results["sequential"][0]
        for name, (params, losses, _) in results.items():
            torch.testing.assert_close(params, reference, **TOL, msg=name)
            torch.testing.assert_close(losses, results["sequential"][1], equal_nan=True, **TOL, msg=name)
        torch.testing.assert_close(reference[1], starts[1])  # no steps: the client's own start
        moved = (reference - starts).abs().amax(0)
        assert float(moved[~frozen].max()) > 1e-2  # trained coordinates moved
        if mask is not None:
            assert float(moved[frozen].max()) == 0.0  # frozen coordinates did not


def test_a_start_point_is_a_client_trained_from_there() -> None:
    """Client k with start s_k equals a one-client cohort whose anchor is s_k, when no term looks at the anchor."""
    model, data = _mlp(), tiny_data([9, 3, 14, 2], dim=5, classes=3).train
    anchor, starts = model.initial_params(), _starts(model, 4)
    plan = _plan()
    together = train_vectorised(TrainRequest(model, data, anchor, plan, cohort(plan, anchor), 3, 2, starts=starts))
    for k in (0, 2, 3):
        alone = LocalPlan(plan.clients[k : k + 1], plan.steps[k : k + 1], plan.lr[k : k + 1], plan.batch_size)
        one = train_sequential(TrainRequest(model, data, starts[k], alone, cohort(alone, starts[k]), 3, 2))
        torch.testing.assert_close(together[0][k], one[0][0], **TOL)


def test_parameter_patterns_name_the_head_the_body_and_refuse_a_typo() -> None:
    model = _mlp()
    assert head_names(model) == ["3.weight", "3.bias"]
    assert parameter_names(model, ["body"], "x") == ["1.weight", "1.bias"]
    assert parameter_names(model, ["*.bias"], "x") == ["1.bias", "3.bias"]
    assert int(parameter_mask(model, ["head"], "x").sum()) == 8 * 3 + 3
    with pytest.raises(ConfigError, match=r"'fc9\.\*' matches none of the model's parameters"):
        parameter_names(model, ["fc9.*"], "algorithm.personal")


def _engine(backend: str = "dense") -> Engine:
    return Engine(_mlp(), tiny_data([9, 3, 14, 2, 7], dim=5, classes=3), backend=backend, seed=4)  # type: ignore[arg-type]


@pytest.mark.parametrize("backend", ["dense", "vectorised", "sequential"])
def test_the_engine_keeps_personal_parts_and_sends_back_the_shared_part(backend: str) -> None:
    engine = _engine(backend)
    model = engine.model
    personal = Personal("mine", ("head",))
    head = personal.mask(model)
    w = model.initial_params() + 0.05
    plan = LocalPlan.uniform(torch.tensor([0, 2, 3]), 3, 0.1, 4, personal=personal)
    first = engine.train(w, plan, 0)
    torch.testing.assert_close(first.params[:, head], w[head].expand(3, -1))  # personal part: no update
    assert float((first.params[:, ~head] - w[~head]).abs().max()) > 1e-3  # the shared part trained
    # the head started from the model's initial values, the body from w: the same as a plain plan from there
    start = torch.where(head, model.initial_params(), w)
    plain = engine.train(start, LocalPlan.uniform(torch.tensor([0, 2, 3]), 3, 0.1, 4, stream="train"), 0)
    stored = engine.state_rows("mine", torch.tensor([0, 2, 3]), 1, torch.zeros(3, int(head.sum())))
    torch.testing.assert_close(stored, plain.params[:, head], **TOL)
    torch.testing.assert_close(first.params[:, ~head], plain.params[:, ~head], **TOL)
    # round 1 starts clients 0 and 2 from their stored heads, client 1 (never trained) from the initial head
    starts = engine.personal_starts(w, LocalPlan.uniform(torch.tensor([0, 1]), 3, 0.1, 4, personal=personal), 1)
    assert starts is not None
    torch.testing.assert_close(starts[0, head], stored[0])
    torch.testing.assert_close(starts[1, head], model.initial_params()[head])
    torch.testing.assert_close(starts[:, ~head], w[~head].expand(2, -1))
    # personalised scores: each client's own model on its own data, nothing stored
    before = engine.client_state.state_dict()
    eval_plan = LocalPlan.uniform(torch.tensor([0, 2]), 0, 0.1, 4, personal=personal)
    scores = engine.personal_scores(w, eval_plan, 1)
    expected = torch.stack([w.clone(), w.clone()])
    expected[:, head] = stored[:2]
    torch.testing.assert_close(scores.loss, engine.own_scores(expected, torch.tensor([0, 2])).loss)
    assert engine.client_state.state_dict().keys() == before.keys()


def test_a_later_phase_sees_what_an_earlier_phase_of_the_round_stored() -> None:
    engine = _engine()
    personal = Personal("rep", ("head",))
    head = personal.mask(engine.model)
    w = engine.model.initial_params()
    clients = torch.tensor([0, 1])
    engine.train(w, LocalPlan.uniform(clients, 3, 0.1, 4, personal=personal, frozen=("body",)), 0)
    after_head = engine.personal_starts(w, LocalPlan.uniform(clients, 1, 0.1, 4, personal=personal, phase=1), 0)
    assert after_head is not None
    assert float((after_head[:, head] - w[head]).abs().max()) > 1e-3  # phase 1 sees phase 0's heads
    same_phase = engine.personal_starts(w, LocalPlan.uniform(clients, 1, 0.1, 4, personal=personal), 0)
    assert same_phase is not None
    torch.testing.assert_close(same_phase[:, head], w[head].expand(2, -1))  # phase 0 of the round does not
    body = engine.train(w, LocalPlan.uniform(clients, 3, 0.1, 4, personal=personal, frozen=("head",), phase=1), 0)
    assert float((body.params[:, ~head] - w[~head]).abs().max()) > 1e-3
    final = engine.personal_starts(w, LocalPlan.uniform(clients, 1, 0.1, 4, personal=personal), 1)
    assert final is not None
    torch.testing.assert_close(final[:, head], after_head[:, head])  # the body phase kept the heads


class Drift(LocalRule):
    """A toy stateful rule: d = g + s, s ← s + lr·g per step, a ← a + 1 ("param" and "scalar" state)."""

    name: ClassVar[str] = "drift"

    def state_kinds(self) -> dict[str, str]:
        return {"s": "param", "a": "scalar"}

    def step(self, grad_fn: GradFn, w: Tree, state: dict[str, Any], lr: torch.Tensor) -> tuple[Tree, Any, Any]:
        g, loss = grad_fn(w, 0)
        d = {n: g[n] + state["s"][n] for n in w}
        return d, loss, {"s": {n: state["s"][n] + lr * g[n] for n in w}, "a": state["a"] + 1}


def test_a_stateful_rule_carries_its_state_across_steps_and_rounds() -> None:
    results = {}
    for backend in ("vectorised", "sequential"):
        engine = _engine(backend)
        w = engine.model.initial_params()
        plan = LocalPlan.uniform(torch.tensor([0, 2]), 3, 0.1, 4, rule=Drift())
        first = engine.train(w, plan, 0)
        second = engine.train(w, plan, 1)
        a = engine.state_rows("drift.a", torch.tensor([0, 2]), 2, torch.zeros(2))
        results[backend] = (first.params, second.params, a)
    torch.testing.assert_close(results["vectorised"][0], results["sequential"][0], **TOL)
    torch.testing.assert_close(results["vectorised"][1], results["sequential"][1], **TOL)
    assert results["sequential"][2].tolist() == [6.0, 6.0]  # 3 steps in each of two rounds
    assert float((results["sequential"][1] - results["sequential"][0]).abs().max()) > 1e-4  # the state mattered


def test_personal_rows_survive_a_checkpoint() -> None:
    engine = _engine()
    personal = Personal("mine")
    w = engine.model.initial_params()
    engine.train(w, LocalPlan.uniform(torch.tensor([1, 3]), 2, 0.1, 4, personal=personal), 0)
    again = _engine()
    again.load_state_dict(engine.state_dict())
    plan = LocalPlan.uniform(torch.tensor([1, 3]), 2, 0.1, 4, personal=personal)
    torch.testing.assert_close(again.personal_starts(w, plan, 1), engine.personal_starts(w, plan, 1))


def test_conv_backend_trains_personal_heads_like_the_sequential_one() -> None:
    model, shape = zoo_model("lenet")
    results = {}
    for backend in ("conv", "sequential"):
        engine = Engine(model, image_federated(shape, [9, 3, 14, 2]), backend=backend, seed=2)  # type: ignore[arg-type]
        w = model.initial_params()
        plan = LocalPlan.uniform(torch.tensor([0, 1, 3]), 2, 0.05, 4, personal=Personal("p", ("head",)))
        engine.train(w, plan, 0)
        results[backend] = (engine.train(w, plan, 1).params, engine.personal_starts(w, plan, 2))
    torch.testing.assert_close(results["conv"][0], results["sequential"][0], **TOL)
    torch.testing.assert_close(results["conv"][1], results["sequential"][1], **TOL)


@pytest.mark.parametrize("forced", [True, False])
def test_the_dense_gram_path_starts_each_client_from_its_own_point(
    monkeypatch: pytest.MonkeyPatch, forced: bool
) -> None:
    from fedhet.engine import dense

    model, data = _mlp(), tiny_data([9, 3, 14, 2], dim=5, classes=3).train
    anchor, starts = model.initial_params(), _starts(model, 4)
    plan = _plan()
    used: list[bool] = []
    monkeypatch.setattr(dense, "use_gram_first_layer", lambda *a: used.append(forced) or forced)
    request = TrainRequest(model, data, anchor, plan, cohort(plan, anchor), 3, 2, starts=starts)
    layers = dense_layers(model)
    assert layers is not None
    got = train_dense(request, layers)
    assert used and all(u == forced for u in used)
    torch.testing.assert_close(got[0], train_sequential(request)[0], **TOL)


@pytest.mark.parametrize("samples", [[9, 3, 14, 2], [2, 3, 1, 2]])  # the second: fewer samples than T·b (by sample)
@pytest.mark.parametrize("with_starts", [False, True])
def test_affine_terms_fold_into_the_dense_gram_path(
    monkeypatch: pytest.MonkeyPatch, samples: list[int], with_starts: bool
) -> None:
    """Weight decay and a proximal term (gradients λw − κA) in closed form on the Gram path, the other layers'
    steps fused: the autograd backends' numbers."""
    from fedhet.engine import dense
    from fedhet.engine.objective import WeightDecay

    model, data = _mlp(), tiny_data(samples, dim=5, classes=3).train
    anchor = model.initial_params() + 0.05
    starts = _starts(model, 4) if with_starts else None
    plan = _plan(terms=(Proximal(mu=0.7), WeightDecay(lam=0.2)))
    used: list[bool] = []
    monkeypatch.setattr(dense, "use_gram_first_layer", lambda *a: used.append(True) or True)
    request = TrainRequest(model, data, anchor, plan, cohort(plan, anchor), 3, 2, starts=starts)
    layers = dense_layers(model)
    assert layers is not None
    got = train_dense(request, layers)
    assert used
    reference = train_sequential(request)
    assert float((reference[0] - request.start()).abs().max()) > 1e-2
    torch.testing.assert_close(got[0], reference[0], **TOL)
    torch.testing.assert_close(got[1], reference[1], equal_nan=True, **TOL)


@pytest.mark.parametrize("parts", [("head",), ("body",), ("*",), ("*.bias",)])
def test_personal_scores_of_dense_models_equal_each_own_model_scored(parts: tuple[str, ...]) -> None:
    """The dense scorer runs shared layers as one product for every client: the same scores as each client's
    whole model scored on its own (`own_scores`)."""
    engine = _engine()
    personal = Personal("p", parts)
    w = engine.model.initial_params() + 0.1
    clients = torch.tensor([4, 0, 2, 3])
    engine.train(w, LocalPlan.uniform(clients[:3], 3, 0.2, 4, personal=personal), 0)  # client 3 has no rows
    plan = LocalPlan.uniform(clients, 0, 0.1, 4, personal=personal)
    got = engine.personal_scores(w, plan, 1)
    starts = engine.personal_starts(w, plan, 1)
    assert starts is not None
    expected = engine.own_scores(starts, clients)
    torch.testing.assert_close(got.loss, expected.loss, **TOL)
    torch.testing.assert_close(got.accuracy, expected.accuracy)
