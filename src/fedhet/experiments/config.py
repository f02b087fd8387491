"""The run configuration: a YAML file and/or flags, validated into typed objects with one-line errors."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any, Literal

import yaml
from pydantic import (
    BeforeValidator,
    ConfigDict,
    Field,
    SerializerFunctionWrapHandler,
    ValidationError,
    ValidationInfo,
    field_validator,
    model_serializer,
    model_validator,
)

from fedhet.config_keys import COMPONENT_KEYS
from fedhet.data.label_noise import LabelNoise
from fedhet.data.shift_config import Shift
from fedhet.errors import ConfigError
from fedhet.experiments.trackers import validate_track
from fedhet.privacy.settings import DPSGDConfig, PrivacyConfig
from fedhet.registry import Settings, format_validation_error, with_defaults
from fedhet.requirements_config import RequirementsConfig
from fedhet.systems.deadline import Deadline
from fedhet.yaml_text import MAX_CONFIG_BYTES, MAX_CONFIG_VALUES, check_expanded, load_yaml, safe_yaml

__all__ = ["MAX_CONFIG_BYTES", "MAX_CONFIG_VALUES", "RunConfig", "load_yaml", "parse_config", "safe_yaml"]

ComponentSpec = str | dict[str, Any]

# Limits on what a run may ask for (docs/reliability.md, "Limits"): values beyond them are typing mistakes that
# would otherwise run for years or allocate terabytes before failing.
MAX_ROUNDS = 1_000_000
MAX_CLIENTS = 1_000_000
MAX_STEPS = 1_000_000
MAX_EPOCHS = 10_000
MAX_BATCH = 1_000_000
MAX_SEED = 2**63 - 1
MAX_BATCH_SLOTS = 1 << 28  # clients_per_round × local.steps × local.batch_size: 12 bytes of batch indices each


def _no_bool(value: Any) -> Any:
    if isinstance(value, bool):
        raise ValueError("must be a whole number, not yes/no/true/false")
    return value


Count = Annotated[int, BeforeValidator(_no_bool)]


class LocalConfig(Settings):
    """Default local training of every client (a strategy may change it per client)."""

    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)
    steps: Count = Field(10, ge=1, le=MAX_STEPS, description="local SGD steps per round")
    epochs: float | None = Field(
        None,
        gt=0,
        le=MAX_EPOCHS,
        description="instead of steps: client k takes ⌈epochs · n_k / batch_size⌉ steps per round",
    )
    lr: float = Field(0.05, gt=0, description="local learning rate")
    batch_size: Count = Field(10, ge=1, le=MAX_BATCH, description="mini-batch size")
    weight_decay: float = Field(0.0, ge=0, description="L2 penalty λ added to the local gradient as λw")
    optimizer: ComponentSpec = Field(
        "sgd", description="client optimiser: sgd (momentum, nesterov) or adam; persistent: keep its state"
    )
    terms: list[ComponentSpec] = Field(
        default_factory=list, description="extra terms of every client's objective, e.g. [{name: proximal, mu: 0.1}]"
    )
    dp_sgd: DPSGDConfig | None = Field(
        None, description="example-level DP: DP-SGD in every client's steps, e.g. {clip: 1.0, noise_multiplier: 1.1}"
    )

    @field_validator("optimizer", mode="before")
    @classmethod
    def _optimizer(cls, value: Any) -> Any:
        return with_defaults(value, cls.model_fields["optimizer"].default)


class PersonalEvalConfig(Settings):
    """Personalised evaluation: each client's own model scored on its own test data, beside the global model."""

    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)
    enabled: bool | None = Field(
        None,
        description="score personalised models (default: when the algorithm has them, or finetune_steps > 0)",
    )
    finetune_steps: Count = Field(
        0,
        ge=0,
        le=MAX_STEPS,
        description="local SGD steps each client takes from its personalised (or the global) model before scoring",
    )
    lr: float | None = Field(None, gt=0, description="learning rate of the fine-tuning steps (default: local.lr)")
    every: Count = Field(1, ge=1, description="every n-th evaluated round (and always the last)")
    appeal: bool = Field(
        True, description="also personal_appeal: the share of clients whose model beats their requirement ρ_k"
    )


class SelectionConfig(Settings):
    """Which evaluated round's model is the run's result, and early stopping: the best round by a (validation)
    metric is kept beside the last (``best.pt``), and tables report its row (`fedhet.experiments.selection`)."""

    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)
    metric: str | None = Field(
        None,
        description="the metrics.csv column that picks the best round (default: val_loss with a validation split, "
        "else none: the last round is the result)",
    )
    mode: Literal["auto", "max", "min"] = Field(
        "auto", description="whether larger is better (auto: min for losses, MAE and RMSE, max otherwise)"
    )
    patience: Count = Field(
        0, ge=0, description="early stopping: stop after this many evaluated rounds without improvement (0: never)"
    )
    min_delta: float = Field(0.0, ge=0, description="an improvement must beat the best so far by more than this")


class SchedulesConfig(Settings):
    """Learning-rate schedules over the rounds (fedhet list schedules): η_t = η · factor(t, T)."""

    model_config = ConfigDict(extra="forbid")
    local_lr: ComponentSpec = Field("constant", description="schedule of every client's local.lr")
    server_lr: ComponentSpec | None = Field(
        None,
        description="schedule of algorithm.server_lr (default: the algorithm's own: constant, or FedMGDA+'s decay)",
    )

    @field_validator("local_lr", "server_lr", mode="before")
    @classmethod
    def _spec(cls, value: Any) -> Any:
        if value is None or isinstance(value, str | dict):
            return value
        raise ValueError("must be a name or a mapping with a 'name' key")


class RunConfig(Settings):
    """Everything that defines a run. Components are a name or a mapping ``{name: ..., <params>}``."""

    model_config = ConfigDict(extra="forbid")
    imports: list[str] = Field(
        default_factory=list,
        description="modules or .py files to import first: they register your own components (plugins)",
    )
    algorithm: ComponentSpec = Field("fedavg", description="the strategy (fedhet list algorithms)")
    dataset: ComponentSpec = Field("digits", description="the data (fedhet list datasets)")
    partition: ComponentSpec = Field(
        {"name": "dirichlet", "alpha": 0.5},
        description="how samples are split among clients (fedhet list partitioners)",
    )
    model: ComponentSpec = Field("mlp", description="the model (fedhet list models; {name: torch, target: ...})")
    availability: ComponentSpec = Field("always", description="who is online each round (fedhet list availability)")
    attack: ComponentSpec = Field("none", description="malicious clients (fedhet list attacks)")
    system: ComponentSpec = Field(
        "none", description="each client's compute speed and network (fedhet list systems): rounds take time"
    )
    deadline: Deadline = Field(
        default_factory=Deadline, description="a synchronous round's deadline on the simulated clock (with a system)"
    )
    metrics: list[ComponentSpec] = Field(default_factory=list, description="metric plugins, e.g. [appeal]")
    num_clients: Count = Field(20, ge=1, le=MAX_CLIENTS, description="clients that train (seen clients)")
    unseen_clients: Count = Field(0, ge=0, le=MAX_CLIENTS, description="held-out clients that are only evaluated")
    label_noise: LabelNoise = Field(default_factory=LabelNoise, description="corrupt some clients' labels")
    shift: Shift = Field(
        default_factory=Shift, description="a ground-truth group per client and a data shift per group, e.g. rotation"
    )
    requirements: RequirementsConfig = Field(
        default_factory=RequirementsConfig, description="client requirements ρ_k (MaxFL, appeal metrics)"
    )
    test_fraction: float = Field(0.2, ge=0, lt=1, description="share of each client's samples kept for test")
    val_fraction: float = Field(
        0.0, ge=0, lt=1, description="share of each client's samples kept for validation (taken from its training part)"
    )
    selection: SelectionConfig = Field(
        default_factory=SelectionConfig,
        description="the best round by a validation metric (kept beside the last) and early stopping",
    )
    task: ComponentSpec = Field(
        "auto",
        description="what the model learns (fedhet list tasks): classification, binary, regression; auto: the "
        "dataset's",
    )
    schedules: SchedulesConfig = Field(
        default_factory=SchedulesConfig, description="learning-rate schedules of local.lr and algorithm.server_lr"
    )
    clients_per_round: Count = Field(
        10,
        ge=1,
        description="m: clients sampled among the available ones each round (default 10, or num_clients if fewer)",
    )
    rounds: Count = Field(20, ge=1, le=MAX_ROUNDS, description="communication rounds")
    local: LocalConfig = Field(default_factory=LocalConfig, description="every client's default local training")
    personal_eval: PersonalEvalConfig = Field(
        default_factory=PersonalEvalConfig,
        description="personalised evaluation: each client's own model (Ditto, FedRep, ... or fine-tuned)",
    )
    privacy: PrivacyConfig = Field(
        default_factory=PrivacyConfig,
        description="accounting of differential privacy (algorithm dp, local.dp_sgd): δ, accountant, target ε",
    )
    eval_every: Count = Field(1, ge=1, description="evaluate every n rounds (and always after the last)")
    eval_clients: Count = Field(
        0,
        ge=0,
        le=MAX_CLIENTS,
        description="evaluate a seeded sample of this many clients per round (0: all); the last round, and "
        "every round of a run with a metric plugin that needs all clients, evaluate everyone",
    )
    seed: Count = Field(
        0, ge=0, le=MAX_SEED, description="seeds every random draw (data split, sampling, batches, init)"
    )
    backend: Literal["auto", "sequential", "vectorised", "dense", "conv"] = Field(
        "auto", description="how a cohort trains: the same numbers on each, auto picks the fastest"
    )
    chunk_size: Count = Field(0, ge=0, description="clients per chunk (0: whole cohort, or per worker for dense)")
    device: str = Field("cpu", description="where training and evaluation run: 'cpu' or 'cuda' (dense/vectorised/conv)")
    personal_state: Literal["auto", "memory", "disk"] = Field(
        "auto",
        description="where the clients' own rows (personal models, SCAFFOLD's c_i, ...) live between rounds: memory, "
        "disk (files in the run folder), auto (disk when K × the model's bytes exceed a quarter of free memory)",
    )
    precision: Literal["float32", "bfloat16", "float16"] = Field(
        "float32",
        description="local training's matrix products under torch.autocast (bfloat16/float16: faster on a GPU, "
        "results within docs/performance.md's tolerance of float32's); the models stay float32",
    )
    data_dir: str = Field(
        "data", description="folder holding dataset files (data_dir/<dataset name>/); kept absolute in config.yaml"
    )
    download: bool = Field(False, description="download missing dataset files (checksums verified)")
    checkpoint_every: Count = Field(1, ge=1, description="write checkpoint.pt every n rounds (and after the last)")
    max_loss: float = Field(
        1e4,
        gt=0,
        allow_inf_nan=True,
        description="stop as diverged when a local loss is NaN or infinite, or exceeds both this and 100 times the "
        "initial model's loss (a loss that starts high, as on large regression targets, is no divergence; .inf: "
        "only NaN or infinite losses)",
    )
    track: list[ComponentSpec] = Field(
        default_factory=list,
        description="experiment trackers, e.g. [tensorboard, {name: mlflow, uri: ...}, {name: wandb, project: p}]",
    )
    derived: dict[str, Any] = Field(
        default_factory=dict,
        exclude=True,
        description="written by fedhet into a run folder's config.yaml: the values a run worked out where the "
        "config left them to it (q-FFL's L = 1/local.lr, ...); ignored when read",
    )

    @field_validator(*COMPONENT_KEYS, mode="before")
    @classmethod
    def _spec(cls, value: Any, info: ValidationInfo) -> Any:
        if isinstance(value, str | dict):
            return with_defaults(value, cls.model_fields[str(info.field_name)].default)
        raise ValueError("must be a name or a mapping with a 'name' key")

    @field_validator("task", mode="before")
    @classmethod
    def _task(cls, value: Any) -> Any:
        if isinstance(value, str) or (isinstance(value, dict) and "name" in value):
            return value
        raise ValueError("must be a name or a mapping with a 'name' key")

    @field_validator("data_dir")
    @classmethod
    def _data_dir(cls, value: str) -> str:
        """An existing folder as an absolute path, so that a run folder's config.yaml works from any directory."""
        folder = Path(value).expanduser()
        return str(folder.resolve()) if folder.is_dir() else value

    @field_validator("imports")
    @classmethod
    def _imports(cls, value: list[str]) -> list[str]:
        """.py files as absolute paths (modules stay names)."""
        return [
            str(Path(v).expanduser().resolve()) if v.endswith(".py") and Path(v).expanduser().is_file() else v
            for v in value
        ]

    @field_validator("track")
    @classmethod
    def _track(cls, value: list[ComponentSpec]) -> list[ComponentSpec]:
        validate_track(value)  # raises a one-line ConfigError (not caught by pydantic)
        return value

    @model_serializer(mode="wrap")
    def _without_unused_keys(self, handler: SerializerFunctionWrapHandler) -> dict[str, Any]:
        """config.yaml (and the run's identity) as before `track`, `eval_clients`, `personal_eval`, `system`,
        `deadline`, `privacy` and `local.dp_sgd` existed, when unused."""
        data: dict[str, Any] = handler(self)
        if not data.get("track"):
            data.pop("track", None)
        if not data.get("eval_clients"):
            data.pop("eval_clients", None)
        if data.get("personal_eval") == PersonalEvalConfig().model_dump():
            data.pop("personal_eval", None)
        if data.get("system") in ("none", {"name": "none"}):
            data.pop("system", None)
        if data.get("deadline") == Deadline().model_dump():
            data.pop("deadline", None)
        for key, default in (
            ("val_fraction", 0.0),
            ("personal_state", "auto"),
            ("precision", "float32"),
            ("task", "auto"),
            ("selection", SelectionConfig().model_dump()),
            ("schedules", SchedulesConfig().model_dump()),
        ):
            if data.get(key) == default:
                data.pop(key, None)
        if data.get("privacy") == PrivacyConfig().model_dump():
            data.pop("privacy", None)
        if isinstance(data.get("local"), dict) and data["local"].get("dp_sgd", 0) is None:
            data["local"].pop("dp_sgd")
        return data

    @model_validator(mode="after")
    def _sizes(self) -> RunConfig:
        """Sizes that only make sense together (one-line errors, raised before anything runs or is written)."""
        if "clients_per_round" not in self.model_fields_set:  # the default, 10, means "10 or all of them"
            self.clients_per_round = min(self.clients_per_round, self.num_clients)
        if self.clients_per_round > self.num_clients:
            raise ValueError(
                f"clients_per_round ({self.clients_per_round}) is more than num_clients ({self.num_clients}); "
                f"at most {self.num_clients} clients can train in a round"
            )
        if self.test_fraction + self.val_fraction >= 1:
            raise ValueError(
                f"test_fraction ({self.test_fraction:g}) + val_fraction ({self.val_fraction:g}) leave no training "
                "data; their sum must be below 1"
            )
        if self.selection.patience and self.selection_metric() is None:
            raise ValueError(
                "selection.patience stops a run when selection.metric stops improving; set val_fraction (it then "
                "watches val_loss) or name selection.metric"
            )
        slots = self.clients_per_round * self.local.steps * self.local.batch_size
        if slots > MAX_BATCH_SLOTS:
            raise ValueError(
                f"clients_per_round × local.steps × local.batch_size = {slots:,} samples per round need "
                f"{slots * 12 / 2**30:,.0f} GiB for the batch indices alone (at most {MAX_BATCH_SLOTS:,}); lower "
                "local.batch_size (a batch larger than a client's data only adds padding) or local.steps"
            )
        for key in ("steps", "batch_size"):
            value = getattr(self.requirements, key, None)
            limit = MAX_STEPS if key == "steps" else MAX_BATCH
            if isinstance(value, int) and value > limit:
                raise ValueError(f"requirements.{key} ({value:,}) is more than {limit:,}")
        return self

    @model_validator(mode="after")
    def _deadline(self) -> RunConfig:
        """A deadline needs a system model to time the clients against, and its policy needs its seconds."""
        deadline, system = self.deadline, self.spec("system")["name"]
        if deadline.seconds is not None and system == "none":
            raise ValueError(
                f"deadline.seconds ({deadline.seconds:g}) needs a system model to time the clients against, and "
                "system is none; set one (system: lognormal, constant or trace; fedhet list systems) or leave the "
                "deadline out"
            )
        if deadline.seconds is None and deadline != Deadline():
            raise ValueError(
                f"deadline.policy ({deadline.policy_name}) and deadline.overselect have no effect without "
                "deadline.seconds; set the seconds, or leave the deadline out"
            )
        if deadline.policy != "overselect" and deadline.overselect != Deadline().overselect:
            raise ValueError(
                f"deadline.overselect ({deadline.overselect:g}) is used by deadline.policy overselect only, and the "
                f"policy is {deadline.policy_name}; set policy: overselect (or {{name: overselect, r: ...}}), or "
                "leave overselect out"
            )
        return self

    def selection_metric(self) -> str | None:
        """The metric that picks the best round: ``selection.metric``, or val_loss with a validation split."""
        if self.selection.metric is not None:
            return self.selection.metric
        return "val_loss" if self.val_fraction > 0 else None

    def spec(self, key: str) -> dict[str, Any]:
        """The component `key` as a ``{name: ..., **params}`` mapping."""
        value = getattr(self, key)
        return {"name": value} if isinstance(value, str) else dict(value)


def parse_config(raw: dict[str, Any]) -> RunConfig:
    """Validate a raw mapping (from YAML, flags or code) into a `RunConfig`; every problem is one `ConfigError`."""
    check_expanded(raw)
    bad = _non_string_key(raw)
    if bad is not None:
        raise ConfigError(f"config key {bad} is not a name; keys must be text, e.g. rounds or local.lr")
    try:
        return RunConfig.model_validate(raw)
    except ValidationError as err:
        first = err.errors()[0]
        if first["type"] == "value_error" and not first["loc"]:  # a check across keys (`RunConfig._sizes`)
            raise ConfigError(str(first["msg"]).removeprefix("Value error, ")) from None
        raise ConfigError(format_validation_error(err, "", RunConfig)) from None


def _non_string_key(raw: Any, where: str = "") -> str | None:
    """The first mapping key in `raw` that is not a string (as ``section.key`` text), else None."""
    if isinstance(raw, dict):
        for key, value in raw.items():
            if not isinstance(key, str):
                return repr(f"{where}{key}") if where else repr(key)
            found = _non_string_key(value, f"{where}{key}.")
            if found is not None:
                return found
    elif isinstance(raw, list):
        for item in raw:
            found = _non_string_key(item, where)
            if found is not None:
                return found
    return None


def dump_yaml(data: dict[str, Any]) -> str:
    return yaml.safe_dump(data, sort_keys=False)
