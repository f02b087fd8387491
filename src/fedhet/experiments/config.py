"""The run configuration: a YAML file and/or flags, validated into typed objects with one-line errors."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from fedhet.data.labels import LabelNoise
from fedhet.errors import ConfigError
from fedhet.methods.maxfl.requirements import RequirementsConfig
from fedhet.registry import format_validation_error

ComponentSpec = str | dict[str, Any]
COMPONENT_KEYS = ("algorithm", "dataset", "partition", "model", "availability", "attack")


class LocalConfig(BaseModel):
    """Default local training of every client (a strategy may change it per client)."""

    model_config = ConfigDict(extra="forbid")
    steps: int = Field(10, ge=1, description="local SGD steps per round")
    epochs: float | None = Field(
        None, gt=0, description="instead of steps: client k takes ⌈epochs · n_k / batch_size⌉ steps per round"
    )
    lr: float = Field(0.05, gt=0, description="local learning rate")
    batch_size: int = Field(10, ge=1, description="mini-batch size")
    weight_decay: float = Field(0.0, ge=0, description="L2 penalty λ added to the local gradient as λw")
    optimizer: ComponentSpec = Field(
        "sgd", description="client optimiser: sgd (momentum, nesterov) or adam; persistent: keep its state"
    )
    terms: list[ComponentSpec] = Field(
        default_factory=list, description="extra terms of every client's objective, e.g. [{name: proximal, mu: 0.1}]"
    )


class RunConfig(BaseModel):
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
    metrics: list[ComponentSpec] = Field(default_factory=list, description="metric plugins, e.g. [appeal]")
    num_clients: int = Field(20, ge=1, description="clients that train (seen clients)")
    unseen_clients: int = Field(0, ge=0, description="held-out clients that are only evaluated")
    label_noise: LabelNoise = Field(default_factory=LabelNoise, description="corrupt some clients' labels")
    requirements: RequirementsConfig = Field(
        default_factory=RequirementsConfig, description="client requirements ρ_k (MaxFL, appeal metrics)"
    )
    test_fraction: float = Field(0.2, ge=0, lt=1, description="share of each client's samples kept for test")
    clients_per_round: int = Field(10, ge=1, description="m: clients sampled among the available ones each round")
    rounds: int = Field(20, ge=1, description="communication rounds")
    local: LocalConfig = Field(default_factory=LocalConfig, description="every client's default local training")
    eval_every: int = Field(1, ge=1, description="evaluate every n rounds (and always after the last)")
    seed: int = Field(0, ge=0, description="seeds every random draw (data split, sampling, batches, init)")
    backend: Literal["auto", "sequential", "vectorised", "dense"] = Field(
        "auto", description="how a cohort trains: the same numbers on each, auto picks the fastest"
    )
    chunk_size: int = Field(0, ge=0, description="clients per chunk (0: whole cohort, or per worker for dense)")
    device: str = Field("cpu", description="where training and evaluation run: 'cpu' or 'cuda' (dense/vectorised)")
    data_dir: str = Field("data", description="folder holding dataset files (data_dir/<dataset name>/)")
    download: bool = Field(False, description="download missing dataset files (checksums verified)")
    checkpoint_every: int = Field(1, ge=1, description="write checkpoint.pt every n rounds (and after the last)")
    max_loss: float = Field(1e4, gt=0, description="stop as diverged when the local loss exceeds this")

    @field_validator(*COMPONENT_KEYS, mode="before")
    @classmethod
    def _spec(cls, value: Any) -> Any:
        if isinstance(value, str | dict):
            return value
        raise ValueError("must be a name or a mapping with a 'name' key")

    def spec(self, key: str) -> dict[str, Any]:
        """The component `key` as a ``{name: ..., **params}`` mapping."""
        value = getattr(self, key)
        return {"name": value} if isinstance(value, str) else dict(value)


def parse_config(raw: dict[str, Any]) -> RunConfig:
    try:
        return RunConfig(**raw)
    except ValidationError as err:
        raise ConfigError(format_validation_error(err, "", RunConfig)) from None


def load_yaml(path: Path) -> dict[str, Any]:
    if not path.is_file():
        raise ConfigError(f"config file '{path}' does not exist")
    try:
        data = yaml.safe_load(path.read_text()) or {}
    except yaml.YAMLError as err:
        raise ConfigError(f"config file '{path}' is not valid YAML: {str(err).splitlines()[0]}") from None
    if not isinstance(data, dict):
        raise ConfigError(f"config file '{path}' must hold a mapping of keys to values")
    return data


def apply_override(raw: dict[str, Any], assignment: str) -> None:
    """Apply one ``dotted.key=value`` (value parsed as YAML) to the raw config mapping in place."""
    if "=" not in assignment:
        raise ConfigError(f"--set '{assignment}' must look like key=value, e.g. local.lr=0.1")
    key, text = assignment.split("=", 1)
    parts = key.strip().split(".")
    if not all(parts):
        raise ConfigError(f"--set '{assignment}': empty key")
    try:
        value = yaml.safe_load(text)
    except yaml.YAMLError:
        value = text
    node = raw
    for depth, part in enumerate(parts[:-1]):
        child = node.get(part)
        if isinstance(child, str) and depth == 0 and part in COMPONENT_KEYS:
            child = {"name": child}
        elif child is None:
            default = RunConfig.model_fields[part].default if part in COMPONENT_KEYS else {}
            child = {"name": default} if isinstance(default, str) else dict(default or {})
        elif not isinstance(child, dict):
            raise ConfigError(f"--set '{assignment}': '{part}' is not a section")
        node[part] = child
        node = child
    node[parts[-1]] = value


def set_component(raw: dict[str, Any], key: str, name: str) -> None:
    """Choose component `name` for `key` (a flag such as --algorithm), keeping params only if it is unchanged."""
    current = raw.get(key)
    if isinstance(current, dict) and current.get("name") == name:
        return
    raw[key] = name


def dump_yaml(data: dict[str, Any]) -> str:
    return yaml.safe_dump(data, sort_keys=False)
