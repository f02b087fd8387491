"""The compare table: fits the terminal (dropping columns visibly), counts as integers."""

from __future__ import annotations

from pathlib import Path

from rich.console import Console

from fedhet.report.runs import RunGroup, RunRecord
from fedhet.report.tables import DEFAULT_COLUMNS, compare_table, default_columns, final_rows, ranking


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


def test_personalised_runs_show_their_columns_first_and_rank_by_personal_accuracy() -> None:
    def group(name: str, accuracy: float, personal: float | None) -> RunGroup:
        final = {"test_accuracy": accuracy, "test_loss": 0.5}
        if personal is not None:
            final |= {"personal_test_accuracy": personal, "personal_test_accuracy_worst10": personal - 0.1}
        return RunGroup(name, [RunRecord(Path(name), {"rounds": 5, "final": final}, [], label=name)])

    groups = [group("FedAvg", 0.9, None), group("Ditto", 0.8, 0.95), group("FedRep", 0.2, 0.97)]
    columns = default_columns(groups)
    assert columns[:3] == ("personal_test_accuracy", "personal_test_accuracy_worst10", "test_accuracy")
    ranked, rule = ranking(groups)
    assert [g.label for g in ranked] == ["FedRep", "Ditto", "FedAvg"]  # FedAvg: its global model, 0.9
    assert "personalised test accuracy" in rule
    table, _ = compare_table(groups, columns)
    lines = render(table, 200)
    names = [line.split()[1] for line in lines if len(line.split()) > 1]
    assert [n for n in names if n in ("FedRep", "Ditto", "FedAvg")] == ["FedRep", "Ditto", "FedAvg"]
    assert "rows ranked by personalised test accuracy" in " ".join(" ".join(lines).split())
    plain = [group("a", 0.5, None), group("b", 0.7, None), group("c", float("nan"), None)]
    assert [g.label for g in ranking(plain)[0]] == ["b", "a", "c"]  # no value: last
