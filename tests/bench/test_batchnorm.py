"""The batch-norm cost pair: the plain per-client PyTorch loop does the very round the engine does."""

from __future__ import annotations

import torch

from fedhet.bench.batchnorm import PlainLoop
from fedhet.bench.pairs import workload_engine
from fedhet.bench.workloads import Workload
from fedhet.engine.functional import state_dict_of
from fedhet.engine.plan import LocalPlan
from fedhet.strategies.base import ServerContext
from fedhet.strategies.fedavg import FedAvg

TINY = Workload("tiny-resnet", "", {"name": "resnet8", "width": 4}, (3, 8, 8), clients=3, samples=8, steps=2, batch=4)


def test_the_plain_loop_computes_the_engines_fedavg_round() -> None:
    engine = workload_engine(TINY, "auto")
    plain = PlainLoop(engine, TINY)  # the initial global state, before the engine trains
    strategy = FedAvg()
    strategy.setup(ServerContext(engine, engine.local, 0, TINY.clients))
    w = engine.initial_params()
    plan: LocalPlan = strategy.configure(1, torch.arange(TINY.clients), w)
    new = strategy.aggregate(1, w, engine.train(w, plan, 1))
    expected = plain.round()
    got = state_dict_of(engine.model, new)
    assert got.keys() == expected.keys()
    for name, value in expected.items():
        torch.testing.assert_close(got[name], value, atol=1e-5, rtol=1e-4, msg=name)
