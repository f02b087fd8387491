"""fedhet's notes and warnings shown as one line each, ``note: ...`` or ``warning: ...`` on stderr, each distinct
line once.

Python shows a warning as two lines, the first a path into fedhet's source, and shows the same one again whenever
the warnings filters change (every run changes them). `install` (done when fedhet is imported, so in the Python
API, in notebooks and in a sweep's worker processes) makes `warnings.showwarning` show fedhet's categories this way;
other warnings are shown as before. The command line shows them in colour, once per command (`forget`). A
sweep's worker process sends its notes to the sweep (`forward_to`), which shows each once for all its runs.
"""

from __future__ import annotations

import contextlib
import sys
import warnings
from collections.abc import Callable
from typing import Any, TextIO

from fedhet.errors import FedhetNote, FedhetWarning

_shown: set[tuple[str, str]] = set()
_previous = warnings.showwarning
_forward: Callable[[str, str], None] | None = None


def describe(message: Warning | str, category: type[Warning]) -> tuple[str, str]:
    """``("note", text)`` or ``("warning", text)``, the text on one line."""
    return ("note" if issubclass(category, FedhetNote) else "warning"), " ".join(str(message).split())


def first_time(kind: str, text: str) -> bool:
    """Whether this note (or warning) has not been shown yet in this process (since `forget`); it now has."""
    if (kind, text) in _shown:
        return False
    _shown.add((kind, text))
    return True


def forget() -> None:
    """Show every note again (a new command in the same process)."""
    _shown.clear()


def forward_to(send: Callable[[str, str], None] | None) -> None:
    """In a worker process: hand each note's ``(kind, text)`` to `send` (to the parent, which shows it with
    `show_again`) instead of printing it; None: print again."""
    global _forward
    _forward = send


def show_again(kind: str, text: str) -> None:
    """Warn `text` again here, as the note (or warning) a worker process forwarded: shown as notes here are."""
    warnings.warn(text, FedhetNote if kind == "note" else FedhetWarning, stacklevel=2)


def show(
    message: Warning | str,
    category: type[Warning],
    filename: str,
    lineno: int,
    file: TextIO | None = None,
    line: str | None = None,
) -> None:
    """`warnings.showwarning` for fedhet's categories: one ``note: ...``/``warning: ...`` line, once; others as
    Python (or whatever hook was installed before) shows them."""
    if not issubclass(category, FedhetWarning):
        _previous(message, category, filename, lineno, file, line)
        return
    kind, text = describe(message, category)
    if not first_time(kind, text):
        return
    if _forward is not None:
        _forward(kind, text)
        return
    stream: Any = file if file is not None else sys.stderr
    if stream is None:  # no stderr (pythonw): nowhere to say it
        return
    with contextlib.suppress(OSError):  # a closed or broken stderr: a note is not worth failing the run for
        stream.write(f"{kind}: {text}\n")


def install() -> None:
    """Make `warnings.showwarning` show fedhet's notes and warnings as one line each (once; keeps the hook it
    replaces for every other warning)."""
    global _previous
    if warnings.showwarning is not show:
        _previous = warnings.showwarning
        warnings.showwarning = show
