"""The metric plugin contract: declared columns (a clash with a built-in column, another plugin's or the strategy's is
one line), the run's clients and seed, and seeded streams."""

from __future__ import annotations

import textwrap
from pathlib import Path
from typing import Any

import pytest

from fedhet.errors import ConfigError, FedhetError
from fedhet.experiments.build import components
from fedhet.experiments.config import parse_config
from fedhet.experiments.runner import run
from fedhet.metrics.base import METRIC_PLUGINS
from fedhet.seeding import numpy_rng

PLUGINS = textwrap.dedent(
    """
    from typing import ClassVar

    from fedhet.metrics.base import METRIC_PLUGINS, Metric


    @METRIC_PLUGINS.register
    class Overwrites(Metric):
        name: ClassVar[str] = "t_overwrites"
        description: ClassVar[str] = "claims a built-in column"
        column: str = "test_accuracy"
        file: str = "metrics.csv"

        def columns(self):
            return (self.column,) if self.file == "metrics.csv" else ()

        def client_columns(self):
            return (self.column,) if self.file == "clients.csv" else ()

        def compute(self, view):
            return {self.column: -1.0}, {}


    @METRIC_PLUGINS.register
    class Undeclared(Metric):
        name: ClassVar[str] = "t_undeclared"
        description: ClassVar[str] = "writes a column it does not declare"
        client: bool = False

        def compute(self, view):
            if self.client:
                return {}, {"sneaky": view.test.loss}
            return {"sneaky": 1.0}, {}


    @METRIC_PLUGINS.register
    class Seeded(Metric):
        name: ClassVar[str] = "t_seeded"
        description: ClassVar[str] = "draws from the run's seed"
        needs_all_clients: ClassVar[bool] = False

        def columns(self):
            return ("t_draw", "t_clients", "t_seed")

        def compute(self, view):
            draw = float(self.rng("t_seeded", view.round).random())
            return {"t_draw": draw, "t_clients": float(self.num_clients), "t_seed": float(self.seed)}, {}
    """
)
SMALL: dict[str, Any] = {
    "num_clients": 5,
    "clients_per_round": 3,
    "rounds": 2,
    "model": {"name": "mlp", "hidden": [8]},
    "local": {"steps": 2},
    "seed": 4,
}


@pytest.fixture(scope="module")
def plugin_file(tmp_path_factory: pytest.TempPathFactory) -> str:
    path = tmp_path_factory.mktemp("plugins") / "metric_contract_plugins.py"
    path.write_text(PLUGINS)
    return str(path)


def config(plugin_file: str, metrics: list[Any], **changes: Any) -> dict[str, Any]:
    return {**SMALL, "imports": [plugin_file], "metrics": metrics, **changes}


def one_line(err: pytest.ExceptionInfo[BaseException]) -> str:
    text = str(err.value)
    assert "\n" not in text
    return text


def test_a_plugin_that_names_a_built_in_column_is_refused_before_the_run(plugin_file: str, tmp_path: Path) -> None:
    with pytest.raises(ConfigError) as err:
        components(parse_config(config(plugin_file, ["t_overwrites"])))
    assert one_line(err) == (
        "metrics[0] ('t_overwrites') writes the metrics.csv column 'test_accuracy', which fedhet writes itself; give "
        "the plugin's column another name"
    )
    with pytest.raises(ConfigError, match=r"clients.csv column 'test_loss', which fedhet writes itself"):
        components(
            parse_config(config(plugin_file, [{"name": "t_overwrites", "column": "test_loss", "file": "clients.csv"}]))
        )
    with pytest.raises(ConfigError):
        run(parse_config(config(plugin_file, ["t_overwrites"])), tmp_path / "run")
    assert not (tmp_path / "run").exists()  # refused before anything was written


def test_two_plugins_that_write_one_column_are_refused(plugin_file: str) -> None:
    twice = [{"name": "t_overwrites", "column": "mine"}, {"name": "t_overwrites", "column": "mine"}]
    with pytest.raises(ConfigError) as err:
        components(parse_config(config(plugin_file, twice)))
    assert (
        "metrics[1] ('t_overwrites') writes the metrics.csv column 'mine', which metric plugin 't_overwrites' "
        "writes too" in one_line(err)
    )
    components(parse_config(config(plugin_file, [twice[0], {"name": "t_overwrites", "column": "other"}])))


def test_a_column_written_but_not_declared_stops_the_run(plugin_file: str) -> None:
    with pytest.raises(FedhetError) as err:
        run(parse_config(config(plugin_file, ["t_undeclared"])))
    assert "metric plugin 't_undeclared' wrote the metrics.csv column 'sneaky' that it does not declare" in one_line(
        err
    )
    with pytest.raises(FedhetError, match=r"clients.csv column 'sneaky'.*client_columns\(\)"):
        run(parse_config(config(plugin_file, [{"name": "t_undeclared", "client": True}])))


def test_a_column_the_strategy_writes_stops_the_run(plugin_file: str) -> None:
    metrics = [{"name": "t_overwrites", "column": "qffl_loss_max"}]
    with pytest.raises(FedhetError) as err:
        run(parse_config(config(plugin_file, metrics, algorithm="qffl")))
    assert "'qffl_loss_max', which the strategy writes too" in one_line(err)


def test_a_plugin_sees_the_runs_clients_and_seed_and_draws_from_its_streams(plugin_file: str) -> None:
    first = run(parse_config(config(plugin_file, ["t_seeded"])))
    again = run(parse_config(config(plugin_file, ["t_seeded"])))
    for row, same in zip(first.history, again.history, strict=True):
        assert row["t_draw"] == same["t_draw"] == numpy_rng(4, "t_seeded", int(row["round"])).random()
        assert row["t_clients"] == 5 and row["t_seed"] == 4
    assert first.history[0]["t_draw"] != first.history[1]["t_draw"]


def test_num_clients_and_seed_before_setup_say_how_to_fix_it(plugin_file: str) -> None:
    plugin = components(parse_config(config(plugin_file, ["t_seeded"]))).metrics[0]
    with pytest.raises(RuntimeError, match=r"super\(\).setup\(\)"):
        _ = plugin.num_clients


def test_every_built_in_plugin_declares_what_it_writes() -> None:
    """The built-in plugins declare columns that clash with nothing fedhet writes, and with each other only where
    they measure the same thing under the same name (none do)."""
    builtin = [name for name in METRIC_PLUGINS.names() if METRIC_PLUGINS.origin(name) == "fedhet"]
    plugins = [METRIC_PLUGINS.build(name) for name in builtin]
    assert len(plugins) >= 6
    for plugin in plugins:
        assert plugin.columns() or plugin.client_columns(), plugin.name
    from fedhet.metrics.base import check_columns

    check_columns(plugins)
