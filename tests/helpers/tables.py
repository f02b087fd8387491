"""Own tables as users bring them, written in the real format."""

from __future__ import annotations

import csv
from pathlib import Path

import numpy as np


def write_patients(path: Path, n: int = 240) -> Path:
    """A table with an id column, a site column, one empty cell, a binary outcome and a numeric one (blood pressure)."""
    rng = np.random.default_rng(0)
    site = rng.choice(["north", "south", "east", "west"], n)
    age, smoker = rng.normal(55, 12, n), rng.random(n) < 0.3
    pressure = 100 + 0.5 * age + 10 * smoker + rng.normal(0, 4, n)
    risk = 0.05 * (age - 55) + 1.0 * smoker + rng.normal(0, 0.6, n)
    with path.open("w", newline="") as f:
        writer = csv.writer(f)
        writer.writerow(["patient_id", "age", "smoker", "site", "outcome", "pressure"])
        for i in range(n):
            row = [f"P{1000 + i}", round(age[i], 1), int(smoker[i]), site[i], int(risk[i] > 0.5), round(pressure[i], 2)]
            if i == 7:
                row[1] = ""
            writer.writerow(row)
    return path
