"""clients.csv written column by column: the same bytes as row by row."""

from __future__ import annotations

import math
from pathlib import Path

from fedhet.atomic import write_bytes
from fedhet.experiments.metrics_log import columns_bytes, write_csv


def test_columns_are_written_as_the_rows_are(tmp_path: Path) -> None:
    numbers = [3.0, -2.0, -0.0, 0.1, 1e-7, 1e15, 1e16, 999999999999999.0, math.nan, math.inf, -math.inf, 2.5]
    table = {
        "client": [float(i) for i in range(len(numbers))],
        "user": ["a", "b,c", 'say "hi"', "", "é", "x\ny", "7", "-0", "nan", "z", "w", "v"],
        "accuracy": numbers,
    }
    write_bytes(tmp_path / "columns.csv", columns_bytes(table, chunk=5))  # three chunks of rows
    write_csv(tmp_path / "rows.csv", [dict(zip(table, row, strict=True)) for row in zip(*table.values(), strict=True)])
    text = (tmp_path / "columns.csv").read_bytes()
    assert text == (tmp_path / "rows.csv").read_bytes()
    lines = text.decode().split("\r\n")
    assert lines[1] == "0,a,3" and lines[3] == '2,"say ""hi""",-0.0' and lines[7] == "6,7,1e+16"
    assert lines[5] == "4,é,1e-07" and lines[6] == '5,"x\ny",1000000000000000.0' and lines[8] == "7,-0,999999999999999"
    assert lines[9:12] == ["8,nan,nan", "9,z,inf", "10,w,-inf"]
