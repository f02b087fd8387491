"""The local update rule, the two backends and the statistics the engine collects."""

from __future__ import annotations

import itertools
from functools import partial

import pytest
import torch
from torch import nn

from fedhet.engine.batches import local_batches
from fedhet.engine.engine import Engine, resolve_backend
from fedhet.engine.functional import FlatModel
from fedhet.engine.local import (
    _flat,
    _masks_from_the_cpu,
    _tree,
    gradient_statistics,
    make_step,
    train_sequential,
    train_vectorised,
)
from fedhet.engine.objective import Proximal, WeightDecay
from fedhet.engine.plan import LocalPlan
from fedhet.engine.request import TrainRequest
from helpers.tiny import Shift, cohort, linear_model, tiny_data
from helpers.zoo_cnns import image_data, zoo_model


def manual_grad(model: FlatModel, w: torch.Tensor, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    w = w.clone().requires_grad_(True)
    loss = torch.nn.functional.cross_entropy(model.logits(w, x), y)
    (g,) = torch.autograd.grad(loss, w)
    return g


def test_step_adds_proximal_term_correction_and_weight_decay() -> None:
    model = linear_model()
    w0 = model.initial_params()
    w = w0 + 0.3  # away from the global model, so the proximal term is non-zero
    x, y = torch.randn(4, 3), torch.tensor([0, 1, 1, 0])
    corr = torch.linspace(-1, 1, model.size)
    g = manual_grad(model, w, x, y)
    mu, lam, lr = 0.5, 0.01, torch.tensor(0.2)
    tree = partial(_tree, model)
    plan = LocalPlan.uniform(torch.tensor([0]), 1, 0.2, 4, terms=(Proximal(mu=mu), WeightDecay(lam=lam), Shift()))
    step = make_step(model, cohort(plan, w0))
    server: list[dict] = [{}, {}, {}]
    client: list[dict] = [{}, {}, {"c": tree(corr)}]
    new_tree, _, _, loss = step(tree(w), tree(w0), x, y, torch.ones(4), lr, server, client, {}, {})
    new_w = _flat({k: v.unsqueeze(0) for k, v in new_tree.items()}, 1)[0]
    prox = mu * (w - w0)
    assert float(prox.abs().min()) > 0.1
    expected = w - lr * (g + prox + lam * w + corr)
    torch.testing.assert_close(new_w, expected)
    torch.testing.assert_close(loss, torch.nn.functional.cross_entropy(model.logits(w, x), y))


def test_padded_rows_do_not_count() -> None:
    model = linear_model()
    w = model.initial_params()
    x, y = torch.randn(4, 3), torch.tensor([0, 1, 1, 0])
    step = make_step(model, cohort(LocalPlan.uniform(torch.tensor([0]), 1, 0.1, 4), w))
    t = _tree(model, w)
    full, _, _, _ = step(t, t, x[:2], y[:2], torch.ones(2), torch.tensor(0.1), [], [], {}, {})
    padded, _, _, _ = step(t, t, x, y, torch.tensor([1.0, 1.0, 0.0, 0.0]), torch.tensor(0.1), [], [], {}, {})
    for name in full:
        torch.testing.assert_close(full[name], padded[name])


def test_batches_are_epochs_without_replacement_and_padded() -> None:
    offsets = torch.tensor([0, 6, 8])
    index, weight = local_batches(offsets, torch.tensor([0, 1]), torch.tensor([3, 2]), 4, seed=1, round_=0)
    assert index.shape == (2, 3, 4)
    first_epoch = index[0, :1].flatten().tolist()  # 6 samples, batch 4: one full batch per epoch
    assert len(set(first_epoch)) == 4 and all(0 <= i < 6 for i in first_epoch)
    # client 1 has 2 samples < batch 4: both used each step, the rest weight 0
    assert weight[1, :2].sum(1).tolist() == [2.0, 2.0]
    assert set(index[1, 0, :2].tolist()) == {6, 7}
    again, _ = local_batches(offsets, torch.tensor([1, 0]), torch.tensor([2, 3]), 4, seed=1, round_=0)
    assert torch.equal(again[1], index[0])  # draws depend on the client, not its position in the cohort


def test_backends_agree_with_unequal_steps_and_correction() -> None:
    data = tiny_data([7, 3, 12, 5])
    model = linear_model()
    w0 = model.initial_params()
    plan = LocalPlan(
        clients=torch.tensor([0, 1, 2, 3]),
        steps=torch.tensor([4, 0, 6, 1]),
        lr=torch.tensor([0.1, 0.1, 0.05, 0.2]),
        batch_size=4,
        terms=(Proximal(mu=0.1), Shift()),
    )
    shift = torch.randn(4, model.size) * 0.01
    engines = [
        Engine(model, data, backend="sequential", seed=5),
        Engine(model, data, backend="vectorised", seed=5, chunk_size=3),
    ]
    for engine in engines:
        engine.client_state.write("test_shift.c", plan.clients, shift, -1)  # each client's stored c_k
    seq, vec = (engine.train(w0, plan, 2) for engine in engines)
    torch.testing.assert_close(seq.params, vec.params, atol=1e-6, rtol=1e-6)
    torch.testing.assert_close(seq.train_loss, vec.train_loss, atol=1e-6, rtol=1e-6, equal_nan=True)
    assert torch.equal(seq.params[1], w0) and torch.isnan(seq.train_loss[1])


def test_dropout_masks_match_across_backends() -> None:
    data = tiny_data([9, 6, 11], dim=5, classes=3)
    torch.manual_seed(0)
    model = FlatModel(nn.Sequential(nn.Linear(5, 8), nn.ReLU(), nn.Dropout(0.5), nn.Linear(8, 3)))
    w0 = model.initial_params()
    plan = LocalPlan.uniform(torch.tensor([0, 1, 2]), 5, 0.1, 4)
    seq = Engine(model, data, backend="sequential", seed=1).train(w0, plan, 0)
    vec = Engine(model, data, backend="vectorised", seed=1).train(w0, plan, 0)
    torch.testing.assert_close(seq.params, vec.params, atol=1e-6, rtol=1e-6)
    other_seed = Engine(model, data, backend="sequential", seed=2).train(w0, plan, 0)
    assert not torch.allclose(seq.params, other_seed.params)  # masks (and batches) follow the seed


@pytest.mark.parametrize("name", ["cnn_fmnist", "mlp"])
def test_masks_drawn_on_the_cpu_for_another_device_are_the_cpus(name: str) -> None:
    """What a GPU's vectorised run does with dropout (`_masks_from_the_cpu`), run here on the CPU (the masks are
    multiplied in on the data's device, the CPU here): the sequential backend's numbers, with dropout (cnn_fmnist:
    channel dropout and dropout) and without the patch once the block ends; the CPU itself is left alone."""
    if name == "mlp":
        torch.manual_seed(0)
        model = FlatModel(nn.Sequential(nn.Linear(5, 8), nn.ReLU(), nn.Dropout(0.5), nn.Linear(8, 3)))
        part = tiny_data([9, 6, 11], dim=5, classes=3).train
    else:
        model, shape = zoo_model(name)
        part = image_data(shape, [9, 6, 11])
    w0 = model.initial_params()
    plan = LocalPlan.uniform(torch.tensor([0, 1, 2]), 5, 0.1, 4)
    plan.steps = torch.tensor([5, 2, 4])
    model.module.train()
    seq = train_sequential(TrainRequest(model, part, w0, plan, cohort(plan, w0), 1, 0))
    dropouts = [m for m in model.module.modules() if isinstance(m, nn.modules.dropout._DropoutNd)]
    with _masks_from_the_cpu(model, torch.device("cpu")):
        assert all("forward" not in vars(m) for m in dropouts)  # nothing to do on the CPU
    with _masks_from_the_cpu(model, torch.device("cuda")):
        assert all("forward" in vars(m) for m in dropouts)
        vec = train_vectorised(TrainRequest(model, part, w0, plan, cohort(plan, w0), 1, 0))
    assert all("forward" not in vars(m) for m in dropouts)
    assert float((seq[0] - w0).abs().max()) > 1e-2
    torch.testing.assert_close(vec[0], seq[0], atol=1e-6, rtol=1e-5)
    torch.testing.assert_close(vec[1], seq[1], atol=1e-6, rtol=1e-5)


def test_gradient_statistics_match_per_sample_autograd() -> None:
    data = tiny_data([5, 8])
    model = linear_model()
    w0 = model.initial_params()
    mean, var = gradient_statistics(model, data.train, w0, torch.tensor([0, 1]), 4, seed=0, round_=0)
    x, y = data.train.client(0)
    # client 0 has 5 samples, 4 drawn: recover which by matching, then check by hand over all subsets
    per_sample = torch.stack([manual_grad(model, w0, x[i : i + 1], y[i : i + 1]) for i in range(5)])
    matches = [
        idx
        for idx in itertools.combinations(range(5), 4)
        if torch.allclose(per_sample[list(idx)].mean(0), mean[0], atol=1e-6)
    ]
    assert matches, "mean gradient is not the mean of 4 per-sample gradients"
    chosen = per_sample[list(matches[0])]
    torch.testing.assert_close(var[0], chosen.var(0, unbiased=False), atol=1e-6, rtol=1e-5)


def test_auto_backend_prefers_vectorised_for_small_models_and_large_cohorts() -> None:
    """For models the dense backend cannot run (here small CNNs): vmap where it can use two threads."""
    small = FlatModel(nn.Sequential(nn.Conv2d(1, 2, 3), nn.Flatten(), nn.Linear(2 * 6 * 6, 2)))
    big = FlatModel(nn.Sequential(nn.Conv2d(1, 64, 3), nn.Flatten(), nn.Linear(64 * 30 * 30, 10)))
    threads = torch.get_num_threads()
    try:
        torch.set_num_threads(2)
        assert resolve_backend("auto", small, cohort=100) == "vectorised"
        assert resolve_backend("auto", small, cohort=5) == "sequential"
        assert resolve_backend("auto", big, cohort=100) == "sequential"
        torch.set_num_threads(1)
        assert resolve_backend("auto", small, cohort=100) == "sequential"
    finally:
        torch.set_num_threads(threads)
    assert resolve_backend("sequential", linear_model(), cohort=100) == "sequential"


def test_each_epoch_is_a_permutation_and_streams_differ() -> None:
    offsets = torch.tensor([0, 6, 13])
    index, weight = local_batches(offsets, torch.tensor([0, 1]), torch.tensor([4, 4]), 3, seed=0, round_=1)
    for epoch in range(2):
        rows = index[0, 2 * epoch : 2 * epoch + 2].flatten().tolist()
        assert sorted(rows) == list(range(6))  # 6 samples, batch 3: two steps per epoch cover all once
    assert len(set(index[1, :2].flatten().tolist())) == 6  # 7 samples: 6 distinct per epoch
    assert bool((weight == 1).all())
    other, _ = local_batches(offsets, torch.tensor([0, 1]), torch.tensor([4, 4]), 3, seed=0, round_=2)
    assert not torch.equal(other, index)
    finetune, _ = local_batches(offsets, torch.tensor([0, 1]), torch.tensor([4, 4]), 3, 0, 1, stream="finetune")
    assert not torch.equal(finetune, index)
