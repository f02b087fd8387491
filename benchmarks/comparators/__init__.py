"""What `fedhet bench` is compared with beyond its own plain and vmap loops, kept out of the installed package: the
naive reference (typical research code: a deepcopy, a DataLoader and an optimiser per client), Apple's pfl and
Flower's simulation. `benchmarks/full_bench.py` passes them to `fedhet.bench.run.run_bench`."""

from __future__ import annotations

from collections.abc import Callable

from comparators.flower import flower_available, flower_round_times
from comparators.naive import naive_system
from comparators.pfl import pfl_available, pfl_round_times
from fedhet.bench.run import COMPARATORS, Framework, SystemFactory
from fedhet.bench.systems import build_module

SYSTEMS: dict[str, SystemFactory] = {**COMPARATORS, "naive": naive_system}


def frameworks(pfl: bool = True, flower: bool = True, say: Callable[[str], None] = print) -> tuple[Framework, ...]:
    """pfl's and Flower's loops, where asked for and installed (else a line says how to include them)."""
    out = []
    if pfl and pfl_available():
        out.append(
            Framework(
                "pfl",
                "pfl simulation",
                "pfl's SimulatedBackend in this process",
                lambda w, data, rounds: pfl_round_times(w, data, build_module(w), rounds),
            )
        )
    elif pfl:
        say("pfl is not installed: its comparator is skipped (pip install pfl to include it)")
    if flower and flower_available():
        out.append(
            Framework(
                "flower", "flower simulation", "Ray actors of 1 CPU; memory: actors not counted", flower_round_times
            )
        )
    elif flower:
        say("Flower is not installed: its comparator is skipped (pip install 'fedhet[flower]' to include it)")
    return tuple(out)
