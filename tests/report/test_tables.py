"""The compare table: fits the terminal (dropping columns visibly), counts as integers."""

from __future__ import annotations

from pathlib import Path

from rich.console import Console

from fedhet.report.runs import RunGroup, RunRecord
from fedhet.report.tables import DEFAULT_COLUMNS, compare_table, default_columns, final_rows


def records(n: int = 3) -> list[RunRecord]:
    final = {c: 0.123456 for c in DEFAULT_COLUMNS} | {"participants": 10.0, "available": 20.0}
    return [
        RunRecord(Path(f"r{i}"), {"rounds": 50, "final": final}, [], label=f"fedprox mu=0.{i}, local.lr=0.05, seed {i}")
        for i in range(n)
    ]


def render(table: object, width: int) -> list[str]:
    console = Console(width=width, record=True, file=open("/dev/null", "w"))  # noqa: SIM115
    console.print(table)
    return console.export_text().splitlines()


def test_the_table_fits_80_columns_and_says_what_it_left_out() -> None:
    columns = (*DEFAULT_COLUMNS, "participants")
    table, dropped = compare_table(records(), columns, width=80)
    lines = render(table, 80)
    assert max(len(line) for line in lines) <= 80
    assert dropped and set(dropped) < set(columns)
    text = "\n".join(lines)
    assert "left out to fit 80 columns" in text and "--column" in text
    assert "train loss" in text  # named in the caption
    wide, none = compare_table(records(), columns, width=200)
    assert none == () and max(len(line) for line in render(wide, 200)) <= 200


def test_counts_print_as_integers() -> None:
    rows = final_rows(records(1), ("test_accuracy", "participants", "available"))
    assert rows[0][1:] == ["50", "0.1235", "10", "20"]


def test_groups_of_seeds_show_mean_and_std_at_each_runs_selected_round() -> None:
    def run(seed: int, last: float, best: float) -> RunRecord:
        summary = {
            "rounds": 5,
            "final": {"round": 5.0, "test_accuracy": last},
            "selection": {"metric": "val_loss", "mode": "min", "round": 3},
            "selected": {"round": 3.0, "test_accuracy": best},
        }
        return RunRecord(Path(f"s{seed}"), summary, [], {"seed": seed}, label="fedavg")

    group = RunGroup("fedavg", [run(0, 0.9, 0.6), run(1, 0.9, 0.8)])
    rows = final_rows([group], ("test_accuracy",))
    assert rows == [["fedavg", "5", "0.7000 ± 0.1414"]]  # the selected rounds' 0.6 and 0.8, not the last 0.9
    table, _ = compare_table([group], ("test_accuracy",))
    text = " ".join(" ".join(render(table, 200)).split())
    assert "mean ± std over 2 seeds per row" in text and "values at each run's best round by val_loss (min)" in text
    assert default_columns([group]) == ("test_accuracy",)
