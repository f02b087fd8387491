"""Do two versions of fedhet give the same metrics? Run every registered strategy (and the options that change what
a round does) for a few rounds on the embedded digits data, on several backends, then compare two such folders.

    python scripts/same_metrics.py run OUT [--backends dense vectorised] [--jobs 2] [--python PY]
    python scripts/same_metrics.py compare BEFORE AFTER [--rtol 1e-5] [--atol 1e-7]

`run` writes OUT/<case>/<backend>/{metrics.csv,clients.csv} (runs through ``python -m fedhet run``, so the version
compared is whichever fedhet `--python` imports: point PYTHONPATH at another checkout's src/ to run that one).
`compare` reads both folders' CSV files and prints, per case, the largest relative difference over every numeric
cell (wall-clock columns left out); it exits 1 when a case is missing, a column differs or a difference exceeds
`rtol`·|before| + `atol`. Used to check that a refactoring keeps every run's numbers (issue 32).
"""

from __future__ import annotations

import argparse
import csv
import math
import shutil
import subprocess
import sys
import tempfile
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

# every run: 3 rounds, 6 clients (4 a round), 3 local steps; digits is embedded (no download)
BASE = [
    "--dataset",
    "digits",
    "--rounds",
    "3",
    "--seed",
    "1",
    "--set",
    "num_clients=6",
    "--set",
    "clients_per_round=4",
    "--set",
    "local.steps=3",
]
MARKOV = ["--set", "availability={name: markov, pi: 0.6, lam: 0.2}"]
CLASSES = ["--set", "availability=cafed_classes"]

# case name -> extra arguments; one case per registered strategy, then the options that matter
CASES: dict[str, list[str]] = {
    "adafed": ["--algorithm", "adafed", *MARKOV],
    "afl": ["--algorithm", "afl"],
    "cafed": ["--algorithm", "cafed", *MARKOV],
    "f3ast": ["--algorithm", "f3ast", *MARKOV],
    "fedadagrad": ["--algorithm", "fedadagrad"],
    "fedadam": ["--algorithm", "fedadam"],
    "fedavg": ["--algorithm", "fedavg"],
    "fedavg_n": ["--algorithm", "fedavg_n"],
    "fedavgm": ["--algorithm", "fedavgm"],
    "fedmgda": ["--algorithm", "fedmgda"],
    "fedmgda_plus": ["--algorithm", "fedmgda_plus"],
    "fednova": ["--algorithm", "fednova", "--set", "local.epochs=1"],
    "fedprox": ["--algorithm", "fedprox"],
    "fedyogi": ["--algorithm", "fedyogi"],
    "gsnr": ["--algorithm", "gsnr"],
    "krum": ["--algorithm", "krum"],
    "maxfl": ["--algorithm", "maxfl", "--set", "requirements.steps=5"],
    "median": ["--algorithm", "median"],
    "moon": ["--algorithm", "moon"],
    "mwfed": ["--algorithm", "mwfed", "--set", "requirements.steps=5"],
    "perfedavg": ["--algorithm", "perfedavg"],
    "pfedme": ["--algorithm", "pfedme"],
    "qffl": ["--algorithm", "qffl"],
    "scaffold": ["--algorithm", "scaffold"],
    "trimmed_mean": ["--algorithm", "trimmed_mean"],
    "unbiased": ["--algorithm", "unbiased", *MARKOV],
    # options that change a round
    "fedavg_uniform": ["--algorithm", "fedavg", "--set", "algorithm.weighting=uniform"],
    "fedavg_adam_local": ["--algorithm", "fedavg", "--set", "local.optimizer={name: adam, persistent: true}"],
    "fedavg_momentum_wd": [
        "--algorithm",
        "fedavg",
        "--set",
        "local.optimizer={name: sgd, momentum: 0.9}",
        "--set",
        "local.weight_decay=0.01",
    ],
    "fedavg_epochs": ["--algorithm", "fedavg", "--set", "local.epochs=0.5"],
    "fedavg_prox_term": ["--algorithm", "fedavg", "--set", "local.terms=[{name: proximal, mu: 0.1}]"],
    "fedavg_bernoulli": ["--algorithm", "fedavg", "--set", "availability={name: bernoulli, p: 0.7}"],
    "fedavg_eval_sample": ["--algorithm", "fedavg", "--set", "eval_clients=3", "--set", "unseen_clients=2"],
    "fedavg_label_noise": ["--algorithm", "fedavg", "--set", "label_noise={fraction: 0.5}"],
    "fedavg_attack": ["--algorithm", "fedavg", "--set", "attack={name: malicious, fraction: 0.3, update: sign_flip}"],
    "fedavg_metrics": [
        "--algorithm",
        "fedavg",
        "--set",
        "metrics=[improved_users, accuracy_percentiles, {name: target_accuracy, target: 0.3}]",
    ],
    "fedavg_logistic": ["--algorithm", "fedavg", "--model", "logistic"],
    "fedavg_cnn": [
        "--algorithm",
        "fedprox",
        "--model",
        "cnn_femnist",
        "--set",
        "dataset={name: digits, image: true}",
    ],
    "qffl_lipschitz": ["--algorithm", "qffl", "--set", "algorithm.lipschitz=1.0", "--set", "algorithm.q=2"],
    "perfedavg_hf": ["--algorithm", "perfedavg", "--set", "algorithm.hessian_free=true"],
    "gsnr_fedprox": ["--algorithm", "gsnr", "--set", "algorithm.base={name: fedprox, mu: 0.1}"],
    "gsnr_contribution": ["--algorithm", "fedavg", "--set", "metrics=[contribution]"],
    "maxfl_appeal": [
        "--algorithm",
        "maxfl",
        "--set",
        "requirements.steps=5",
        "--set",
        "availability={name: appeal, mandatory_rounds: 1}",
        "--set",
        "metrics=[{name: appeal, finetune_steps: 2}]",
    ],
    "cafed_classes": ["--algorithm", "cafed", *CLASSES, "--set", "metrics=[alpha_accuracy]"],
    "fedmgda_eps": ["--algorithm", "fedmgda_plus", "--set", "algorithm.epsilon=0.1"],
    "fedavg_dirichlet_iid": ["--algorithm", "fedavg", "--partition", "iid"],
}
BACKENDS = ("dense", "vectorised", "sequential")
# a case whose model a backend cannot run takes another (dense runs Linear networks only; conv runs the CNN); dense
# cannot run the local rules that need autograd: those cases run on the other backends only
INSTEAD = {("fedavg_cnn", "dense"): "conv"}
SKIP = {(case, "dense") for case in ("moon", "perfedavg", "perfedavg_hf", "pfedme")}
FILES = ("metrics.csv", "clients.csv")


def run_one(python: str, out: Path, case: str, backend: str) -> str:
    backend = INSTEAD.get((case, backend), backend)
    folder = out / case / backend
    with tempfile.TemporaryDirectory() as tmp:
        run_dir = Path(tmp) / "run"
        args = [python, "-m", "fedhet", "run", *BASE, *CASES[case], "--backend", backend, "--out", str(run_dir)]
        done = subprocess.run([*args, "--quiet"], capture_output=True, text=True, cwd=tmp)
        folder.mkdir(parents=True, exist_ok=True)
        if done.returncode != 0:
            (folder / "error.txt").write_text(done.stderr)
            return f"{case}/{backend}: failed: {done.stderr.strip().splitlines()[-1] if done.stderr else '?'}"
        for name in FILES:
            if (run_dir / name).is_file():
                shutil.copy(run_dir / name, folder / name)
    return f"{case}/{backend}: ok"


def run_all(out: Path, backends: list[str], jobs: int, python: str, only: list[str]) -> int:
    jobs_list = [(c, b) for c in CASES for b in backends if (c, b) not in SKIP and (not only or c in only)]
    with ThreadPoolExecutor(jobs) as pool:
        lines = list(pool.map(lambda cb: run_one(python, out, *cb), jobs_list))
    for line in lines:
        print(line)
    failed = [line for line in lines if not line.endswith("ok")]
    print(f"{len(lines) - len(failed)} of {len(lines)} runs written to {out}")
    return 1 if failed else 0


def read_csv(path: Path) -> tuple[list[str], list[dict[str, str]]]:
    with path.open(newline="") as f:
        reader = csv.DictReader(f)
        return list(reader.fieldnames or []), list(reader)


def differences(before: Path, after: Path, rtol: float, atol: float) -> tuple[float, list[str]]:
    """The largest relative difference between two CSV files, and what does not match."""
    cols_a, rows_a = read_csv(before)
    cols_b, rows_b = read_csv(after)
    problems = []
    if cols_a != cols_b:
        problems.append(f"columns differ: {cols_a} vs {cols_b}")
    if len(rows_a) != len(rows_b):
        problems.append(f"{len(rows_a)} rows vs {len(rows_b)}")
    worst = 0.0
    for i, (a, b) in enumerate(zip(rows_a, rows_b, strict=False)):
        for col in cols_a:
            if "time" in col or col.endswith("_s") or col not in b:  # wall-clock columns differ anyway
                continue
            x, y = a[col], b[col]
            if x == y:
                continue
            try:
                fx, fy = float(x), float(y)
            except ValueError:
                problems.append(f"row {i} {col}: {x!r} vs {y!r}")
                continue
            if math.isnan(fx) and math.isnan(fy):
                continue
            rel = abs(fx - fy) / max(abs(fx), 1e-12)
            worst = max(worst, rel if math.isfinite(rel) else math.inf)
            if not abs(fx - fy) <= rtol * abs(fx) + atol:
                problems.append(f"row {i} {col}: {x} vs {y}")
    return worst, problems


def compare(before: Path, after: Path, rtol: float, atol: float) -> int:
    cases = sorted({p.parent.relative_to(before) for p in before.glob("*/*/metrics.csv")})
    if not cases:
        print(f"no runs under {before}")
        return 1
    bad = 0
    overall = 0.0
    for case in cases:
        worst = 0.0
        problems: list[str] = []
        for name in FILES:
            a, b = before / case / name, after / case / name
            if not a.is_file():
                continue
            if not b.is_file():
                problems.append(f"{name} missing in {after}")
                continue
            w, p = differences(a, b, rtol, atol)
            worst = max(worst, w)
            problems += [f"{name}: {text}" for text in p]
        overall = max(overall, worst)
        status = "same" if not problems else "DIFFERENT"
        print(f"{case!s:32} {status:9} largest relative difference {worst:.3g}")
        for text in problems[:5]:
            print(f"    {text}")
        bad += bool(problems)
    extra = sorted({p.parent.relative_to(after) for p in after.glob("*/*/metrics.csv")} - set(cases))
    if extra:
        print(f"only in {after}: {', '.join(map(str, extra))}")
    print(
        f"{len(cases) - bad} of {len(cases)} runs the same (rtol {rtol:g}, atol {atol:g}); largest relative "
        f"difference {overall:.3g}"
    )
    return 1 if bad else 0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="command", required=True)
    run_p = sub.add_parser("run", help="run every case into a folder")
    run_p.add_argument("out", type=Path)
    run_p.add_argument("--backends", nargs="+", default=list(BACKENDS), choices=BACKENDS)
    run_p.add_argument("--jobs", type=int, default=2)
    run_p.add_argument("--python", default=sys.executable, help="the Python whose fedhet runs")
    run_p.add_argument("--only", nargs="*", default=[], help="only these cases")
    cmp_p = sub.add_parser("compare", help="compare two folders written by run")
    cmp_p.add_argument("before", type=Path)
    cmp_p.add_argument("after", type=Path)
    cmp_p.add_argument("--rtol", type=float, default=1e-5)
    cmp_p.add_argument("--atol", type=float, default=1e-7)
    args = parser.parse_args()
    if args.command == "run":
        unknown = [c for c in args.only if c not in CASES]
        if unknown:
            parser.error(f"unknown cases: {', '.join(unknown)}")
        return run_all(args.out, args.backends, args.jobs, args.python, args.only)
    return compare(args.before, args.after, args.rtol, args.atol)


if __name__ == "__main__":
    sys.exit(main())
