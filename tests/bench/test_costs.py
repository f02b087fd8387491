"""`fedhet bench --costs`: each method-cost measurement runs and becomes a target (the numbers are not asserted:
tests never assert timings)."""

from __future__ import annotations

import pytest
from typer.testing import CliRunner

from fedhet.bench import asynchronous, batchnorm, clusters, costs, personal
from fedhet.bench.workloads import Workload
from fedhet.cli.main import app

RESNET = Workload("tiny-resnet", "", {"name": "resnet8", "width": 4}, (3, 8, 8), clients=3, samples=8, steps=2, batch=4)
SMALL = Workload("small", "MLP, 24 clients", {"name": "mlp", "hidden": [8]}, (6,), 3, clients=24, samples=12, steps=2)


def test_the_costs_run_on_small_workloads_and_become_targets(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(personal, "MLP", SMALL)
    monkeypatch.setattr(personal, "EVAL", SMALL)
    monkeypatch.setattr(clusters, "MLP", SMALL)
    monkeypatch.setattr(asynchronous, "WORKLOAD", SMALL)
    monkeypatch.setattr(batchnorm, "RESNET", RESNET)
    monkeypatch.setattr(costs, "fedbuff_throughput", _smaller(asynchronous.fedbuff_throughput))
    result = CliRunner().invoke(app, ["bench", "--costs", "--quick"], env={"COLUMNS": "200"})
    assert result.exit_code == 0, result.output
    names = ("Ditto round", "personalised evaluation", "FedBuff", "the machine", "IFCA round, k=4")
    for name in (*names, "ResNet-8 round with batch norm"):
        assert name in result.output


def _smaller(measure):  # type: ignore[no-untyped-def]
    def small(turns: int = 3, **_: object):  # type: ignore[no-untyped-def]
        return measure(turns=turns, concurrency=8, buffer=4)

    return small
