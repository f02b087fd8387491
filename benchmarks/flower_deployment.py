"""A Flower deployment round against the same round in Flower's simulation runtime (and the native engine).

Run from the Flower venv: .venv-flower/bin/python benchmarks/flower_deployment.py [CONFIG] [--rounds 8]
[--nodes 3] [--isolation none process subprocess] [--json runs/flower-deployment.json]

Each system runs CONFIG (default scripts/flower-maxfl.yaml) with `--rounds` rounds into a fresh run folder while
this script watches the folder's metrics.csv: the time at which each round's row appears gives the round's
duration. A round is measured from the previous row to its own (so the first round, which also pays for start-up,
is reported apart), and the table gives the median of rounds 2..R and the whole command's time. The deployment is
scripts/flower_local.sh (a SuperLink and NODES SuperNodes on loopback) with each isolation asked for: `none`
(each SuperNode answers its tasks in its own process), `process` (fedhet's long-lived worker beside each node) and
`subprocess` (Flower's default, a new process per message). Every run's
metrics are checked against the native run's (1e-5), so a fast but wrong system cannot pass.
"""

from __future__ import annotations

import argparse
import csv
import itertools
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import yaml

from fedhet.atomic import write_text
from fedhet.flower.ports import free_port_block

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "scripts" / "flower_local.sh"


def rows(path: Path) -> list[dict[str, str]]:
    try:
        with path.open() as f:
            return list(csv.DictReader(f))
    except FileNotFoundError:
        return []


def watch(command: list[str], out: Path, rounds: int, env: dict[str, str], limit_s: float) -> dict[str, object]:
    """Run `command`, timing the appearance of each of `out`/metrics.csv's rows."""
    started = time.perf_counter()
    process = subprocess.Popen(command, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT)
    stamps: list[float] = []
    while process.poll() is None and time.perf_counter() - started < limit_s:
        count = len(rows(out / "metrics.csv"))
        while len(stamps) < count:
            stamps.append(time.perf_counter() - started)
        time.sleep(0.02)
    if process.poll() is None:
        process.kill()
    process.wait()
    total = time.perf_counter() - started
    count = len(rows(out / "metrics.csv"))
    stamps += [total] * (count - len(stamps))  # rows written in the last poll interval
    if count < rounds:
        raise RuntimeError(f"{' '.join(command)} wrote {count} of {rounds} rounds (exit code {process.returncode})")
    durations = [b - a for a, b in itertools.pairwise(stamps)]
    return {"total_s": total, "first_round_at_s": stamps[0], "round_s": statistics.median(durations)}


def same_metrics(a: Path, b: Path, tol: float = 1e-5) -> bool:
    for row_a, row_b in zip(rows(a / "metrics.csv"), rows(b / "metrics.csv"), strict=True):
        for key, x in row_a.items():
            if x != row_b[key] and abs(float(x) - float(row_b[key])) > tol * max(1.0, abs(float(x))):
                return False
    return True


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("config", nargs="?", type=Path, default=ROOT / "scripts" / "flower-maxfl.yaml")
    parser.add_argument("--rounds", type=int, default=8)
    parser.add_argument("--nodes", type=int, default=3)
    parser.add_argument("--isolation", nargs="+", default=["none", "process", "subprocess"])
    parser.add_argument("--limit", type=float, default=1800, help="seconds each system may take")
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    bin_ = Path(sys.executable).parent
    env = {**os.environ, "FLWR_TELEMETRY_ENABLED": "0", "VENV": str(bin_.parent)}
    work = Path(tempfile.mkdtemp(prefix="fedhet-flower-bench-"))
    raw = yaml.safe_load(args.config.read_text())
    raw["rounds"] = args.rounds
    config = work / "config.yaml"
    config.write_text(yaml.safe_dump(raw))
    fedhet = str(bin_ / "fedhet")
    results: dict[str, dict[str, object]] = {}

    def record(name: str, result: dict[str, object], out: Path) -> None:
        result["same_metrics_as_native"] = name == "native" or same_metrics(work / "native", out)
        results[name] = result
        print(
            f"{name:<24} round {result['round_s']:.3f} s (median of rounds 2..{args.rounds}), first round at "
            f"{result['first_round_at_s']:.1f} s, whole command {result['total_s']:.1f} s, "
            f"native numbers: {result['same_metrics_as_native']}",
            flush=True,
        )

    base = [fedhet, "run", str(config), "--quiet", "--out"]
    record("native", watch([*base, str(work / "native")], work / "native", args.rounds, env, args.limit), work)
    sim = work / "simulation"
    flags = ["--engine", "flower", "--nodes", str(args.nodes)]
    record("simulation", watch([*base, str(sim), *flags], sim, args.rounds, env, args.limit), sim)
    for isolation in args.isolation:
        out = work / f"deployment-{isolation}"
        port = free_port_block(args.nodes + 2)
        denv = {**env, "PORT": str(port), "ISOLATION": isolation}
        command = [str(SCRIPT), "demo", str(config), str(out), str(args.nodes)]
        record(f"deployment ({isolation})", watch(command, out, args.rounds, denv, args.limit), out)
    sim_round = float(results["simulation"]["round_s"])  # type: ignore[arg-type]
    for result in results.values():
        result["round_vs_simulation"] = float(result["round_s"]) / sim_round  # type: ignore[arg-type]
    print("\n| system | s per round | × simulation | first round at | whole command | native numbers |")
    print("|---|---|---|---|---|---|")
    for name, r in results.items():
        print(
            f"| {name} | {r['round_s']:.3f} | {r['round_vs_simulation']:.2f}× | {r['first_round_at_s']:.1f} s | "
            f"{r['total_s']:.1f} s | {'yes' if r['same_metrics_as_native'] else 'NO'} |"
        )
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        payload = {"config": raw, "nodes": args.nodes, "results": results}
        write_text(args.json, json.dumps(payload, indent=2) + "\n")


if __name__ == "__main__":
    main()
