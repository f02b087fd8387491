# %% [markdown]
# # fedhet walkthrough
#
# A notebook as a Python file: run it with `python examples/walkthrough.py`, or cell by cell in VS Code,
# PyCharm or Jupyter (jupytext) — every cell starts with `# %%`.

# %%
import numpy as np

import fedhet

print("fedhet", fedhet.__version__)

# %% [markdown]
# ## 1. Data: your arrays, with one owner per sample
# Three "sites" whose features are shifted differently: a natural, non-IID federation.

# %%
rng = np.random.default_rng(0)
n = 900
site = rng.integers(0, 9, n)
x = rng.normal(size=(n, 10)) + 0.5 * site[:, None] / 9
y = (x[:, :3].sum(axis=1) > 0.75).astype(int) + (x[:, 3] > 0.8).astype(int)
data = fedhet.datasets.from_arrays(x, y, users=site, name="sites")
print(data.x.shape, "classes:", data.num_classes, "users:", int(data.users.max()) + 1)

# %% [markdown]
# ## 2. A config, validated up front
# The same keys as a YAML file for `fedhet run`; mistakes are one-line errors.

# %%
config = fedhet.Config(
    dataset=data,
    partition="natural",
    num_clients=9,
    clients_per_round=5,
    model={"name": "mlp", "hidden": [32]},
    rounds=15,
    local={"steps": 10, "lr": 0.1, "batch_size": 16},
)
try:
    fedhet.Config(rounds=0)
except fedhet.errors.ConfigError as err:
    print("error:", err)

# %% [markdown]
# ## 3. Run, with a callback that watches every round

# %%


class Watch(fedhet.Callback):
    def on_round_end(self, state, metrics):
        if metrics is not None and state.round % 5 == 0:
            print(f"round {state.round:2d}: test accuracy {metrics['test_accuracy']:.3f}")
        return False  # True would stop the run here


result = fedhet.run(config, out="runs/walkthrough", overwrite=True, callbacks=[Watch()])
print(result.status, f"in {result.wall_time_s:.1f} s")

# %% [markdown]
# ## 4. Results: per round, per client, and the model

# %%
print("accuracy per round:", [round(a, 3) for a in result.metric("test_accuracy")])
worst = min(result.clients, key=lambda row: row["test_accuracy"])
print(f"worst client: {int(worst['client'])} with accuracy {worst['test_accuracy']:.3f}")
print("model:", {k: tuple(v.shape) for k, v in result.state_dict.items()})

# %% [markdown]
# ## 5. Later: read the run folder back

# %%
again = fedhet.load_run("runs/walkthrough")
assert again.final == result.final
print("files:", sorted(p.name for p in again.out.iterdir()))
