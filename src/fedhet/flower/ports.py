"""Free loopback ports for a local deployment: scripts/flower_local.sh's SuperLink listens on PORT and its SuperNode
i on PORT + 1 + i, so a deployment needs a block of consecutive free ports (the tests and
benchmarks/flower_deployment.py pick one per deployment)."""

from __future__ import annotations

import socket


def free_port_block(size: int, start: int = 23000, stop: int = 40000, step: int = 50) -> int:
    """The first port of `size` consecutive ports that are free on 127.0.0.1, searched from `start` in `step`s."""
    for base in range(start, stop, step):
        try:
            for port in range(base, base + size):
                with socket.socket() as s:
                    s.bind(("127.0.0.1", port))
            return base
        except OSError:
            continue
    raise RuntimeError(f"no {size} consecutive free loopback ports between {start} and {stop}")
