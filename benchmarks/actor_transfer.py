"""What shipping an actor's models back costs: the `mlp` workload's round of models (100 × 159,010 float32, 64 MB)
returned by a Ray actor through Ray's object store (what `--actors` did before) against written into the driver's
shared-memory `Outbox` (`fedhet.experiments.actors`, what an actor on the driver's machine does now), each followed
by the driver's copy (`concat_results`), taking turns; medians and ranges in ms, and whether the bytes arrived.

Run: python benchmarks/actor_transfer.py [--rounds 15] [--clients 100]
"""

from __future__ import annotations

import argparse
import os
import statistics
import time
import warnings

import numpy as np
import ray
import torch

from fedhet.engine.memory import keep_freed_memory
from fedhet.experiments.actors import Outbox, _map_file

SIZE = 159_010  # MLP 784-200-10's parameters


class Sender:
    """An actor holding a shard's models (as `Trainer` holds them after training)."""

    def __init__(self, clients: int) -> None:
        keep_freed_memory()  # as an actor's engine does
        self.models = torch.randn(clients, SIZE)
        self.box: object = None

    def by_ray(self) -> np.ndarray:
        return self.models.numpy()

    def by_outbox(self, name: str) -> tuple[int, ...]:
        if name:
            self.box = _map_file(name)
        torch.frombuffer(self.box, dtype=torch.float32, count=self.models.numel()).copy_(self.models.view(-1))  # type: ignore[call-overload]
        return tuple(self.models.shape)

    def reference(self) -> np.ndarray:
        return self.models.numpy()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=15)
    parser.add_argument("--clients", type=int, default=100)
    args = parser.parse_args()
    keep_freed_memory()  # as the driver's engine does
    print(f"load average before: {' '.join(f'{x:.2f}' for x in os.getloadavg())} ({os.cpu_count()} CPUs)")
    ray.init(address="local", num_cpus=1, include_dashboard=False, log_to_driver=False)
    try:
        actor = ray.remote(num_cpus=1)(Sender).remote(args.clients)
        want = torch.from_numpy(ray.get(actor.reference.remote()).copy())
        box = Outbox()
        times: dict[str, list[float]] = {"Ray's object store": [], "outbox": []}
        same = True
        for r in range(args.rounds + 2):
            start = time.perf_counter()
            with warnings.catch_warnings():  # read-only arrays
                warnings.simplefilter("ignore", UserWarning)
                got = torch.from_numpy(ray.get(actor.by_ray.remote())).clone()
            ray_s = time.perf_counter() - start
            same &= torch.equal(got, want)
            del got
            start = time.perf_counter()
            name = box.ready(want.numel() * 4)
            assert name is not None, "no room in shared memory"
            shape = ray.get(actor.by_outbox.remote(name))
            got = box.models(shape).clone()
            box.opened()
            box_s = time.perf_counter() - start
            same &= torch.equal(got, want)
            if r >= 2:
                times["Ray's object store"].append(ray_s)
                times["outbox"].append(box_s)
        box.close()
    finally:
        ray.shutdown()
    mb = args.clients * SIZE * 4 / 2**20
    for name, t in times.items():
        print(
            f"{name:>18}: {1e3 * statistics.median(t):.1f} ms ({1e3 * min(t):.1f}–{1e3 * max(t):.1f}) for {mb:.0f} MB"
        )
    print(f"the same bytes: {same}")
    print(f"load average after: {' '.join(f'{x:.2f}' for x in os.getloadavg())}")


if __name__ == "__main__":
    main()
