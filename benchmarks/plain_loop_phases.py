"""Does a reference loop change speed during a run? Times a bench workload's plain loop and a fedhet backend round by
round, with what the machine and this process's threads did meanwhile (from /proc, Linux only).

Run from the Flower venv (for --after-flower) or the core venv:

    .venv-flower/bin/python benchmarks/plain_loop_phases.py [--workload mlp] [--backend dense] [--rounds 40]
        [--after-flower]

Each line is one round of each system: its milliseconds, the share of the machine's CPU time that was user, system,
idle and steal, the share this process used (1.0 = every core), and its busiest threads. On the 2-core VM of
benchmarks/README.md the MLP's plain loop took about 480 ms a round, then about 940 ms for stretches of 10 s to a
minute, with this process holding both cores, only two threads busy and no steal time, while `dense` kept its speed.
`--after-flower` first runs Flower's simulation of the logistic-regression workload (3 rounds), after which such a
stretch came in 3 of 5 tries.
"""

from __future__ import annotations

import argparse
import os
import time
from pathlib import Path

import torch

from fedhet.bench.run import COMPARATORS, _run, fedhet_system
from fedhet.bench.workloads import CORE


def machine_jiffies() -> list[int]:
    """user, nice, system, idle, iowait, irq, softirq, steal … of all cores (/proc/stat)."""
    return [int(v) for v in Path("/proc/stat").read_text().splitlines()[0].split()[1:]]


def thread_jiffies() -> dict[str, tuple[str, int]]:
    """user + system jiffies of each of this process's threads, by thread id, with the thread's name."""
    out = {}
    for tid in os.listdir("/proc/self/task"):
        try:
            raw = Path(f"/proc/self/task/{tid}/stat").read_text()
        except OSError:  # the thread ended meanwhile
            continue
        fields = raw.rsplit(")", 1)[1].split()
        out[tid] = (raw[raw.index("(") + 1 : raw.rindex(")")], int(fields[11]) + int(fields[12]))
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--workload", default="mlp", choices=[w.name for w in CORE])
    parser.add_argument("--backend", default="dense", help="the fedhet backend timed beside the plain loop")
    parser.add_argument("--rounds", type=int, default=40)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--after-flower", action="store_true", help="run Flower's simulation first")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    workloads = {w.name: w for w in CORE}
    w = workloads[args.workload]
    data = w.data()
    systems = [COMPARATORS["plain"](w, data), fedhet_system(w, data, args.backend, 0)]
    for r in range(2):  # warm-up
        for s in systems:
            _run(s, r + 1, None)
    if args.after_flower:
        from comparators.flower import flower_round_times

        logreg = workloads["logreg"]
        flower_round_times(logreg, logreg.data(), 3)
    start, machine, threads = time.perf_counter(), machine_jiffies(), thread_jiffies()
    for r in range(args.rounds):
        times = [_run(s, 10 + r, None) for s in systems]
        now, now_threads = machine_jiffies(), thread_jiffies()
        d = [a - b for a, b in zip(now, machine, strict=False)]
        total = max(sum(d), 1)
        used = {tid: (name, j - threads.get(tid, (name, 0))[1]) for tid, (name, j) in now_threads.items()}
        busiest = sorted(used.values(), key=lambda v: -v[1])[:3]
        ours = sum(j for _, j in used.values())
        machine, threads = now, now_threads
        print(
            f"{time.perf_counter() - start:6.1f} s  "
            + "  ".join(f"{s.name} {1e3 * t:7.1f} ms" for s, t in zip(systems, times, strict=True))
            + f"  | user {d[0] / total:.2f} sys {d[2] / total:.2f} idle {d[3] / total:.2f} steal {d[7] / total:.2f}"
            + f" ours {ours / total:.2f} | busiest threads "
            + ", ".join(f"{name} {j}" for name, j in busiest),
            flush=True,
        )


if __name__ == "__main__":
    main()
