"""`fedhet compare` and `fedhet plot` on a recipe-like folder of real runs (issue 42, item 3): the methods' names,
personalised runs ranked by their personalised accuracy with those columns first, --label renames, a target line
and a log x-axis; bad --label and damaged runs.json files in one line or not at all."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from fedhet.cli.main import app

runner = CliRunner()
FAST = ["--dataset", "digits", "--rounds", "2", "--set", "num_clients=6", "--set", "model.hidden=[8]", "--quiet"]
METHODS = {
    "FedAvg": ["--algorithm", "fedavg", "--set", "personal_eval.enabled=true"],
    "Ditto": ["--algorithm", "ditto"],
}


def invoke(*args: str) -> tuple[int, str, str]:
    result = runner.invoke(app, list(args), env={"COLUMNS": "200"})
    return result.exit_code, result.stdout, result.stderr


@pytest.fixture(scope="module")
def recipe(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Two methods' runs as `fedhet reproduce` lays them out: OUT/<method>/seed0 and runs.json naming them."""
    root = tmp_path_factory.mktemp("recipe") / "personal"
    index = []
    for method, args in METHODS.items():
        code, out, err = invoke("run", *FAST, *args, "--set", "personal_eval.appeal=false", "--out",
                                str(root / method / "seed0"))  # fmt: skip
        assert code == 0, out + err
        index.append({"label": f"{method}, seed 0", "folder": f"{method}/seed0", "status": "finished"})
    (root / "runs.json").write_text(json.dumps(index))
    return root


@pytest.fixture
def written(tmp_path: Path) -> Path:
    """The same layout with run folders written directly (fast): FedAvg and Ditto, one seed each."""
    root = tmp_path / "written"
    for i, (method, algorithm) in enumerate((("FedAvg", "fedavg"), ("Ditto", "ditto"))):
        folder = root / method / "seed0"
        folder.mkdir(parents=True)
        (folder / "metrics.csv").write_text(f"round,test_accuracy\n1,0.5\n2,{0.6 + 0.1 * i}\n")
        (folder / "summary.json").write_text(json.dumps({"rounds": 2, "final": {"test_accuracy": 0.6 + 0.1 * i}}))
        (folder / "config.yaml").write_text(f"algorithm: {{name: {algorithm}}}\nseed: 0\nrounds: 2\n")
    index = [{"label": f"{m}, seed 0", "folder": f"{m}/seed0", "status": "finished"} for m in ("FedAvg", "Ditto")]
    (root / "runs.json").write_text(json.dumps(index))
    return root


def table_rows(out: str) -> list[str]:
    """The first cell of each row of the first rich table (the run's name)."""
    first = out.split("└")[0]
    return [line.split("│")[1].strip() for line in first.splitlines() if line.startswith("│")]


@pytest.mark.slow
def test_compare_names_methods_ranks_by_personal_accuracy_and_plots_a_target(recipe: Path, tmp_path: Path) -> None:
    code, out, err = invoke("compare", str(recipe), "--plot", str(tmp_path / "c.png"), "--target", "0.5", "--log-x")
    assert code == 0, out + err
    finals = {m: json.loads((recipe / m / "seed0" / "summary.json").read_text())["final"] for m in METHODS}
    order = sorted(METHODS, key=lambda m: -finals[m]["personal_test_accuracy"])
    assert table_rows(out) == order  # the recipe's names, best personalised accuracy first
    header = next(line for line in out.splitlines() if line.startswith("┃"))
    assert header.index("pers. acc") < header.index(" acc ")  # personal columns first
    assert "rows ranked by personalised test accuracy" in " ".join(out.split())
    assert (tmp_path / "c.png").stat().st_size > 1000 and "when test_accuracy first reached 0.5" in out
    code, out, err = invoke("plot", str(recipe), "--label", "Ditto=mine", "-o", str(tmp_path / "p.png"))
    assert code == 0 and (tmp_path / "p.png").stat().st_size > 1000, out + err
    code, out, err = invoke("compare", str(recipe), "--label", "Ditto=mine", "--column", "test_accuracy")
    assert code == 0 and sorted(table_rows(out)) == ["FedAvg", "mine"], out + err


@pytest.mark.parametrize(
    ("labels", "fragment"),
    [
        (["a", "b", "c"], "3 --label for 1 paths and 2 groups"),
        (["Ditto=mine", "other"], "not both"),
        (["Ditto=same", "FedAvg=same"], "two groups would be called 'same'"),
        (["Ditto=", "FedAvg=x"], "cannot be empty"),
        (["--target", "inf"], "--target inf: give a finite number"),
        (["--target", "nan"], "--target nan: give a finite number"),
    ],
)
def test_bad_labels_and_targets_are_one_line_exit_2_and_write_nothing(
    written: Path, tmp_path: Path, labels: list[str], fragment: str
) -> None:
    args = labels if labels[0].startswith("--") else [part for label in labels for part in ("--label", label)]
    code, out, err = invoke("plot", str(written), *args, "-o", str(tmp_path / "p.png"))
    assert code == 2 and out == "" and len(err.strip().splitlines()) == 1 and fragment in err, (out, err)
    assert not (tmp_path / "p.png").exists()
    code, out, err = invoke("compare", str(written), *args, "--plot", str(tmp_path / "p.png"))
    assert code == 2 and out == "" and len(err.strip().splitlines()) == 1 and fragment in err, (out, err)
    assert not (tmp_path / "p.png").exists()


@pytest.mark.parametrize(
    "index",
    [
        "[{]",  # not JSON
        "[" * 100_000 + "]" * 100_000,  # nested too deeply
        '{"label": "x"}',  # not a list
        '[{"label": 3, "folder": "Ditto/seed0"}, {"label": "FedAvg, seed 0", "folder": ["x"]}]',  # wrong types
    ],
)
def test_a_damaged_runs_json_leaves_the_runs_named_from_their_configs(written: Path, index: str) -> None:
    (written / "runs.json").write_text(index)
    code, out, err = invoke("compare", str(written), "--column", "test_accuracy")
    assert code == 0 and err == "", out + err
    names = table_rows(out)
    assert len(names) == 2 and all(len(n) <= 60 for n in names) and "ditto" in " ".join(names).lower(), names


def test_a_name_from_runs_json_is_one_printable_line_of_at_most_60_characters(written: Path) -> None:
    from fedhet.report.runs import read_groups

    label = "a\nvery\u0000long" + " name" * 40
    (written / "runs.json").write_text(json.dumps([{"label": label, "folder": "Ditto/seed0"}]))
    names = sorted(g.label for g in read_groups([written]))
    assert names[0].startswith("a very long name name") and len(names[0]) == 60 and names[0].endswith("…")
    assert names[1] == "fedavg"  # not in runs.json: named from its config
