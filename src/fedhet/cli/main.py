"""The `fedhet` command line."""

from __future__ import annotations

import errno
import gc
import os
import signal
import sys
import threading
import warnings
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from functools import wraps
from pathlib import Path
from typing import Annotated, Any, TypeVar

import typer
from rich.console import Console, ConsoleDimensions
from rich.markup import escape
from rich.table import Table
from typer.core import TyperGroup

from fedhet import notes
from fedhet.errors import FedhetError, FedhetWarning

try:  # newer typer has its own copy of click
    from typer._click.exceptions import ClickException
except ImportError:  # pragma: no cover - older typer uses click itself
    from click.exceptions import ClickException  # type: ignore[assignment]


@contextmanager
def _one_line_usage_errors() -> Iterator[None]:
    """A usage error (an unknown option, a bad option value, a missing argument) as one ``error: ...`` line on
    stderr with its exit code (2), like every other error, instead of typer's usage and box."""
    try:
        yield
    except ClickException as err:
        if type(err).__name__ == "NoArgsIsHelpError":  # `fedhet` alone: its help, as typer shows it
            raise
        text = " ".join(err.format_message().split()).rstrip(".")
        ctx = getattr(err, "ctx", None)
        hint = f"; see {ctx.command_path} --help" if ctx is not None else ""
        _say_error(text[:1].lower() + text[1:] + hint)
        raise typer.Exit(err.exit_code) from None


class OneLineErrors(TyperGroup):
    """fedhet's group of commands, whose usage errors are one line each (`_one_line_usage_errors`)."""

    def make_context(self, *args: Any, **kwargs: Any) -> Any:  # the group's own options: fedhet --bogus
        with _one_line_usage_errors():
            return super().make_context(*args, **kwargs)

    def invoke(self, ctx: Any) -> Any:  # a command's options and arguments: fedhet run --rounds many
        with _one_line_usage_errors():
            return super().invoke(ctx)


app = typer.Typer(
    name="fedhet",
    cls=OneLineErrors,
    help="Federated learning when clients differ: run, compare and plot experiments.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)
PIPE_WIDTH = 10_000  # the page width of output that is not a terminal: nothing wraps


class UnwrappedConsole(Console):
    """rich's console, except that output that is not a terminal (a pipe, a file) and has no ``COLUMNS`` is not
    wrapped at 80 columns: tables keep their rows whole and Markdown rows stay on one line."""

    @property
    def size(self) -> ConsoleDimensions:
        dims = Console.size.fget(self)  # type: ignore[attr-defined]
        if self._width is None and "COLUMNS" not in self._environ and not self.is_terminal:
            return ConsoleDimensions(PIPE_WIDTH, dims.height)
        return dims

    @size.setter
    def size(self, new_size: tuple[int, int]) -> None:
        Console.size.fset(self, new_size)  # type: ignore[attr-defined]


console = UnwrappedConsole()
err_console = UnwrappedConsole(stderr=True)
F = TypeVar("F", bound=Callable[..., Any])


def _print_version(value: bool) -> None:
    if value:
        from fedhet.version import package_version

        console.print(f"fedhet {package_version()}", highlight=False)
        raise typer.Exit()


@app.callback()
def _main(
    version: Annotated[
        bool, typer.Option("--version", help="print fedhet's version and exit", callback=_print_version, is_eager=True)
    ] = False,
) -> None:
    """Federated learning when clients differ: run, compare and plot experiments."""


class Terminated(KeyboardInterrupt):
    """SIGTERM (sent by `timeout`, Slurm, `docker stop`), raised like Ctrl-C so that a run ends the same way."""


@contextmanager
def _one_line_warnings() -> Iterator[None]:
    """While inside, a `FedhetWarning` prints as one ``warning: ...`` (or ``note: ...``) line on stderr (not Python's
    two lines), once per command: a second command in the same process (a notebook, a test) says its notes again."""
    previous = warnings.showwarning

    def show(message: Warning | str, category: type[Warning], *args: Any, **kwargs: Any) -> None:
        if issubclass(category, FedhetWarning):
            kind, text = notes.describe(message, category)
            if notes.first_time(kind, text):
                colour = "cyan" if kind == "note" else "yellow"
                err_console.print(f"[{colour}]{kind}:[/] {escape(text)}", highlight=False, soft_wrap=True)
        else:
            previous(message, category, *args, **kwargs)

    notes.forget()
    with warnings.catch_warnings():
        warnings.simplefilter("default", FedhetWarning)  # a new filter: Python forgets the warnings it has shown
        warnings.showwarning = show
        try:
            yield
        finally:
            warnings.showwarning = previous


@contextmanager
def _sigterm_as_interrupt() -> Iterator[None]:
    """While inside, SIGTERM raises `Terminated` (only the main thread can take signals)."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def handler(signum: int, frame: Any) -> None:
        raise Terminated

    previous = signal.signal(signal.SIGTERM, handler)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


def _say_error(text: str) -> None:
    err_console.print(f"[bold red]error:[/] {escape(text)}", highlight=False, soft_wrap=True)


def _os_error(err: OSError) -> str:
    """One line for a failed read or write: what, where, and what to do."""
    where = f" '{err.filename}'" if err.filename else ""
    full = err.errno in (errno.ENOSPC, errno.EDQUOT)
    text = f"cannot {'write' if full or err.errno == errno.EROFS else 'access'}{where}: {err.strerror or err}"
    hint = getattr(err, "fedhet_hint", "")
    if hint:
        return f"{text}; {'free some space, then ' if full else ''}{hint}"
    return text + ("; free some space and run the command again" if full else "")


def friendly(func: F) -> F:
    """Report fedhet errors, failed file operations and exhausted memory as one line on stderr with exit code 2 (no
    traceback); Ctrl-C and SIGTERM as one line with exit code 130 and 143."""

    @wraps(func)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        try:
            with _sigterm_as_interrupt(), _one_line_warnings():
                return func(*args, **kwargs)
        except FedhetError as err:
            _say_error(str(err))
            raise typer.Exit(2) from None
        except OSError as err:
            _say_error(_os_error(err))
            raise typer.Exit(2) from None
        except MemoryError:
            pass  # said below, once leaving this block has freed what the failed work held
        except RuntimeError as err:
            if not _out_of_memory(err):
                raise
        except SystemExit as err:  # sys.exit() in user code (a model, a plugin) must not end fedhet as a success
            _say_error(f"code the run imports (a model, a plugin) called sys.exit({err.code!r}); fedhet stopped there")
            raise typer.Exit(2) from None
        except KeyboardInterrupt as err:
            hint = getattr(err, "fedhet_hint", "")
            err_console.print(f"interrupted{'; ' + hint if hint else ''}", highlight=False, soft_wrap=True)
            raise typer.Exit(143 if isinstance(err, Terminated) else 130) from None
        gc.collect()
        try:
            _say_error(OUT_OF_MEMORY)
        except MemoryError:  # nothing left even to format the line: write it as it is
            os.write(2, f"error: {OUT_OF_MEMORY}\n".encode())
        raise typer.Exit(2)

    return wrapper  # type: ignore[return-value]


OUT_OF_MEMORY = "out of memory; lower the sizes in the config (clients, local.batch_size, the model)"


def _out_of_memory(err: RuntimeError) -> bool:
    """Whether `err` is torch's failed allocation (a RuntimeError on the CPU, torch.OutOfMemoryError on a GPU)."""
    text = str(err)
    return "can't allocate memory" in text or "out of memory" in text.lower()


EstimateOption = Annotated[
    bool,
    typer.Option(
        help="time a few rounds of each config at full size (random stand-ins of the real shapes where the data files "
        "are absent), print the projected total and peak memory; writes nothing"
    ),
]

# flags of `fedhet run` that change the run: a resume takes none of them (but --rounds)
_RUN_FLAGS = (
    "config",
    "algorithm",
    "dataset",
    "model",
    "partition",
    "seed",
    "backend",
    "out",
    "set_",
    "data_dir",
    "download",
    "overwrite",
    "estimate",
    "target_epsilon",
)


@app.command()
@friendly
def run(
    config: Annotated[Path | None, typer.Argument(help="YAML config file (optional)")] = None,
    algorithm: Annotated[str | None, typer.Option(help="algorithm name (see fedhet list)")] = None,
    dataset: Annotated[str | None, typer.Option(help="dataset name")] = None,
    model: Annotated[str | None, typer.Option(help="model name")] = None,
    partition: Annotated[str | None, typer.Option(help="partitioner name")] = None,
    rounds: Annotated[int | None, typer.Option(help="communication rounds")] = None,
    seed: Annotated[int | None, typer.Option(help="random seed")] = None,
    backend: Annotated[str | None, typer.Option(help="auto, dense, conv, vectorised or sequential")] = None,
    out: Annotated[
        Path | None, typer.Option(help="run folder to write: new, empty, or (with --overwrite) a fedhet run")
    ] = None,
    set_: Annotated[
        list[str] | None, typer.Option("--set", help="override a key, e.g. --set local.lr=0.1 (repeatable)")
    ] = None,
    data_dir: Annotated[Path | None, typer.Option(help="folder with dataset files")] = None,
    download: Annotated[bool, typer.Option(help="download missing dataset files")] = False,
    resume: Annotated[
        Path | None,
        typer.Option(
            help="continue the interrupted (or finished) run in this folder as configured there; with --rounds N, "
            "run it up to N rounds; no other flag that changes the run is taken"
        ),
    ] = None,
    quiet: Annotated[bool, typer.Option(help="no progress bar or table")] = False,
    overwrite: Annotated[
        bool, typer.Option(help="replace the fedhet run in --out (removes fedhet's files only)")
    ] = False,
    engine: Annotated[
        str, typer.Option(help="native, or flower: Flower's simulation runtime (needs the fedhet[flower] extra)")
    ] = "native",
    imports: Annotated[
        list[str] | None,
        typer.Option("--import", help="a module or .py file with your own components (plugins; repeatable)"),
    ] = None,
    nodes: Annotated[int, typer.Option(help="simulated Flower nodes holding the clients (--engine flower)")] = 2,
    track: Annotated[
        list[str] | None,
        typer.Option(help="log to a tracker: tensorboard, mlflow or wandb (repeatable; settings: the config's track)"),
    ] = None,
    estimate: EstimateOption = False,
    threads: Annotated[
        int | None,
        typer.Option(
            help="torch threads (default: torch's; per-client training of small models runs on one thread anyway)"
        ),
    ] = None,
    trust_imports: Annotated[
        bool,
        typer.Option(
            help="with --resume: import the code the run folder's config names (imports, a torch model target); "
            "only for folders you trust"
        ),
    ] = False,
    target_epsilon: Annotated[
        float | None,
        typer.Option(help="differential privacy: set the noise multiplier so that ε after the run is this"),
    ] = None,
    actors: Annotated[
        int | None,
        typer.Option(
            help="train each round's cohort on this many Ray actors (processes; --threads torch threads each), the "
            "same numbers as one process (needs the fedhet[ray] extra)"
        ),
    ] = None,
    ray: Annotated[
        str | None,
        typer.Option(help="with --actors: the Ray cluster's address (auto, or HOST:PORT; default: a local instance)"),
    ] = None,
) -> None:
    """Run one experiment and write its run folder (one fedhet process per folder; Ctrl-C or SIGTERM stops it
    cleanly and --resume continues it)."""
    if threads is not None and threads < 1:
        raise FedhetError(f"--threads {threads}: give at least 1 torch thread")
    if actors is not None or ray is not None:  # (the actors' module imports torch: a misspelt key answers without)
        from fedhet.experiments.actors import check_actors

        check_actors(actors, ray, engine, estimate)
    with _torch_threads(threads), _builder(actors, ray, threads) as builder:
        _run(
            config,
            algorithm,
            dataset,
            model,
            partition,
            rounds,
            seed,
            backend,
            out,
            set_,
            data_dir,
            download,
            resume,
            quiet,
            overwrite,
            engine,
            imports,
            nodes,
            track,
            estimate,
            trust_imports,
            target_epsilon,
            builder,
        )


@contextmanager
def _builder(actors: int | None, address: str | None, threads: int | None) -> Iterator[Any]:
    """The run's builder: the runner's own (None), or one whose training goes to `actors` Ray actors."""
    if actors is None:
        yield None
        return
    from fedhet.experiments.actors import ActorPool

    with ActorPool(actors, address, threads or 1) as pool:
        yield pool.builder


@contextmanager
def _torch_threads(count: int | None) -> Iterator[None]:
    """`fedhet.engine.threads.torch_threads`, without importing torch for nothing: a config error is reported
    before torch is imported."""
    if not count and "torch" not in sys.modules:
        yield
        return
    from fedhet.engine.threads import torch_threads

    with torch_threads(count):
        yield


def _run(
    config: Path | None,
    algorithm: str | None,
    dataset: str | None,
    model: str | None,
    partition: str | None,
    rounds: int | None,
    seed: int | None,
    backend: str | None,
    out: Path | None,
    set_: list[str] | None,
    data_dir: Path | None,
    download: bool,
    resume: Path | None,
    quiet: bool,
    overwrite: bool,
    engine: str,
    imports: list[str] | None,
    nodes: int,
    track: list[str] | None,
    estimate: bool,
    trust_imports: bool,
    target_epsilon: float | None,
    builder: Any = None,
) -> None:
    if engine not in ("native", "flower"):
        raise FedhetError(f"--engine '{engine}' is not one of: native, flower")
    if estimate and engine == "flower":
        raise FedhetError("--estimate times the native engine: leave out --engine flower")
    if resume is not None:
        given = locals()
        _refuse_run_flags(resume, [name for name in _RUN_FLAGS if given[name] not in (None, False, [])])
    if trust_imports and resume is None:
        raise FedhetError("--trust-imports goes with --resume (the code a config you pass names is imported anyway)")
    if engine == "flower":
        from fedhet.flower import require_flwr

        require_flwr()
    if resume is not None:
        _resume(resume, rounds, engine, nodes, track or [], _progress(quiet), quiet, trust_imports, builder)
        return
    from fedhet.experiments.assembly import assemble, default_run_folder
    from fedhet.experiments.config import parse_config

    raw = assemble(
        config,
        components={"algorithm": algorithm, "dataset": dataset, "model": model, "partition": partition},
        values={"rounds": rounds, "seed": seed, "backend": backend, "data_dir": data_dir, "download": download or None},
        settings={"privacy.target_epsilon": (target_epsilon, "--target-epsilon")},
        imports=imports or [],
        overrides=set_ or [],
        track=track or [],
    )
    cfg = parse_config(raw)
    if estimate:
        from fedhet.experiments.estimate import estimate_run

        _print_estimates([estimate_run(raw)], "this run")
        return
    _start(cfg, out or default_run_folder(cfg), overwrite, engine, nodes, _progress(quiet), quiet, builder)


def _refuse_run_flags(resume: Path, given: list[str]) -> None:
    """--resume takes no flag that changes the run but --rounds."""
    if given:
        flags = " and ".join(
            "the config file" if n == "config" else "--" + n.rstrip("_").replace("_", "-") for n in given
        )
        raise FedhetError(
            f"--resume continues the run as configured in '{resume}': leave out {flags} (of its settings only "
            "--rounds may change), or start a new run with --out"
        )


def _start(
    cfg: Any,
    out: Path,
    overwrite: bool,
    engine: str,
    nodes: int,
    callbacks: list[Any],
    quiet: bool,
    builder: Any = None,
) -> None:
    """Run `cfg` into the new run folder `out` on the native engine (`builder`: the runner's own, or --actors') or in
    Flower's simulation."""
    from fedhet.experiments.runfolder import check_new, prepare_new
    from fedhet.experiments.runner import run as start_run

    with _resume_hint(out):
        if engine == "flower":
            prepare_new(out, overwrite)
            state = _simulate(cfg, out, nodes, callbacks)
        else:
            if builder is not None:
                check_new(out, overwrite)  # before the actors start (a minute on a busy machine)
            state = start_run(cfg, out, callbacks, overwrite=overwrite, **({"builder": builder} if builder else {}))
    _report(state, quiet)


def _resume(
    out: Path,
    rounds: int | None,
    engine: str,
    nodes: int,
    track: list[str],
    callbacks: list[Any],
    quiet: bool,
    trust: bool = False,
    builder: Any = None,
) -> None:
    """Continue the run in `out` (up to `rounds`), with the trackers of `track` added; `trust`: the code its
    config.yaml names may be imported (``--trust-imports``); `builder`: the runner's own (None) or --actors'."""
    from fedhet.experiments.runner import resume as resume_run

    if track:
        from fedhet.experiments.tracking import trackers_for

        callbacks = [*callbacks, *trackers_for(list(track), out)]
    with _resume_hint(out):
        if engine == "flower":
            if rounds is not None:
                raise FedhetError("--rounds with --resume is not supported with --engine flower")
            state = _simulate(None, out, nodes, callbacks, trust)
        else:
            state = resume_run(out, callbacks, rounds=rounds, trust=trust, **({"builder": builder} if builder else {}))
    if state.already_finished:
        console.print(f"'{out}' is already finished ({state.round} rounds); nothing to resume", highlight=False)
        return
    _report(state, quiet)


@contextmanager
def _resume_hint(out: Path) -> Iterator[None]:
    """An interrupted run's message names its folder and the command that continues it."""
    try:
        yield
    except (KeyboardInterrupt, OSError) as err:
        if (out / "config.yaml").is_file():
            err.fedhet_hint = f"continue with: fedhet run --resume {out}"  # type: ignore[union-attr]
        raise


def _simulate(cfg: Any, out: Path, nodes: int, callbacks: list[Any], trust: bool = False) -> Any:
    from fedhet.flower.simulation import simulate

    return simulate(cfg, out, nodes, callbacks, trust=trust)


def _progress(quiet: bool) -> list[Any]:
    """The run's callbacks: its progress bar, unless `quiet`."""
    if quiet:
        return []
    from fedhet.cli.progress import ProgressBar

    return [ProgressBar(console)]


def _report(state: Any, quiet: bool) -> None:
    if quiet:
        console.print(str(state.out))
        return
    from fedhet.experiments.tracking import tracking_hints
    from fedhet.report.labels import format_value

    engine = state.experiment.engine
    nodes = getattr(engine, "nodes", None)  # a Flower run's remote engine
    backend = engine.last_backend or engine.backend_for(state.config.clients_per_round)
    where = f"Flower, {len(nodes)} nodes" if nodes is not None else f"{backend} backend"
    pool = getattr(engine, "pool", None)  # --actors
    if pool is not None:
        where += f" on {pool.count} Ray actors"
    from fedhet.experiments.selection import selected_row

    table = Table(title=f"{state.status}: {state.round} rounds in {state.wall_time_s:.1f} s ({where})")
    table.add_column("metric")
    table.add_column("final", justify="right")
    rule = state.rule
    selected = selected_row(state.history, rule) if rule is not None else {}
    if rule is not None:
        table.add_column(f"round {selected.get('round', 0):.0f} (best {rule.describe()})", justify="right")
    for key, value in state.final.items():
        if key != "round":
            chosen = [format_value(key, selected[key]) if key in selected else "-"] if rule is not None else []
            table.add_row(key, format_value(key, value), *chosen)
    console.print(table)
    console.print(f"run folder: [bold]{state.out}[/]")
    if state.out is not None:
        for line in tracking_hints(state.config.track, state.out):
            console.print(line, highlight=False, markup=False, soft_wrap=True)


@app.command("list")
@friendly
def list_(
    what: Annotated[
        str | None,
        typer.Argument(
            help="algorithms, terms, optimizers, server-optimizers, rules, schedules, tasks, datasets, partitioners, "
            "shifts, models, availability, attacks, metrics, plugins, recipes"
        ),
    ] = None,
    imports: Annotated[
        list[str] | None, typer.Option("--import", help="also list the components of this module or .py file")
    ] = None,
) -> None:
    """List every registered component with a line each, and where it comes from (fedhet or a plugin)."""
    from fedhet.cli.catalogue import component_groups
    from fedhet.registry import closest

    groups = component_groups(imports or [])
    if what is not None and what not in groups:
        raise FedhetError(f"cannot list '{what}'{closest(what, list(groups))}; choose one of: {', '.join(groups)}")
    for group, entries in groups.items():
        if what is not None and group != what:
            continue
        table = Table(title=group, show_header=False, title_justify="left")
        table.add_column("name", style="bold")
        table.add_column("description")
        table.add_column("from", style="dim")
        for name, (text, origin) in entries.items():
            table.add_row(name, text, origin)
        console.print(table)


@app.command()
@friendly
def describe(
    config: Annotated[Path | None, typer.Argument(help="YAML config file (optional; as fedhet run's)")] = None,
    dataset: Annotated[str | None, typer.Option(help="dataset name")] = None,
    partition: Annotated[str | None, typer.Option(help="partitioner name")] = None,
    seed: Annotated[int | None, typer.Option(help="random seed")] = None,
    set_: Annotated[
        list[str] | None, typer.Option("--set", help="override a key, e.g. --set shift.name=noise (repeatable)")
    ] = None,
    imports: Annotated[
        list[str] | None, typer.Option("--import", help="a module or .py file with your own components (repeatable)")
    ] = None,
    data_dir: Annotated[Path | None, typer.Option(help="folder with dataset files")] = None,
    out: Annotated[Path, typer.Option(help="folder for clients.csv and heterogeneity.png")] = Path("describe"),
) -> None:
    """Describe the clients a config makes, without training: sizes, label distributions and their distance to the
    global one (total variation, Jensen-Shannon), the shift's groups and levels; writes clients.csv and a figure."""
    from fedhet.cli.describe import describe_data
    from fedhet.experiments.assembly import assemble

    raw = assemble(
        config,
        components={"dataset": dataset, "partition": partition},
        values={"seed": seed, "data_dir": data_dir},
        imports=imports or [],
        overrides=set_ or [],
    )
    describe_data(console, raw, out)


XOption = Annotated[
    str, typer.Option("--x", help="x-axis: round, or time (the simulated clock of runs with a system model)")
]
RunsArgument = Annotated[
    list[Path],
    typer.Argument(
        help="run folders, or folders holding run folders (a sweep, a recipe); runs of one config over seeds are "
        "one line (mean ± std)"
    ),
]
LabelOption = Annotated[
    list[str] | None,
    typer.Option(
        "--label",
        help="rename a group: OLD=NEW (OLD: its shown name or its folder's, e.g. a sweep point's); or one name per "
        "path, or per group in the order found (repeatable)",
    ),
]
LogXOption = Annotated[bool, typer.Option("--log-x", help="a logarithmic x-axis on the figure")]


@app.command()
@friendly
def compare(
    runs: RunsArgument,
    plot: Annotated[Path | None, typer.Option(help="also write a PNG of curves here")] = None,
    metric: Annotated[str | None, typer.Option(help="metric to plot (default: test accuracy, else test loss)")] = None,
    column: Annotated[
        list[str] | None,
        typer.Option(help="final metric to show as a column (repeatable; default: accuracy, the task's, loss)"),
    ] = None,
    x: XOption = "round",
    target: Annotated[
        float | None,
        typer.Option(
            help="also show when --metric first reached this value (rounds- and time-to-accuracy), and draw it on "
            "the --plot figure"
        ),
    ] = None,
    label: LabelOption = None,
    logx: LogXOption = False,
) -> None:
    """Final metrics of runs side by side, at each run's selected round, best first (and their curves with --plot):
    runs of one config over seeds (a sweep's points, a recipe's methods) are one row, mean ± std; each is named by
    its recipe's method name or its method and what distinguishes it, or by --label. Rows are ranked by personalised
    test accuracy where runs have personalised models, else by test accuracy; the caption says which."""
    from fedhet.report.plots import check_target, plot_curves
    from fedhet.report.runs import read_groups
    from fedhet.report.tables import compare_table, default_columns, reach_columns

    check_target(target)
    records = read_groups(runs, label)
    metric = metric or _default_metric(records)
    table, _ = compare_table(records, tuple(column) if column else default_columns(records), width=console.width)
    console.print(table)
    if target is not None:
        header, rows = reach_columns(records, metric, target)
        reached = Table(title=f"when {metric} first reached {target:g}")
        for i, name in enumerate(header):
            reached.add_column(name, justify="left" if i == 0 else "right")
        for row in rows:
            reached.add_row(*row)
        console.print(reached)
    if plot is not None:
        console.print(f"figure: {plot_curves(records, metric, plot, x=x, target=target, logx=logx)}")


@app.command()
@friendly
def plot(
    runs: RunsArgument,
    metric: Annotated[
        str | None, typer.Option(help="metric to plot, e.g. test_accuracy (default: it, else test_loss)")
    ] = None,
    output: Annotated[Path, typer.Option("--output", "-o", help="image file to write")] = Path("plot.png"),
    x: XOption = "round",
    label: LabelOption = None,
    target: Annotated[float | None, typer.Option(help="draw a dashed horizontal line at this value")] = None,
    logx: LogXOption = False,
) -> None:
    """Plot a metric against the round (or the simulated time) for runs: one line per run, or per config over
    seeds (a sweep's points, a recipe's methods: mean ± std band), named by its recipe's method name or its method
    and what distinguishes it, or by --label."""
    from fedhet.report.plots import plot_curves
    from fedhet.report.runs import read_groups

    groups = read_groups(runs, label)
    metric = metric or _default_metric(groups)
    console.print(f"figure: {plot_curves(groups, metric, output, x=x, target=target, logx=logx)}")


def _default_metric(groups: list[Any]) -> str:
    """test_accuracy where the runs have it (classification), else test_loss (regression)."""
    have = {k for g in groups for r in g.runs for row in r.rows for k in row}
    return "test_accuracy" if "test_accuracy" in have or "test_loss" not in have else "test_loss"


WorkersOption = Annotated[
    int | None,
    typer.Option(help="runs at once, each in its own process (default: one per core; 1: one after another here)"),
]
RayOption = Annotated[
    str | None,
    typer.Option(
        "--ray",
        help="run on the Ray cluster at this address (host:port, or auto); needs fedhet[ray] and run folders on "
        "a file system every node sees",
    ),
]
ThreadsOption = Annotated[
    int | None,
    typer.Option(
        help="torch threads per run (default: one; the same config and seed give the same numbers with any --workers)"
    ),
]
INTERRUPTED = "interrupted; run the same command again to continue (finished runs are reused, cut-off runs resume)"


def _executor(
    workers: int | None, ray: str | None, threads: int | None, quiet: bool, overrides: dict[str, Any] | None = None
) -> Any:
    from fedhet.experiments.executor import Executor

    monitor = None
    if not quiet:
        from fedhet.cli.progress import RunsProgress

        monitor = RunsProgress(console)
    return Executor(workers, ray=ray, threads=threads, monitor=monitor, overrides=overrides)


@app.command()
@friendly
def sweep(
    config: Annotated[Path | None, typer.Argument(help="YAML config file; may hold a sweep: section")] = None,
    grid: Annotated[
        list[str] | None,
        typer.Option("--grid", help="a key and its values, e.g. --grid local.lr=0.01,0.05 (repeatable)"),
    ] = None,
    seeds: Annotated[int | None, typer.Option(help="seeds per point: seed, seed+1, ... (default 1)")] = None,
    out: Annotated[Path | None, typer.Option(help="sweep folder (default runs/sweep-<config name>)")] = None,
    set_: Annotated[
        list[str] | None, typer.Option("--set", help="override a key of the base config (repeatable)")
    ] = None,
    metric: Annotated[
        str | None,
        typer.Option(
            help="final metric that picks the best point (default: test_accuracy; personal_test_accuracy for "
            "personalised runs; val_loss with a validation split)"
        ),
    ] = None,
    mode: Annotated[str | None, typer.Option(help="max or min (default: min for losses, max otherwise)")] = None,
    show: Annotated[list[str] | None, typer.Option(help="another metric for the summary table (repeatable)")] = None,
    imports: Annotated[
        list[str] | None,
        typer.Option("--import", help="a module or .py file with your own components (plugins; repeatable)"),
    ] = None,
    workers: WorkersOption = None,
    ray: RayOption = None,
    threads: ThreadsOption = None,
    quiet: Annotated[bool, typer.Option(help="no progress display")] = False,
) -> None:
    """Run a grid of configs over several seeds: one run folder per point and seed, a summary (mean ± std over
    seeds) and the best point."""
    from fedhet.experiments.assembly import assemble, default_sweep_folder
    from fedhet.experiments.sweep import make_sweep, run_sweep

    raw = assemble(config, imports=imports or [], overrides=set_ or [])
    spec = make_sweep(raw, grid or [], seeds, metric, mode, show or [])
    out = out or default_sweep_folder(config)
    try:
        with _executor(workers, ray, threads, quiet) as executor:
            result = run_sweep(spec, out, executor)
    except KeyboardInterrupt:
        err_console.print(INTERRUPTED)
        raise typer.Exit(130) from None
    console.print(result.table, highlight=False, markup=False, soft_wrap=True)
    failed = [o for o in result.outcomes if o.status == "failed"]
    console.print(f"results: [bold]{out}[/] (summary.md, summary.csv, one run folder per point and seed)")
    if failed and quiet:  # no progress display said why
        for o in failed:
            err_console.print(f"failed: {o.task.label}: {o.error}", highlight=False, markup=False, soft_wrap=True)
    if failed:
        err_console.print(
            f"[red]{len(failed)} of {len(result.outcomes)} runs failed[/] (see above"
            + (f" and {out / 'errors.log'}" if any(o.detail for o in failed) else "")
            + "); run the same command again to retry them"
        )
        raise typer.Exit(1)


def _note(text: str, quiet: bool) -> None:
    if not quiet:
        console.print(f"[yellow]{escape(text)}[/]")


def _print_estimates(estimates: list[Any], title: str, note: str = "") -> None:
    from fedhet.experiments.estimate import STAND_IN_NOTE, estimate_header, estimate_rows

    if note:
        console.print(escape(note), highlight=False)
    if not estimates:
        return

    table = Table(title=f"{title}: cost on this machine (a few rounds of each config timed)")
    for column in estimate_header(estimates):
        table.add_column(column, justify="left" if column in ("method", "backend") else "right")
    for row in estimate_rows(estimates):
        table.add_row(*row)
    console.print(table)
    for e in estimates:
        if e.footprint is not None and len(estimates) == 1:  # one run: its memory by part
            for line in e.footprint.lines():
                console.print(line, highlight=False)
        if e.steps_timed:
            timed, steps = e.steps_timed
            console.print(f"{e.label}: rounds timed with {timed} of their {steps} local steps, local training scaled")
    if any(e.stand_in for e in estimates):
        console.print(f"{STAND_IN_NOTE} (the dataset files are not in the data folder); nothing was written")
    else:
        console.print("nothing was written")


@app.command()
@friendly
def reproduce(
    recipe: Annotated[str, typer.Argument(help="recipe name (fedhet list recipes)")],
    out: Annotated[Path | None, typer.Option(help="folder for the runs, table.md and figures")] = None,
    quick: Annotated[bool, typer.Option(help="a reduced version (fewer rounds and clients)")] = False,
    seeds: Annotated[int | None, typer.Option(help="number of seeds, at least 1 (default: the recipe's)")] = None,
    embedded: Annotated[
        bool | None, typer.Option("--embedded/--paper-data", help="force the embedded dataset, or the paper's")
    ] = None,
    workers: WorkersOption = None,
    ray: RayOption = None,
    threads: ThreadsOption = None,
    quiet: Annotated[bool, typer.Option(help="no progress display")] = False,
    estimate: EstimateOption = False,
    device: Annotated[
        str | None, typer.Option(help="run every config on this device: cpu or cuda (default: the recipe's, cpu)")
    ] = None,
) -> None:
    """Rerun a paper's experiment: every method over several seeds, a markdown table and figures."""
    from fedhet.experiments.assembly import default_recipe_folder
    from fedhet.experiments.reproduce import run_recipe
    from fedhet.recipes import get_recipe

    if seeds is not None and seeds < 1:
        raise FedhetError(f"--seeds {seeds}: give at least 1 seed (or leave --seeds out for the recipe's own)")
    chosen = get_recipe(recipe)
    seed_list = tuple(range(seeds)) if seeds is not None else None
    overrides = None
    if device is not None:
        from fedhet.engine.engine import resolve_device

        resolve_device(device)  # a clear error now, not in every run
        overrides = {"device": device}
    if estimate:
        from fedhet.experiments.estimate import estimate_recipe

        if quick or embedded is not None:
            raise FedhetError("--estimate sizes the paper's full experiment: leave out --quick and --embedded")

        estimates, note = estimate_recipe(chosen, seed_list, changes=overrides, say=lambda text: _note(text, quiet))
        _print_estimates(estimates, chosen.name, note)
        return
    out = out or default_recipe_folder(recipe)
    try:
        with _executor(workers, ray, threads, quiet, overrides) as executor:
            result = run_recipe(
                chosen,
                out,
                quick=quick,
                seeds=seed_list,
                embedded=embedded,
                executor=executor,
                say=lambda text: console.print(f"[yellow]{escape(text)}[/]"),
            )
    except KeyboardInterrupt:
        err_console.print(INTERRUPTED)
        raise typer.Exit(130) from None
    console.print(result.table)
    console.print(f"results: [bold]{out}[/] (table.md, figures, one run folder per method and seed)")


BENCH_COMPARATORS = (
    "fedhet's backends against a plain PyTorch loop and a vmap loop; the naive reference, pfl and Flower "
    "(pip install 'fedhet[flower]' pfl) are compared by python benchmarks/full_bench.py in a source checkout"
)


@app.command()
@friendly
def bench(
    quick: Annotated[bool, typer.Option(help="fewer repetitions and smaller sweeps (under two minutes)")] = False,
    json_file: Annotated[Path | None, typer.Option("--json", help="write every row to this JSON file")] = None,
    workload: Annotated[list[str] | None, typer.Option(help="only these workloads (repeatable)")] = None,
    threads: Annotated[int, typer.Option(help="torch threads for everything timed (0: torch's default)")] = 0,
    costs: Annotated[
        bool | None,
        typer.Option(
            "--costs/--no-costs",
            help="what the methods cost (Ditto, personalised evaluation, FedBuff) against their references; "
            "--costs alone runs only these (default: with the workloads, after them)",
        ),
    ] = None,
    device: Annotated[
        str | None,
        typer.Option(
            help="instead: the local training's achieved FLOP/s on this device (cuda, cpu) against its peak "
            "(a measured matrix product, and the data sheet's for known GPUs)"
        ),
    ] = None,
    precision: Annotated[
        str, typer.Option(help="with --device: float32, bfloat16 or float16 (torch.autocast)")
    ] = "float32",
) -> None:
    """Time whole rounds on fedhet's backends against a plain PyTorch loop, a vmap loop and the machine limit (the
    naive reference, pfl and Flower: python benchmarks/full_bench.py in a source checkout), and what the methods
    cost against their references; with --device, the FLOP/s reached on a device against its peak."""
    if device is not None:
        from fedhet.bench.device import DTYPES, device_report
        from fedhet.engine.threads import torch_threads

        if precision not in DTYPES:
            raise FedhetError(f"--precision {precision}: use float32, bfloat16 or float16")

        def line(text: str) -> None:
            console.print(text, markup=False, highlight=False)

        with torch_threads(threads):
            device_report(device, precision, quick, line)  # type: ignore[arg-type]
        return
    from fedhet.bench.costs import method_costs
    from fedhet.bench.report import rows_table, targets_table
    from fedhet.bench.run import run_bench
    from fedhet.bench.targets import check_targets
    from fedhet.engine.threads import torch_threads

    if threads < 0:
        raise FedhetError(f"--threads {threads}: give a number of threads, or 0 for torch's default")
    only = tuple(workload or ())

    def say(line: str) -> None:
        console.print(line, markup=False, highlight=False)

    targets = []
    if costs is not True:
        say(BENCH_COMPARATORS)
        rows = run_bench(quick=quick, json_path=json_file, progress=say, only=only, threads=threads)
        console.print(rows_table(rows))
        targets = check_targets(rows)
    if costs is not False:
        with torch_threads(threads or 1):  # the costs are ratios on one thread (docs/performance.md)
            targets += method_costs(quick, say)
    console.print(targets_table(targets))


def main() -> None:  # pragma: no cover
    sys.exit(app())
