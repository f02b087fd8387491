"""The Flower tests: run by `make test-flower` (FEDHET_FLOWER_TESTS=1), where a missing flwr is an error.

In the core suite (no Flower installed) this folder is not collected.
"""

from __future__ import annotations

import importlib.util
import os

if importlib.util.find_spec("flwr") is None:
    if os.environ.get("FEDHET_FLOWER_TESTS") == "1":
        raise RuntimeError("FEDHET_FLOWER_TESTS=1 but flwr is not installed: run make test-flower (it installs it)")
    collect_ignore_glob = ["test_*.py"]  # the core suite does not collect them
