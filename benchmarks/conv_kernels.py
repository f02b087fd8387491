"""oneDNN against torch's direct convolution kernel (im2col and one matrix product, `aten._slow_conv2d_*`) for the
zoo CNNs' layers on one core, and what the conv backend's rule (the direct kernel for the backward pass of a
convolution of one input channel, `fedhet.engine.conv.Conv.direct_backward`) gives per round.

Part 1, µs per client (a call on one client's batch), medians of 5 timings taking turns: forward, backward
without the input's gradient (a first layer) and with it, and oneDNN's forward against NNPACK's (where torch has
it; the backend does not use NNPACK, see docs/performance.md). Part 2, ms per round of local training (10 steps of
10) on the conv backend with the rule and without it, taking turns; medians of the repetitions after the first.
Run (about 2 minutes on 2 quiet cores):  python benchmarks/conv_kernels.py [--batches 10] [--threads 2] [--reps 5]
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable

import torch
from conv_chunks import conv_round  # this folder's script: the same workloads

from fedhet.engine import conv
from fedhet.engine.memory import keep_freed_memory
from fedhet.engine.request import TrainRequest
from fedhet.engine.step import fresh_cohort

aten = torch.ops.aten
LAYERS = {  # in, out, input side, kernel, padding
    "lenet_cifar conv1": (3, 6, 32, 5, 0),
    "lenet_cifar conv2": (6, 16, 14, 5, 0),
    "cnn_mnist conv1": (1, 32, 28, 5, 2),
    "cnn_mnist conv2": (32, 64, 14, 5, 2),
    "cnn_fmnist conv1": (1, 16, 28, 5, 0),
    "cnn_fmnist conv2": (16, 32, 12, 5, 0),
    "cnn_cifar conv1": (3, 32, 32, 5, 0),
    "cnn_cifar conv2": (32, 64, 14, 5, 0),
    "vgg16 (width 1/4) conv1": (3, 16, 32, 3, 1),
    "vgg16 (width 1/4) conv3": (16, 32, 16, 3, 1),
    "vgg16 (width 1/4) conv8": (64, 64, 4, 3, 1),
}
MODELS = ("cnn_mnist", "cnn_fmnist", "cnn_femnist", "lenet_cifar")  # cohorts of benchmarks/conv_chunks.py


def _us(fn: Callable[[], object], calls: int) -> float:
    start = time.perf_counter()
    for _ in range(calls):
        fn()
    return (time.perf_counter() - start) / calls * 1e6


def layer(batch: int, name: str, c_in: int, c_out: int, side: int, k: int, pad: int) -> str:
    """One layer's three calls on both kernels, µs per call."""
    x, w, b = torch.randn(batch, c_in, side, side), torch.randn(c_out, c_in, k, k), torch.randn(c_out)
    s, p, d = [1, 1], [pad, pad], [1, 1]
    g = torch.randn_like(aten.convolution(x, w, b, s, p, d, False, [0, 0], 1))
    pairs = {
        "forward": (
            lambda: aten.convolution(x, w, b, s, p, d, False, [0, 0], 1),
            lambda: aten._slow_conv2d_forward(x, w, [k, k], b, s, p),
        ),
        "backward": (
            lambda: aten.convolution_backward(g, x, w, [c_out], s, p, d, False, [0, 0], 1, [False, True, True]),
            lambda: aten._slow_conv2d_backward(g, x, w, [k, k], s, p, [False, True, True]),
        ),
        "backward with input": (
            lambda: aten.convolution_backward(g, x, w, [c_out], s, p, d, False, [0, 0], 1, [True, True, True]),
            lambda: aten._slow_conv2d_backward(g, x, w, [k, k], s, p, [True, True, True]),
        ),
    }
    if torch._nnpack_available():
        pairs["forward on NNPACK"] = (pairs["forward"][0], lambda: aten._nnpack_spatial_convolution(x, w, b, p, s))
    calls = max(5, min(200, int(2e9 / (batch * c_out * side * side * c_in * k * k))))
    cells = []
    for what, (onednn, direct) in pairs.items():
        onednn(), direct()
        a, c = [], []
        for _ in range(5):
            a.append(_us(onednn, calls))
            c.append(_us(direct, calls))
        cells.append(f"{what} {statistics.median(a):.0f} → {statistics.median(c):.0f}")
    return f"batch {batch}, {name} ({c_in} → {c_out}), µs oneDNN → direct: " + "; ".join(cells)


def kernels(batch: int) -> None:
    torch.set_num_threads(1)
    for name, shape in LAYERS.items():
        print(layer(batch, name, *shape), flush=True)


def rounds(threads: int, reps: int) -> None:
    torch.set_num_threads(threads)
    keep_freed_memory()  # as the engine does
    rule = conv.Conv.direct_backward
    for name in MODELS:
        w, model, spec, data, w0, plan = conv_round(name)
        times: dict[str, list[float]] = {"oneDNN only": [], "direct backward for one input channel": []}
        for rep in range(reps):
            for mode in times:
                conv.Conv.direct_backward = rule if mode.startswith("direct") else (lambda self, a: False)  # type: ignore[method-assign]
                start = time.perf_counter()
                conv.train_conv(TrainRequest(model, data, w0, plan, fresh_cohort(plan, w0), 0, rep), spec)
                if rep:
                    times[mode].append(time.perf_counter() - start)
        conv.Conv.direct_backward = rule  # type: ignore[method-assign]
        cells = [f"{mode} {1e3 * statistics.median(t):.0f} ms" for mode, t in times.items()]
        print(f"{name} ({w.clients} clients, {threads} threads): " + "; ".join(cells), flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batches", default="10")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--reps", type=int, default=5)
    args = parser.parse_args()
    for batch in args.batches.split(","):
        kernels(int(batch))
    rounds(args.threads, args.reps)


if __name__ == "__main__":
    main()
