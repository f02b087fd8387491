"""DP-SGD's per-sample clipping without per-sample gradients, for the dense backend (`fedhet.engine.dense`).

For a linear layer z_i = W a_i + b, sample i's gradient is the outer product ∇W_i = δ_iᵀ a_i (δ_i = ∂ℓ_i/∂z_i, the
row of the output gradient of a batch-sized backward pass, a_i the layer's input), so its norm needs neither the
(out, in) gradient nor a second pass ("ghost clipping": Goodfellow, arXiv:1510.01799, 2015; Li et al., ICLR 2022,
§4, whose ‖∇W_i‖²_F = vec(a_i a_iᵀ)·vec(δ_i δ_iᵀ) over a sequence of rows reduces, with one row per sample, to)

    ‖∇W_i‖² = ‖a_i‖² ‖δ_i‖²,   ‖∇b_i‖² = ‖δ_i‖²   (with a bias: (‖a_i‖² + 1) ‖δ_i‖², the input with a 1 appended)

summed over the trained layers: ‖g_i‖², then c_i = min(1, C/‖g_i‖) (Abadi et al., CCS 2016, Algorithm 1). The
clipped sum is Σ_i c_i ∇W_i = (c ⊙ δ)ᵀ A: the same δ and A weighted (book-keeping, Bu et al., "Differentially
Private Optimization on Large Model at Small Cost", ICML 2023), one matrix product as in plain SGD.
The noise ξ of client k's step t is drawn from the stream the vectorised backend draws it from
(`fedhet.engine.privacy.step_noise`), so both give the same numbers up to float rounding (tested).
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import Tensor

from fedhet.seeding import torch_gen


def square_norms(inputs: Sequence[Tensor], deltas: Sequence[Tensor], trained: Sequence[tuple[bool, bool]]) -> Tensor:
    """‖g_i‖² of each sample (..., b): Σ_l (‖a_{l,i}‖² [weight trained] + 1 [bias trained]) ‖δ_{l,i}‖² from each
    layer's squared input norms ‖a_{l,i}‖² (..., b), output gradients δ_l (..., b, out) and whether its weight and
    its bias are trained (a frozen parameter's gradient is not clipped: it is not released)."""
    total: Tensor | None = None
    for a_sq, delta, (weight, bias) in zip(inputs, deltas, trained, strict=True):
        if not (weight or bias):
            continue
        scale = (a_sq + 1.0 if bias else a_sq) if weight else torch.ones_like(a_sq)
        term = scale * delta.square().sum(-1)
        total = term if total is None else total.add_(term)
    if total is None:
        return torch.zeros_like(inputs[0])
    return total


def clip_factors(square: Tensor, clip: float) -> Tensor:
    """c_i = min(1, C/‖g_i‖) from ‖g_i‖² (1 for a zero gradient, and for C = inf)."""
    return (clip / square.sqrt()).clamp(max=1.0)


def draw_noise(clients: Sequence[int], seed: int, round_: int, key: str, step: int, out: Tensor) -> Tensor:
    """Step `step`'s standard normal noise of each of `clients` into the rows of `out` (m, P), from the streams of
    `fedhet.engine.privacy.step_noise` (seed, key, round, client, step): its numbers, without a temporary per row."""
    for row, k in zip(out, clients, strict=True):
        torch.randn(row.shape, generator=torch_gen(seed, key, round_, k, step), out=row)
    return out
