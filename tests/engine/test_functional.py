"""`FlatModel` with batch norm: the running statistics as the last coordinates of the flat vector, updated by a
training forward pass as torch updates them, left alone by evaluation, recomputed from data on request."""

from __future__ import annotations

import copy

import torch
from torch import nn

from fedhet.engine.functional import FlatModel

TOL = {"atol": 1e-6, "rtol": 1e-5}


def bn_model(seed: int = 0) -> FlatModel:
    torch.manual_seed(seed)
    return FlatModel(nn.Sequential(nn.Linear(3, 4), nn.BatchNorm1d(4), nn.ReLU(), nn.Linear(4, 2)))


def test_the_statistics_follow_the_parameters_in_the_flat_vector() -> None:
    model = bn_model()
    params = [n for n, _ in model.module.named_parameters()]
    stats = ["1.running_mean", "1.running_var", "1.num_batches_tracked"]
    assert model.names == params + stats and model.stat_names == stats
    assert model.num_params == 3 * 4 + 4 + 4 + 4 + 4 * 2 + 2 and model.size == model.num_params + 9
    w = model.initial_params()
    torch.testing.assert_close(w[model.stats], torch.tensor([0.0] * 4 + [1.0] * 4 + [0.0]))
    assert model.unflatten(w)["1.num_batches_tracked"].shape == ()


def test_a_training_forward_pass_updates_the_statistics_as_torch_does() -> None:
    model = bn_model()
    reference = copy.deepcopy(model.module).train()
    x = torch.randn(5, 3)
    model.module.train()
    w = model.initial_params()
    views = model.unflatten(w)
    params = {n: v for n, v in views.items() if n not in model.stat_names}
    stats = {n: views[n] for n in model.stat_names}
    out, new = model.forward_tracked(params, stats, x)
    torch.testing.assert_close(out, reference(x), **TOL)
    torch.testing.assert_close(new["1.running_mean"], reference[1].running_mean, **TOL)
    torch.testing.assert_close(new["1.running_var"], reference[1].running_var, **TOL)
    assert float(new["1.num_batches_tracked"]) == 1.0
    torch.testing.assert_close(w, model.initial_params())  # the given statistics are not written into
    model.forward(views, x)  # neither does an untracked pass (a data term's, the preflight's)
    torch.testing.assert_close(w, model.initial_params())


def test_evaluation_reads_the_statistics_of_the_vector() -> None:
    model = bn_model()
    w = model.initial_params()
    w[model.slices["1.running_mean"]] = torch.tensor([0.5, -1.0, 2.0, 0.0])
    w[model.slices["1.running_var"]] = torch.tensor([4.0, 1.0, 0.25, 9.0])
    module = copy.deepcopy(model.module).eval()
    module[1].running_mean.copy_(w[model.slices["1.running_mean"]])
    module[1].running_var.copy_(w[model.slices["1.running_var"]])
    x = torch.randn(6, 3)
    model.module.eval()
    torch.testing.assert_close(model.logits(w, x), module(x), **TOL)


def test_the_bound_module_trains_its_statistics_in_buffers_of_their_own() -> None:
    model = bn_model()
    w, _ = model.bound_buffers()
    model.bind_statistics(torch.tensor([1.0] * 4 + [2.0] * 4 + [5.0]))
    model.module.train()
    x = torch.randn(7, 3)
    model.module(x)
    h = model.module[0](x).detach()
    got = model.bound_statistics()
    torch.testing.assert_close(got[:4], 0.9 + 0.1 * h.mean(0), **TOL)
    torch.testing.assert_close(got[4:8], 1.8 + 0.1 * h.var(0), **TOL)
    assert float(got[8]) == 6.0
    torch.testing.assert_close(w[model.stats], model.initial_params()[model.stats])  # not the parameters' buffer


def test_recomputed_statistics_are_the_mean_of_the_batch_statistics() -> None:
    """One batch: the exact mean and unbiased variance of the layer's inputs; two: the mean of the two batches'."""
    model = bn_model()
    model.module.train()
    w = model.initial_params()
    x = torch.randn(10, 3)
    h = model.module[0](x).detach()
    one = model.recompute_statistics(w, x, batch=10)
    torch.testing.assert_close(one[model.slices["1.running_mean"]], h.mean(0), **TOL)
    torch.testing.assert_close(one[model.slices["1.running_var"]], h.var(0), **TOL)
    two = model.recompute_statistics(w, x, batch=5)
    halves = (h[:5].mean(0) + h[5:].mean(0)) / 2
    torch.testing.assert_close(two[model.slices["1.running_mean"]], halves, **TOL)
    assert float(two[model.slices["1.num_batches_tracked"]]) == 2.0
    torch.testing.assert_close(two[: model.num_params], w[: model.num_params])  # the parameters as they were
    assert model.module.training and model.module[1].momentum == 0.1  # the module as it was


def test_a_model_without_batch_norm_has_no_statistics() -> None:
    model = FlatModel(nn.Sequential(nn.Linear(3, 2), nn.BatchNorm1d(2, track_running_stats=False)))
    assert model.stat_names == [] and model.size == model.num_params == 3 * 2 + 2 + 2 + 2
