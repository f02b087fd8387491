"""FLOP rates, on one core, of the matrix products an MLP 784-200-10 local step is made of, against a large
square product (the bench's machine limit). Run: python benchmarks/gemm_shapes.py

It shows why the MLP workload cannot reach half of the square product's rate: every client multiplies a
batch of 10 samples by its own weights, and those skinny products run slower, more so once a chunk of clients'
weights no longer fits in a core's cache.
"""

from __future__ import annotations

import time
from collections.abc import Callable

import torch


def rate(name: str, fn: Callable[[], object], flops: float, reps: int) -> None:
    fn()
    best = float("inf")
    for _ in range(5):
        start = time.perf_counter()
        for _ in range(reps):
            fn()
        best = min(best, (time.perf_counter() - start) / reps)
    print(f"{name:44s} {best * 1e6:9.1f} us {flops / best / 1e9:7.1f} GFLOP/s")


def main() -> None:
    torch.set_num_threads(1)
    d, h, b = 784, 200, 10
    step = 2 * b * d * h
    a = torch.randn(2048, 2048)
    rate("2048x2048 @ 2048x2048", lambda: a @ a, 2 * 2048**3, 3)
    x, w, g = torch.randn(1, b, d), torch.randn(1, h, d), torch.randn(1, b, h)
    rate("forward (10x784) @ (784x200), one client", lambda: torch.bmm(x, w.mT), step, 2000)
    rate("update W -= (200x10) @ (10x784), one client", lambda: w.baddbmm_(g.mT, x, alpha=-1e-9), step, 2000)
    xs, ws, gs = torch.randn(16, b, d), torch.randn(16, h, d), torch.randn(16, b, h)
    rate("forward, 16 clients (10 MB of weights)", lambda: torch.bmm(xs, ws.mT), 16 * step, 200)
    rate("update, 16 clients", lambda: ws.baddbmm_(gs.mT, xs, alpha=-1e-9), 16 * step, 200)
    e, w0 = torch.randn(6200, d), torch.randn(h, d)
    rate("evaluation (6200x784) @ (784x200)", lambda: e @ w0.T, 2 * 6200 * d * h, 50)


if __name__ == "__main__":
    main()
