"""Small configs and comparisons shared by the Flower tests."""

from __future__ import annotations

import csv
from pathlib import Path
from typing import Any

from fedhet.experiments.config import RunConfig, parse_config


def small_config(algorithm: Any = "fedavg", **extra: Any) -> RunConfig:
    raw: dict[str, Any] = {
        "algorithm": algorithm,
        "dataset": "digits",
        "partition": {"name": "dirichlet", "alpha": 0.5, "min_size": 20},
        "model": "logistic",
        "num_clients": 6,
        "clients_per_round": 4,
        "rounds": 3,
        "local": {"steps": 4, "lr": 0.05, "batch_size": 8},
        "seed": 1,
    }
    raw.update(extra)
    return parse_config(raw)


def read_metrics(folder: Path) -> list[dict[str, str]]:
    with (folder / "metrics.csv").open() as f:
        return list(csv.DictReader(f))


def assert_same_metrics(a: list[dict[str, str]], b: list[dict[str, str]], tol: float = 1e-5) -> None:
    """Same rounds and columns; every number within `tol` (relative, absolute below 1)."""
    assert len(a) == len(b)
    for row_a, row_b in zip(a, b, strict=True):
        assert row_a.keys() == row_b.keys()
        for key in row_a:
            if row_a[key] == row_b[key]:  # also the empty cells of columns a round does not have
                continue
            x, y = float(row_a[key]), float(row_b[key])
            assert abs(x - y) <= tol * max(1.0, abs(x)), (key, x, y)
