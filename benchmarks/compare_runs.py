"""Do two `fedhet bench` runs agree? For every (workload, system) row of both JSON files: the training and
round medians and the training ratio to the plain loop, their relative difference, and whether it is within
the tolerance (10% by default). Exit status 1 when a row differs by more.

Run:  python benchmarks/compare_runs.py runs/a.json runs/b.json [--tolerance 0.1]
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any


def _rows(path: Path) -> dict[tuple[str, str], dict[str, Any]]:
    payload = json.loads(path.read_text())
    return {(r["workload"], r["backend"]): r for r in payload["rows"] if r["backend"] != "machine limit"}


def _diff(a: float | None, b: float | None) -> float | None:
    if a is None or b is None or a != a or b != b or min(abs(a), abs(b)) == 0:
        return None
    return abs(a - b) / min(abs(a), abs(b))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("first", type=Path)
    parser.add_argument("second", type=Path)
    parser.add_argument("--tolerance", type=float, default=0.1)
    args = parser.parse_args()
    first, second = _rows(args.first), _rows(args.second)
    worst = 0.0
    print("| workload | system | train ms (1st / 2nd) | round ms (1st / 2nd) | train × plain (1st / 2nd) | max diff |")
    print("|---|---|---|---|---|---|")
    for key in (k for k in first if k in second):
        a, b = first[key], second[key]
        diffs = [
            _diff(a["train_s"], b["train_s"]),
            _diff(a["median_s"], b["median_s"]),
            _diff(a.get("train_ratio_to_plain"), b.get("train_ratio_to_plain")),
        ]
        known = [d for d in diffs if d is not None]
        top = max(known) if known else 0.0
        worst = max(worst, top)
        ratio = " / ".join(
            "-" if r.get("train_ratio_to_plain") is None else f"{r['train_ratio_to_plain']:.2f}" for r in (a, b)
        )
        print(
            f"| {key[0]} | {key[1]} | {1e3 * a['train_s']:.1f} / {1e3 * b['train_s']:.1f} "
            f"| {1e3 * a['median_s']:.1f} / {1e3 * b['median_s']:.1f} | {ratio} "
            f"| {100 * top:.1f}%{' **over**' if top > args.tolerance else ''} |"
        )
    print(f"\nlargest difference {100 * worst:.1f}% (tolerance {100 * args.tolerance:.0f}%)")
    sys.exit(1 if worst > args.tolerance else 0)


if __name__ == "__main__":
    main()
