"""Can `torch.func.vmap` run a model's training step? Probed once per model on two samples of real data."""

from __future__ import annotations

import warnings

import torch
from torch import Tensor
from torch.func import grad, vmap

from fedhet.data.dataset import ClientData
from fedhet.engine.functional import FlatModel, VmapProbe


def probe_vmap(model: FlatModel, data: ClientData) -> VmapProbe:
    """Run a vmapped gradient step of two stacked copies of the model on two samples of `data`."""
    if len(data.y) == 0:
        return VmapProbe()
    x, y = data.x[:2].unsqueeze(0).expand(2, *data.x[:2].shape), data.y[:2].unsqueeze(0).expand(2, *data.y[:2].shape)
    params = {n: v.unsqueeze(0).expand(2, *v.shape) for n, v in model.unflatten(model.initial_params()).items()}

    stats = {n: params.pop(n) for n in model.stat_names}  # updated in the forward pass, as in a training step

    def loss(w: dict[str, Tensor], s: dict[str, Tensor], xb: Tensor, yb: Tensor) -> Tensor:
        return model.task.loss(model.forward_tracked(w, s, xb)[0], yb).mean()

    randomness = "same" if model.has_dropout else "error"
    was_training = model.module.training
    model.module.train()
    try:
        with warnings.catch_warnings(record=True) as caught, torch.random.fork_rng():
            warnings.simplefilter("always")
            vmap(grad(loss), randomness=randomness)(params, stats, x, y)
        slow = [str(w.message).split(".")[0] for w in caught if "batching rule" in str(w.message)]
        return VmapProbe(slow=slow[0].removeprefix("There is a performance drop because ") if slow else None)
    except Exception as err:
        return VmapProbe(failure=f"{type(err).__name__}: {str(err).splitlines()[0][:160]}")
    finally:
        model.module.train(was_training)
