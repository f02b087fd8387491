"""The `fedhet` command line."""

from __future__ import annotations

import shutil
import sys
import time
from collections.abc import Callable
from functools import wraps
from pathlib import Path
from typing import Annotated, Any, TypeVar

import typer
from rich.console import Console
from rich.markup import escape
from rich.table import Table

from fedhet.errors import FedhetError

app = typer.Typer(
    name="fedhet",
    help="Federated learning when clients differ: run, compare and plot experiments.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)
console = Console()
err_console = Console(stderr=True)
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


def friendly(func: F) -> F:
    """Report fedhet errors as one line on stderr with exit code 2 (no traceback)."""

    @wraps(func)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        try:
            return func(*args, **kwargs)
        except FedhetError as err:
            err_console.print(f"[bold red]error:[/] {escape(str(err))}", highlight=False, soft_wrap=True)
            raise typer.Exit(2) from None
        except KeyboardInterrupt:
            err_console.print("interrupted; continue with: fedhet run --resume <run folder>")
            raise typer.Exit(130) from None

    return wrapper  # type: ignore[return-value]


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
    backend: Annotated[str | None, typer.Option(help="auto, sequential or vectorised")] = None,
    out: Annotated[Path | None, typer.Option(help="run folder to write")] = None,
    set_: Annotated[
        list[str] | None, typer.Option("--set", help="override a key, e.g. --set local.lr=0.1 (repeatable)")
    ] = None,
    data_dir: Annotated[Path | None, typer.Option(help="folder with dataset files")] = None,
    download: Annotated[bool, typer.Option(help="download missing dataset files")] = False,
    resume: Annotated[Path | None, typer.Option(help="continue the interrupted run in this folder")] = None,
    quiet: Annotated[bool, typer.Option(help="no progress bar or table")] = False,
    overwrite: Annotated[bool, typer.Option(help="replace an existing run in --out")] = False,
    engine: Annotated[
        str, typer.Option(help="native, or flower: Flower's simulation runtime (needs the fedhet[flower] extra)")
    ] = "native",
    imports: Annotated[
        list[str] | None,
        typer.Option("--import", help="a module or .py file with your own components (plugins; repeatable)"),
    ] = None,
    nodes: Annotated[int, typer.Option(help="simulated Flower nodes holding the clients (--engine flower)")] = 2,
) -> None:
    """Run one experiment and write its run folder."""
    from fedhet.experiments.config import apply_override, load_yaml, parse_config, set_component
    from fedhet.experiments.runner import CHECKPOINT
    from fedhet.experiments.runner import resume as resume_run
    from fedhet.experiments.runner import run as start_run

    callbacks = [] if quiet else [_progress()]
    if engine not in ("native", "flower"):
        raise FedhetError(f"--engine '{engine}' is not one of: native, flower")
    if engine == "flower":
        from fedhet.flower import require_flwr

        require_flwr()
    if resume is not None:
        state = _simulate(None, resume, nodes, callbacks) if engine == "flower" else resume_run(resume, callbacks)
        _report(state, quiet)
        return
    raw: dict[str, Any] = load_yaml(config) if config is not None else {}
    for key, value in (
        ("algorithm", algorithm),
        ("dataset", dataset),
        ("model", model),
        ("partition", partition),
    ):
        if value is not None:
            set_component(raw, key, value)
    for key, flag in (("rounds", rounds), ("seed", seed), ("backend", backend), ("data_dir", data_dir)):
        if flag is not None:
            raw[key] = str(flag) if isinstance(flag, Path) else flag
    if download:
        raw["download"] = True
    if imports:
        raw["imports"] = [*raw.get("imports", []), *imports]
    for assignment in set_ or []:
        apply_override(raw, assignment)
    cfg = parse_config(raw)
    if out is None:
        out = (
            Path("runs")
            / f"{cfg.spec('algorithm')['name']}_{cfg.spec('dataset')['name']}_seed{cfg.seed}_{int(time.time())}"
        )
    if (out / CHECKPOINT).exists() and overwrite:
        shutil.rmtree(out)
    if (out / CHECKPOINT).exists():
        raise FedhetError(
            f"'{out}' already holds a run; continue it with --resume {out} or choose another --out (or --overwrite)"
        )
    state = _simulate(cfg, out, nodes, callbacks) if engine == "flower" else start_run(cfg, out, callbacks)
    _report(state, quiet)


def _simulate(cfg: Any, out: Path, nodes: int, callbacks: list[Any]) -> Any:
    from fedhet.flower.simulation import simulate

    return simulate(cfg, out, nodes, callbacks)


def _progress() -> Any:
    from fedhet.cli.progress import ProgressBar

    return ProgressBar(console)


def _report(state: Any, quiet: bool) -> None:
    if quiet:
        console.print(str(state.out))
        return
    engine = state.experiment.engine
    nodes = getattr(engine, "nodes", None)  # a Flower run's remote engine
    backend = engine.backend_for(state.config.clients_per_round)
    where = f"Flower, {len(nodes)} nodes" if nodes is not None else f"{backend} backend"
    table = Table(title=f"{state.status}: {state.round} rounds in {state.wall_time_s:.1f} s ({where})")
    table.add_column("metric")
    table.add_column("final", justify="right")
    for key, value in state.final.items():
        if key != "round":
            table.add_row(key, f"{value:.4f}")
    console.print(table)
    console.print(f"run folder: [bold]{state.out}[/]")


@app.command("list")
@friendly
def list_(
    what: Annotated[
        str | None,
        typer.Argument(
            help="algorithms, terms, optimizers, server-optimizers, rules, datasets, partitioners, models, "
            "availability, attacks, metrics, plugins, recipes"
        ),
    ] = None,
    imports: Annotated[
        list[str] | None, typer.Option("--import", help="also list the components of this module or .py file")
    ] = None,
) -> None:
    """List every registered component with a line each, and where it comes from (fedhet or a plugin)."""
    from fedhet import catalog
    from fedhet.metrics import METRICS
    from fedhet.plugins import load_plugins
    from fedhet.recipes import RECIPES
    from fedhet.registry import Registry, closest

    load_plugins(imports or [])
    registries: dict[str, Registry[Any]] = {
        "algorithms": catalog.STRATEGIES,
        "terms": catalog.TERMS,
        "optimizers": catalog.OPTIMIZERS,
        "server-optimizers": catalog.SERVER_OPTIMIZERS,
        "rules": catalog.RULES,
        "datasets": catalog.DATASETS,
        "partitioners": catalog.PARTITIONERS,
        "models": catalog.MODELS,
        "availability": catalog.AVAILABILITY,
        "attacks": catalog.ATTACKS,
        "plugins": catalog.METRIC_PLUGINS,
    }
    groups: dict[str, dict[str, tuple[str, str]]] = {
        group: {c.name: (c.description, registry.origin(c.name)) for c in registry}
        for group, registry in registries.items()
    }
    groups["metrics"] = {name: (text, "fedhet") for name, text in METRICS.items()}
    groups["recipes"] = {name: (factory().description, "fedhet") for name, factory in sorted(RECIPES.items())}
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
def compare(
    runs: Annotated[list[Path], typer.Argument(help="run folders")],
    plot: Annotated[Path | None, typer.Option(help="also write a PNG of curves here")] = None,
    metric: Annotated[str, typer.Option(help="metric to plot")] = "test_accuracy",
) -> None:
    """Final metrics of several runs side by side (and their curves with --plot)."""
    from fedhet.report.plots import plot_curves
    from fedhet.report.runs import read_run
    from fedhet.report.tables import compare_table

    records = [read_run(p) for p in runs]
    console.print(compare_table(records))
    if plot is not None:
        console.print(f"figure: {plot_curves(records, metric, plot)}")


@app.command()
@friendly
def plot(
    runs: Annotated[list[Path], typer.Argument(help="run folders")],
    metric: Annotated[str, typer.Option(help="metric to plot, e.g. test_accuracy")] = "test_accuracy",
    output: Annotated[Path, typer.Option("--output", "-o", help="image file to write")] = Path("plot.png"),
) -> None:
    """Plot a metric against the round for one or more runs."""
    from fedhet.report.plots import plot_curves
    from fedhet.report.runs import read_run

    console.print(f"figure: {plot_curves([read_run(p) for p in runs], metric, output)}")


@app.command()
@friendly
def reproduce(
    recipe: Annotated[str, typer.Argument(help="recipe name (fedhet list recipes)")],
    out: Annotated[Path | None, typer.Option(help="folder for the runs, table.md and figures")] = None,
    quick: Annotated[bool, typer.Option(help="a reduced version (fewer rounds and clients)")] = False,
    seeds: Annotated[int | None, typer.Option(help="number of seeds (default: the recipe's)")] = None,
    embedded: Annotated[
        bool | None, typer.Option("--embedded/--paper-data", help="force the embedded dataset, or the paper's")
    ] = None,
    quiet: Annotated[bool, typer.Option(help="no progress bars")] = False,
) -> None:
    """Rerun a paper's experiment: every method over several seeds, a markdown table and figures."""
    from fedhet.experiments.recipes import run_recipe
    from fedhet.recipes import get_recipe

    chosen = get_recipe(recipe)
    out = out or Path("runs") / recipe
    seed_list = tuple(range(seeds)) if seeds is not None else None
    result = run_recipe(
        chosen,
        out,
        quick=quick,
        seeds=seed_list,
        embedded=embedded,
        callbacks=None if quiet else (lambda method, seed: [_progress()]),
        say=lambda text: console.print(f"[yellow]{text}[/]"),
    )
    console.print(result.table)
    console.print(f"results: [bold]{out}[/] (table.md, figures, one run folder per method and seed)")


@app.command()
@friendly
def bench(
    quick: Annotated[bool, typer.Option(help="fewer repetitions and smaller sweeps (under two minutes)")] = False,
    json_file: Annotated[Path | None, typer.Option("--json", help="write every row to this JSON file")] = None,
    workload: Annotated[list[str] | None, typer.Option(help="only these workloads (repeatable)")] = None,
    flower: Annotated[bool, typer.Option(help="include Flower's simulation when flwr is installed")] = True,
    threads: Annotated[int, typer.Option(help="torch threads for everything timed (0: torch's default)")] = 0,
) -> None:
    """Time whole rounds on fedhet's backends, a naive reference, Flower (if installed) and the machine limit."""
    from fedhet.bench.report import rows_table, targets_table
    from fedhet.bench.run import run_bench
    from fedhet.bench.targets import check_targets

    only = tuple(workload or ())

    def say(line: str) -> None:
        console.print(line, markup=False, highlight=False)

    rows = run_bench(quick=quick, json_path=json_file, progress=say, only=only, flower=flower, threads=threads)
    console.print(rows_table(rows))
    console.print(targets_table(check_targets(rows)))


def main() -> None:  # pragma: no cover
    sys.exit(app())
