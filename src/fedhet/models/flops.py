"""Forward FLOPs per sample attributed to each parameter, in the order of ``module.named_parameters()``.

A weight of a ``Linear`` or ``Conv*`` layer costs 2 FLOPs (a multiply and an add) at each output position it is
applied to (1 for a Linear layer on flat inputs, H_out·W_out for a 2-d convolution), a bias 1 per position; any
other parameter (a norm's scale, an embedding row) 2 at each of its own output positions. So the FLOPs of a
sub-model that trains a subset of the coordinates (a width slice: HeteroFL, FedRolex, FjORD) are the sum over the
coordinates it keeps, and a client's compute time on the simulated clock scales by that share
(`fedhet.systems.clock`). The backward pass costs about twice the forward one for every parameter alike, so the
share is the same for a training step.
"""

from __future__ import annotations

import torch
from torch import Tensor, nn


def parameter_flops(module: nn.Module, input_shape: tuple[int, ...]) -> Tensor:
    """(P,) float64 forward FLOPs per sample owed to each parameter of `module` on inputs of `input_shape` (one
    forward pass of a single zero sample measures each layer's output positions)."""
    positions: dict[nn.Module, float] = {}

    def record(layer: nn.Module, inputs: object, output: object) -> None:
        if isinstance(output, Tensor) and output.dim() > 0:
            channels = getattr(layer, "out_features", None) or getattr(layer, "out_channels", None)
            per_sample = output[0].numel() if output.dim() > 1 else output.numel()
            positions[layer] = per_sample / channels if channels else 1.0

    owners = [m for m in module.modules() if any(True for _ in m.parameters(recurse=False))]
    hooks = [m.register_forward_hook(record) for m in owners]
    was_training = module.training
    try:
        module.eval()  # batch norm's statistics stay as they are
        with torch.no_grad():
            module(torch.zeros(1, *input_shape))
    finally:
        module.train(was_training)
        for hook in hooks:
            hook.remove()
    parts, seen = [], set()
    for layer in owners:  # named_parameters' order: depth first, a module's own before its children's, each once
        where = positions.get(layer, 1.0)
        for name, p in layer.named_parameters(recurse=False):
            if id(p) not in seen:
                seen.add(id(p))
                per = 1.0 if name == "bias" else 2.0
                parts.append(torch.full((p.numel(),), per * where, dtype=torch.float64))
    return torch.cat(parts) if parts else torch.zeros(0, dtype=torch.float64)
