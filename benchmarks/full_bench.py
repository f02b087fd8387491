"""The full benchmark (`make bench`): `fedhet bench` with the comparators that are not installed with fedhet, the
naive reference, pfl and Flower (each where installed), from a source checkout.

    python benchmarks/full_bench.py [--quick] [--json runs/bench.json] [--workload NAME ...] [--threads N]
                                    [--no-pfl] [--no-flower]

Prints the rows and the targets as `fedhet bench` does; `python -m fedhet.bench.report FILE.json` turns the JSON
into the Markdown tables of benchmarks/README.md.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from comparators import SYSTEMS, frameworks
from rich.console import Console

from fedhet.bench.report import rows_table, targets_table
from fedhet.bench.run import run_bench
from fedhet.bench.targets import check_targets


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="fewer repetitions and smaller sweeps")
    parser.add_argument("--json", type=Path, help="write every row to this JSON file")
    parser.add_argument("--workload", action="append", default=[], help="only these workloads (repeatable)")
    parser.add_argument("--threads", type=int, default=0, help="torch threads for everything timed (0: default)")
    parser.add_argument("--no-pfl", dest="pfl", action="store_false", help="leave pfl out")
    parser.add_argument("--no-flower", dest="flower", action="store_false", help="leave Flower out")
    args = parser.parse_args()
    console = Console()

    def say(line: str) -> None:
        console.print(line, markup=False, highlight=False)

    rows = run_bench(
        quick=args.quick,
        json_path=args.json,
        progress=say,
        only=tuple(args.workload),
        threads=args.threads,
        systems=SYSTEMS,
        frameworks=frameworks(args.pfl, args.flower, say),
    )
    console.print(rows_table(rows))
    console.print(targets_table(check_targets(rows)))


if __name__ == "__main__":
    main()
