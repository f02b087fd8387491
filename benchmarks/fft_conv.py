"""Convolution by FFT against oneDNN for the zoo CNNs' layers on one core: a method measured and not used.

A convolution is a product in the frequency domain, so its channel mixing costs a (B×C)·(C×O) complex product
per frequency instead of K² real ones per pixel: for the FedAvg CNN's second layer 7× fewer FLOPs. Each client's
weights change every step, though, so each step also transforms its O·C kernels and inverts their gradient,
and the batch (10) is too small to share that. Per layer and client batch: the forward pass, the input's
gradient (not for a first layer) and the weights' gradient, what the conv backend computes, with

- `onednn`: `aten.convolution` and `aten.convolution_backward` (what the backend calls);
- `fft`: `torch.fft.rfft2` of the padded input, the kernels and the output's gradient; per-frequency complex
  `bmm`s over the channels; `irfft2` back (cross-correlation: Y = X·conj(W), ∂X = ∂Y·W, ∂W = X·conj(∂Y));
- `fft, no kernel transforms`: the same without transforming the kernels or inverting their gradient, a bound
  for any cheaper way to do those (a matrix product with the 5×5 DFT, say).

µs per client, medians of `--reps` timings taking turns; the ratios of the two FFT timings to oneDNN's (above 1:
slower); the largest relative difference between the two methods' outputs.
Run (about a minute on one core):  python benchmarks/fft_conv.py [--batch 10] [--reps 21]
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable

import torch
import torch.nn.functional as F
from conv_kernels import LAYERS  # this folder's script: the zoo CNNs' layers
from torch import Tensor

aten = torch.ops.aten


def onednn(x: Tensor, w: Tensor, pad: int, gy: Tensor, need_input: bool) -> list[Tensor]:
    """Output, weight gradient (and input gradient) with the kernels the conv backend calls."""
    y = aten.convolution(x, w, None, [1, 1], [pad, pad], [1, 1], False, [0, 0], 1)
    gx, gw, _ = aten.convolution_backward(
        gy, x, w, None, [1, 1], [pad, pad], [1, 1], False, [0, 0], 1, [need_input, True, False]
    )
    return [y, gw] + ([gx] if need_input else [])


def fft(x: Tensor, w: Tensor, pad: int, gy: Tensor, need_input: bool, kernels: bool = True) -> list[Tensor]:
    """The same by FFT; `kernels=False` skips the kernels' transforms (their results are then meaningless)."""
    b, c, h, _ = x.shape
    o, k = w.shape[0], w.shape[-1]
    n = h + 2 * pad  # no wrap-around: every output and gradient index stays inside n
    size, out = (n, n), n - k + 1
    freqs = n * (n // 2 + 1)
    xf = torch.fft.rfft2(F.pad(x, (pad,) * 4)).reshape(b, c, freqs).permute(2, 0, 1).contiguous()  # F,B,C
    if kernels:  # the kernels' spectrum W (F,C,O) and its conjugate
        wf = torch.fft.rfft2(w, s=size).reshape(o, c, freqs).permute(2, 1, 0).contiguous()
        wf_conj = wf.conj_physical()
    else:  # as if both came for free
        wf = wf_conj = torch.empty(freqs, c, o, dtype=torch.cfloat)
    y = torch.fft.irfft2(torch.bmm(xf, wf_conj).permute(1, 2, 0).reshape(b, o, n, -1), s=size)
    gyf = torch.fft.rfft2(gy, s=size).reshape(b, o, freqs).permute(2, 0, 1).contiguous()  # F,B,O
    gwf = torch.bmm(gyf.conj_physical().transpose(1, 2).contiguous(), xf)  # F,O,C
    gw = torch.fft.irfft2(gwf.permute(1, 2, 0).reshape(o, c, n, -1), s=size)[..., :k, :k] if kernels else w
    result = [y[..., :out, :out], gw]
    if need_input:
        gx = torch.fft.irfft2(torch.bmm(gyf, wf.transpose(1, 2)).permute(1, 2, 0).reshape(b, c, n, -1), s=size)
        result.append(gx[..., pad : pad + h, pad : pad + h])
    return result


def measure(
    layer: tuple[int, int, int, int, int], first: bool, batch: int, reps: int
) -> tuple[dict[str, float], float]:
    """µs per client of each method (medians of `reps` taking turns) and their outputs' largest relative difference."""
    c, o, h, k, pad = layer
    need_input = c > 1 and not first
    x, w = torch.randn(batch, c, h, h), torch.randn(o, c, k, k)
    gy = torch.randn(batch, o, h + 2 * pad - k + 1, h + 2 * pad - k + 1)
    ref, got = onednn(x, w, pad, gy, need_input), fft(x, w, pad, gy, need_input)
    diff = max(((a - b).abs().max() / a.abs().max()).item() for a, b in zip(ref, got, strict=True))
    calls: dict[str, Callable[[], object]] = {
        "onednn": lambda: onednn(x, w, pad, gy, need_input),
        "fft": lambda: fft(x, w, pad, gy, need_input),
        "bound": lambda: fft(x, w, pad, gy, need_input, kernels=False),
    }
    times: dict[str, list[float]] = {key: [] for key in calls}
    for rep in range(reps + 2):
        for key, call in calls.items():
            start = time.perf_counter()
            call()
            if rep >= 2:
                times[key].append(time.perf_counter() - start)
    return {key: statistics.median(t) * 1e6 for key, t in times.items()}, diff


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batch", type=int, default=10)
    parser.add_argument("--reps", type=int, default=21)
    args = parser.parse_args()
    torch.set_num_threads(1)
    torch.manual_seed(0)
    print(f"µs per client, batch {args.batch}, one thread; medians of {args.reps}")
    print(f"{'layer':26s} {'onednn':>8s} {'fft':>8s} {'fft, no kernel transforms':>26s}", end=" ")
    print(f"{'ratios':>13s} {'rel. diff':>9s}")
    for name, layer in LAYERS.items():
        us, diff = measure(layer, "conv1" in name, args.batch, args.reps)
        print(
            f"{name:26s} {us['onednn']:8.0f} {us['fft']:8.0f} {us['bound']:26.0f} "
            f"{us['fft'] / us['onednn']:6.2f} {us['bound'] / us['onednn']:6.2f} {diff:9.1e}"
        )


if __name__ == "__main__":
    main()
