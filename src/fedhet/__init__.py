"""fedhet: federated learning when clients differ (MaxFL, CA-Fed, FedMGDA+, FedGSNR and their baselines).

Start here:

    $ fedhet run --algorithm fedavg --dataset digits --rounds 30      # a first run (CLI)
    $ fedhet list                                                     # every algorithm, dataset, model

    >>> import fedhet
    >>> result = fedhet.run({"algorithm": "fedavg", "dataset": "digits", "rounds": 30})
    >>> result.final["test_accuracy"]

Your data and model: ``dataset: {name: table, path: data.csv, label: y}`` (also ``arrays``, ``image_folder``,
``huggingface``, ``torchvision``, or ``fedhet.datasets.from_arrays(x, y)`` from Python) and
``model: {name: torch, target: "my_nets.py:Net"}`` (or the class itself from Python).

Public API: `run`, `load_run`, `Config`, `RunResult`, `Callback`, `model_factory`, `datasets`; the documentation site
(``make docs``) has the getting-started guide and the configuration reference.
"""

from __future__ import annotations

from importlib import import_module
from typing import TYPE_CHECKING, Any

from fedhet.notes import install as _install_notes
from fedhet.version import package_version

if TYPE_CHECKING:
    from fedhet import datasets, errors
    from fedhet.api import Callback, Config, RunResult, load_run, run
    from fedhet.models.torch_model import model_factory

    __version__: str

__all__ = ["Callback", "Config", "RunResult", "__version__", "datasets", "errors", "load_run", "model_factory", "run"]

_install_notes()  # fedhet's notes print as one line each, once (`fedhet.notes`)

# Loaded on first use, so that `import fedhet` stays light (no torch, no metadata scan until needed).
_LAZY = {
    "run": "fedhet.api",
    "load_run": "fedhet.api",
    "Config": "fedhet.api",
    "RunResult": "fedhet.api",
    "Callback": "fedhet.api",
    "model_factory": "fedhet.models.torch_model",
}


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        value = getattr(import_module(_LAZY[name]), name)
        globals()[name] = value
        return value
    if name in ("datasets", "errors"):
        return import_module(f"fedhet.{name}")
    if name == "__version__":
        return package_version()
    raise AttributeError(f"module 'fedhet' has no attribute '{name}'")


def __dir__() -> list[str]:
    return sorted({*globals(), *__all__})
