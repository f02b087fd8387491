"""Imports every built-in component so that the registries are complete (import this, not the modules).

The module imports register the components (side effects); ruff's F401 is switched off for this file.
"""

from fedhet.attacks.base import ATTACKS
from fedhet.availability import markov
from fedhet.availability.base import AVAILABILITY
from fedhet.data import (
    arrays,
    cafed_synthetic,
    embedded,
    huggingface,
    images,
    in_memory,
    markov_text,
    partition,
    real,
    shakespeare_text,
    tables,
    torchvision_source,
)
from fedhet.data.partition import PARTITIONERS
from fedhet.data.shift_config import SHIFTS
from fedhet.data.sources import DATASETS
from fedhet.engine.objective import TERMS
from fedhet.engine.optimizers import OPTIMIZERS
from fedhet.engine.rules import RULES
from fedhet.engine.schedules import SCHEDULES
from fedhet.engine.task import TASKS
from fedhet.methods import cafed, fedgsnr, fedmgda, maxfl
from fedhet.metrics import fairness, leakage, speed
from fedhet.metrics.base import METRIC_PLUGINS
from fedhet.models import architectures, exits, torch_model, transformer, zoo
from fedhet.models import fedmgda as fedmgda_models
from fedhet.models.base import MODELS
from fedhet.privacy import secagg
from fedhet.privacy import strategy as dp_strategy
from fedhet.privacy.mechanisms import MECHANISMS
from fedhet.strategies import (
    afl,
    apfl,
    cfl,
    depthfl,
    ditto,
    fedasync,
    fedavg,
    fedbn,
    fedbuff,
    feddf,
    fedgh,
    fednova,
    fedopt,
    fedper,
    fedproto,
    fedprox,
    fedrep,
    fedrolex,
    finetune,
    fjord,
    flexlora,
    heterofl,
    hetlora,
    ifca,
    local_only,
    mifa,
    moon,
    perfedavg,
    pfedme,
    poc,
    qffl,
    robust,
    scaffold,
    tifl,
)
from fedhet.strategies.base import STRATEGIES
from fedhet.strategies.server import SERVER_OPTIMIZERS
from fedhet.strategies.staleness import STALENESS
from fedhet.systems.base import SYSTEMS
from fedhet.systems.deadline import DEADLINE_POLICIES

__all__ = [
    "ATTACKS",
    "AVAILABILITY",
    "DATASETS",
    "DEADLINE_POLICIES",
    "MECHANISMS",
    "METRIC_PLUGINS",
    "MODELS",
    "OPTIMIZERS",
    "PARTITIONERS",
    "RULES",
    "SCHEDULES",
    "SERVER_OPTIMIZERS",
    "SHIFTS",
    "STALENESS",
    "STRATEGIES",
    "SYSTEMS",
    "TASKS",
    "TERMS",
]
