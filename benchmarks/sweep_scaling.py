"""How a sweep scales with worker processes: one 12-run sweep (6 grid points × 2 seeds of FedAvg/FedProx on the
embedded digits) run with --workers 1 (in this process), 2, 4, ... up to the cores this process may use, the
speedup over one worker, and a check that every run folder's metrics.csv is byte-identical to the serial one's.

Run: python benchmarks/sweep_scaling.py [--rounds 500] [--max-workers N] [--json runs/sweep_scaling.json]

The same as the command line does: fedhet sweep <config> --grid ... --seeds 2 --workers N. Timings include
starting the worker processes (about 3 CPU-seconds each to import torch and fedhet; the serial sweep runs in this
process, which has them already). The machine's load average is printed before and after, and the share of a core
the serial sweep got (its CPU time over its wall time: about 1 on a quiet machine); other processes on the cores
lower the speedup.
"""

from __future__ import annotations

import argparse
import filecmp
import json
import os
import platform
import tempfile
import time
from pathlib import Path
from typing import Any

import torch

from fedhet.experiments.executor import Executor, default_workers
from fedhet.experiments.sweep import make_sweep, run_sweep

BASE: dict[str, Any] = {
    "dataset": "digits",
    "partition": {"name": "dirichlet", "alpha": 0.3, "min_size": 20},
    "model": {"name": "mlp", "hidden": [64]},
    "num_clients": 20,
    "clients_per_round": 10,
    "local": {"steps": 10, "lr": 0.05, "batch_size": 10},
}
GRID = ["local.lr=0.02,0.05,0.1", "algorithm=fedavg,{name: fedprox, mu: 0.01}"]


def identical(a: Path, b: Path) -> bool:
    """Every metrics.csv under `a` has a byte-identical twin under `b` (and there are as many)."""
    files = sorted(p.relative_to(a) for p in a.rglob("metrics.csv"))
    return len(files) == len(list(b.rglob("metrics.csv"))) and all(
        filecmp.cmp(a / f, b / f, shallow=False) for f in files
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=500, help="rounds per run (default 500: ~6 s of one core)")
    parser.add_argument("--max-workers", type=int, default=default_workers(), help="most workers to try")
    parser.add_argument("--json", type=Path, help="also write the rows here")
    args = parser.parse_args()
    sweep = make_sweep({**BASE, "rounds": args.rounds}, grid=GRID, seeds=2)
    counts = [1]
    while counts[-1] * 2 <= args.max_workers:
        counts.append(counts[-1] * 2)
    if args.max_workers not in counts:
        counts.append(args.max_workers)
    load = os.getloadavg()
    print(f"{len(sweep.points()) * len(sweep.seeds)} runs of {args.rounds} rounds; workers {counts}; load {load}")
    rows: list[dict[str, Any]] = []
    share = 0.0
    with tempfile.TemporaryDirectory(prefix="fedhet-sweep-") as tmp:
        root = Path(tmp)
        for workers in counts:
            start, cpu = time.perf_counter(), time.process_time()
            with Executor(workers) as executor:
                result = run_sweep(sweep, root / f"w{workers}", executor)
            seconds = time.perf_counter() - start
            if workers == 1:
                share = (time.process_time() - cpu) / seconds
                print(f"the serial sweep got {share:.2f} of a core (about 1 on a quiet machine)")
            assert all(o.ok for o in result.outcomes), [o.error for o in result.outcomes if not o.ok]
            same = identical(root / "w1", root / f"w{workers}")
            speedup = rows[0]["seconds"] / seconds if rows else 1.0
            rows.append({"workers": workers, "seconds": round(seconds, 2), "speedup": round(speedup, 2)})
            rows[-1]["identical"] = same
            print(f"--workers {workers}: {seconds:7.1f} s, speedup {speedup:.2f}x, metrics.csv identical: {same}")
    after = os.getloadavg()
    print(f"load average before {load[0]:.2f}, after {after[0]:.2f} (cores: {os.cpu_count()})")
    if args.json is not None:
        machine = {
            "cpu": platform.processor() or platform.machine(),
            "cores": os.cpu_count(),
            "torch": torch.__version__,
        }
        payload = {"rounds": args.rounds, "rows": rows, "load": [load[0], after[0]], "core_share": share}
        payload["machine"] = machine
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(payload, indent=1) + "\n")
    if not all(r["identical"] for r in rows):
        raise SystemExit("parallel run folders differ from the serial ones")


if __name__ == "__main__":
    main()
