"""``availability.npz``: who was available, selected and weighted in each round of a run (every run folder gets it
when its strategy logs participation).

The per round × client arrays the server saw and decided (active, selected, applied weights, π̂, λ̂, α; from the
strategy's ``participation_log``) and the availability process's true π, λ and client classes, for CA-Fed's
Figs. 1 and 2.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from fedhet.availability.markov import ClientClasses, MarkovChains
from fedhet.experiments.callbacks import Callback

if TYPE_CHECKING:
    from fedhet.experiments.runner import RunState

PARTICIPATION_FILE = "availability.npz"


class ParticipationWriter(Callback):
    """At the end of a run, writes ``availability.npz`` (see the module docstring) into the run folder."""

    def on_run_end(self, state: RunState) -> None:
        if state.out is not None and participation_arrays(state):
            write_participation(state, state.out / PARTICIPATION_FILE)


def participation_arrays(state: RunState) -> dict[str, np.ndarray]:
    """The arrays of ``availability.npz`` for a run (empty when its strategy logs no participation)."""
    exp = state.experiment
    log = getattr(exp.strategy, "participation_log", None)
    out: dict[str, np.ndarray] = dict(log()) if callable(log) else {}
    process = exp.availability
    if isinstance(process, MarkovChains):
        out["pi"], out["lambda"], out["chain"] = process.client_pi, process.client_lambda, process.member
    if isinstance(process, ClientClasses):
        out["group"], out["more_available"], out["correlated"] = process.classes()
    return out


def write_participation(state: RunState, path: Path) -> Path:
    np.savez_compressed(path, **participation_arrays(state))  # type: ignore[arg-type]
    return path
