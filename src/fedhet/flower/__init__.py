"""fedhet on Flower's engines (the optional ``fedhet[flower]`` extra; see docs/flower.md).

A fedhet strategy runs unchanged on the server: its engine is a `RemoteEngine`, an engine-shaped proxy whose
calls (train, losses, scores, gradient statistics) travel as Flower messages to the nodes that hold the clients'
data, where a `NodeWorker` answers them with fedhet's own engine. Nothing in fedhet's core imports flwr; the
modules that do (`apps`, `simulation`) call `require_flwr` first.
"""

from __future__ import annotations

import importlib.util

from fedhet.errors import ConfigError

INSTALL_HINT = "pip install 'fedhet[flower]'  (or, in a clone: make flower-venv, then use .venv-flower/bin/fedhet)"


def require_flwr() -> None:
    """Stop with a one-line message when Flower is not installed."""
    if importlib.util.find_spec("flwr") is None:
        raise ConfigError(f"the Flower engine needs Flower, which is not installed; install it with: {INSTALL_HINT}")
