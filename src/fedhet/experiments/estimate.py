"""The cost of a run or a paper recipe before running it (``--estimate``): a few rounds of each distinct config at
full size, timed (set-up, training, evaluation), with the process's peak memory, and the total projected from them.
Nothing is written.

A dataset whose files are absent is replaced by a stand-in: random tensors of its real shapes, class count, size
and number of users (`DatasetSource.stand_in`), so a paper-scale recipe can be sized (and shown to fit in memory)
on a machine that does not have its data. Times measured on stand-ins are those of the real data: the work per
sample does not depend on the values.
"""

from __future__ import annotations

import contextlib
import io
import itertools
import json
import re
import statistics
import tempfile
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

import torch

from fedhet.catalog import DATASETS
from fedhet.data.in_memory import hold
from fedhet.engine.engine import resolve_device
from fedhet.errors import ConfigError
from fedhet.experiments.callbacks import Callback
from fedhet.experiments.config import parse_config
from fedhet.experiments.evaluation import evaluate_global, evaluation_sample
from fedhet.experiments.executor import Executor, Outcome, Post, Task
from fedhet.experiments.footprint import Footprint, footprint
from fedhet.experiments.reproduce import Recipe, dataset_available, deep_merge
from fedhet.experiments.runner import run
from fedhet.experiments.state import RunState
from fedhet.metrics.base import needs_all_clients
from fedhet.process_memory import memory_mb, reset_peak

STAND_IN_NOTE = "stand-in data: random tensors of the real shapes"
T = TypeVar("T")


@dataclass
class Estimate:
    """What one config of a run or recipe costs, per run: `setup_s` (data, partition, model), `train_s` per round,
    `eval_s` per evaluation and `final_eval_s` for the last one (everyone is scored there, even with
    ``eval_clients``); `evals` evaluations over `rounds` rounds, × `runs` (seeds). `peak_mb`: the process's resident
    peak while it ran (the data held included; the evaluations timed scored a sample of clients)."""

    label: str
    runs: int
    rounds: int
    evals: int
    setup_s: float
    train_s: float
    eval_s: float
    final_eval_s: float
    peak_mb: float
    backend: str
    stand_in: bool
    steps_timed: tuple[int, int] | None = None  # (timed, configured) local steps when the timed rounds had fewer
    gpu_peak_mb: float | None = None  # the most GPU memory its tensors held, for a config on `device: cuda`
    footprint: Footprint | None = None  # its memory by part, projected for K clients and the cohort

    @property
    def run_s(self) -> float:
        return self.setup_s + self.rounds * self.train_s + (self.evals - 1) * self.eval_s + self.final_eval_s

    @property
    def projected_s(self) -> float:
        return self.run_s * self.runs


ESTIMATE_EVAL_CLIENTS = 10  # clients scored in a timed evaluation at most (the others: `_seconds_per_sample`)
MAX_TIMED_STEPS = 50  # local steps of a timed round at most; a round of more is timed with these and scaled
ROUND_BUDGET_S = 10.0  # a timed round trains for about this long at most (fewer steps, one at least: `_Probe`)
EVAL_BUDGET_S = 10.0  # a timed evaluation scores as many clients as take about this long (two at least)
WARM_UP_ROUNDS = 2  # the first trains, the second trains and evaluates: neither is timed
MAX_PAIRS = 9  # timed pairs of rounds (one that only trains, one that trains and evaluates) at most ...
PAIRS_FOR_S = 3.0  # ... while their rounds took less than this many seconds (one pair at least)


@dataclass
class _Pair:
    """One timed pair of rounds: training (with the round's writes), the local training within it (the engine's
    `train`), the evaluation's compute, and the extra writes of an evaluated round (its metrics row)."""

    train_s: float
    local_s: float
    eval_s: float
    eval_writes_s: float

    def train_at(self, scale: float) -> float:
        """The training round's seconds had its local training been `scale` times as long (as many more steps)."""
        return self.train_s + self.local_s * (scale - 1.0)


class _RoundTimes(Callback):
    """The clock at each round's end and how much of each round went to the run folder's writes (after the
    runner's clock, ``state.wall_time_s``, stopped for the round). After the warm-up, rounds come in pairs (odd:
    training only, even: training and an evaluation); the run stops after `MAX_PAIRS` pairs or once the pairs
    took `PAIRS_FOR_S`."""

    def __init__(self, budget_s: float = PAIRS_FOR_S) -> None:
        self.budget_s = budget_s
        self.start = 0.0
        self.ends: list[float] = []
        self.writes: list[float] = []
        self.local: list[float] = []

    def on_run_start(self, state: RunState) -> None:
        self.start = time.perf_counter()

    def on_round_end(self, state: RunState, metrics: dict[str, float] | None) -> bool:
        now = time.perf_counter()
        self.ends.append(now)
        self.writes.append(max(0.0, now - self.start - state.wall_time_s))
        self.local.append(state.local_training_s)
        if state.round <= WARM_UP_ROUNDS or state.round % 2:
            return False
        pairs = (state.round - WARM_UP_ROUNDS) // 2
        return pairs >= MAX_PAIRS or now - self.ends[WARM_UP_ROUNDS - 1] >= self.budget_s

    def pairs(self) -> list[_Pair]:
        rounds = [b - a for a, b in itertools.pairwise([self.start, *self.ends])]
        out = []
        for odd in range(WARM_UP_ROUNDS, len(rounds) - 1, 2):
            train, evaluated = rounds[odd], rounds[odd + 1]
            compute_train, compute_eval = train - self.writes[odd], evaluated - self.writes[odd + 1]
            out.append(
                _Pair(
                    train,
                    self.local[odd],
                    max(0.0, compute_eval - compute_train),
                    max(0.0, self.writes[odd + 1] - self.writes[odd]),
                )
            )
        return out


class StandIns:
    """The dataset a config names, or its stand-in when its files are absent (made once per dataset)."""

    def __init__(self, scale: float) -> None:
        self.scale = scale
        self.refs: dict[str, str | None] = {}
        self.users: dict[str, int] = {}  # users of a stand-in

    def config(self, raw: dict[str, Any]) -> tuple[dict[str, Any], bool]:
        cfg = parse_config(raw)
        spec = cfg.spec("dataset")
        key = repr(sorted(spec.items()))
        if key not in self.refs:
            if dataset_available({"dataset": spec, "data_dir": cfg.data_dir}):
                self.refs[key] = None
            else:
                data = DATASETS.build(spec, where="dataset").stand_in(self.scale)
                if data is None:
                    raise ConfigError(
                        f"dataset '{spec['name']}' has no stand-in: put its files in '{cfg.data_dir}' to estimate "
                        "this run"
                    )
                self.refs[key] = hold(data)
                self.users[key] = len(data.users.unique()) if data.users is not None else 0
        ref = self.refs[key]
        if ref is None:
            return raw, False
        raw = {**raw, "dataset": {"name": "in_memory", "ref": ref}}
        if self.scale < 1:  # a shrunk stand-in (tests): clients shrink with the samples and users
            users = self.users[key] or cfg.num_clients + cfg.unseen_clients  # natural partitions: one user each
            clients = min(cfg.num_clients, max(5, round(cfg.num_clients * self.scale)), users)
            raw["num_clients"], raw["clients_per_round"] = clients, min(cfg.clients_per_round, clients)
            raw["unseen_clients"] = min(round(cfg.unseen_clients * self.scale), users - clients)
        return raw, True


@dataclass
class _Probe:
    """What sizes the timed rounds of a config whose rounds are long: a round's local training with one step per
    client and a client of mean size's evaluation, each run once, cold (so both rather high)."""

    step_s: float
    eval_client_s: float

    def timed_steps(self, steps: int) -> int:
        """The local steps a timed round takes: the config's, at most `MAX_TIMED_STEPS`, fewer where a round of
        them would train for more than `ROUND_BUDGET_S`; one at least."""
        fit = int(ROUND_BUDGET_S / self.step_s) if self.step_s > 0 else steps
        return max(1, min(steps, MAX_TIMED_STEPS, fit))

    def eval_clients(self) -> int:
        """The clients a timed evaluation scores: `ESTIMATE_EVAL_CLIENTS`, fewer where scoring them would take
        more than `EVAL_BUDGET_S`; two at least (`_seconds_per_sample` compares all of them with one)."""
        fit = int(EVAL_BUDGET_S / self.eval_client_s) if self.eval_client_s > 0 else ESTIMATE_EVAL_CLIENTS
        return max(2, min(ESTIMATE_EVAL_CLIENTS, fit))


class _StopAfterFirstRound(Callback):
    """Stops a run after its first round (before an evaluation when ``eval_every`` is 2 or more)."""

    def on_round_end(self, state: RunState, metrics: dict[str, float] | None) -> bool:
        return True


def _probe(short: dict[str, Any]) -> _Probe:
    """One round of `short` (a stand-in config) with one local step per client, then client 0's evaluation,
    scaled to a client of mean size."""
    probe = deep_merge(short, {"rounds": 2, "eval_every": 2, "local": {"steps": 1}})
    state = run(parse_config(probe), callbacks=[_StopAfterFirstRound()])
    exp = state.experiment
    start = time.perf_counter()
    evaluate_global(exp.engine, state.params, torch.zeros(1, dtype=torch.long))
    sizes = (exp.data.train.sizes + exp.data.test.sizes).double()
    per_sample = (time.perf_counter() - start) / max(float(sizes[0]), 1.0)
    return _Probe(state.local_training_s, per_sample * float(sizes.mean()))


def _probe_key(short: dict[str, Any]) -> str:
    """What a probe's times depend on enough to be shared: the config without its method and metrics."""
    return _cost_key({k: v for k, v in short.items() if k not in ("algorithm", "metrics")})


def estimate_config(
    raw: dict[str, Any],
    label: str,
    runs: int,
    stand_ins: StandIns,
    budget_s: float = PAIRS_FOR_S,
    probes: dict[str, _Probe] | None = None,
) -> Estimate:
    """A few rounds of `raw` (its dataset or a stand-in), in this process, into a temporary run folder (deleted): two
    warm up training and evaluation, then pairs of rounds (training only; training and an evaluation) give the
    medians. A round's time includes its writes (checkpoint, metrics row).

    A step-based round is first probed (`_Probe`, shared by the configs of `probes` that differ only in method
    and metrics): a round of more than `MAX_TIMED_STEPS` local steps, or one that would train for more than
    `ROUND_BUDGET_S`, is timed with fewer, and its local training (the engine's `train`: not the strategy's own
    work, such as FedGSNR's gradient statistics, nor the round's writes) scaled to the config's steps.
    The timed evaluations score a seeded sample of clients (`ESTIMATE_EVAL_CLIENTS`, fewer where they would take
    more than `EVAL_BUDGET_S`, or the config's smaller ``eval_clients``); what a run's evaluations cost (the
    config's sample on average, or everyone; everyone at the last) adds what the samples they score beyond those
    cost, each at `_seconds_per_sample`.
    """
    cfg = parse_config(raw)
    raw = {key: value for key, value in raw.items() if key != "track"}  # nothing is logged (nor its cost timed)
    short, stand_in = stand_ins.config(raw)
    small = parse_config(short)
    sample = min(ESTIMATE_EVAL_CLIENTS, small.eval_clients or ESTIMATE_EVAL_CLIENTS)
    steps_timed = None
    if cfg.local.epochs is None:  # the work of a round grows with its steps
        probes = {} if probes is None else probes
        key = _probe_key(short)
        if key not in probes:
            probes[key] = _probe(short)
        timed = probes[key].timed_steps(cfg.local.steps)
        if timed < cfg.local.steps:
            steps_timed = (timed, cfg.local.steps)
            short = deep_merge(short, {"local": {"steps": timed}})
        sample = min(sample, probes[key].eval_clients())
    times = _RoundTimes(budget_s)
    device = resolve_device(cfg.device)  # a clear error where the config names a GPU this machine lacks
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
    reset_peak()
    begun = time.perf_counter()
    longest = WARM_UP_ROUNDS + 2 * MAX_PAIRS
    short = {**short, "rounds": max(cfg.rounds, longest + 1), "eval_every": 2, "eval_clients": sample}
    with tempfile.TemporaryDirectory(prefix="fedhet-estimate-") as tmp:  # a run folder's writes are timed too
        state = run(parse_config(short), Path(tmp) / "run", callbacks=[times], score_sample_only=True)
    peak = memory_mb("VmHWM")
    gpu_peak = torch.cuda.max_memory_allocated(device) / 2**20 if device.type == "cuda" else None
    pairs = times.pairs()
    exp = state.experiment
    sizes = (exp.data.train.sizes + exp.data.test.sizes).double()
    everyone = len(sizes)
    everyone_needed = needs_all_clients(exp.metrics)

    def scored_by(round_: int) -> torch.Tensor:
        chosen = evaluation_sample(everyone, sample, small.seed, round_)
        return torch.arange(everyone) if chosen is None else chosen

    scored_sets = [scored_by(WARM_UP_ROUNDS + 2 * (i + 1)) for i in range(len(pairs))]  # rounds 4, 6, ...
    scored = statistics.mean(float(sizes[c].sum()) for c in scored_sets)
    evaluated = statistics.median(p.eval_s for p in pairs) + statistics.median(p.eval_writes_s for p in pairs)
    per_sample = _seconds_per_sample(exp.engine, state.params, sizes, scored_sets[-1])
    # of everyone, per evaluation (a metric plugin that needs everyone turns the config's sampling off)
    share = min(1.0, small.eval_clients / everyone) if small.eval_clients and not everyone_needed else 1.0
    total = float(sizes.sum())
    evals = cfg.rounds // cfg.eval_every + (cfg.rounds % cfg.eval_every > 0)
    scale = steps_timed[1] / steps_timed[0] if steps_timed else 1.0
    return Estimate(
        label,
        runs,
        cfg.rounds,
        evals,
        times.start - begun,
        statistics.median(p.train_at(scale) for p in pairs),
        max(0.0, evaluated + per_sample * (share * total - scored)),
        max(0.0, evaluated + per_sample * (total - scored)),
        peak,
        (exp.engine.last_backend or exp.engine.backend_for(state.config.clients_per_round))
        + ("" if device.type == "cpu" else f" on {device}"),
        stand_in,
        steps_timed,
        gpu_peak,
        footprint(exp),
    )


def _seconds_per_sample(engine: Any, params: torch.Tensor, sizes: torch.Tensor, clients: torch.Tensor) -> float:
    """What one more sample adds to an evaluation: `clients` scored against their first one alone (best of a few
    tries), per sample of difference. An evaluation also has costs that do not grow with its samples, so the
    time of a sampled evaluation is not simply scaled."""

    def seconds(chosen: torch.Tensor) -> float:
        best = float("inf")
        for _ in range(3):
            start = time.perf_counter()
            evaluate_global(engine, params, chosen)
            best = min(best, time.perf_counter() - start)
            if best > 1.0:
                break
        return best

    extra = float(sizes[clients].sum() - sizes[clients[:1]].sum())
    return max(0.0, seconds(clients) - seconds(clients[:1])) / extra if extra > 0 else 0.0


class _Planned(Exception):
    """Raised by `_Planner` to stop a study once it has handed over its first stage of runs."""


class _Planner(Executor):
    """An executor that runs nothing: it keeps the first stage of tasks a study hands it, and stops the study."""

    def __init__(self) -> None:
        super().__init__(1)
        self.tasks: list[Task] = []
        self.stage = ""

    def run(self, tasks: Sequence[Task], post: Post | None = None, stage: str = "runs") -> list[Outcome]:
        self.tasks, self.stage = list(tasks), stage
        raise _Planned


@dataclass
class Plan:
    """What a recipe would run: (label, config of its first seed, runs) per distinct config; `note` says what the
    plan leaves out (a study's later stages, chosen from its first stage's results)."""

    configs: list[tuple[str, dict[str, Any], int]] = field(default_factory=list)
    note: str = ""


def _seedless(label: str) -> str:
    return re.sub(r"[,|/ ]*\bseed ?\d+$", "", label).strip() or label


# Coefficients of the strategies' rules whose size changes the arithmetic, not the work of a round: learning-rate
# decay (FedMGDA+, FedAvg-n), q-FedAvg's q and Lipschitz constant, proximal weights. Only whether one is zero (a
# term switched off) can change what a round computes.
SCALE_ONLY = frozenset({"lr_decay", "decay_every", "q", "lipschitz", "mu", "prox_mu"})


def _cost_key(config: dict[str, Any]) -> str:
    """The config up to what does not change a round's cost: the seed, the learning rates (``lr``, ``*_lr``), and
    of the `SCALE_ONLY` coefficients only whether each is zero."""

    def strip(value: Any) -> Any:
        if not isinstance(value, dict):
            return value
        return {
            k: (v != 0 if k in SCALE_ONLY and isinstance(v, int | float) else strip(v))
            for k, v in value.items()
            if k != "seed" and k != "lr" and not k.endswith("_lr")
        }

    return json.dumps(strip(config), sort_keys=True, default=str)


def _by_cost(items: Iterable[T], config: Callable[[T], dict[str, Any]]) -> list[list[T]]:
    """`items` grouped by what a round of their config costs (`_cost_key`), in first-seen order."""
    groups: dict[str, list[T]] = {}
    for item in items:
        groups.setdefault(_cost_key(config(item)), []).append(item)
    return list(groups.values())


def _alike_label(methods: list[str]) -> str:
    """The first of methods that cost the same per round, and how many more there are."""
    return methods[0] if len(methods) == 1 else f"{methods[0]} (+{len(methods) - 1} alike)"


def _group_label(tasks: list[Task], root: Path) -> str:
    """The tasks' common label up to the seed, or else their common run-folder prefix under `root`."""
    labels = {_seedless(t.label) for t in tasks}
    if len(labels) == 1:
        return labels.pop()
    parts = [t.out.relative_to(root).parts for t in tasks]
    common = [p[0] for p in zip(*parts, strict=False) if len(set(p)) == 1 and not re.fullmatch(r"seed\d+", p[0])]
    return "/".join(common) or _seedless(tasks[0].label)


def plan_recipe(recipe: Recipe, seeds: tuple[int, ...]) -> Plan:
    """The runs of `recipe` at paper scale: its methods × seeds, or the first stage a study of its own hands its
    executor (run with the paper's data, or stand-ins: ``embedded=False``), grouped by what a round costs (methods
    that differ only in learning rates or the size of a `SCALE_ONLY` coefficient are timed once)."""
    if recipe.custom is None:
        methods = [(m, recipe.config(m, seeds[0], quick=False)) for m in recipe.methods]
        groups = _by_cost(methods, lambda method: method[1])
        return Plan([(_alike_label([m for m, _ in g]), g[0][1], len(seeds) * len(g)) for g in groups])
    planner = _Planner()
    with tempfile.TemporaryDirectory(prefix="fedhet-estimate-") as tmp, contextlib.redirect_stdout(io.StringIO()):
        root = Path(tmp).absolute()
        try:
            recipe.custom(root, False, seeds, False, planner)
        except _Planned:
            pass
        else:
            return Plan(note=f"'{recipe.name}' trains no model (an analytic study): it has nothing to estimate")
    note = (
        f"'{recipe.name}' is a study of stages: this is its first, '{planner.stage}' ({len(planner.tasks)} runs); "
        "the runs it chooses from their results are not included"
        if planner.stage != "runs"
        else ""
    )
    tasks_by_cost = _by_cost(planner.tasks, lambda task: task.config)
    return Plan([(_group_label(tasks, root), tasks[0].config, len(tasks)) for tasks in tasks_by_cost], note)


def estimate_recipe(
    recipe: Recipe,
    seeds: tuple[int, ...] | None = None,
    scale: float = 1.0,
    changes: dict[str, Any] | None = None,
    say: Callable[[str], None] = print,
    budget_s: float = PAIRS_FOR_S,
) -> tuple[list[Estimate], str]:
    """One `Estimate` per distinct config of `recipe` (its methods, or a study's runs) with its paper data (or
    stand-ins; `scale` shrinks them, `changes` edits every config, `budget_s` bounds the timed rounds: for tests),
    over `seeds` (default the recipe's), and a note on what the estimate leaves out."""
    plan = plan_recipe(recipe, seeds or recipe.seeds)
    stand_ins = StandIns(scale)
    out = []
    probes: dict[str, _Probe] = {}
    for i, (label, raw, runs) in enumerate(plan.configs, 1):
        say(f"estimating {recipe.name} ({i}/{len(plan.configs)}): {label}")
        e = estimate_config(deep_merge(raw, changes or {}), label, runs, stand_ins, budget_s, probes)
        say(f"  {e.train_s:.3g} s a round, {e.eval_s:.3g} s an evaluation: {format_duration(e.projected_s)}")
        out.append(e)
    return out, plan.note


def estimate_run(raw: dict[str, Any], scale: float = 1.0) -> Estimate:
    """The `Estimate` of one run's config."""
    return estimate_config(raw, "run", 1, StandIns(scale))


def format_duration(seconds: float) -> str:
    """1.2 s, 3.4 min, 5.6 h or 7.8 days."""
    for unit, size in (("days", 86_400), ("h", 3_600), ("min", 60)):
        if seconds >= size:
            return f"{seconds / size:.1f} {unit}"
    return f"{seconds:.1f} s"


def _on_a_gpu(estimates: list[Estimate]) -> bool:
    return any(e.gpu_peak_mb is not None for e in estimates)


def estimate_header(estimates: list[Estimate]) -> list[str]:
    """The columns of `estimate_rows`: a GPU's peak too where a config ran on one."""
    gpu = ["GPU peak MB"] if _on_a_gpu(estimates) else []
    return ["method", "backend", "train s/round", "s/evaluation", "rounds × runs", "peak MB", *gpu, "projected"]


def estimate_rows(estimates: list[Estimate]) -> list[list[str]]:
    """Table rows (`estimate_header`), and a total row when there are several."""
    gpu = _on_a_gpu(estimates)

    def mb(value: float | None) -> list[str]:
        return [] if not gpu else ["" if value is None else f"{value:,.0f}"]

    rows = [
        [
            e.label,
            e.backend,
            f"{e.train_s:.3f}",
            f"{e.eval_s:.3f}",
            f"{e.rounds} × {e.runs}",
            f"{e.peak_mb:,.0f}",
            *mb(e.gpu_peak_mb),
            format_duration(e.projected_s),
        ]
        for e in estimates
    ]
    if len(estimates) > 1:
        total = sum(e.projected_s for e in estimates)
        peak = max(e.peak_mb for e in estimates)
        gpu_peak = max((e.gpu_peak_mb for e in estimates if e.gpu_peak_mb is not None), default=None)
        runs = f"{sum(e.runs for e in estimates)} runs"
        rows.append(["total", "", "", "", runs, f"{peak:,.0f}", *mb(gpu_peak), format_duration(total)])
    return rows
