"""The round loop: select, configure, train, aggregate, evaluate, checkpoint; with callbacks and resume.

The run folder's files, lock and checks are `fedhet.experiments.runfolder`'s; the checkpoint format is
`fedhet.experiments.checkpoint`'s (docs/reliability.md says what they guarantee).
"""

from __future__ import annotations

import json
import time
import warnings
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from torch import Tensor

from fedhet.atomic import read_plain, write_bytes
from fedhet.engine.architectures import ArchitectureEngine
from fedhet.engine.engine import Engine
from fedhet.engine.plan import LocalPlan, LocalResult
from fedhet.errors import DivergenceError, FedhetError, FedhetNote
from fedhet.experiments.asynchronous import AsyncRunner
from fedhet.experiments.build import Experiment, build, explicit_config, resolved_config
from fedhet.experiments.callbacks import Callback
from fedhet.experiments.checkpoint import CheckpointError
from fedhet.experiments.config import RunConfig, load_yaml, parse_config
from fedhet.experiments.evaluation import (
    evaluate_global,
    evaluate_personal,
    evaluation_sample,
    in_target_units,
    personal_plan,
    spread_scores,
    target_factor,
)
from fedhet.experiments.metrics_log import columns_bytes, write_columns
from fedhet.experiments.participation import ParticipationWriter
from fedhet.experiments.runfolder import (
    CHECKPOINT,
    CLIENTS,
    CONFIG,
    METRICS,
    SUMMARY,
    RunFolder,
    identity,
)
from fedhet.experiments.selection import (
    best_index,
    check_selection,
    missing_metric,
    rounds_without_improvement,
    selected_row,
)
from fedhet.experiments.state import RunState, pack_columns, unpack_columns
from fedhet.experiments.tracking import with_trackers
from fedhet.experiments.trust import code_of_folder
from fedhet.metrics.base import RoundView, compute_checked, needs_all_clients
from fedhet.models.flops import parameter_flops
from fedhet.strategies.asynchronous import AsynchronousStrategy
from fedhet.strategies.base import Train
from fedhet.systems.clock import RoundClock

__all__ = [
    "CHECKPOINT",
    "CLIENTS",
    "CONFIG",
    "METRICS",
    "SUMMARY",
    "RunState",
    "resume",
    "run",
    "run_or_resume",
    "same_run",
]


def run(
    config: RunConfig,
    out: Path | None = None,
    callbacks: list[Callback] | None = None,
    builder: Callable[[RunConfig], Experiment] = build,
    overwrite: bool = False,
    score_sample_only: bool = False,
) -> RunState:
    """Run `config` from the start; with `out`, write the run folder (docs/reliability.md: "Run folders").

    Everything is validated before the folder is touched. `out` must be missing, empty or hold only fedhet's files;
    a run already there is refused unless `overwrite` (which removes fedhet's own files only).
    `builder` makes the run's objects (default `build`; the Flower adapter passes one whose engine is remote).
    `score_sample_only` (for ``--estimate``): rounds before the last score the ``eval_clients`` sample even where a
    metric plugin needs every client; such a plugin sees the sample's scores repeated over the other clients, so
    its own work is done (and timed) as in a real run, on made-up values.
    """
    experiment = builder(config)
    check_selection(experiment)  # before anything is written
    state = RunState.start(experiment, out=out, score_sample_only=score_sample_only)
    if out is None:
        _place_client_state(experiment, None)
        return _loop(state, callbacks or [])
    with RunFolder.create(out, experiment.config_text(), overwrite) as folder:
        state.folder = folder
        _place_client_state(experiment, folder)
        return _loop(state, callbacks or [])


def resume(
    out: Path,
    callbacks: list[Callback] | None = None,
    builder: Callable[[RunConfig], Experiment] = build,
    rounds: int | None = None,
    trust: bool = False,
) -> RunState:
    """Continue the run in folder `out` from its last checkpoint; ends with the same numbers (and metrics.csv)
    as an uninterrupted run. The checkpoint must match config.yaml and metrics.csv (else `CheckpointError`).

    `rounds` changes the planned number of rounds (at least the checkpoint's; config.yaml is updated): a run
    continued to more rounds equals one planned that long, except that the old last round was evaluated.
    Without `trust`, a config.yaml that names code to import is refused (`fedhet.experiments.trust`).
    """
    with RunFolder.open(out) as folder:
        raw = folder.read_config()
        if rounds is not None:
            raw = {**raw, "rounds": rounds}
        how = f"if you do, resume with fedhet run --resume {out} --trust-imports"
        with code_of_folder(raw, out / CONFIG, trust, how):
            experiment = builder(parse_config(raw))
        check_selection(experiment)
        state = RunState.start(experiment, out=out, folder=folder)
        _place_client_state(experiment, folder)
        saved = folder.read_checkpoint()
        if saved is not None:
            _restore(state, saved)
        state.history = folder.restore_metrics(saved)  # the last step: it cuts metrics.csv back to the checkpoint
        if saved is not None and state.history and saved.get("last_row", {}).get("round") == state.final["round"]:
            state.history[-1] = dict(saved["last_row"])  # the same row, with its columns in their original order
        if rounds is not None:
            folder.write_config(experiment.config_text())
        elif saved is not None and state.round == state.config.rounds and _finished(folder.path):
            state.status, state.already_finished = "finished", True
            _repair_clients(state)
            return state
        elif saved is not None and _out_of_patience(state):  # stopped early by selection.patience: done
            state.status, state.already_finished = "stopped early", True
            _repair_clients(state)
            return state
        _write_best(state)  # the checkpoint's selected model (a cut-off run may have written a later one)
        return _loop(state, callbacks or [])


def run_or_resume(
    config: RunConfig,
    out: Path,
    callbacks: list[Callback] | None = None,
    builder: Callable[[RunConfig], Experiment] = build,
) -> RunState:
    """`run` into `out`, unless `out` already holds a checkpointed run of this very config: then `resume` it (a
    finished run is loaded, not recomputed). So a recipe that was interrupted picks up where it stopped; a run of
    another config there is replaced (fedhet's own files only)."""
    if (out / CHECKPOINT).is_file() and (out / CONFIG).is_file() and same_run(config, out):
        return resume(out, callbacks, builder, trust=True)  # its config is `config`: the code it names is yours
    return run(config, out, callbacks, builder, overwrite=True)


def same_run(config: RunConfig, out: Path) -> bool:
    """Whether the run folder `out` holds a run of `config` (its config.yaml has the same identity and rounds);
    compared as text, so that nothing the folder's config names is imported."""
    try:
        raw = load_yaml(out / CONFIG)
        same = identity(raw) == identity(resolved_config(explicit_config(config)))
        return same and raw.get("rounds") == config.rounds
    except FedhetError:
        return False


def _finished(out: Path) -> bool:
    """Whether the summary.json in `out` says its run finished (a run killed before writing it did not)."""
    try:
        summary = json.loads((out / SUMMARY).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return False
    return isinstance(summary, dict) and summary.get("status") == "finished"


def _repair_clients(state: RunState) -> None:
    """A finished run's clients.csv as its last checkpoint has it (the file is written from the checkpoint's client
    columns): a damaged or missing one is written again, with a note."""
    assert state.folder is not None
    path = state.folder.path / CLIENTS
    expected = columns_bytes(state.client_table()) if state.client_columns else None
    try:
        found: bytes | None = read_plain(path)
    except (FileNotFoundError, IsADirectoryError):
        found = None
    if expected is not None and found != expected:
        write_bytes(path, expected)
        warnings.warn(
            f"'{path}' did not match the run's checkpoint; it was written again from the checkpoint",
            FedhetNote,
            stacklevel=2,
        )


def _place_client_state(experiment: Experiment, folder: RunFolder | None) -> None:
    """Keep the native engine's per-client state where ``personal_state`` says (`Engine.place_client_state`; a
    remote engine's clients keep theirs on their nodes)."""
    if isinstance(experiment.engine, Engine):
        claim = (lambda name: folder.record([name])) if folder is not None else None
        experiment.engine.place_client_state(
            experiment.config.personal_state, folder.path if folder is not None else None, claim
        )


def _checkpoint(state: RunState) -> dict[str, Any]:
    """What a checkpoint holds besides metrics.csv's extent (the history itself is metrics.csv)."""
    exp = state.experiment
    return {
        "config_sha256": identity(exp.resolved_config()),
        "round": state.round,
        "params": state.params,
        "wall_time_s": state.wall_time_s,
        "last_row": state.final,
        "client_columns": pack_columns(state.client_columns, state.evaluated),  # clients.csv of the last evaluation
        "backend": exp.engine.last_backend,  # summary.json's, also when a resume has no round left to train
        "strategy": exp.strategy.state_dict(),
        "availability": exp.availability.state_dict(),
        "engine": exp.engine.state_dict(),
        "metrics": [plugin.state_dict() for plugin in exp.metrics],
        **({"clock": state.clock.state_dict(), "system": exp.system.state_dict()} if state.clock is not None else {}),
        **({"asynchronous": state.pending.state_dict()} if state.pending is not None else {}),
        **({"best": {"round": state.best_round, "params": state.best_params}} if state.rule is not None else {}),
        **({"privacy": exp.privacy.state_dict()} if exp.privacy is not None else {}),
    }


def _restore(state: RunState, saved: dict[str, Any]) -> None:
    """Load a checkpoint's payload into `state`, refusing one that belongs to another run or does not fit."""
    assert state.folder is not None
    exp, out = state.experiment, state.folder.path
    what = f"checkpoint '{out / CHECKPOINT}'"
    restart = f"start afresh with fedhet run --out {out} --overwrite"
    if saved.get("config_sha256") != identity(exp.resolved_config()):
        raise CheckpointError(
            f"{what} was written by a run of another config than {out / CONFIG} (was config.yaml edited?); restore "
            f"config.yaml, or {restart}"
        )
    round_, params = saved.get("round"), saved.get("params")
    if type(round_) is not int or round_ < 1:
        raise CheckpointError(f"{what} is corrupt (round {round_!r})")
    if round_ > state.config.rounds:
        raise CheckpointError(
            f"{what} is at round {round_}, beyond the {state.config.rounds} rounds planned; resume with --rounds "
            f"{round_} or more"
        )
    if not isinstance(params, Tensor) or params.shape != state.params.shape or params.dtype != state.params.dtype:
        got = tuple(params.shape) if isinstance(params, Tensor) else type(params).__name__
        raise CheckpointError(f"{what} holds parameters of another model ({got}, expected {tuple(state.params.shape)})")
    try:
        for key in ("strategy", "availability", "engine"):
            if not isinstance(saved[key], dict):
                raise TypeError(f"its {key} state is not a mapping")
        exp.strategy.load_state_dict(saved["strategy"])
        exp.availability.load_state_dict(saved["availability"])
        exp.engine.load_state_dict(saved["engine"])
        for plugin, plugin_state in zip(exp.metrics, saved["metrics"], strict=True):
            plugin.load_state_dict(plugin_state)
        if exp.privacy is not None:
            exp.privacy.load_state_dict(saved["privacy"])
        wall_time = float(saved["wall_time_s"])
        columns = unpack_columns(saved["client_columns"])
        last_row = saved["last_row"]
        if not isinstance(last_row, dict):
            raise TypeError("last_row is not a mapping")
    except Exception as err:  # a payload that passed its checksum but does not fit this run's components
        reason = str(err).splitlines()[0][:100] if str(err) else type(err).__name__
        raise CheckpointError(f"{what} does not fit this run ({reason}); {restart}") from None
    state.params, state.round, state.wall_time_s, state.client_columns = params, round_, wall_time, columns
    if isinstance(saved.get("backend"), str):
        exp.engine.last_backend = saved["backend"]
    try:
        if state.clock is not None:
            state.clock.load_state_dict(saved["clock"])
            exp.system.load_state_dict(saved["system"])
        if state.pending is not None:
            state.pending.load_state_dict(saved["asynchronous"])
        if state.rule is not None:
            best = saved["best"]
            state.best_round, state.best_params = int(best["round"]), best["params"]
            if state.best_params is not None and not isinstance(state.best_params, Tensor):
                raise TypeError("its best model is not a tensor")
    except Exception as err:
        reason = str(err).splitlines()[0][:100] if str(err) else type(err).__name__
        raise CheckpointError(f"{what} does not fit this run's clock ({reason}); {restart}") from None


def _persist(state: RunState, metrics: dict[str, float] | None) -> None:
    """After a round: append its metrics row, then (when due) the checkpoint, which records the row's end."""
    assert state.folder is not None
    if metrics is not None:
        state.folder.metrics.append(metrics)
    if _checkpoint_due(state):
        state.folder.write_checkpoint(_checkpoint(state))


def _checkpoint_due(state: RunState) -> bool:
    return state.round % state.config.checkpoint_every == 0 or state.round == state.config.rounds


def _write_best(state: RunState) -> None:
    """best.pt: the selected round's model, written before the row and checkpoint that record it (a run cut off in
    between redoes the round and writes it again; a resume writes the checkpoint's)."""
    rule = state.rule
    if state.folder is not None and rule is not None and state.best_params is not None:
        row = next((r for r in state.history if r.get("round") == state.best_round), {})
        value = row.get(rule.metric, float("nan"))
        state.folder.write_best(state.best_params, state.best_round, rule.metric, value)


def _keep_if_best(state: RunState, metrics: dict[str, float] | None, evaluated: Tensor | None) -> bool:
    """Whether this round's evaluated model is the best so far by the run's rule (then kept as the selected one)."""
    rule = state.rule
    if rule is None or metrics is None or evaluated is None:
        return False
    note = missing_metric(metrics, rule) if len(state.history) == 1 else None
    if note is not None:
        warnings.warn(note, FedhetNote, stacklevel=2)
    if best_index(state.history, rule) != len(state.history) - 1:
        return False
    state.best_round, state.best_params = state.round, evaluated.detach().clone()
    return True


def _out_of_patience(state: RunState) -> bool:
    """Early stopping: ``selection.patience`` evaluated rounds have passed without an improvement."""
    rule, patience = state.rule, state.config.selection.patience
    return rule is not None and patience > 0 and rounds_without_improvement(state.history, rule) >= patience


def _write_outputs(state: RunState) -> None:
    """clients.csv, the metric plugins' files and summary.json (metrics.csv is written as rounds go)."""
    if state.folder is None:
        return
    cfg = state.config
    if state.client_columns:
        write_columns(state.folder.path / CLIENTS, state.client_table())
    state.folder.save_plugin_files(state.experiment.metrics)
    summary = {
        "algorithm": cfg.spec("algorithm")["name"],
        "dataset": cfg.spec("dataset")["name"],
        "seed": cfg.seed,
        "rounds": state.round,
        "rounds_planned": cfg.rounds,
        "status": state.status,
        "backend": state.experiment.engine.last_backend or state.experiment.engine.backend_for(cfg.clients_per_round),
        "wall_time_s": round(state.wall_time_s, 3),
        "final": state.final,
    }
    rule = state.rule
    if rule is not None:
        summary["selection"] = {"metric": rule.metric, "mode": rule.mode, "round": state.best_round}
        summary["selected"] = selected_row(state.history, rule)
    if state.experiment.privacy is not None:
        summary["privacy"] = state.experiment.privacy.summary()
    if state.clock is not None and cfg.deadline.seconds is not None:
        summary["deadline_empty_rounds"] = state.clock.empty_rounds
    state.folder.write_summary(summary)


def _evaluation_sample(state: RunState) -> Tensor | None:
    """The clients evaluated this round under ``eval_clients`` (None: everyone, also when a metric plugin needs
    all of them, unless `RunState.score_sample_only`)."""
    exp, cfg = state.experiment, state.config
    if cfg.eval_clients == 0 or (needs_all_clients(exp.metrics) and not state.score_sample_only):
        return None
    return evaluation_sample(exp.data.num_clients, cfg.eval_clients, cfg.seed, state.round)


def _trainer(state: RunState, round_: int, clock: RoundClock | None = None) -> Train:
    """Runs a plan of round `round_` on the engine from the round's global model, through the run's attack and,
    with a system model, the round's clock (which may cut the plan's steps or leave clients out: `dropped`)."""
    exp, params = state.experiment, state.params
    attack = exp.strategy.ctx.attack
    model = exp.engine.model

    def train(plan: LocalPlan) -> LocalResult:
        if exp.privacy is not None:
            plan = exp.privacy.training_plan(plan)
        plan = attack.corrupt_plan(plan, round_)
        if clock is None:
            return exp.engine.train(params, plan, round_)
        if isinstance(exp.engine, ArchitectureEngine):  # each client its own architecture's bytes and compute
            scheduled = clock.schedule(plan, *exp.engine.clock_costs(plan))
        else:
            personal = int(plan.personal.mask(model).sum()) if plan.personal is not None else 0
            scheduled = clock.schedule(plan, model.size, personal)
        result = exp.engine.train(params, scheduled.plan, round_)
        late = scheduled.late
        result.dropped = late if result.dropped is None else result.dropped | late
        return result

    return train


def _round_clock(state: RunState, round_: int, clients: Tensor) -> RoundClock | None:
    """The clock of round `round_`'s cohort (None without a system model)."""
    if state.clock is None:
        return None
    exp, cfg = state.experiment, state.config
    keep = cfg.deadline.rule.keep(cfg.clients_per_round) if cfg.deadline.seconds is not None else None
    if state.flops is None and any(part.sub_models for part in exp.strategy.parts()):
        state.flops = parameter_flops(exp.engine.model.module, exp.data.input_shape)
    profiles = exp.system.profiles(round_)
    return RoundClock(profiles, clients, exp.data.train.sizes, cfg.deadline, keep, state.flops)


def _personal_evaluation(
    state: RunState, params: Tensor, sample: Tensor | None
) -> tuple[dict[str, float], LocalPlan | None]:
    """The personalised models' metrics after this round when the run scores them and it is due (every
    ``personal_eval.every``-th evaluation, and the last; their per-client columns join clients.csv), and the plan
    that makes the evaluated clients' personalised models (for metric plugins; None when the run has none)."""
    exp, cfg = state.experiment, state.config
    settings = cfg.personal_eval
    due = state.round == cfg.rounds or (state.round // cfg.eval_every) % settings.every == 0
    clients = sample if sample is not None else torch.arange(exp.data.num_clients)
    plan = personal_plan(exp.strategy, settings, exp.engine.local, clients)
    if plan is None or not due:
        return {}, plan
    requirements = exp.requirements if settings.appeal else None
    metrics, columns = evaluate_personal(exp.engine, params, plan, state.round, requirements)
    state.client_columns.update(columns)
    return metrics, plan


GROWTH_LIMIT = 100.0  # a local loss this many times the initial model's is divergence, however small max_loss is


def _check_divergence(state: RunState, losses: Tensor) -> None:
    """Stop with a message naming the cause when a local loss is NaN or infinite, the model is not finite, or a
    local loss exceeds max(max_loss, GROWTH_LIMIT × the initial model's loss): the loss a model starts from (a
    regression on large targets starts in the thousands) is no divergence, a loss grown a hundredfold is."""
    cfg, data = state.config, state.experiment.data
    finite = bool(torch.isfinite(losses).all()) and bool(torch.isfinite(state.params).all())
    worst = float(losses.max()) if len(losses) else 0.0
    if finite and worst <= cfg.max_loss:
        return
    lr = f"lower local.lr (now {cfg.local.lr}) or algorithm.server_lr"
    targets = data.train.y
    if data.target_scale is None and torch.is_floating_point(targets) and len(targets):
        lr += (
            f" (the targets span {float(targets.min()):.4g} to {float(targets.max()):.4g} and task.standardize is "
            "off: standardised targets train at the default rate)"
        )
    if not finite:
        raise DivergenceError(
            f"round {state.round + 1}: training diverged (a local loss or the model became NaN or infinite: the "
            f"local steps overflowed); {lr}"
        )
    start = _initial_loss(state)
    if worst <= max(cfg.max_loss, GROWTH_LIMIT * start):
        return
    grown = f"{worst / start:.3g} times the initial model's {start:.4g}" if start > 0 else "the initial model's is 0"
    raise DivergenceError(
        f"round {state.round + 1}: training diverged (the largest local loss {worst:.4g} is above max_loss "
        f"{cfg.max_loss:g} and {grown}): the local steps are too large for this data; {lr}"
    )


def _initial_loss(state: RunState) -> float:
    """The initial model's largest mean training loss over the training clients (computed once, when a local loss
    first exceeds max_loss)."""
    if state.initial_loss is None:
        exp = state.experiment
        start = exp.engine.losses_at(exp.engine.initial_params(), exp.data.seen_ids, "train")
        state.initial_loss = float(start.nan_to_num(0.0).max()) if len(start) else 0.0
    return state.initial_loss


@dataclass
class RoundOutcome:
    """What a round did, for its row of metrics.csv: the model before it, the cohort's training, how many clients
    were online and took part, and columns of the round's own (the clock's, an asynchronous round's staleness)."""

    previous: Tensor
    result: LocalResult | None
    participants: int
    available: int
    columns: dict[str, float] = field(default_factory=dict)


def _synchronous_round(state: RunState) -> RoundOutcome:
    """Select, train (with a system model: on the round's clock, under its deadline), aggregate."""
    exp = state.experiment
    t = state.round
    available = exp.availability.available(t) & exp.data.seen
    attack = exp.strategy.ctx.attack
    exp.strategy.ctx.params = state.params
    exp.strategy.ctx.start_round(t)  # the round's scheduled learning rates
    clients = attack.cohort(exp.strategy.select(t, available), available, t)
    previous = state.params
    result: LocalResult | None = None
    state.local_training_s = 0.0
    clock = _round_clock(state, t, clients)
    if len(clients):  # an empty pool (e.g. nobody opted in) leaves the model as it is
        training = time.perf_counter()
        result = exp.strategy.local_training(t, clients, state.params, _trainer(state, t, clock))
        state.local_training_s = time.perf_counter() - training
        if result.dropped is not None and bool(result.dropped.any()):
            # clients lost mid-round (a Flower node failed, or late for the deadline): the round goes on with the
            # others (strategies keep their per-cohort values by client id, so aggregate reads the survivors')
            result = result.rows(~result.dropped)
            clients = result.clients
        result = attack.corrupt_updates(result, state.params, t)
        if len(result.clients):
            state.params = exp.strategy.aggregate(t, state.params, result).detach()
    columns: dict[str, float] = {}
    if state.clock is not None and clock is not None:
        state.clock.advance(clock.duration(), *clock.traffic())
        columns = {**state.clock.columns(), "late_clients": float(clock.left_out.sum())}
        if clock.emptied():
            _note_empty_round(state, clock)
    return RoundOutcome(previous, result, len(clients), int(available.sum()), columns)


def _note_empty_round(state: RunState, clock: RoundClock) -> None:
    """Count a round whose deadline left out every client; the first one of a run is a note."""
    assert state.clock is not None
    state.clock.empty_rounds += 1
    if state.clock.empty_rounds == 1:
        deadline = state.config.deadline
        warnings.warn(
            f"round {state.round + 1}: no client of the {len(clock.clients)} selected can finish within "
            f"deadline.seconds {deadline.seconds:g} (policy {deadline.policy_name}), so the model did not change; "
            "summary.json counts such rounds (deadline_empty_rounds); raise deadline.seconds",
            FedhetNote,
            stacklevel=2,
        )


def _asynchronous_round(state: RunState) -> RoundOutcome:
    """The events up to the server's next model version (`fedhet.experiments.asynchronous`)."""
    exp = state.experiment
    assert state.clock is not None and state.pending is not None
    strategy = exp.strategy
    assert isinstance(strategy, AsynchronousStrategy)
    t = state.round
    strategy.ctx.start_round(t)  # the server step's scheduled learning rates
    available = exp.availability.available(t)
    runner = AsyncRunner(
        strategy,
        exp.engine,
        exp.system.profiles,
        exp.data.seen,
        exp.data.train.sizes,
        state.config.seed,
        state.pending,
        state.clock,
    )
    previous = state.params
    training = time.perf_counter()
    state.params, step = runner.step(t, state.params, available)
    state.local_training_s = time.perf_counter() - training
    staleness = step.staleness
    columns = {
        **state.clock.columns(),
        "staleness": float(staleness.mean()) if len(staleness) else float("nan"),
        "in_flight": float(len(state.pending.flights)),
    }
    participants = len(step.result.clients) if step.result is not None else 0
    return RoundOutcome(previous, step.result, participants, int((available & exp.data.seen).sum()), columns)


def _evaluate(
    state: RunState, outcome: RoundOutcome, local_loss: float
) -> tuple[dict[str, float] | None, Tensor | None]:
    """The round's row of metrics.csv when it is evaluated (every ``eval_every`` rounds, and the last), and the model
    evaluated."""
    exp, cfg = state.experiment, state.config
    if not (state.round % cfg.eval_every == 0 or state.round == cfg.rounds):
        return None, None
    evaluated = exp.strategy.evaluation_params(state.params)
    sample = _evaluation_sample(state) if state.round < cfg.rounds else None
    state.evaluated = sample
    metrics, state.client_columns, test, train = evaluate_global(
        exp.engine, evaluated, sample, count=cfg.eval_clients > 0
    )
    if sample is not None and needs_all_clients(exp.metrics):  # only with `score_sample_only`
        test, train = spread_scores(test, sample), spread_scores(train, sample)
    personal, personal_models = _personal_evaluation(state, evaluated, sample)
    val = exp.engine.scores(evaluated, "val", sample) if exp.metrics and exp.data.val is not None else None
    task, scale = exp.engine.model.task, exp.data.target_scale
    val = in_target_units(val, task, scale) if val is not None else None
    metrics = {
        "round": float(state.round),
        **metrics,
        "local_loss": local_loss * target_factor(task, scale, "loss"),
        "participants": float(outcome.participants),
        "available": float(outcome.available),
        **exp.strategy.round_metrics(),
        **(exp.privacy.round_metrics(test) if exp.privacy is not None else {}),
        **personal,
        **outcome.columns,
    }
    state.client_columns.update(exp.strategy.client_columns())
    if exp.system.capacity is not None:
        state.client_columns["system_capacity"] = exp.system.capacities()
    if exp.privacy is not None:
        state.client_columns.update(exp.privacy.client_columns())
    view = RoundView(
        state.round,
        exp.engine,
        evaluated,
        outcome.previous,
        outcome.result,
        test,
        train,
        state.history,
        final=state.round == cfg.rounds,
        val=val,
        personal=personal_models,
    )
    for plugin in exp.metrics:
        extra, columns = compute_checked(plugin, view, metrics)
        metrics.update(extra)
        state.client_columns.update(columns)
    state.history.append(metrics)
    return metrics, evaluated


def _loop(state: RunState, callbacks: list[Callback]) -> RunState:
    exp, cfg = state.experiment, state.config
    if state.folder is not None:
        callbacks = [ParticipationWriter(), *with_trackers(callbacks, cfg, state.folder.path)]
    for cb in callbacks:
        cb.on_run_start(state)
    started = time.perf_counter() - state.wall_time_s
    one_round = _asynchronous_round if state.pending is not None else _synchronous_round
    try:
        while state.round < cfg.rounds:
            outcome = one_round(state)
            result = outcome.result
            losses = result.train_loss[result.steps > 0] if result is not None else torch.zeros(0)
            local_loss = float(losses.double().mean()) if len(losses) else float("nan")
            _check_divergence(state, losses)
            exp.availability.observe(state.round, exp.engine, state.params)
            if exp.privacy is not None:
                exp.privacy.record(result if result is not None and len(result.clients) else None)
            state.round += 1
            metrics, evaluated = _evaluate(state, outcome, local_loss)
            improved = _keep_if_best(state, metrics, evaluated)
            patience_out = _out_of_patience(state) and state.round < cfg.rounds
            state.wall_time_s = time.perf_counter() - started
            if state.folder is not None:
                if improved:
                    _write_best(state)
                _persist(state, metrics)
                if patience_out and not _checkpoint_due(state):  # keep the last row of a run stopped early
                    state.folder.write_checkpoint(_checkpoint(state))
            stop = patience_out
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
    except (OSError, FedhetError):  # a full disk, every Flower node lost: interrupted, to resume once it is fixed
        raise
    except SystemExit as err:  # sys.exit() in a model's, plugin's or callback's code: a failure, not a success
        state.status = "failed"
        raise FedhetError(
            f"round {state.round + 1}: the run's code (its model, a plugin or a callback) called "
            f"sys.exit({err.code!r}); the run failed"
        ) from None
    except Exception:  # a crash in code (a plugin's, a model's, a callback's): the run failed
        state.status = "failed"
        raise
    finally:
        state.wall_time_s = time.perf_counter() - started
        if state.status == "running":
            state.status = "interrupted"
        try:
            _write_outputs(state)
        finally:
            for cb in callbacks:
                cb.on_run_end(state)
    return state
