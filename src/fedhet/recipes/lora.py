"""Heterogeneous LoRA ranks (``fedhet reproduce lora``): FlexLoRA (Bai et al. 2024) and HetLoRA (Cho et al. 2024) on
a small transformer trained here from scratch (no downloaded weights).

Two stages per seed:

1. **pretraining**: the whole transformer (``transformer``, no adapters) trained with FedAvg on a generic corpus;
   its final weights are saved as ``OUT/base-seed<k>.pt``;
2. **fine-tuning**: LoRA adapters (rank r_max = 16 on q, v, fc1, fc2 and the read-out; the base frozen) trained on
   the clients' own data, with FlexLoRA and HetLoRA at mixed ranks {2, 4, 8, 16} (a quarter of the clients each,
   ``fix``), against FlexLoRA with every client at rank 2 and at rank 16, and FedAvg of the factors at rank 16.

Data: Shakespeare (``shakespeare_text``, one client per speaking role; the generic corpus is the same roles' text,
for want of another) when its file is in ``data/shakespeare_text/``, else the generated ``markov_text`` languages
(the generic corpus: their generic chain; each client: the shared task chain mixed with its own). The tables give,
for the mixed-rank runs, each rank's share of the clients, its clients' next-token accuracy (each at its own rank,
clients.csv ``capacity_test_accuracy``) and the global model's at that rank over all clients; and each method's
mean accuracy of the clients at their own rank.
"""

from __future__ import annotations

import io
import math
from pathlib import Path
from typing import Any

import numpy as np
from torch import Tensor

from fedhet.atomic import write_bytes
from fedhet.experiments.executor import Executor, Outcome, Task, raise_failures
from fedhet.experiments.naming import safe_name
from fedhet.experiments.reproduce import Recipe, dataset_available, deep_merge, mean_std, register_recipe
from fedhet.experiments.state import RunState
from fedhet.report.tables import markdown_table

R_MAX = 16
LEVELS = [1.0, 0.5, 0.25, 0.125]  # ranks 16, 8, 4, 2 of r_max = 16
MODEL: dict[str, Any] = {"name": "transformer", "d_model": 32, "layers": 1, "heads": 2}
LORA: dict[str, Any] = {"rank": R_MAX, "alpha": 16.0, "targets": ["q", "v", "fc1", "fc2", "out"]}
MARKOV: dict[str, Any] = {
    "name": "markov_text",
    "vocab": 16,
    "seq_len": 8,
    "samples_per_user": 200,
    "num_users": 20,
    "shift": 0.7,
    "personal": 0.3,
}
SHAKESPEARE: dict[str, Any] = {
    "name": "shakespeare_text",
    "seq_len": 20,
    "max_samples_per_role": 400,
    "min_chars": 2000,
}
LOCAL: dict[str, Any] = {"steps": 10, "lr": 0.5, "batch_size": 32}
PRETRAIN: dict[str, Any] = {
    "model": MODEL,
    "partition": "natural",
    "num_clients": 20,
    "clients_per_round": 20,
    "rounds": 6,
    "local": LOCAL,
    "algorithm": "fedavg",
}
FINETUNE: dict[str, Any] = {**PRETRAIN, "clients_per_round": 10, "rounds": 10}
QUICK_PRETRAIN: dict[str, Any] = {"rounds": 3}
QUICK_FINETUNE: dict[str, Any] = {"rounds": 4}
METHODS: dict[str, dict[str, Any]] = {  # each method's changes to the fine-tuning config
    "FlexLoRA, ranks {2, 4, 8, 16}": {"algorithm": {"name": "flexlora", "levels": LEVELS}},
    "HetLoRA, ranks {2, 4, 8, 16}": {"algorithm": {"name": "hetlora", "levels": LEVELS}},
    "FlexLoRA, all at rank 2": {"algorithm": {"name": "flexlora", "levels": [0.125]}},
    "FlexLoRA, all at rank 16": {"algorithm": {"name": "flexlora", "levels": [1.0]}},
    "FedAvg of the factors, rank 16": {"algorithm": {"name": "fedavg"}},
    # the pretrained base as it is: one round whose steps cannot move the adapters (B stays 0 to 1e-30)
    "pretrained base, no fine-tuning": {"algorithm": {"name": "fedavg"}, "rounds": 1, "local": {"lr": 1e-30}},
}
MIXED = [m for m in METHODS if "{" in m]  # the mixed-rank methods


def rank_of(level: float) -> int:
    return max(1, math.ceil(level * R_MAX - 1e-9))


def final_model(state: RunState) -> dict[str, Tensor]:
    """The run's final global model as a state dict (the base the fine-tuning starts from)."""
    from fedhet.engine.functional import state_dict_of

    return state_dict_of(state.experiment.engine.model, state.params)


def client_accuracy(state: RunState) -> dict[str, list[float]]:
    """Each seen client's level (1 where the method has none) and test accuracy at it."""
    columns = state.client_columns
    seen = state.experiment.data.seen
    accuracy = columns.get("capacity_test_accuracy", columns.get("test_accuracy"))
    level = columns.get("capacity")
    if accuracy is None:
        return {"level": [], "accuracy": []}
    return {
        "level": [1.0] * int(seen.sum()) if level is None else level[seen].tolist(),
        "accuracy": accuracy[seen].tolist(),
    }


def settings(quick: bool, embedded: bool) -> tuple[dict[str, Any], dict[str, Any]]:
    """(pretraining, fine-tuning) configs without seed and base."""
    pretrain, finetune = PRETRAIN, FINETUNE
    if quick:
        pretrain, finetune = deep_merge(pretrain, QUICK_PRETRAIN), deep_merge(finetune, QUICK_FINETUNE)
    if embedded:
        return {**pretrain, "dataset": {**MARKOV, "generic": True}}, {**finetune, "dataset": MARKOV}
    return {**pretrain, "dataset": SHAKESPEARE}, {**finetune, "dataset": SHAKESPEARE}


def lora_study(out: Path, quick: bool, seeds: tuple[int, ...], embedded: bool | None, executor: Executor) -> str:
    """Pretrain, fine-tune every method on every seed, and write the tables (module doc)."""
    if embedded is None:
        embedded = not dataset_available({"dataset": SHAKESPEARE})
    pretrain, finetune = settings(quick, embedded)
    out = out.resolve()
    pre = [Task({**pretrain, "seed": s}, out / "pretrain" / f"seed{s}", f"pretrain, seed {s}") for s in seeds]
    done = executor.run(pre, post=final_model, stage="pretraining")
    raise_failures(done)
    import torch

    for seed, outcome in zip(seeds, done, strict=True):
        buffer = io.BytesIO()
        torch.save(outcome.result, buffer)
        write_bytes(out / f"base-seed{seed}.pt", buffer.getbuffer())
    tasks = [
        Task(
            _finetune_config(finetune, changes, out / f"base-seed{seed}.pt", seed),
            out / safe_name(method) / f"seed{seed}",
            f"{method}, seed {seed}",
            {"method": method, "seed": seed},
        )
        for method, changes in METHODS.items()
        for seed in seeds
    ]
    outcomes = executor.run(tasks, post=client_accuracy, stage="fine-tuning")
    data = "the generated markov_text languages" if embedded else "Shakespeare (shakespeare_text)"
    table = f"### Heterogeneous LoRA ranks on a small transformer, {data}\n\nseeds: {', '.join(map(str, seeds))}"
    table += " (quick)" if quick else ""
    table += "\n\n" + rank_table(outcomes) + "\n\n" + method_table(outcomes) + "\n"
    raise_failures(outcomes)
    return table


def _finetune_config(finetune: dict[str, Any], changes: dict[str, Any], base: Path, seed: int) -> dict[str, Any]:
    """A method's fine-tuning run: LoRA on the pretrained `base`, evaluated at its last round."""
    config = deep_merge({**finetune, "model": {**MODEL, "lora": LORA, "base": str(base)}}, changes)
    return {**config, "eval_every": config["rounds"], "seed": seed}


def rank_table(outcomes: list[Outcome]) -> str:
    """Per rank: its share of the clients, and for each mixed-rank method its clients' accuracy (each at its rank)
    and the global model's at that rank on all clients (mean ± std over seeds)."""
    rows = []
    for level in sorted(LEVELS):
        share: list[float] = []
        cells = []
        for method in MIXED:
            own, everyone = [], []
            for o in (o for o in outcomes if o.task.meta["method"] == method and o.ok):
                levels, accuracy = np.array(o.result["level"]), np.array(o.result["accuracy"])
                mine = np.isclose(levels, level)
                share.append(float(mine.mean()))
                own.append(float(np.nanmean(accuracy[mine])) if mine.any() else math.nan)
                everyone.append(o.final.get(f"test_accuracy_level{level:g}", math.nan))
            cells += [mean_std(own), mean_std(everyone)]
        rows.append([str(rank_of(level)), mean_std(share), *cells])
    header = ["rank", "share of clients"]
    for method in MIXED:
        name = method.split(",")[0]
        header += [f"{name}: its clients (at their rank)", f"{name}: global model at this rank, all clients"]
    return markdown_table(header, rows)


def method_table(outcomes: list[Outcome]) -> str:
    """Per method: the mean next-token test accuracy of the clients, each at its own rank."""
    values: dict[str, list[float]] = {}
    for o in outcomes:
        accuracy = np.array(o.result["accuracy"]) if o.ok else np.array([math.nan])
        values.setdefault(o.task.meta["method"], []).append(float(np.nanmean(accuracy)))
    rows = [[method, mean_std(v)] for method, v in values.items()]
    return markdown_table(["method", "clients' accuracy (each at its rank)"], rows)


@register_recipe
def lora() -> Recipe:
    return Recipe(
        name="lora",
        description="FlexLoRA, HetLoRA: heterogeneous LoRA ranks on a small transformer pretrained here",
        base={},
        methods={},
        columns={},
        custom=lora_study,
    )
