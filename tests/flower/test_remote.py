"""RemoteEngine over in-process nodes: the same numbers as the single-machine engine, node failures, resume."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from flower_helpers import assert_same_metrics, read_metrics, small_config

from fedhet.experiments.config import RunConfig
from fedhet.experiments.runner import run
from fedhet.flower.node import NodeWorker, config_text, derived_partition, node_clients
from fedhet.flower.remote import InProcessTransport, Settings, remote_builder


def nodes(config: RunConfig, count: int) -> InProcessTransport:
    text = config_text(config)
    workers = {}
    for p in range(count):
        data, clients = derived_partition(config, text, p, count)
        workers[100 + p] = NodeWorker(config, data, clients)
    return InProcessTransport(workers)


def test_clients_are_cut_into_blocks() -> None:
    assert [node_clients(7, p, 3).tolist() for p in range(3)] == [[0, 1, 2], [3, 4], [5, 6]]


@pytest.mark.parametrize(
    "algorithm",
    [
        "fedavg",
        "scaffold",
        {"name": "maxfl", "finetune_steps": 2},
        "qffl",
        {"name": "gsnr", "base": "scaffold"},
        "fedmgda_plus",
        {"name": "cafed", "loss_batch": 4},
        "perfedavg",
        "afl",
        "mwfed",
    ],
    ids=lambda a: a if isinstance(a, str) else a["name"],
)
def test_remote_run_matches_the_native_run(tmp_path: Path, algorithm: object) -> None:
    config = small_config(algorithm, requirements={"steps": 5})
    native = run(config, tmp_path / "native")
    remote = run(config, tmp_path / "remote", builder=remote_builder(nodes(config, 3), Settings()))
    assert remote.status == native.status == "finished"
    assert_same_metrics(read_metrics(tmp_path / "native"), read_metrics(tmp_path / "remote"))
    torch.testing.assert_close(remote.params, native.params, atol=1e-5, rtol=1e-5)
