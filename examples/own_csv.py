"""Your own CSV file: a table of patients from 6 hospitals, one client per hospital.

Run: python examples/own_csv.py   (writes patients.csv and runs/own_csv in the current folder)

The same run from the command line:

    fedhet run --dataset table --set dataset.path=patients.csv --set dataset.label=outcome \
        --set dataset.user=hospital --set 'dataset.categorical=[smoker]' --partition natural \
        --set num_clients=6 --set clients_per_round=6 --rounds 20 --out runs/own_csv_cli
"""

from __future__ import annotations

import csv

import numpy as np

import fedhet


def write_patients(path: str, n: int = 600) -> None:
    """A synthetic table: age, blood pressure, smoker (yes/no), hospital, outcome (healthy/ill)."""
    rng = np.random.default_rng(0)
    hospital = rng.integers(0, 6, n)
    age = rng.normal(50 + 3 * hospital, 10)  # hospitals differ in their patients
    pressure = rng.normal(120, 15, n)
    smoker = rng.random(n) < 0.3
    risk = 0.04 * (age - 50) + 0.03 * (pressure - 120) + 1.0 * smoker + rng.normal(0, 0.5, n)
    with open(path, "w", newline="") as f:
        writer = csv.writer(f)
        writer.writerow(["age", "pressure", "smoker", "hospital", "outcome"])
        for i in range(n):
            outcome = "ill" if risk[i] > 0.3 else "healthy"
            writer.writerow(
                [round(age[i], 1), round(pressure[i]), "yes" if smoker[i] else "no", f"H{hospital[i]}", outcome]
            )


def main() -> None:
    write_patients("patients.csv")
    config = {
        "dataset": {
            "name": "table",
            "path": "patients.csv",  # relative paths start at the current folder
            "label": "outcome",
            "categorical": ["smoker"],  # one-hot encoded; numeric columns are standardised
            "user": "hospital",  # partition 'natural': one client per hospital
        },
        "partition": "natural",
        "num_clients": 6,
        "clients_per_round": 6,
        "model": {"name": "mlp", "hidden": [16]},
        "rounds": 20,
        "local": {"steps": 5, "lr": 0.1, "batch_size": 16},
    }
    result = fedhet.run(config, out="runs/own_csv", overwrite=True)
    print(f"{result.status} after {result.rounds} rounds: test accuracy {result.final['test_accuracy']:.3f}")
    for row in result.clients:
        print(f"  hospital client {int(row['client'])}: accuracy {row['test_accuracy']:.3f}")


if __name__ == "__main__":
    main()
