"""``availability.npz``: who was available, selected and weighted in each round of a run (every run folder gets it
when its strategy logs participation).

The per round × client arrays the server saw and decided (`Strategy.participation_log`: for CA-Fed's strategies
active, selected, applied weights, π̂, λ̂, α) and the availability process's own per-client arrays
(`Availability.saved_arrays`: for Markov chains the true π, λ and client classes), for CA-Fed's Figs. 1 and 2.
"""

from __future__ import annotations

import io
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from fedhet.atomic import write_bytes
from fedhet.experiments.callbacks import Callback

if TYPE_CHECKING:
    from fedhet.experiments.state import RunState

PARTICIPATION_FILE = "availability.npz"


class ParticipationWriter(Callback):
    """At the end of a run, writes ``availability.npz`` (see the module docstring) into the run folder."""

    def on_run_end(self, state: RunState) -> None:
        if state.out is not None and participation_arrays(state):
            write_participation(state, state.out / PARTICIPATION_FILE)


def participation_arrays(state: RunState) -> dict[str, np.ndarray]:
    """The arrays of ``availability.npz`` for a run (empty when its strategy logs no participation)."""
    exp = state.experiment
    return {**exp.strategy.participation_log(), **exp.availability.saved_arrays()}


def write_participation(state: RunState, path: Path) -> Path:
    """Write ``availability.npz`` atomically (arrays only: ``np.load(path)`` reads it without pickle)."""
    buffer = io.BytesIO()
    np.savez_compressed(buffer, **participation_arrays(state))  # type: ignore[arg-type]
    write_bytes(path, buffer.getbuffer())
    return path
