"""CSV and Parquet tables as a Dataset (`table` source), with the bad inputs people have."""

from __future__ import annotations

import csv
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import torch

from fedhet.catalog import DATASETS
from fedhet.data.tables import MAX_CATEGORIES
from fedhet.datasets import load
from fedhet.errors import DataError, FedhetNote

ONE_LINE = "^[^\n]+$"


def write_csv(path: Path, rows: list[list[Any]], delimiter: str = ",") -> Path:
    with path.open("w", newline="") as f:
        csv.writer(f, delimiter=delimiter).writerows(rows)
    return path


HEADER = ["age", "colour", "height", "who", "label"]
ROWS = [
    [30, "red", 1.5, "ann", "yes"],
    [40, "blue", 1.7, "bob", "no"],
    [50, "red", 1.9, "ann", "yes"],
    [20, "green", 1.6, "cat", "maybe"],
]


def table(path: Path, **spec: Any) -> Any:
    return load({"name": "table", "path": str(path), **spec})


def test_csv_numeric_and_one_hot_columns_by_hand(tmp_path: Path) -> None:
    path = write_csv(tmp_path / "people.csv", [HEADER, *ROWS])
    data = table(path, label="label", categorical=["colour"], user="who", standardize=False)
    # features in order: age, colour=blue, colour=green, colour=red, height
    expected = [[30, 0, 0, 1, 1.5], [40, 1, 0, 0, 1.7], [50, 0, 0, 1, 1.9], [20, 0, 1, 0, 1.6]]
    assert torch.allclose(data.x, torch.tensor(expected, dtype=torch.float32))
    assert data.y.tolist() == [2, 1, 2, 0] and data.num_classes == 3  # maybe < no < yes
    assert data.users is not None and data.users.tolist() == [0, 1, 0, 2]
    assert data.name == "people"


def test_numeric_columns_are_standardised_and_one_hot_columns_are_not(tmp_path: Path) -> None:
    path = write_csv(tmp_path / "people.csv", [HEADER, *ROWS])
    data = table(path, label="label", categorical=["colour"], features=["age", "colour"])
    age = np.array([30, 40, 50, 20.0])
    assert torch.allclose(data.x[:, 0], torch.tensor((age - age.mean()) / age.std(), dtype=torch.float32))
    assert data.x[:, 1:].tolist() == [[0, 0, 1], [1, 0, 0], [0, 0, 1], [0, 1, 0]]


def test_numeric_labels_are_numbered_in_sorted_order(tmp_path: Path) -> None:
    path = write_csv(tmp_path / "t.csv", [["f", "y"], [1, -1], [2, 1], [3, 1], [4, 5]])
    data = table(path, label="y")
    assert data.y.tolist() == [0, 1, 1, 2] and data.num_classes == 3


def test_tsv_and_a_custom_delimiter(tmp_path: Path) -> None:
    tsv = write_csv(tmp_path / "t.tsv", [["f", "y"], [1, "a"], [2, "b"]], delimiter="\t")
    assert table(tsv, label="y", standardize=False).x.tolist() == [[1.0], [2.0]]
    semi = write_csv(tmp_path / "t.csv", [["f", "y"], [1, "a"], [2, "b"]], delimiter=";")
    assert table(semi, label="y", delimiter=";", standardize=False).x.tolist() == [[1.0], [2.0]]


def test_parquet_gives_the_same_dataset_as_csv(tmp_path: Path) -> None:
    path = write_csv(tmp_path / "people.csv", [HEADER, *ROWS])
    columns = {name: [row[j] for row in ROWS] for j, name in enumerate(HEADER)}
    pq.write_table(pa.table(columns), tmp_path / "people.parquet")
    spec = {"label": "label", "categorical": ["colour"], "user": "who"}
    a, b = table(path, **spec), table(tmp_path / "people.parquet", **spec)
    assert torch.allclose(a.x, b.x) and torch.equal(a.y, b.y) and torch.equal(a.users, b.users)


@pytest.mark.parametrize(
    ("rows", "spec", "message"),
    [
        ([HEADER, *ROWS], {"label": "lable"}, "has no label column 'lable' (did you mean 'label'?); its columns:"),
        ([HEADER, *ROWS], {"label": "label", "user": "whom"}, "has no user column 'whom'"),
        ([HEADER, *ROWS], {"label": "label", "features": ["age", "weight"]}, "has no feature column 'weight'"),
        (
            [HEADER, *ROWS],
            {"label": "label"},
            "column 'colour' is not numeric (e.g. 'red'); list it under 'categorical'",
        ),
        (
            [HEADER, *ROWS],
            {"label": "label", "features": ["age"], "categorical": ["colour"]},
            "categorical column 'colour' is not among the features",
        ),
        ([["f", "y"], [1, 0.5], [2, 1]], {"label": "y"}, "label '0.5' (column 'y', data row 1) is not a class"),
        ([["f", "y"], [1, "a"], ["", "b"]], {"label": "y"}, "column 'f' has no value in data row 2"),
        ([["f", "y"], [1, "a"], [2, "a"]], {"label": "y"}, "holds one class only"),
        ([["f", "y"], [1, "a"], [2]], {"label": "y"}, "line 3 has 1 fields but the header has 2"),
        ([["f", "y", "f"], [1, "a", 2]], {"label": "y"}, "column 'f' appears twice"),
        ([["f", "y"]], {"label": "y"}, "has no data rows"),
        ([["y"], ["a"], ["b"]], {"label": "y"}, "has no feature column"),
        ([["f", "y"], ["inf", "a"], [1, "b"]], {"label": "y"}, "holds 'inf' in data row 1, which is infinite"),
        ([["f", "y"], [1, "a"], ["NaN", "b"]], {"label": "y"}, "column 'f' holds 'NaN' in data row 2, which is NaN"),
        ([["f", "y"], ["1e400", "a"], [1, "b"]], {"label": "y"}, "holds '1e400' in data row 1, which is out of range"),
        ([["f", "y"], ["-1e39", "a"], [1, "b"]], {"label": "y"}, "holds '-1e39' in data row 1, which is out of range"),
        (
            [["c", "y"], *([f"v{i}", "ab"[i % 2]] for i in range(MAX_CATEGORIES + 1))],
            {"label": "y", "categorical": ["c"]},
            f"column 'c' has {MAX_CATEGORIES + 1:,} distinct values, more than the {MAX_CATEGORIES:,} one-hot columns",
        ),
    ],
)
def test_bad_tables_are_one_line_errors(
    tmp_path: Path, rows: list[list[Any]], spec: dict[str, Any], message: str
) -> None:
    path = write_csv(tmp_path / "bad.csv", rows)
    with pytest.raises(DataError, match=ONE_LINE) as err:
        table(path, **spec)
    assert message in str(err.value), str(err.value)


def test_bad_files(tmp_path: Path) -> None:
    with pytest.raises(DataError, match=r"no such file or folder 'nope.csv'"):
        table(Path("nope.csv"), label="y")
    (tmp_path / "t.xlsx").write_text("x")
    with pytest.raises(DataError, match=r"unknown file type '.xlsx'; use .csv, .tsv or .parquet"):
        table(tmp_path / "t.xlsx", label="y")
    (tmp_path / "t.parquet").write_text("not parquet")
    with pytest.raises(DataError, match="is not a readable Parquet file"):
        table(tmp_path / "t.parquet", label="y")
    (tmp_path / "empty.csv").write_text("")
    with pytest.raises(DataError, match="is empty; its first line must name the columns"):
        table(tmp_path / "empty.csv", label="y")
    (tmp_path / "latin.csv").write_bytes("f,y\n1,caf\xe9\n".encode("latin-1"))
    with pytest.raises(DataError, match="is not a readable CSV file"):
        table(tmp_path / "latin.csv", label="y")
    pq.write_table(pa.table({"f": [1.0, None], "y": ["a", "b"]}), tmp_path / "gap.parquet")
    with pytest.raises(DataError, match="column 'f' has no value in data row 2"):
        table(tmp_path / "gap.parquet", label="y")


SITES = [
    ["patient_id", "age", "pressure", "smoker", "site", "outcome"],
    ["P1", 60, 120, "yes", "north", "ill"],
    ["P2", 45, "", "no", "south", "healthy"],
    ["P3", 52, 130, "", "north", "ill"],
    ["P4", 38, 118, "no", "east", "healthy"],
    ["P5", 71, 140, "yes", "south", ""],
    ["P6", 66, 125, "no", "east", "ill"],
]


def test_id_columns_are_left_out_with_a_note(tmp_path: Path) -> None:
    path = write_csv(
        tmp_path / "p.csv",
        [["record_id", "Unnamed: 0", "PatientID", "age", "y"]]
        + [[f"r{i}", i, 100 + i, 20 + i, "a" if i % 2 else "b"] for i in range(4)],
    )
    with pytest.warns(FedhetNote, match=r"left out columns 'record_id', 'Unnamed: 0', 'PatientID': every value is"):
        data = table(path, label="y", standardize=False)
    assert data.x.tolist() == [[20.0], [21.0], [22.0], [23.0]]
    kept = table(path, label="y", standardize=False, features=["age", "PatientID"])  # named: kept, no note
    assert kept.x[:, 1].tolist() == [100.0, 101.0, 102.0, 103.0]
    names = [[f"n{i}", float(i % 3), "a" if i % 2 else "b"] for i in range(12)]  # 12 different texts: an id
    with pytest.warns(FedhetNote, match="left out column 'name'"):
        table(write_csv(tmp_path / "n.csv", [["name", "f", "y"], *names]), label="y")


def test_empty_cells_are_refused_dropped_or_filled_as_asked(tmp_path: Path) -> None:
    path = write_csv(tmp_path / "p.csv", SITES)
    spec = {"label": "outcome", "user": "site", "categorical": ["smoker"], "standardize": False}
    with pytest.raises(DataError, match=r"has no value in data row 2; fill or drop it \(dataset.missing: drop"):
        table(path, **spec, features=["age", "pressure", "smoker"])
    with pytest.warns(FedhetNote, match=r"dropped 3 of 6 rows with an empty cell \(dataset.missing: drop\)"):
        dropped = table(path, **spec, missing="drop")
    assert dropped.x[:, 0].tolist() == [60.0, 38.0, 66.0]  # age of P1, P4, P6
    with pytest.warns(
        FedhetNote,
        match=r"dropped 1 of 6 rows with no outcome or site; filled 1 empty cells of "
        r"'pressure' with its median 122.5; filled 1 empty cells of 'smoker' with a category",
    ):
        filled = table(path, **spec, missing="median")
    # features: age, pressure, smoker=(missing), smoker=no, smoker=yes; P5 (no outcome) dropped
    assert filled.x.tolist()[1] == [45.0, 122.5, 0.0, 1.0, 0.0] and filled.x.tolist()[2] == [52.0, 130.0, 1.0, 0.0, 0.0]
    with pytest.warns(FedhetNote, match="with its mean 123.2"):
        table(path, **spec, missing="mean")


def test_user_names_and_a_regression_target(tmp_path: Path) -> None:
    path = write_csv(tmp_path / "p.csv", SITES)
    with pytest.warns(FedhetNote):
        data = table(
            path, label="age", user="site", missing="drop", categorical=["smoker", "outcome"], task="regression"
        )
    assert data.task == "regression" and data.y.dtype == torch.float32 and data.num_classes == 1
    assert (
        data.y.tolist() == [60.0, 38.0, 66.0]
        and data.user_names == ("east", "north")
        and data.users.tolist() == [1, 0, 0]
    )
    with pytest.raises(DataError, match="target column 'outcome' is not numeric"):
        table(path, label="outcome", user="site", missing="drop", categorical=["smoker"], task="regression")


def test_paths_are_kept_absolute(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from fedhet.catalog import DATASETS

    write_csv(tmp_path / "p.csv", SITES)
    monkeypatch.chdir(tmp_path)
    source = DATASETS.build({"name": "table", "path": "p.csv", "label": "outcome"})
    assert source.path == str(tmp_path / "p.csv")  # type: ignore[attr-defined]
    assert DATASETS.build({"name": "table", "path": "nope.csv", "label": "y"}).path == "nope.csv"  # type: ignore[attr-defined]


def test_a_whole_number_label_of_many_values_is_refused_as_a_guess(tmp_path: Path) -> None:
    """scikit-learn's diabetes target (214 whole numbers from 25 to 346) once became a 214-class classifier."""
    rng = np.random.default_rng(0)
    rows = [
        ["x", "y"],
        *([round(float(v), 3), int(t)] for v, t in zip(rng.normal(size=120), range(25, 385, 3), strict=True)),
    ]
    path = write_csv(tmp_path / "d.csv", rows)
    with pytest.raises(DataError, match=ONE_LINE) as err:
        table(path, label="y")
    assert "column 'y'): the labels are 120 different whole numbers from 25 to 382" in str(err.value)
    assert "--set task=regression" in str(err.value) and "task: classification" in str(err.value)
    with pytest.warns(FedhetNote):
        assert table(path, label="y", task="classification").num_classes == 120  # named: classes, numbered
        assert table(path, label="y", task="regression").y[:2].tolist() == [25.0, 28.0]
        # a run that names a class task (task: classification) reads a source left at auto as classes
        source = DATASETS.build({"name": "table", "path": str(path), "label": "y"}, where="dataset")
        assert source.for_task(False).load(tmp_path).num_classes == 120
        assert source.for_task(True).load(tmp_path).task == "regression" and source.for_task(None) is source
