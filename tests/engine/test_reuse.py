"""Products of a round's mini-batches that a second training of the same clients reuses (`fedhet.engine.reuse`)."""

from __future__ import annotations

from dataclasses import replace

import pytest
import torch
from torch import Tensor, nn

from fedhet.engine import dense
from fedhet.engine.engine import Engine
from fedhet.engine.functional import FlatModel
from fedhet.engine.objective import Proximal
from fedhet.engine.personal import Personal
from fedhet.engine.plan import LocalPlan
from fedhet.engine.reuse import Reuse, rows_key
from helpers.tiny import tiny_data

TOL = {"atol": 1e-6, "rtol": 1e-5}


def test_kept_products_are_found_only_by_what_they_were_computed_from() -> None:
    reuse, calls = Reuse(), []
    x_all, rows = torch.randn(10, 3), torch.tensor([[0, 1], [2, 3]])
    key = rows_key(x_all, rows, True)

    def inputs() -> tuple[Tensor, Tensor]:
        calls.append("inputs")
        return torch.randn(2, 2, 3), torch.randn(2, 2, 2)

    first = reuse.inputs(key, inputs)
    assert reuse.inputs(key, inputs) is first and calls == ["inputs"]
    reuse.inputs(rows_key(x_all, rows + 1, True), inputs)  # other rows
    reuse.inputs(rows_key(x_all, rows, False), inputs)  # the same rows, a layer without a bias (no + 1)
    reuse.inputs(rows_key(torch.randn(10, 3), rows, True), inputs)  # other samples
    assert len(calls) == 4
    w, b = torch.randn(4, 3), torch.randn(4)

    def outputs() -> Tensor:
        calls.append("outputs")
        return torch.randn(2, 2, 4)

    z = reuse.outputs(key, w, b, outputs)
    assert reuse.outputs(key, w.clone(), b.clone(), outputs) is z  # a layer of the same values
    reuse.outputs(key, w + 1e-3, b, outputs)
    reuse.outputs(key, w, None, outputs)
    assert calls.count("outputs") == 3
    reuse.start_round(7)  # a new round: nothing kept
    reuse.inputs(key, inputs)
    reuse.start_round(7)  # the same round: kept
    reuse.inputs(key, inputs)
    assert calls.count("inputs") == 5
    none = Reuse(budget=0)  # nothing fits
    none.inputs(key, inputs)
    none.inputs(key, inputs)
    assert calls.count("inputs") == 7


def _mlp() -> FlatModel:
    torch.manual_seed(0)
    return FlatModel(nn.Sequential(nn.Flatten(), nn.Linear(5, 8), nn.ReLU(), nn.Linear(8, 3)))


@pytest.mark.parametrize("sizes", [[9, 3, 14, 2], [2, 3, 1, 2]])  # the second: fewer samples than T·b (by sample)
def test_dittos_personal_steps_reuse_the_global_steps_products_and_give_the_same_numbers(
    monkeypatch: pytest.MonkeyPatch, sizes: list[int]
) -> None:
    """The global steps, then personal steps pulled towards the received model on the same mini-batches (Ditto's
    round): the second training computes neither X, X Xᵀ nor X Aᵀ again, and its models are the sequential
    backend's."""
    computed: list[int] = []
    inputs = dense._inputs
    monkeypatch.setattr(dense, "_inputs", lambda *a: computed.append(1) or inputs(*a))
    monkeypatch.setattr(dense, "use_gram_first_layer", lambda *a: True)
    clients = torch.arange(4)
    personal = Personal("p")
    models = {}
    for backend in ("dense", "sequential"):
        engine = Engine(_mlp(), tiny_data(sizes, dim=5, classes=3), backend=backend, seed=4)  # type: ignore[arg-type]
        w = engine.model.initial_params() + 0.05
        plan = LocalPlan.uniform(clients, 3, 0.1, 4)
        engine.train(w, plan, 2)
        before = len(computed)
        result = engine.train(w, replace(plan, terms=(Proximal(mu=0.5),), personal=personal, phase=1), 2)
        if backend == "dense":
            assert before > 0 and len(computed) == before  # every chunk's inputs were kept
        torch.testing.assert_close(result.params, w.expand(4, -1))  # nothing shared: the received model back
        starts = engine.personal_starts(w, LocalPlan.uniform(clients, 0, 0.1, 4, personal=personal), 3)
        assert starts is not None
        models[backend] = starts
    assert float((models["sequential"] - (_mlp().initial_params())).abs().max()) > 1e-2
    torch.testing.assert_close(models["dense"], models["sequential"], **TOL)
