"""The round loop: select, configure, train, aggregate, evaluate, checkpoint; with callbacks and resume."""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from torch import Tensor

from fedhet.engine.plan import LocalResult
from fedhet.errors import ConfigError, DivergenceError
from fedhet.experiments.build import Experiment, build, resolved_config
from fedhet.experiments.callbacks import Callback, CSVWriter, write_csv
from fedhet.experiments.config import RunConfig, dump_yaml, load_yaml, parse_config
from fedhet.experiments.evaluation import evaluate_global
from fedhet.experiments.participation import ParticipationWriter
from fedhet.metrics.base import RoundView

CONFIG, METRICS, CLIENTS, SUMMARY, CHECKPOINT = (
    "config.yaml",
    "metrics.csv",
    "clients.csv",
    "summary.json",
    "checkpoint.pt",
)


@dataclass
class RunState:
    """The state of a run between rounds; `round` counts completed rounds."""

    experiment: Experiment
    params: Tensor
    round: int = 0
    history: list[dict[str, float]] = field(default_factory=list)
    wall_time_s: float = 0.0
    status: str = "running"
    out: Path | None = None
    client_columns: dict[str, Tensor] = field(default_factory=dict)

    @property
    def config(self) -> RunConfig:
        return self.experiment.config

    @property
    def final(self) -> dict[str, float]:
        return self.history[-1] if self.history else {}


def run(
    config: RunConfig,
    out: Path | None = None,
    callbacks: list[Callback] | None = None,
    builder: Callable[[RunConfig], Experiment] = build,
) -> RunState:
    """Run `config` from the start; with `out`, write the run folder (see README: "Run folders").

    `builder` makes the run's objects (default `build`; the Flower adapter passes one whose engine is remote).
    """
    experiment = builder(config)
    state = RunState(experiment, experiment.engine.initial_params(), out=out)
    if out is not None:
        out.mkdir(parents=True, exist_ok=True)
        (out / CONFIG).write_text(dump_yaml(experiment.resolved_config()))
    return _loop(state, callbacks or [])


def resume(
    out: Path, callbacks: list[Callback] | None = None, builder: Callable[[RunConfig], Experiment] = build
) -> RunState:
    """Continue the run in folder `out` from its last checkpoint; ends with the same numbers as an
    uninterrupted run."""
    if not (out / CONFIG).is_file():
        raise ConfigError(f"'{out}' is not a run folder (no {CONFIG}); start it with fedhet run --out {out}")
    config = parse_config(load_yaml(out / CONFIG))
    experiment = builder(config)
    state = RunState(experiment, experiment.engine.initial_params(), out=out)
    checkpoint = out / CHECKPOINT
    if checkpoint.is_file():
        saved: dict[str, Any] = torch.load(checkpoint, weights_only=False)
        state.params, state.round = saved["params"], saved["round"]
        state.history, state.wall_time_s = saved["history"], saved["wall_time_s"]
        experiment.strategy.load_state_dict(saved["strategy"])
        experiment.availability.load_state_dict(saved["availability"])
        experiment.engine.load_state_dict(saved.get("engine", {}))
        for plugin, plugin_state in zip(experiment.metrics, saved["metrics"], strict=True):
            plugin.load_state_dict(plugin_state)
    return _loop(state, callbacks or [])


def run_or_resume(
    config: RunConfig,
    out: Path,
    callbacks: list[Callback] | None = None,
    builder: Callable[[RunConfig], Experiment] = build,
) -> RunState:
    """`run` into `out`, unless `out` already holds a checkpointed run of this very config: then `resume` it (a
    finished run is loaded, not recomputed). So a recipe that was interrupted picks up where it stopped."""
    config_file, checkpoint = out / CONFIG, out / CHECKPOINT
    same = checkpoint.is_file() and config_file.is_file()
    if same and config_file.read_text() == dump_yaml(resolved_config(config)):
        return resume(out, callbacks, builder)
    return run(config, out, callbacks, builder)


def _save_checkpoint(state: RunState) -> None:
    assert state.out is not None
    exp = state.experiment
    payload = {
        "round": state.round,
        "params": state.params,
        "history": state.history,
        "wall_time_s": state.wall_time_s,
        "strategy": exp.strategy.state_dict(),
        "availability": exp.availability.state_dict(),
        "engine": exp.engine.state_dict(),
        "metrics": [plugin.state_dict() for plugin in exp.metrics],
    }
    tmp = state.out / (CHECKPOINT + ".tmp")
    torch.save(payload, tmp)
    tmp.replace(state.out / CHECKPOINT)


def _write_outputs(state: RunState) -> None:
    """clients.csv and summary.json (metrics.csv is written as rounds go)."""
    if state.out is None:
        return
    cfg = state.config
    if state.client_columns:
        k = len(next(iter(state.client_columns.values())))
        rows = [{"client": float(i), **{c: float(v[i]) for c, v in state.client_columns.items()}} for i in range(k)]
        write_csv(state.out / CLIENTS, rows)
    for plugin in state.experiment.metrics:
        plugin.save(state.out)
    summary = {
        "algorithm": cfg.spec("algorithm")["name"],
        "dataset": cfg.spec("dataset")["name"],
        "seed": cfg.seed,
        "rounds": state.round,
        "rounds_planned": cfg.rounds,
        "status": state.status,
        "backend": state.experiment.engine.backend_for(cfg.clients_per_round),
        "wall_time_s": round(state.wall_time_s, 3),
        "final": state.final,
    }
    (state.out / SUMMARY).write_text(json.dumps(summary, indent=2) + "\n")


def _check_divergence(state: RunState, losses: Tensor) -> None:
    """Stop with a clear message when a local loss is NaN/too large or the model is not finite."""
    cfg = state.config
    bad_loss = bool((torch.isnan(losses) | (losses > cfg.max_loss)).any())
    if bad_loss or not bool(torch.isfinite(state.params).all()):
        worst = float(losses.nan_to_num(float("inf")).max()) if len(losses) else float("nan")
        raise DivergenceError(
            f"round {state.round + 1}: training diverged (largest local loss {worst:.4g}, max_loss "
            f"{cfg.max_loss:g}); lower local.lr (now {cfg.local.lr}) or algorithm.server_lr"
        )


def _loop(state: RunState, callbacks: list[Callback]) -> RunState:
    exp, cfg = state.experiment, state.config
    if state.out is not None:
        callbacks = [CSVWriter(state.out / METRICS), ParticipationWriter(), *callbacks]
    for cb in callbacks:
        cb.on_run_start(state)
    seen = exp.data.seen
    started = time.perf_counter() - state.wall_time_s
    try:
        while state.round < cfg.rounds:
            t = state.round
            available = exp.availability.available(t) & seen
            attack = exp.strategy.ctx.attack
            clients = attack.cohort(exp.strategy.select(t, available), available, t)
            previous = state.params
            result: LocalResult | None = None
            if len(clients):  # an empty pool (e.g. nobody opted in) leaves the model as it is
                plan = attack.corrupt_plan(exp.strategy.configure(t, clients, state.params), t)
                result = exp.engine.train(state.params, plan, t)
                if result.dropped is not None and bool(result.dropped.any()):
                    # clients lost mid-round (a Flower node failed): the round goes on with the others (strategies
                    # keep their per-cohort values by client id, so aggregate reads those of the survivors)
                    result = result.rows(~result.dropped)
                    clients = result.clients
                result = attack.corrupt_updates(result, state.params, t)
                if len(result.clients):
                    state.params = exp.strategy.aggregate(t, state.params, result).detach()
            losses = result.train_loss[result.steps > 0] if result is not None else torch.zeros(0)
            local_loss = float(losses.double().mean()) if len(losses) else float("nan")
            _check_divergence(state, losses)
            exp.availability.observe(t, exp.engine, state.params)
            state.round = t + 1
            metrics: dict[str, float] | None = None
            if state.round % cfg.eval_every == 0 or state.round == cfg.rounds:
                evaluated = exp.strategy.evaluation_params(state.params)
                metrics, state.client_columns, test, train = evaluate_global(exp.engine, evaluated)
                metrics = {
                    "round": float(state.round),
                    **metrics,
                    "local_loss": local_loss,
                    "participants": float(len(clients)),
                    "available": float(available.sum()),
                    **exp.strategy.round_metrics(),
                }
                view = RoundView(
                    state.round,
                    exp.engine,
                    evaluated,
                    previous,
                    result,
                    test,
                    train,
                    state.history,
                    final=state.round == cfg.rounds,
                )
                for plugin in exp.metrics:
                    extra, columns = plugin.compute(view)
                    metrics.update(extra)
                    state.client_columns.update(columns)
                state.history.append(metrics)
            state.wall_time_s = time.perf_counter() - started
            if state.out is not None and (state.round % cfg.checkpoint_every == 0 or state.round == cfg.rounds):
                _save_checkpoint(state)
            stop = False
            for cb in callbacks:
                stop = cb.on_round_end(state, metrics) or stop
            if stop:
                state.status = "stopped early"
                break
        else:
            state.status = "finished"
    except DivergenceError:
        state.status = "diverged"
        raise
    finally:
        state.wall_time_s = time.perf_counter() - started
        if state.status == "running":
            state.status = "interrupted"
        _write_outputs(state)
        for cb in callbacks:
            cb.on_run_end(state)
    return state
