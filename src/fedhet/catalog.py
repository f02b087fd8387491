"""Imports every built-in component so that the registries are complete (import this, not the modules)."""

from fedhet.attacks.base import ATTACKS
from fedhet.availability import appeal, markov  # noqa: F401
from fedhet.availability.base import AVAILABILITY
from fedhet.data import cafed_synthetic, embedded, partition, real, shakespeare_text  # noqa: F401  (registration side effects)
from fedhet.data.partition import PARTITIONERS
from fedhet.data.sources import DATASETS
from fedhet.metrics import appeal as appeal_metrics  # noqa: F401
from fedhet.metrics import availability, contribution, fairness, speed  # noqa: F401
from fedhet.metrics.base import METRIC_PLUGINS
from fedhet.models import zoo  # noqa: F401
from fedhet.models.base import MODELS
from fedhet.strategies.base import STRATEGIES

__all__ = ["ATTACKS", "AVAILABILITY", "DATASETS", "METRIC_PLUGINS", "MODELS", "PARTITIONERS", "STRATEGIES"]
