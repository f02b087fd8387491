"""fedhet on Flower's engines (the optional ``fedhet[flower]`` extra; see docs/flower.md).

A fedhet strategy runs unchanged on the server: its engine is a `RemoteEngine`, an engine-shaped proxy whose
calls (train, losses, scores, gradient statistics) travel as Flower messages to the nodes that hold the clients'
data, where a `NodeWorker` answers them with fedhet's own engine. Nothing in fedhet's core imports flwr; the
modules that do (`apps`, `simulation`) call `require_flwr` first.
"""

from __future__ import annotations

import importlib.metadata
import importlib.util

from fedhet.errors import ConfigError

INSTALL_HINT = "pip install 'fedhet[flower]'  (or, in a clone: make flower-venv, then use .venv-flower/bin/fedhet)"
SUPPORTED_FLWR = "1.42"  # the release whose internals the node worker and the SuperNode and SuperLink launchers use


def require_flwr() -> None:
    """Stop with a one-line message when Flower is not installed."""
    if importlib.util.find_spec("flwr") is None:
        raise ConfigError(f"the Flower engine needs Flower, which is not installed; install it with: {INSTALL_HINT}")


def require_flwr_release(uses: str, otherwise: str) -> None:
    """Stop with a one-line message unless Flower is installed in its `SUPPORTED_FLWR` release: `uses` says what of
    that release's internals fedhet uses, `otherwise` what the user can run instead."""
    require_flwr()
    version = importlib.metadata.version("flwr")
    if not version.startswith(SUPPORTED_FLWR + "."):
        raise ConfigError(
            f"fedhet's {uses} of flwr {SUPPORTED_FLWR}.x, but flwr {version} is installed; "
            f"install it with: {INSTALL_HINT}, {otherwise}"
        )
