"""Build the objects of a run from a validated `RunConfig`."""

from __future__ import annotations

import warnings
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
import yaml

from fedhet.attacks.base import Attack
from fedhet.availability.base import Availability
from fedhet.catalog import ATTACKS, AVAILABILITY, DATASETS, METRIC_PLUGINS, MODELS, PARTITIONERS, STRATEGIES, SYSTEMS
from fedhet.config_keys import COMPONENT_KEYS
from fedhet.data.arrays import standardise_targets
from fedhet.data.dataset import Dataset, FederatedData
from fedhet.data.federate import federate
from fedhet.data.labels import corrupt_labels
from fedhet.data.partition import Partitioner
from fedhet.data.shift import client_groups, shift_clients
from fedhet.data.shift_config import NoShift, ShiftComponent
from fedhet.data.sources import DatasetSource
from fedhet.engine.architectures import ArchitectureEngine, assign_members
from fedhet.engine.engine import Engine
from fedhet.engine.functional import FlatModel
from fedhet.engine.objective import TERMS, LocalTerm
from fedhet.engine.optimizers import OPTIMIZERS, ClientOptimizer
from fedhet.engine.plan import LocalSettings
from fedhet.engine.protocol import EngineProtocol
from fedhet.engine.schedules import SCHEDULES, Schedule
from fedhet.engine.schedules import Constant as ConstantSchedule
from fedhet.engine.task import TASKS, Task
from fedhet.errors import ConfigError, FedhetNote
from fedhet.experiments.config import RunConfig, dump_yaml, parse_config
from fedhet.experiments.evaluation import scores_personal
from fedhet.experiments.footprint import check_memory
from fedhet.experiments.preflight import check_exits, check_run
from fedhet.metrics.base import Metric, check_columns
from fedhet.models.architectures import Architectures
from fedhet.models.base import ModelSpec
from fedhet.plugins import load_plugins
from fedhet.privacy.ledger import (
    PrivacyLedger,
    RunShape,
    check_dp_sgd,
    check_sampling,
    check_unused_privacy,
    planned_participations,
    run_mechanisms,
    sampling_problem,
)
from fedhet.registry import Component, spec_of
from fedhet.requirements import ClientRequirements, UsesRequirements
from fedhet.seeding import derive_seed
from fedhet.strategies.base import ServerContext, Strategy
from fedhet.strategies.fedbn import check_statistics
from fedhet.systems.base import Constant, NoSystem, SystemModel


@dataclass
class Experiment:
    """A run's live objects."""

    config: RunConfig
    data: FederatedData
    engine: EngineProtocol
    strategy: Strategy
    availability: Availability
    metrics: list[Metric]
    requirements: ClientRequirements | None = None  # when a component or personalised appeal uses them
    system: SystemModel = field(default_factory=NoSystem)  # the clients' speeds (`none`: no simulated clock)
    privacy: PrivacyLedger | None = None  # a DP run's accounting (algorithm dp, local.dp_sgd)

    def resolved_config(self) -> dict[str, Any]:
        """The config with every component's parameters filled in (what identifies the run)."""
        return resolved_config(self.config)

    def derived(self) -> dict[str, Any]:
        """What the run's components worked out where the config left it to them (`Component.derived`), by key."""
        found: dict[str, Any] = {"algorithm": self.strategy.derived(), "availability": self.availability.derived()}
        found["metrics"] = [plugin.derived() for plugin in self.metrics]
        found["requirements"] = self.requirements.derived() if self.requirements is not None else {}
        scale = self.data.target_scale
        if scale is not None:  # the model predicts standardised targets: prediction · scale + mean is in their units
            found["task"] = {"target_mean": [round(float(m), 6) for m in scale.mean], "target_scale": scale.scale}
        return {key: value for key, value in found.items() if any(value)}

    def config_text(self) -> str:
        """``config.yaml``: the resolved config and, under ``derived``, the values the run worked out (not read
        back: a run of this file derives them again)."""
        derived = self.derived()
        return dump_yaml({**self.resolved_config(), **({"derived": derived} if derived else {})})


def resolved_config(config: RunConfig) -> dict[str, Any]:
    """`config` with every component's parameters filled in (what a run folder's ``config.yaml`` holds)."""
    raw = config.model_dump(mode="json")
    parts = components(config)
    for key, component in parts.items():
        raw[key] = spec_of(component)
    if not parts.system.simulates_time:
        raw.pop("system")  # as before system models existed
    raw["metrics"] = [spec_of(m) for m in parts.metrics]
    raw["local"]["optimizer"] = spec_of(parts.optimizer)
    raw["local"]["terms"] = [spec_of(t) for t in parts.terms]
    raw["shift"] = spec_of(parts.shift)
    if parts.task is not None:
        raw["task"] = spec_of(parts.task)
    if "schedules" in raw:
        raw["schedules"] = {
            key: spec_of(schedule) if schedule is not None else None
            for key, schedule in (("local_lr", parts.local_schedule), ("server_lr", parts.server_schedule))
        }
    return raw


@dataclass
class Components:
    """The validated components of a config."""

    algorithm: Strategy
    dataset: DatasetSource
    partition: Partitioner
    model: ModelSpec
    availability: Availability
    attack: Attack
    system: SystemModel
    metrics: list[Metric]
    optimizer: ClientOptimizer
    terms: list[LocalTerm]
    task: Task | None = None  # None: the dataset's (``task: auto``)
    local_schedule: Schedule | None = None  # None: constant
    server_schedule: Schedule | None = None  # None: the strategy's own
    shift: ShiftComponent = field(default_factory=NoShift)  # the config's shift (a plugin's once imported)

    def items(self) -> list[tuple[str, Component]]:
        return [(key, getattr(self, key)) for key in COMPONENT_KEYS]


def components(config: RunConfig) -> Components:
    """Validate every component of `config` (errors name the key, e.g. ``partition.alpha``; a metric plugin's
    column that another writes is refused), after importing the config's plugins."""
    load_plugins(config.imports)
    parts = Components(
        algorithm=STRATEGIES.build(config.spec("algorithm"), where="algorithm"),
        dataset=DATASETS.build(config.spec("dataset"), where="dataset"),
        partition=PARTITIONERS.build(config.spec("partition"), where="partition"),
        model=MODELS.build(config.spec("model"), where="model"),
        availability=AVAILABILITY.build(config.spec("availability"), where="availability"),
        attack=ATTACKS.build(config.spec("attack"), where="attack"),
        system=SYSTEMS.build(config.spec("system"), where="system"),
        metrics=[METRIC_PLUGINS.build(spec, where=f"metrics[{i}]") for i, spec in enumerate(config.metrics)],
        optimizer=OPTIMIZERS.build(config.local.optimizer, where="local.optimizer"),
        terms=[TERMS.build(spec, where=f"local.terms[{i}]") for i, spec in enumerate(config.local.terms)],
        task=None if config.task == "auto" else TASKS.build(config.task, where="task"),
        local_schedule=_schedule(config.schedules.local_lr, "schedules.local_lr"),
        server_schedule=_schedule(config.schedules.server_lr, "schedules.server_lr"),
        shift=config.shift.component(),
    )
    check_columns(parts.metrics)
    return parts


def _schedule(spec: str | dict[str, Any] | None, where: str) -> Schedule | None:
    """The schedule of `spec`; None for none or the constant one (nothing to schedule: the numbers of a run without
    schedules)."""
    if spec is None:
        return None
    schedule = SCHEDULES.build(spec, where=where)
    return None if isinstance(schedule, ConstantSchedule) else schedule


def task_of(config: RunConfig, parts: Components, data_task: str) -> Task:
    """The run's task: the config's, or (``task: auto``) the dataset's."""
    return parts.task if parts.task is not None else TASKS.build(data_task, where="task")


def load_dataset(config: RunConfig, parts: Components) -> Dataset:
    """The whole dataset, its labels read as the run's task needs them (numeric targets for a regression)."""
    numeric = None if parts.task is None else not parts.task.classes
    dataset = parts.dataset.for_task(numeric).load(Path(config.data_dir), download=config.download)
    task = task_of(config, parts, dataset.task)
    task.check_labels(dataset.y, dataset.num_classes, f"dataset '{parts.dataset.name}'")
    return dataset


def implied(config: RunConfig, parts: Components, dataset: Dataset) -> tuple[RunConfig, list[str]]:
    """The config with what the data implies where the config leaves it open, and a line for each: a user column
    (``dataset.user``) splits by user, one client per user (``partition: natural``; ``num_clients``: the users,
    unless set); a task without classes (regression) splits IID; a dataset whose task is not classification names
    it (``task: auto``). The run folder's config.yaml then holds it all, and reruns as it ran."""
    given = config.model_fields_set
    changes: dict[str, Any] = {}
    notes: list[str] = []
    column = parts.dataset.user_column()
    task = task_of(config, parts, dataset.task)
    if config.task == "auto" and dataset.task != "classification":
        changes["task"] = dataset.task
    if "partition" not in given and column is not None and dataset.users is not None:
        users = int(dataset.users.max()) + 1
        count = config.num_clients if "num_clients" in given else users - config.unseen_clients
        per_round = min(config.clients_per_round, count)
        changes.update(partition={"name": "natural"}, num_clients=count, clients_per_round=per_round)
        unseen = f" and {config.unseen_clients} unseen" if config.unseen_clients else ""
        notes.append(
            f"dataset.user={column}: {users} users, so partition natural, one client per user ({count} clients"
            f"{unseen}, {per_round} a round); name a partition to split otherwise"
        )
    elif "partition" not in given and not task.classes:
        changes["partition"] = {"name": "iid"}
        notes.append(f"task {task.name}: no classes to split by, so partition iid; name a partition to split otherwise")
    model = parts.algorithm.default_model
    if "model" not in given and model is not None:
        changes["model"] = {"name": model} if isinstance(model, str) else model
        if isinstance(model, str):
            named = model
        else:  # a spec, in one line of YAML
            named = yaml.safe_dump(model, default_flow_style=True, width=1 << 20, sort_keys=False).strip()
        notes.append(f"algorithm {parts.algorithm.name} trains model {named} unless the config names a model")
    if not changes:
        return config, notes
    return parse_config({**config.model_dump(mode="json"), **changes}), notes


def prepared(config: RunConfig) -> tuple[RunConfig, Components, Dataset, list[str]]:
    """The config made explicit (`implied`), its components, its dataset, and the lines saying what was implied."""
    parts = components(config)
    dataset = load_dataset(config, parts)
    explicit, notes = implied(config, parts, dataset)
    if explicit is not config:
        parts = components(explicit)
    return explicit, parts, dataset, notes


def explicit_config(config: RunConfig) -> RunConfig:
    """`config` as a run of it records it in config.yaml (`implied`); loads the dataset only where the config
    leaves something to the data (a user column or a task without classes and no partition named, a dataset that
    may name its task)."""
    parts = components(config)
    open_partition = "partition" not in config.model_fields_set and (
        parts.dataset.user_column() is not None or (parts.task is not None and not parts.task.classes)
    )
    declared = getattr(parts.dataset, "task", "auto") != "auto" or parts.dataset.name == "in_memory"
    if open_partition or (config.task == "auto" and declared):
        return prepared(config)[0]
    return config


def federate_dataset(config: RunConfig, parts: Components, dataset: Dataset) -> FederatedData:
    """Split `dataset` among the clients (train, validation, test), shift each group's data (``shift``), corrupt the
    configured labels, and standardise a regression's targets (``task.standardize``) by its training samples."""
    shift = parts.shift.for_dataset(dataset)
    groups = client_groups(config.num_clients + config.unseen_clients, shift, config.seed)
    data = federate(
        dataset,
        shift.partitioner(parts.partition, groups.numpy()),
        config.num_clients,
        unseen_clients=config.unseen_clients,
        test_fraction=config.test_fraction,
        seed=config.seed,
        val_fraction=config.val_fraction,
    )
    data = shift_clients(data, shift, config.seed)
    data = corrupt_labels(data, config.label_noise, config.seed)
    if task_of(config, parts, data.task).standardizes_targets() and torch.is_floating_point(data.train.y):
        data = standardise_targets(data)
    return data


def federated_data(config: RunConfig, parts: Components) -> FederatedData:
    """Load the dataset, split it among the clients as the config (made explicit) says, corrupt the labels."""
    explicit, parts, dataset, _ = prepared(config)
    return federate_dataset(explicit, parts, dataset)


def build_model(
    config: RunConfig,
    parts: Components,
    input_shape: tuple[int, ...],
    num_classes: int,
    data_task: str = "classification",
) -> FlatModel:
    """The model for the run's task (`task_of`), initialised from the seed's "model-init" stream (the same wherever
    it is built)."""
    task = task_of(config, parts, data_task)
    with torch.random.fork_rng():
        torch.manual_seed(derive_seed(config.seed, "model-init"))
        return FlatModel(parts.model.build(input_shape, task.outputs(num_classes)), task)


def local_settings(config: RunConfig, parts: Components) -> LocalSettings:
    """The run's default local training: the ``local`` section with its optimiser and objective terms."""
    local = config.local
    return LocalSettings(
        local.steps, local.lr, local.batch_size, local.weight_decay, parts.optimizer, tuple(parts.terms), local.epochs
    )


def make_engine(
    config: RunConfig, parts: Components, model: FlatModel, data: FederatedData, cls: type[Engine] = Engine
) -> Engine:
    """The engine (of class `cls`) over `data` with the config's backend and local settings (a model of several
    architectures: `ArchitectureEngine`, which routes each client to its own)."""
    if isinstance(parts.model, Architectures):
        if cls is not Engine:
            raise ConfigError("model: architectures runs in one process: leave out the Ray actors (actors)")
        cls = ArchitectureEngine
    return cls(
        model,
        data,
        backend=config.backend,
        seed=config.seed,
        chunk_size=config.chunk_size,
        local=local_settings(config, parts),
        device=config.device,
        precision=config.precision,
    )


def assemble(config: RunConfig, parts: Components, data: FederatedData, engine: EngineProtocol) -> Experiment:
    """Set the strategy, attack, availability and metrics up on `engine` (local, or a remote proxy)."""
    strategy = parts.algorithm
    requirements = ClientRequirements(engine, config.requirements)  # computed only if a component asks for ρ
    used = False
    for component in [*strategy.parts(), parts.availability, parts.attack, *parts.metrics]:
        if isinstance(component, UsesRequirements):
            component.use_requirements(requirements)
            used = True
    parts.attack.setup(data.num_clients, config.seed, eligible=data.seen)  # unseen clients never train
    local = local_settings(config, parts)
    if strategy.asynchronous and config.deadline.seconds is not None:
        raise ConfigError(
            f"a deadline cuts synchronous rounds short, and {config.spec('algorithm')['name']} is asynchronous (no "
            "round waits for its slowest client: algorithm.concurrency and the buffer set the pace); leave the "
            "deadline out"
        )
    # an asynchronous strategy needs a clock: without a system model every client runs at the constant one's speed
    system = parts.system if parts.system.simulates_time or not strategy.asynchronous else Constant()
    system.setup(data.num_clients, config.seed)
    if isinstance(parts.model, Architectures):
        check_architectures(parts.model, strategy, engine, system, config)
    timed = system.simulates_time and config.deadline.seconds is not None
    dropping = timed and config.deadline.rule.drops_clients
    check_sampling(
        config.privacy, strategy, config.spec("availability")["name"], config.spec("attack")["name"], dropping
    )
    private = bool(run_mechanisms(strategy, config.local.dp_sgd))
    check_statistics(parts.model, strategy, engine.model, private, isinstance(engine, Engine))  # batch norm
    ctx = ServerContext(engine, local, config.seed, config.clients_per_round, parts.attack, system)
    if timed:  # a deadline that over-selects: the server selects more clients than the updates it keeps
        ctx.cohort_size = config.deadline.rule.cohort(config.clients_per_round)
    ctx.local_schedule, ctx.server_schedule, ctx.rounds = parts.local_schedule, parts.server_schedule, config.rounds
    strategy.setup(ctx)
    availability = parts.availability
    availability.setup(data.num_clients, config.seed)
    availability.always_in(parts.attack.opted_in())
    for i, plugin in enumerate(parts.metrics):
        _check_personal_attack(plugin, i, strategy, config)
        plugin.setup(engine, config.seed)
    used = used or (config.personal_eval.appeal and scores_personal(strategy, config.personal_eval))
    privacy = privacy_ledger(config, strategy, data, local, engine, dropping)
    return Experiment(
        config, data, engine, strategy, availability, parts.metrics, requirements if used else None, system, privacy
    )


def _check_personal_attack(plugin: Metric, i: int, strategy: Strategy, config: RunConfig) -> None:
    """Refuse a metric plugin that looks at stored personalised models in a run that keeps none."""
    if not plugin.needs_personal_models():
        return
    name = config.spec("algorithm")["name"]
    if strategy.personalization(torch.zeros(0, dtype=torch.long)) is None:
        raise ConfigError(
            f"metrics[{i}] ('{plugin.name}') looks at the clients' personalised models, and algorithm '{name}' keeps "
            "none; use an algorithm with personal models (ditto, fedrep, local_only, ifca, ...) or target: global"
        )
    if config.personal_eval.finetune_steps:
        raise ConfigError(
            f"metrics[{i}] ('{plugin.name}') looks at the clients' stored personalised models, and "
            "personal_eval.finetune_steps makes them by training at each evaluation; leave finetune_steps out"
        )


def privacy_ledger(
    config: RunConfig,
    strategy: Strategy,
    data: FederatedData,
    local: LocalSettings,
    engine: EngineProtocol,
    dropping: bool = False,
) -> PrivacyLedger | None:
    """The run's privacy accounting when it asks for DP (`fedhet.privacy.ledger`; sets the noise from a target ε),
    after the refusals that need the built run (before anything is written)."""
    sgd = config.local.dp_sgd
    mechanisms = run_mechanisms(strategy, sgd)
    masked = [part.name for part in strategy.parts() if part.sub_models]
    if masked and mechanisms:
        raise ConfigError(
            f"'{masked[0]}' trains sub-models (sliced-off weights held at zero), which DP's clipping and noise "
            "would move: differential privacy (algorithm dp, local.dp_sgd) does not combine with it"
        )
    if not mechanisms:
        check_unused_privacy(config.privacy)
        return None
    if sgd is not None:
        check_dp_sgd(config.backend, strategy, engine, data.seen)
    sizes = data.train.sizes
    uniform = (
        sampling_problem(strategy, config.spec("availability")["name"], config.spec("attack")["name"], dropping) is None
    )
    shape = RunShape(
        config.rounds,
        config.clients_per_round,
        sizes,
        data.seen,
        local.plan(torch.arange(len(sizes)), sizes).steps,
        local.batch_size,
        planned_participations(strategy, data.seen, config.rounds) if uniform else None,
    )
    return PrivacyLedger(config.privacy, mechanisms, shape)


def check_architectures(
    spec: Architectures, strategy: Strategy, engine: EngineProtocol, system: SystemModel, config: RunConfig
) -> None:
    """A run of several architectures: a strategy that shares no weights between them, on the native engine; each
    client given its member (`fedhet.engine.architectures.assign_members`)."""
    name = strategy.name
    if not strategy.architectures:
        raise ConfigError(
            f"model: architectures gives clients different models, and algorithm '{name}' averages weights of one "
            "model; use fedproto, fedgh, feddf or local_only"
        )
    if not isinstance(engine, ArchitectureEngine):
        raise ConfigError("model: architectures runs on fedhet's own engine, not on Flower nodes")
    engine.place_client_state(config.personal_state, None)  # in memory: refused before anything is written
    capacities = system.capacities() if system.capacity is not None else None
    engine.assign(assign_members(spec, engine.model, engine.data.num_clients, config.seed, capacities))


EngineMaker = Callable[[RunConfig, Components, FlatModel, FederatedData], EngineProtocol]


def build(config: RunConfig, make: EngineMaker = make_engine) -> Experiment:
    """Load and federate the data (the config made explicit: `implied`; a line for each thing implied, as a
    `FedhetNote`), build the model, engine (`make`: `make_engine`, or another's such as
    `fedhet.experiments.actors`'), strategy and availability process."""
    config, parts, dataset, notes = prepared(config)
    for note in notes:
        warnings.warn(note, FedhetNote, stacklevel=2)
    data = federate_dataset(config, parts, dataset)
    model = build_model(config, parts, data.input_shape, data.num_classes, data.task)
    check_run(config, data, model)  # before the engine probes the model, and before anything is written
    check_exits(config, parts.terms, model)
    engine = make(config, parts, model, data)
    experiment = assemble(config, parts, data, engine)
    check_memory(experiment)  # the clients' state and a round's cohort must fit: before anything is written
    return experiment
