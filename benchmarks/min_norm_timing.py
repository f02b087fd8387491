"""Median time per call of FedMGDA+'s min-norm QP (`fedhet.methods.fedmgda.min_norm.solve_min_norm`) on the sizes
FedMGDA+ uses (2 to 100 clients per round), with normalised updates of 2000 parameters: generic ones (a shared
component, cos ≈ 0.1) and nearly parallel ones (1 − cos from 1e-9 to 1e-4, the case of issue 13).

    python benchmarks/min_norm_timing.py                  # this checkout's solver
    python benchmarks/min_norm_timing.py --before 0e3f507 # and the solver at an older commit, side by side
    python benchmarks/min_norm_timing.py --scipy          # and SciPy's SLSQP (objective error vs ours)

For each size the objective of every solver is compared with the best one found ("err": largest excess over it,
relative to max G_ii); "raised" counts exceptions (the old solver's "did not converge"). Run on a quiet machine:
one BLAS thread (OPENBLAS_NUM_THREADS=1) gives steadier numbers for these small matrices.
"""

from __future__ import annotations

import argparse
import importlib.util
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np

from fedhet.methods.fedmgda.min_norm import box_bounds, solve_min_norm

Solver = Callable[[np.ndarray, np.ndarray, float], np.ndarray]


def solver_at(revision: str) -> Solver:
    """solve_min_norm as it was at a git revision (loaded from `git show`)."""
    for where in ("src/fedhet/methods/fedmgda/min_norm.py", "src/fedhet/strategies/min_norm.py"):  # moved in 0.3
        shown = subprocess.run(["git", "show", f"{revision}:{where}"], capture_output=True, text=True)
        if shown.returncode == 0:
            break
    shown.check_returncode()
    source = shown.stdout
    path = Path(tempfile.mkdtemp()) / "min_norm_before.py"
    path.write_text(source)
    spec = importlib.util.spec_from_file_location("min_norm_before", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules["min_norm_before"] = module
    spec.loader.exec_module(module)
    return lambda g, c, e: module.solve_min_norm(g, c, e).weights


def slsqp(gram: np.ndarray, center: np.ndarray, eps: float) -> np.ndarray:
    from scipy.optimize import minimize

    lower, upper = box_bounds(center, eps)
    n = len(gram)
    res = minimize(
        lambda x: x @ gram @ x,
        np.clip(np.full(n, 1.0 / n), lower, upper),
        jac=lambda x: 2 * gram @ x,
        bounds=list(zip(lower, upper, strict=True)),
        constraints=[{"type": "eq", "fun": lambda x: x.sum() - 1.0, "jac": lambda x: np.ones(n)}],
        method="SLSQP",
        options={"ftol": 1e-15, "maxiter": 1000},
    )
    return np.asarray(res.x)


def instances(n: int, kind: str, count: int, rng: np.random.Generator) -> list[np.ndarray]:
    out = []
    for _ in range(count):
        if kind == "generic":
            u = rng.normal(size=(n, 2000)) + 0.3 * rng.normal(size=2000)
        else:
            u = rng.normal(size=2000) + 10 ** rng.uniform(-4.5, -2) * rng.normal(size=(n, 2000))
        u /= np.linalg.norm(u, axis=1, keepdims=True)
        out.append(u @ u.T)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--before", help="git revision whose solver to time as well")
    parser.add_argument("--scipy", action="store_true", help="time SciPy's SLSQP as well")
    parser.add_argument("--sizes", default="2,5,10,20,50,100")
    parser.add_argument("--count", type=int, default=15, help="instances per size and kind")
    args = parser.parse_args()
    solvers: dict[str, Solver] = {"now": lambda g, c, e: solve_min_norm(g, c, e).weights}
    if args.before:
        solvers["before"] = solver_at(args.before)
    if args.scipy:
        solvers["slsqp"] = slsqp
    rng = np.random.default_rng(0)
    for kind in ("generic", "nearly parallel"):
        for n in (int(s) for s in args.sizes.split(",")):
            grams = instances(n, kind, args.count, rng)
            for eps in (1.0, 0.05):
                center = np.full(n, 1.0 / n)
                times: dict[str, list[float]] = {name: [] for name in solvers}
                values: dict[str, list[float]] = {name: [] for name in solvers}
                raised = dict.fromkeys(solvers, 0)
                for gram in grams:
                    for name, solve in solvers.items():
                        start = time.perf_counter()
                        try:
                            lam = solve(gram, center, eps)
                            values[name].append(float(lam @ gram @ lam))
                        except RuntimeError:
                            raised[name] += 1
                            values[name].append(np.inf)
                        times[name].append(time.perf_counter() - start)
                best = np.min([values[name] for name in solvers], axis=0)
                row = f"{kind:15s} n={n:3d} ε={eps:<4}"
                for name in solvers:
                    err = float(np.max(np.asarray(values[name]) - best))
                    median = 1e3 * float(np.median(times[name]))
                    row += f" | {name}: {median:8.3f} ms, err {err:.0e}, raised {raised[name]}"
                print(row, flush=True)


if __name__ == "__main__":
    main()
