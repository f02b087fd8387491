"""fedhet's notes and warnings as one line each, once: in the Python API, and forwarded from worker processes."""

from __future__ import annotations

import io
import subprocess
import sys
import warnings
from collections.abc import Iterator
from pathlib import Path

import pytest

from fedhet import notes
from fedhet.errors import FedhetNote, FedhetWarning

SRC = Path(__file__).resolve().parents[1] / "src"


@pytest.fixture(autouse=True)
def fresh() -> Iterator[None]:
    notes.forget()
    yield
    notes.forget()
    notes.forward_to(None)


def test_a_note_is_one_line_without_a_source_path_and_said_once() -> None:
    out = io.StringIO()
    for _ in range(3):
        notes.show(FedhetNote("dropped 1 row\n  with an empty cell"), FedhetNote, "/src/fedhet/data/tables.py", 9, out)
    notes.show(FedhetWarning("slow"), FedhetWarning, "x.py", 1, out)
    assert out.getvalue() == "note: dropped 1 row with an empty cell\nwarning: slow\n"
    notes.forget()  # a new command says it again
    notes.show("dropped 1 row with an empty cell", FedhetNote, "x.py", 1, out)
    assert out.getvalue().count("note:") == 2


def test_other_warnings_are_shown_as_before(monkeypatch: pytest.MonkeyPatch) -> None:
    seen: list[str] = []
    monkeypatch.setattr(notes, "_previous", lambda message, *args: seen.append(str(message)))
    notes.show(UserWarning("theirs"), UserWarning, "x.py", 1, io.StringIO())
    assert seen == ["theirs"]


def test_a_worker_forwards_its_notes_once_and_the_parent_shows_them() -> None:
    sent: list[tuple[str, str]] = []
    notes.forward_to(lambda kind, text: sent.append((kind, text)))
    out = io.StringIO()
    notes.show("a note", FedhetNote, "x.py", 1, out)
    notes.show("a note", FedhetNote, "x.py", 1, out)
    assert sent == [("note", "a note")] and out.getvalue() == ""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        notes.show_again("warning", "a warning")
    assert [(w.category, str(w.message)) for w in caught] == [(FedhetWarning, "a warning")]


def test_importing_fedhet_shows_notes_as_one_line_once() -> None:
    code = (
        "import warnings, fedhet\n"
        "from fedhet.errors import FedhetNote\n"
        "for _ in range(3):\n"
        "    with warnings.catch_warnings():  # a run changes the filters: Python would say it again\n"
        "        warnings.warn('standardised 3 columns', FedhetNote)\n"
        "warnings.warn('theirs', UserWarning)\n"
    )
    env = {"PYTHONPATH": str(SRC), "PATH": "/usr/bin:/bin"}
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=60)
    assert done.returncode == 0, done.stderr
    lines = done.stderr.splitlines()
    assert lines[0] == "note: standardised 3 columns"
    assert lines.count("note: standardised 3 columns") == 1 and "UserWarning: theirs" in lines[1]
