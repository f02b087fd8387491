"""Run many independent runs: one after another, in worker processes on this machine, or as Ray tasks.

A `Task` is a run config and its run folder. Every run is made by `run_or_resume`, so the same task gives the same
run folder whichever way it runs (byte-identical ``metrics.csv``), a finished run is reused and a run cut off
(interrupted sweep, killed worker) is resumed from its last checkpoint. A run that fails (an error, a divergence)
is recorded in its `Outcome` and the others go on.

Worker processes are spawned (not forked) and run torch on `threads` threads each (default one: the papers'
models are small, and one thread per run on every core beats several threads per run). Ray is an optional extra
(``pip install 'fedhet[ray]'``); its workers write the run folders themselves, so the folders must be on a file
system every node sees (one machine, or a shared disk).
"""

from __future__ import annotations

import csv
import json
import os
import pickle
import time
import traceback
from collections import Counter, deque
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import FIRST_COMPLETED, Future, ProcessPoolExecutor, wait
from concurrent.futures.process import BrokenProcessPool
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from queue import Empty
from typing import TYPE_CHECKING, Any

from fedhet import atomic, notes
from fedhet.errors import ConfigError, DataError, DivergenceError, FedhetError
from fedhet.experiments.callbacks import Callback

if TYPE_CHECKING:
    from fedhet.experiments.state import RunState

DONE = ("finished", "stopped early")  # statuses of a run that ended normally
RAY_HINT = "pip install 'fedhet[ray]'"


@dataclass(frozen=True, eq=False)
class Task:
    """One run: its raw config (what a YAML file gives), its run folder, a human label and free-form facts about
    it (the sweep point, the seed, the recipe's method; callbacks such as experiment trackers read them)."""

    config: dict[str, Any]
    out: Path
    label: str = ""
    meta: dict[str, Any] = field(default_factory=dict)


CallbackFactory = Callable[[Task], list[Callback]]  # picklable (a module-level function or class instance)
Post = Callable[["RunState"], Any]  # picklable; called in the worker on the run's final state


@dataclass
class Outcome:
    """How a task ended: ``status`` is the run's (finished, stopped early) or diverged / failed, with the
    per-round metrics, what the task's `Post` returned, and a one-line ``error`` (``detail``: a traceback)."""

    task: Task
    status: str
    history: list[dict[str, float]] = field(default_factory=list)
    result: Any = None
    error: str = ""
    detail: str = ""
    wall_time_s: float = 0.0
    attempts: int = 1
    reused: bool = False  # a finished run found in its folder, not run again

    @property
    def ok(self) -> bool:
        return self.status in DONE

    @property
    def final(self) -> dict[str, float]:
        return self.history[-1] if self.history else {}

    @property
    def selected(self) -> dict[str, float]:
        """The row of the run's selected round: its best by ``selection`` (a validation metric), else its last."""
        from fedhet.experiments.config import parse_config
        from fedhet.experiments.selection import selected_row
        from fedhet.experiments.state import selection_rule

        try:
            rule = selection_rule(parse_config(self.task.config))
        except FedhetError:
            rule = None
        return selected_row(self.history, rule)

    @property
    def rounds(self) -> int:
        return int(self.final.get("round", 0))


class Monitor:
    """Told what an executor does (the CLI's progress display implements it); every hook is optional."""

    def start(self, stage: str, tasks: Sequence[Task], done: int, where: str) -> None:
        """`tasks` are about to run, `done` of them were found finished; `where` says how they run."""

    def started(self, key: int) -> None:
        """Task `key` (its index) was handed to a worker."""

    def rounds(self, key: int, done: int, total: int) -> None:
        """Task `key` has `done` of its `total` rounds (not reported from Ray tasks)."""

    def finished(self, key: int, outcome: Outcome) -> None:
        """Task `key` ended (also when it failed)."""

    def stop(self) -> None:
        """The stage is over."""


@dataclass(frozen=True)
class _Settings:
    """What every task of a stage shares (sent to the workers once per task)."""

    callbacks: CallbackFactory | None
    post: Post | None
    threads: int
    cwd: str | None = None  # Ray workers start elsewhere: relative paths in configs are the driver's


class _Reporter(Callback):
    """Passes a run's progress (rounds done of planned) to the parent."""

    def __init__(self, key: int, report: Callable[[int, int, int], None]) -> None:
        self.key, self.report = key, report

    def on_run_start(self, state: RunState) -> None:
        self.report(self.key, state.round, state.config.rounds)

    def on_round_end(self, state: RunState, metrics: dict[str, float] | None) -> bool:
        self.report(self.key, state.round, state.config.rounds)
        return False


def run_task(
    task: Task, key: int, settings: _Settings, report: Callable[[int, int, int], None] | None = None
) -> Outcome:
    """Make (or reuse, or resume) the run of `task` and say how it ended; never raises for a failed run."""
    from fedhet.engine.threads import torch_threads
    from fedhet.experiments.config import parse_config
    from fedhet.experiments.runner import run_or_resume

    started = time.perf_counter()
    try:
        with _working_dir(settings.cwd), torch_threads(settings.threads):
            if settings.cwd is not None and not task.out.parent.is_dir():
                raise FedhetError(
                    f"'{task.out.parent}' does not exist on Ray node {os.uname().nodename}: run folders must be on "
                    "a file system every node sees (choose --out there)"
                )
            listeners = list(settings.callbacks(task)) if settings.callbacks is not None else []
            if report is not None:
                listeners.append(_Reporter(key, report))
            state = run_or_resume(parse_config(task.config), task.out, listeners)
            _restore_client_columns(state)
            result = settings.post(state) if settings.post is not None else None
    except DivergenceError as err:
        return Outcome(task, "diverged", error=str(err), wall_time_s=time.perf_counter() - started)
    except FedhetError as err:
        return Outcome(task, "failed", error=str(err), wall_time_s=time.perf_counter() - started)
    except (Exception, SystemExit) as err:  # a bug, a plugin's error or sys.exit(): recorded, the other runs go on
        return Outcome(
            task,
            "failed",
            error=f"{type(err).__name__}: {err}".splitlines()[0],
            detail=traceback.format_exc(),
            wall_time_s=time.perf_counter() - started,
        )
    return Outcome(task, state.status, list(state.history), result, wall_time_s=time.perf_counter() - started)


@contextmanager
def _working_dir(path: str | None) -> Iterator[None]:
    before = os.getcwd()
    if path is not None and os.path.isdir(path):
        os.chdir(path)
    try:
        yield
    finally:
        os.chdir(before)


def _restore_client_columns(state: RunState) -> None:
    """A reused (finished) run has no per-client columns in memory: read them back from ``clients.csv``."""
    import torch

    path = state.out / "clients.csv" if state.out is not None else None
    if state.client_columns or path is None or not path.is_file():
        return
    with path.open() as f:
        rows = list(csv.DictReader(f))
    if rows:
        columns = [c for c in rows[0] if c not in ("client", "user")]  # the user (site) names are text
        state.client_columns = {
            c: torch.tensor([float(r[c]) if r[c] else float("nan") for r in rows], dtype=torch.float64) for c in columns
        }


def reuse(task: Task) -> Outcome | None:
    """The outcome of `task` read from its folder when the folder holds a finished run of this very config."""
    from fedhet.experiments.build import explicit_config, resolved_config
    from fedhet.experiments.config import dump_yaml, load_yaml, parse_config

    summary, config, metrics = (task.out / name for name in ("summary.json", "config.yaml", "metrics.csv"))
    if not (summary.is_file() and config.is_file() and metrics.is_file()):
        return None
    try:
        status = json.loads(summary.read_text()).get("status")
        written = {k: v for k, v in load_yaml(config).items() if k != "derived"}  # derived: not part of the config
        same = dump_yaml(written) == dump_yaml(resolved_config(explicit_config(parse_config(task.config))))
    except (ValueError, OSError, FedhetError):
        return None
    if status not in DONE or not same:
        return None
    with metrics.open() as f:
        history = [{k: float(v) for k, v in row.items() if v not in ("", None)} for row in csv.DictReader(f)]
    return Outcome(task, status, history, reused=True, attempts=0)


def refuse_linked_folders(root: Path, tasks: Sequence[Task]) -> None:
    """Refuse (`fedhet.atomic.LinkError`, one line) tasks whose run folder, or a folder between it and `root` (a
    sweep's point folder), is a link, or whose run folder's own files are (`refuse_links`): a sweep or recipe
    never follows one (it would write a run into another folder, perhaps another run's)."""
    from fedhet.experiments.runfolder import refuse_links

    for task in tasks:
        try:
            parts = task.out.relative_to(root).parts
        except ValueError:
            parts = ()
        for depth in range(1, len(parts)):
            atomic.refuse_link(root.joinpath(*parts[:depth]))
        atomic.refuse_link(task.out)
        if task.out.is_dir():
            refuse_links(task.out)


def write_text(path: Path, text: str) -> None:
    """Write `text` to `path` atomically (`fedhet.atomic`: a temporary file, then a rename)."""
    atomic.write_text(path, text)


def write_index(path: Path, outcomes: Sequence[Outcome]) -> None:
    """A JSON list of the runs: label, folder (relative to `path`'s folder), status and error; what the
    shell-safe folder names stand for."""
    rows = [
        {
            "label": o.task.label,
            "folder": os.path.relpath(o.task.out, path.parent.absolute()),
            "status": o.status,
            **({"error": o.error} if o.error else {}),
        }
        for o in outcomes
    ]
    write_text(path, json.dumps(rows, indent=1, ensure_ascii=False) + "\n")


def raise_failures(outcomes: Sequence[Outcome], diverged: bool = False) -> None:
    """A one-line error naming the runs that failed (and those that diverged, with `diverged`; otherwise a
    divergence is a result, not a failure)."""
    failed = [o for o in outcomes if o.status == "failed" or (diverged and o.status == "diverged")]
    if failed:
        first = failed[0]
        raise FedhetError(
            f"{len(failed)} of {len(outcomes)} runs failed, the first: {first.task.label}: {first.error}; the other "
            "runs are kept: fix the cause and run the same command again"
        )


def default_workers(threads: int = 1) -> int:
    """As many runs at once as the cores this process may use allow, with `threads` torch threads each."""
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
    return max(1, cores // max(1, threads))


class Executor:
    """Runs lists of tasks, stage after stage, serially (``workers=1``), in `workers` spawned processes, or as
    Ray tasks on the cluster at `ray` (an address such as ``127.0.0.1:6379``, or ``auto``).

    `callbacks` makes each run's callbacks (in the worker); `retries`: how often a task whose worker process died
    is started again (it resumes from its checkpoint); `overrides`: top-level config keys set in every task's
    config (``{"device": "cuda"}``). Use as a context manager, or call `close`.
    """

    def __init__(
        self,
        workers: int | None = 1,
        *,
        ray: str | None = None,
        threads: int | None = 1,
        callbacks: CallbackFactory | None = None,
        monitor: Monitor | None = None,
        retries: int = 2,
        overrides: dict[str, Any] | None = None,
    ) -> None:
        if workers is not None and workers < 1:
            raise ConfigError(f"--workers {workers}: give at least 1 (or leave it out: as many as the cores allow)")
        if threads is not None and threads < 1:
            raise ConfigError(f"--threads {threads}: give at least 1 torch thread per run")
        if ray is not None:
            import importlib.util

            if importlib.util.find_spec("ray") is None:  # before any folder is made
                raise FedhetError(f"--ray needs Ray: {RAY_HINT}")
        # None: one thread per run, however the runs are made (a run's numbers depend on its thread count: the
        # same run made here or in a worker must write the same metrics.csv)
        self.threads = threads if threads is not None else 1
        self.ray_address, self.retries = ray, retries
        self.workers = workers if workers is not None or ray is not None else default_workers(self.threads or 1)
        self.callbacks, self.monitor = callbacks, monitor or Monitor()
        self.overrides = overrides or {}
        self.history: list[Outcome] = []  # every outcome of every stage, in order
        self._data_checked: set[str] = set()
        self._pool: ProcessPoolExecutor | None = None
        self._queue: Any = None
        self._ray: Any = None

    def __enter__(self) -> Executor:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        self._close_pool()
        if self._ray is not None:
            self._ray.shutdown()
            self._ray = None

    def _where(self, pending: int) -> str:
        if self.ray_address is not None:
            return f"the Ray cluster at {self.ray_address}"
        if self.workers == 1 or pending <= 1:
            return "this process"
        return f"{min(self.workers or 1, pending)} worker processes"

    def check_data(self, tasks: Sequence[Task]) -> None:
        """Refuse in one line, before any of `tasks` runs, one whose dataset does not load (its files missing or
        damaged): each distinct dataset (and data folder) is loaded once, here (not on Ray, whose nodes may hold
        files this machine does not)."""
        from fedhet.experiments.build import components
        from fedhet.experiments.config import parse_config

        for task in tasks if self.ray_address is None else ():
            raw = {**task.config, **self.overrides}
            key = json.dumps([raw.get("dataset"), raw.get("data_dir"), raw.get("imports")], sort_keys=True, default=str)
            if key in self._data_checked or raw.get("download"):  # with download, the first run fetches the files
                continue
            cfg = parse_config(raw)
            try:
                components(cfg).dataset.load(Path(cfg.data_dir))
            except DataError as err:
                raise DataError(f"{err} (none of the {len(tasks)} runs was started)") from None
            self._data_checked.add(key)

    def run(self, tasks: Sequence[Task], post: Post | None = None, stage: str = "runs") -> list[Outcome]:
        """Run every task (reusing finished run folders when there is no `post`), in task order; a dataset that
        does not load stops them all before the first (`check_data`)."""
        tasks = [Task({**t.config, **self.overrides}, t.out.absolute(), t.label, t.meta) for t in tasks]
        twice = [folder for folder, n in Counter(t.out for t in tasks).items() if n > 1]
        if twice:
            raise ConfigError(f"two runs would share the run folder '{twice[0]}'; give them different labels")
        outcomes: list[Outcome | None] = [reuse(t) if post is None else None for t in tasks]
        pending = [i for i, o in enumerate(outcomes) if o is None]
        self.check_data([tasks[i] for i in pending])
        settings = _Settings(self.callbacks, post, self.threads)
        for task in tasks:
            task.out.parent.mkdir(parents=True, exist_ok=True)
        self.monitor.start(stage, tasks, len(tasks) - len(pending), self._where(len(pending)))
        try:
            if not pending:
                pass
            elif self.ray_address is not None:
                self._run_ray(tasks, pending, outcomes, settings)
            elif self.workers == 1 or len(pending) == 1:
                self._run_serial(tasks, pending, outcomes, settings)
            else:
                self._run_pool(tasks, pending, outcomes, settings)
        except BaseException:
            self._close_pool(terminate=True)
            raise
        finally:
            self.monitor.stop()
        done = [o for o in outcomes if o is not None]
        self.history.extend(done)
        return done

    # ---------------------------------------------------------------------------------------------- serially

    def _run_serial(
        self, tasks: list[Task], pending: list[int], outcomes: list[Outcome | None], settings: _Settings
    ) -> None:
        for i in pending:
            self.monitor.started(i)
            outcomes[i] = run_task(tasks[i], i, settings, self.monitor.rounds)
            self.monitor.finished(i, outcomes[i])  # type: ignore[arg-type]

    # ------------------------------------------------------------------------------------- worker processes

    def _start_pool(self) -> ProcessPoolExecutor:
        if self._pool is None:
            import multiprocessing

            context = multiprocessing.get_context("spawn")
            self._queue = context.Queue()
            self._pool = ProcessPoolExecutor(
                self.workers,
                mp_context=context,
                initializer=_init_worker,
                initargs=(self._queue, self.threads, os.getpid()),
            )
        return self._pool

    def _close_pool(self, terminate: bool = False) -> None:
        if self._pool is None:
            return
        pool, self._pool = self._pool, None
        if terminate:  # an interrupt: stop the runs now (each resumes from its last checkpoint next time)
            processes = list((getattr(pool, "_processes", None) or {}).values())  # shutdown forgets them
            for process in processes:
                if process.is_alive():
                    process.terminate()  # SIGTERM: the worker's run stops as on Ctrl-C (`_init_worker`)
            _join_or_kill(processes, STOP_GRACE_S)
        pool.shutdown(wait=True, cancel_futures=True)

    def _run_pool(
        self, tasks: list[Task], pending: list[int], outcomes: list[Outcome | None], settings: _Settings
    ) -> None:
        try:
            pickle.dumps((settings, tasks[pending[0]]))
        except Exception as err:
            raise ConfigError(
                f"the runs' callbacks or result function cannot be sent to worker processes ({err}); "
                "make them module-level, or run with --workers 1"
            ) from None
        todo, attempts = deque(pending), dict.fromkeys(pending, 0)
        inflight: dict[Future[Outcome], int] = {}
        while todo or inflight:
            pool = self._start_pool()
            while todo and len(inflight) < (self.workers or 1):
                i = todo.popleft()
                attempts[i] += 1
                inflight[pool.submit(_pool_task, tasks[i], i, settings)] = i
                self.monitor.started(i)
            done, _ = wait(inflight, timeout=0.25, return_when=FIRST_COMPLETED)
            self._drain()
            lost: list[int] = []
            for future in done:
                i = inflight.pop(future)
                try:
                    outcome = future.result()
                except BrokenProcessPool:
                    lost.append(i)
                    continue
                outcome.attempts = attempts[i]
                outcomes[i] = outcome
                self.monitor.finished(i, outcome)
            if lost:  # a worker died (killed, out of memory): every run of the pool is started again
                lost += list(inflight.values())
                inflight.clear()
                self._close_pool(terminate=True)
                for i in sorted(lost, reverse=True):
                    if attempts[i] <= self.retries:
                        todo.appendleft(i)
                    else:
                        outcomes[i] = Outcome(tasks[i], "failed", error=f"its worker process died {attempts[i]} times")
                        self.monitor.finished(i, outcomes[i])  # type: ignore[arg-type]
        self._drain()

    def _drain(self) -> None:
        while self._queue is not None:
            try:
                key, done, total = self._queue.get_nowait()
            except (Empty, OSError, ValueError):
                return
            if key == NOTE:  # a worker's note (`_init_worker`): shown here, once for all the runs
                notes.show_again(done, total)
            else:
                self.monitor.rounds(key, done, total)

    # ------------------------------------------------------------------------------------------------- Ray

    def _connect_ray(self) -> Any:
        if self._ray is None:
            try:
                import ray
            except ImportError:
                raise FedhetError(f"--ray needs Ray: {RAY_HINT}") from None
            import logging

            try:
                ray.init(address=self.ray_address, log_to_driver=False, logging_level=logging.WARNING)
            except (ConnectionError, RuntimeError, ValueError) as err:
                first = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
                raise FedhetError(
                    f"cannot reach the Ray cluster at '{self.ray_address}' ({first}); start one with "
                    "`ray start --head` and pass its address (or auto)"
                ) from None
            self._ray = ray
        return self._ray

    def _run_ray(
        self, tasks: list[Task], pending: list[int], outcomes: list[Outcome | None], settings: _Settings
    ) -> None:
        ray = self._connect_ray()
        settings = _Settings(settings.callbacks, settings.post, settings.threads, cwd=os.getcwd())
        per_task = max(1, self.threads)
        remote = ray.remote(run_task).options(num_cpus=per_task, max_retries=self.retries)
        capacity = self.workers or max(1, int(ray.cluster_resources().get("CPU", 1)) // per_task)
        todo = deque(pending)
        inflight: dict[Any, int] = {}
        try:
            while todo or inflight:
                while todo and len(inflight) < capacity:
                    i = todo.popleft()
                    inflight[remote.remote(tasks[i], i, settings)] = i
                    self.monitor.started(i)
                ready, _ = ray.wait(list(inflight), num_returns=1, timeout=0.25)
                for ref in ready:
                    i = inflight.pop(ref)
                    try:
                        outcome = ray.get(ref)
                    except ray.exceptions.RayError as err:  # retries used up, or the cluster went away
                        outcome = Outcome(tasks[i], "failed", error=f"Ray: {str(err).strip().splitlines()[0]}")
                    outcomes[i] = outcome
                    self.monitor.finished(i, outcome)
        except BaseException:  # an interrupt: stop the runs (each resumes from its last checkpoint next time)
            for ref in inflight:
                ray.cancel(ref)
            raise


_QUEUE: Any = None  # in a worker process: where it reports the rounds of its runs (and its notes)
NOTE = -1  # the key of a note on the queue: (NOTE, kind, text)
_IN_TASK = False  # in a worker process: whether a run is going on (SIGTERM then stops it as Ctrl-C would)
_STOPPING = False  # in a worker process: a SIGTERM has stopped the run, which is writing its files
STOP_GRACE_S = 20.0  # how long a stopped worker has to write its run's files before it is killed
PR_SET_PDEATHSIG = 1  # Linux prctl option: the signal a process gets when its parent ends


class _Stopped(KeyboardInterrupt):
    """SIGTERM in a worker: from the parent (Ctrl-C on the sweep) or because the parent died."""


def _init_worker(queue: Any, threads: int, parent: int) -> None:
    """A worker process ignores Ctrl-C (the parent stops it), stops its run on SIGTERM as Ctrl-C stops a run (the
    run folder says "interrupted" and resumes), ends with its parent however the parent ends (`_die_with_parent`),
    reports its rounds and notes to `queue`, runs torch on `threads`."""
    import signal

    import torch

    global _QUEUE
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, _on_sigterm)
    _die_with_parent(parent)
    _QUEUE = queue
    notes.forward_to(lambda kind, text: queue.put((NOTE, kind, text)))
    torch.set_num_threads(max(1, threads))


def _on_sigterm(signum: int, frame: Any) -> None:
    global _STOPPING
    if not _IN_TASK:
        os._exit(128 + signum)  # between runs: nothing to save
    if _STOPPING:  # a parent's death sends two (the kernel's and `_die_with_parent`'s watch): the second would cut
        return  # the run's files short; the watch still ends the process `STOP_GRACE_S` later
    _STOPPING = True
    raise _Stopped


def _die_with_parent(parent: int) -> None:
    """Have the kernel send this process SIGTERM when its parent ends (Linux: prctl PR_SET_PDEATHSIG), and, on any
    system, a daemon thread that does so when the parent is gone (checked every second) and kills the process
    `STOP_GRACE_S` later."""
    import signal
    import sys
    import threading

    if sys.platform.startswith("linux"):
        import contextlib
        import ctypes

        with contextlib.suppress(OSError, AttributeError):  # a libc without prctl: the thread below does it
            ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGTERM, 0, 0, 0)

    def watch() -> None:
        while os.getppid() == parent:
            time.sleep(1.0)
        os.kill(os.getpid(), signal.SIGTERM)
        time.sleep(STOP_GRACE_S)
        os._exit(137)

    threading.Thread(target=watch, name="fedhet-parent-watch", daemon=True).start()
    if os.getppid() != parent:  # the parent died before the kernel was told
        os.kill(os.getpid(), signal.SIGTERM)


def _join_or_kill(processes: Sequence[Any], grace: float) -> None:
    """Wait up to `grace` seconds for `processes` to end, then kill those left (a second Ctrl-C: at once)."""
    deadline = time.monotonic() + grace
    try:
        for process in processes:
            process.join(max(0.0, deadline - time.monotonic()))
    except KeyboardInterrupt:
        pass
    for process in processes:
        if process.is_alive():
            process.kill()
            process.join()


def _report(key: int, done: int, total: int) -> None:
    if _QUEUE is not None:
        _QUEUE.put((key, done, total))


def _pool_task(task: Task, key: int, settings: _Settings) -> Outcome:
    global _IN_TASK
    _IN_TASK = True
    try:
        return run_task(task, key, settings, _report)
    except KeyboardInterrupt:  # stopped (`_on_sigterm`): the run has written its files; the pool is going away
        os._exit(143)
    finally:
        _IN_TASK = False
