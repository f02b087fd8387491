"""The plain and vmap references compute fedhet's numbers when given fedhet's mini-batches."""

from __future__ import annotations

import torch

from fedhet.bench.plain import PlainLoop, VmapLoop, draw_batches
from fedhet.bench.systems import build_module
from fedhet.bench.workloads import Workload
from fedhet.engine.batches import local_batches
from fedhet.engine.engine import Engine
from fedhet.engine.functional import FlatModel
from fedhet.engine.local import train_sequential
from fedhet.engine.plan import LocalPlan
from fedhet.engine.request import TrainRequest
from fedhet.engine.step import fresh_cohort

W = Workload("w", "", {"name": "mlp", "hidden": [6]}, (5,), 3, clients=4, eval_only=2, samples=7, steps=5, batch=3)


def _fedhet(w: Workload) -> tuple[torch.Tensor, torch.Tensor, FlatModel]:
    """fedhet's local models after a round from the initial weights, and its mini-batches (client-local rows)."""
    data = w.data()
    model = FlatModel(build_module(w))
    plan = LocalPlan.uniform(torch.arange(w.clients), w.steps, w.lr, w.batch)
    w0 = model.initial_params()
    local = train_sequential(TrainRequest(model, data.train, w0, plan, fresh_cohort(plan, w0), 0, 1))[0]
    index, weight = local_batches(data.train.offsets, plan.clients, plan.steps, w.batch, 0, 1)
    assert bool((weight == 1).all())  # full batches: the references need them
    return local, index - data.train.offsets[: w.clients].view(-1, 1, 1), model


def test_plain_loop_trains_and_scores_like_fedhet() -> None:
    data = W.data()
    local, batches, model = _fedhet(W)
    loop = PlainLoop(build_module(W), data, W.clients, W.steps, W.lr, W.batch)
    got = loop.train(list(batches))
    assert float((local - model.initial_params()).abs().max()) > 1e-3
    torch.testing.assert_close(got, local, atol=1e-6, rtol=1e-5)
    scores = loop.scores(got)
    engine = Engine(model, data, backend="sequential")
    test, train = engine.scores(loop.global_, "test"), engine.scores(loop.global_, "train")
    assert len(scores) == W.clients + W.eval_only
    torch.testing.assert_close(torch.tensor([s[0] for s in scores]), test.loss, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(torch.tensor([s[3] for s in scores]), train.accuracy)


def test_vmap_loop_trains_and_scores_like_fedhet() -> None:
    data = W.data()
    local, batches, model = _fedhet(W)
    loop = VmapLoop(build_module(W), data, W.clients, W.steps, W.lr, W.batch)
    stacked = loop.train(batches)
    got = torch.cat([v.reshape(W.clients, -1) for v in stacked.values()], 1)
    torch.testing.assert_close(got, local, atol=1e-6, rtol=1e-5)
    test_loss, test_acc, train_loss, _ = loop.scores(stacked)
    engine = Engine(model, data, backend="sequential")
    flat = torch.cat([v.reshape(-1) for v in loop.global_.values()])
    torch.testing.assert_close(flat, local.mean(0))
    test = engine.scores(flat, "test")
    torch.testing.assert_close(test_loss, test.loss, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(test_acc, test.accuracy)
    torch.testing.assert_close(train_loss, engine.scores(flat, "train").loss, atol=1e-5, rtol=1e-5)
    drawn = loop.train()  # its own mini-batches: the same shapes of work
    assert all(drawn[k].shape == v.shape for k, v in stacked.items())


def test_draw_batches_walks_through_permutations() -> None:
    gen = torch.Generator().manual_seed(0)
    (rows,) = draw_batches([7], steps=5, batch=3, gen=gen)
    assert rows.shape == (5, 3)
    for epoch in (rows[0:2], rows[2:4]):  # two batches per epoch (6 of 7 samples), no sample twice in one
        assert len(set(epoch.flatten().tolist())) == 6
    assert int(rows.min()) >= 0 and int(rows.max()) <= 6
