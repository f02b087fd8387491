# %% [markdown]
# # Tutorial: a researcher's loop on your own table
#
# A notebook as a Python file (jupytext "percent" format): run it with `python examples/tutorial.py`, or cell by
# cell in VS Code, PyCharm or Jupyter. It takes a CSV of patients from four hospitals, trains a federated model
# with a validation split, model selection and early stopping, tries a learning-rate schedule, switches the task
# to regression, and compares two settings over seeds (mean ± std), from Python and from the command line.

# %%
import csv
import subprocess
import sys
import warnings
from pathlib import Path

import numpy as np

import fedhet
from fedhet.errors import FedhetNote

warnings.simplefilter("ignore", FedhetNote)  # fedhet's notes say what it did to the table; printed below instead

# %% [markdown]
# ## 1. A CSV as it comes: an id column, a site column, an empty cell
# `outcome` is 0/1, `pressure` is numeric; row 7 misses its age.

# %%
rng = np.random.default_rng(0)
n = 480
site = rng.choice(["north", "south", "east", "west"], n)
age, smoker = rng.normal(55, 12, n), rng.random(n) < 0.3
pressure = 100 + 0.5 * age + 10 * smoker + rng.normal(0, 4, n)
risk = 0.05 * (age - 55) + smoker + 0.3 * (site == "east") + rng.normal(0, 0.6, n)
with Path("patients.csv").open("w", newline="") as f:
    writer = csv.writer(f)
    writer.writerow(["patient_id", "age", "smoker", "site", "outcome", "pressure"])
    for i in range(n):
        age_cell = "" if i == 7 else round(age[i], 1)
        writer.writerow([f"P{1000 + i}", age_cell, int(smoker[i]), site[i], int(risk[i] > 0.5), round(pressure[i], 1)])

# %% [markdown]
# ## 2. One run: validation, the best round, early stopping, a schedule
# `dataset.user: site` makes one client per hospital; `missing: drop` drops the row with the empty cell; the id
# column is left out and the numeric columns standardised (each said in a note). `val_fraction` keeps 20% of
# each client's training samples for validation; the run's result is the round with the best validation loss
# (`best.pt`), and it stops once 10 rounds pass without improving it by 0.001. The local learning rate follows a
# cosine schedule.

# %%
table = {"name": "table", "path": "patients.csv", "label": "outcome", "user": "site", "missing": "drop"}
config = {
    "dataset": table,
    "task": "binary",
    "rounds": 60,
    "val_fraction": 0.2,
    "selection": {"metric": "val_loss", "patience": 10, "min_delta": 0.001},
    "schedules": {"local_lr": {"name": "cosine", "min_factor": 0.1}},
}
with warnings.catch_warnings(record=True) as notes:
    warnings.simplefilter("always", FedhetNote)
    result = fedhet.run(config, out="runs/binary")
for note in notes:
    print("note:", note.message)
selected = result.selected
print(f"ran {len(result.history)} rounds; best validation loss at round {int(selected['round'])}")
print(f"test at that round: AUC {selected['test_auc']:.3f}, F1 {selected['test_f1']:.3f}")
print("clients:", [row["user"] for row in result.clients])

# %% [markdown]
# The run folder holds `metrics.csv` (one row per round, `val_*` and `test_*` columns), `clients.csv` (one row per
# hospital, named), `model.pt` (the last round) and `best.pt` (the selected one); `fedhet.load_run` reads it back.

# %%
again = fedhet.load_run("runs/binary")
print("best model's tensors:", sorted(again.best_state_dict or {}))

# %% [markdown]
# ## 3. Another task: regression of a numeric column
# The same table, `pressure` as target: the squared error is trained; MAE, RMSE and R² are reported.

# %%
regression = fedhet.run(
    {"dataset": {**table, "label": "pressure"}, "task": "regression", "rounds": 30, "local": {"lr": 0.003}}
)
final = regression.final
print(f"regression: test RMSE {final['test_rmse']:.2f}, R² {final['test_r2']:.3f}")

# %% [markdown]
# ## 4. Two settings over three seeds, compared as mean ± std
# `fedhet sweep` runs every point of the grid for each seed and chooses the best point on validation;
# `fedhet compare` reads the sweep folder as one group per point (in a notebook: `!fedhet sweep ...`).

# %%
fedhet_cli = [sys.executable, "-m", "fedhet"]
settings = ["dataset.name=table", "dataset.path=patients.csv", "dataset.label=outcome", "dataset.user=site"]
settings += ["dataset.missing=drop", "task=binary", "val_fraction=0.2", "rounds=20"]
sweep = [*fedhet_cli, "sweep", *(a for s in settings for a in ("--set", s)), "--grid", "local.lr=0.01,0.1"]
subprocess.run([*sweep, "--seeds", "3", "--workers", "1", "--out", "runs/sweep", "--quiet"], check=True)  # its summary
compare = [*fedhet_cli, "compare", "runs/sweep", "--column", "test_auc", "--plot", "runs/sweep.png"]
print(subprocess.run(compare, check=True, capture_output=True, text=True).stdout)
