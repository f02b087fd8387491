"""Imports every built-in component so that the registries are complete (import this, not the modules).

The module imports register the components (side effects); ruff's F401 is switched off for this file.
"""

from fedhet.attacks.base import ATTACKS
from fedhet.availability import appeal, markov
from fedhet.availability.base import AVAILABILITY
from fedhet.data import (
    arrays,
    cafed_synthetic,
    embedded,
    huggingface,
    images,
    memory,
    partition,
    real,
    shakespeare_text,
    tables,
    torchvision_source,
)
from fedhet.data.partition import PARTITIONERS
from fedhet.data.sources import DATASETS
from fedhet.metrics import appeal as appeal_metrics
from fedhet.metrics import availability, contribution, fairness, speed
from fedhet.metrics.base import METRIC_PLUGINS
from fedhet.models import fedmgda as fedmgda_models
from fedhet.models import torch_model, zoo
from fedhet.models.base import MODELS
from fedhet.strategies import (
    adafed,
    afl,
    cafed,
    f3ast,
    fedavg,
    fedmgda,
    fednova,
    fedprox,
    gsnr,
    maxfl,
    mwfed,
    perfedavg,
    pfedme,
    qffl,
    robust,
    scaffold,
    unbiased,
)
from fedhet.strategies.base import STRATEGIES

__all__ = ["ATTACKS", "AVAILABILITY", "DATASETS", "METRIC_PLUGINS", "MODELS", "PARTITIONERS", "STRATEGIES"]
