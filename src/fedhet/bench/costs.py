"""What the methods of the later issues cost, as targets of `fedhet bench` (``--costs``): each compares a method's
work with the reference it extends, on one engine and backend, timed in turns (ratios measured in the same run).

* a Ditto round (two models trained per client) against a FedAvg round: at most 2.2×;
* personalised evaluation of 1,000 clients against the global model's evaluation: at most 2× (whole personal models,
  and personal heads; with the machine's own ratio of per-client to shared matrix products beside it);
* FedBuff's clients trained per second against synchronous FedAvg rounds: at least 0.5×;
* an IFCA round with k = 4 against a FedAvg round plus the 4 loss evaluations it needs: at most 1.5×.
* a ResNet-8 round with batch norm on ``backend: auto`` against a plain per-client PyTorch loop: at most 1.5×.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import asdict

from fedhet.bench.asynchronous import fedbuff_throughput
from fedhet.bench.batchnorm import resnet_round
from fedhet.bench.clusters import ifca_round
from fedhet.bench.pairs import CostRow
from fedhet.bench.personal import ditto_round, machine_limit, personal_evaluation
from fedhet.bench.targets import Target


def _at_most(row: CostRow, note: str = "") -> Target:
    measured = f"{row.ratio:.2f}× ({1e3 * row.method_s:,.0f} ms vs {1e3 * row.reference_s:,.0f} ms){note}"
    return Target(f"{row.name} vs {row.reference}", f"≤ {row.goal:g}×", measured, row.ratio <= row.goal)


def ditto_target(reps: int) -> list[Target]:
    return [_at_most(ditto_round(reps))]


def personal_evaluation_targets(reps: int) -> list[Target]:
    limit = machine_limit(reps)
    note = f"; the machine: per-client products {limit.ratio:.2f}× one shared product of the same FLOPs"
    return [_at_most(personal_evaluation(reps=reps), note), _at_most(personal_evaluation(("head",), reps))]


def fedbuff_target(reps: int) -> list[Target]:
    row = fedbuff_throughput(turns=reps)
    measured = (
        f"{row.ratio:.2f}× ({row.asynchronous:,.0f} vs {row.synchronous:,.0f} clients/s; "
        f"{row.clients_per_call:.0f} clients a training call)"
    )
    return [Target("FedBuff (C=100, K=10) clients/s vs FedAvg rounds", "≥ 0.5×", measured, row.ratio >= 0.5)]


def ifca_target(reps: int) -> list[Target]:
    return [_at_most(ifca_round(reps=reps))]


def batchnorm_target(reps: int) -> list[Target]:
    return [_at_most(resnet_round(min(reps, 3)))]


COSTS: list[Callable[[int], list[Target]]] = [
    ditto_target,
    personal_evaluation_targets,
    fedbuff_target,
    ifca_target,
    batchnorm_target,
]


def method_costs(quick: bool = False, progress: Callable[[str], None] = print) -> list[Target]:
    """Every method-cost target (`quick`: fewer turns)."""
    reps = 3 if quick else 7
    out: list[Target] = []
    for cost in COSTS:
        progress(f"costs: {cost.__name__}")
        out += cost(reps)
    return out


def as_dicts(targets: list[Target]) -> list[dict[str, object]]:
    return [asdict(t) for t in targets]
