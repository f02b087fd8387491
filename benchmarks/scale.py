"""A round's cost as the population grows (issue 47): the same 100-client cohort among K = 1,000 … 1,000,000 clients.

Run: python benchmarks/scale.py [--clients 1000 100000 1000000] [--rounds 6] [--out DIR] [--profile FILE]
       [--algorithm ditto --personal-state disk --clients-per-round 10000]

Each K runs in a fresh process (so that its peak memory is its own): 10 samples × 64 features per client (one user
id per 10 samples, ``partition: natural``), logistic regression, 100 clients a round, 1,000 scored per evaluation
(``eval_clients``), one torch thread, written to a run folder (metrics.csv, clients.csv, ...). The table gives the
whole script's time (data made + ``fedhet.run``) and its CPU time, setup + the first round (from the script's
start), one round (the summary's ``wall_time_s`` / rounds), the median of rounds 2..R−1 (each evaluates a sample
of 1,000 clients) in wall time and in the process's CPU time (steadier on a shared machine), the last round (it
evaluates every client, for clients.csv) and the process's peak resident memory (VmHWM, the script's arrays
included); ``--profile`` writes a cProfile of one K (give one K) to FILE.

``--algorithm ditto`` runs Ditto with a personal head (``personal: [head]``; the logistic model's head is all of it:
130 floats, 520 bytes per client), its clients' rows kept as ``--personal-state`` says (memory, disk: files in the
run folder); the table then also gives the clients holding rows at the end, the state files' size and the disk they
use, and the peak's file-backed part (the mapped state pages the kernel may drop).
"""

from __future__ import annotations

import argparse
import itertools
import json
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

SAMPLES, FEATURES = 10, 64


def one(
    clients: int, rounds: int, out: Path, profile: str | None, algorithm: str, state: str, per_round: int
) -> dict[str, float]:
    """Make the data and run it; the measurements of this process."""
    import numpy as np
    import torch

    torch.set_num_threads(1)
    import fedhet
    from fedhet.experiments.callbacks import Callback
    from fedhet.process_memory import memory_mb

    ends: list[float] = []
    cpu: list[float] = []  # this process's CPU time: steadier than wall time on a shared machine

    class RoundEnds(Callback):
        def on_round_end(self, state: object, metrics: object) -> bool:
            if not _engine:
                _engine.append(state.experiment.engine)  # type: ignore[attr-defined]
            ends.append(time.perf_counter())
            cpu.append(time.process_time())
            return False

    start = time.perf_counter()
    rng = np.random.default_rng(0)
    n = clients * SAMPLES
    x = rng.standard_normal((n, FEATURES), dtype=np.float32)
    y = (x[:, 0] + 0.5 * rng.standard_normal(n, dtype=np.float32) > 0).astype(np.int64)
    users = np.repeat(np.arange(clients, dtype=np.int64), SAMPLES)
    data = fedhet.datasets.from_arrays(x, y, users, num_classes=2)
    data_bytes = x.nbytes + y.nbytes + users.nbytes
    config = {
        "dataset": data,
        "partition": "natural",
        "model": "logistic",
        "num_clients": clients,
        "clients_per_round": per_round,
        "personal_state": state,
        "eval_clients": 1000,
        "rounds": rounds,
        "seed": 0,
    }
    if algorithm == "ditto":
        config["algorithm"] = {"name": "ditto", "personal": ["head"]}
    if profile:
        import cProfile

        with cProfile.Profile() as prof:
            result = fedhet.run(config, out, overwrite=True, callbacks=[RoundEnds()])
        prof.dump_stats(profile)
    else:
        result = fedhet.run(config, out, overwrite=True, callbacks=[RoundEnds()])
    total = time.perf_counter() - start
    usage = resource.getrusage(resource.RUSAGE_SELF)
    round_s = result.wall_time_s / rounds
    middle = sorted(b - a for a, b in itertools.pairwise(ends[:-1]))  # rounds 2..R-1: sampled evaluation
    middle_cpu = sorted(b - a for a, b in itertools.pairwise(cpu[:-1]))
    files = sorted(Path(out).glob("client-state-*.bin"))
    store = getattr(_engine[0], "client_state", None) if _engine else None
    holding = len(store.clients("ditto")) if store is not None and algorithm == "ditto" else 0
    return {
        "clients": clients,
        "holding": holding,
        "state_file_gb": sum(f.stat().st_size for f in files) / 1e9,
        "state_disk_gb": sum(f.stat().st_blocks * 512 for f in files) / 1e9,
        "peak_file_gb": _peak_file_gb(),
        "total_s": total,
        "cpu_s": usage.ru_utime + usage.ru_stime,
        "first_s": ends[0] - start,
        "round_s": round_s,
        "middle_s": middle[len(middle) // 2] if middle else float("nan"),
        "middle_cpu_s": middle_cpu[len(middle_cpu) // 2] if middle_cpu else float("nan"),
        "last_s": ends[-1] - ends[-2] if len(ends) > 1 else float("nan"),
        "peak_gb": memory_mb("VmHWM") / 1024,
        "data_gb": data_bytes / 1e9,
    }


_engine: list[object] = []  # the run's engine, kept by `KeepEngine`


def _peak_file_gb() -> float:
    """The file-backed part of this process's resident memory now (RssFile: mapped files, e.g. the state tables)."""
    from fedhet.process_memory import memory_mb

    return memory_mb("RssFile") / 1024


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--clients", type=int, nargs="+", default=[1000, 100_000])
    parser.add_argument("--rounds", type=int, default=6)
    parser.add_argument("--out", type=Path, default=None, help="run folders go here (default: a temporary folder)")
    parser.add_argument("--profile", default=None, help="write a cProfile of the (one) K here")
    parser.add_argument("--algorithm", choices=["fedavg", "ditto"], default="fedavg")
    parser.add_argument("--personal-state", choices=["auto", "memory", "disk"], default="auto")
    parser.add_argument("--clients-per-round", type=int, default=100)
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        options = (args.algorithm, args.personal_state, args.clients_per_round)
        print(json.dumps(one(args.clients[0], args.rounds, args.out, args.profile, *options)))
        return
    with tempfile.TemporaryDirectory() as tmp:
        base = args.out or Path(tmp)
        rows = []
        for k in args.clients:
            cmd = [sys.executable, __file__, "--child", "--clients", str(k), "--rounds", str(args.rounds)]
            cmd += ["--algorithm", args.algorithm, "--personal-state", args.personal_state]
            cmd += ["--clients-per-round", str(args.clients_per_round)]
            cmd += ["--out", str(base / f"K{k}")] + (["--profile", args.profile] if args.profile else [])
            done = subprocess.run(cmd, capture_output=True, text=True, check=False)
            if done.returncode != 0:
                sys.exit(f"K = {k} failed:\n{done.stderr}")
            rows.append(json.loads(done.stdout.strip().splitlines()[-1]))
    print("| clients K | " + " | ".join(f"{r['clients']:,}" for r in rows) + " |")
    print("|---|" + "---|" * len(rows))
    lines = [
        (f"whole script (data made, fedhet.run of {args.rounds} rounds)", "total_s", "{:.1f} s"),
        ("its CPU time (user + system; the machine is shared)", "cpu_s", "{:.1f} s"),
        ("setup + first round (script start to round 1's end)", "first_s", "{:.1f} s"),
        (f"one round (summary wall_time_s / {args.rounds})", "round_s", "{:.0f} ms"),
        ("a round evaluating a sample (median of rounds 2..R−1)", "middle_s", "{:.0f} ms"),
        ("its CPU time (median)", "middle_cpu_s", "{:.0f} ms"),
        ("the last round (evaluates every client)", "last_s", "{:.0f} ms"),
        ("peak memory (VmHWM, the script's arrays included)", "peak_gb", "{:.2f} GB"),
        ("the data's bytes (x, y, users)", "data_gb", "{:.2f} GB"),
    ]
    if args.algorithm == "ditto":
        lines += [
            ("clients holding a personal head at the end", "holding", "{:,.0f}"),
            ("resident file-backed memory at the end (RssFile: libraries, mapped state)", "peak_file_gb", "{:.2f} GB"),
            ("state files' size (sparse)", "state_file_gb", "{:.2f} GB"),
            ("state files' disk use", "state_disk_gb", "{:.3f} GB"),
        ]
    for label, key, fmt in lines:
        scale = 1000.0 if key in ("round_s", "middle_s", "middle_cpu_s", "last_s") else 1.0
        print(f"| {label} | " + " | ".join(fmt.format(r[key] * scale) for r in rows) + " |")


if __name__ == "__main__":
    main()
