"""Named, typed components (datasets, partitioners, models, strategies, availability).

Every component is a pydantic model whose fields are its parameters; a registry maps a name to the class,
and `build` validates a ``{"name": ..., **params}`` mapping into an instance with one-line errors.
"""

from __future__ import annotations

import difflib
import math
import sys
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any, ClassVar, Generic, TypeVar, get_args

from pydantic import BaseModel, ConfigDict, ValidationError, field_validator, model_validator
from pydantic.fields import FieldInfo

from fedhet.errors import ConfigError

FLOAT32_MAX = 3.4028234663852886e38  # torch.finfo(torch.float32).max: the models and updates are float32


class Settings(BaseModel):
    """Base of every model of settings (the run config's sections, every component): a number must be finite
    (NaN and ±inf are refused; a field that gives ``.inf`` a meaning says ``allow_inf_nan=True``) and, where
    finite, within float32's range: fedhet trains in float32, where 1e300 is already infinite."""

    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)

    @field_validator("*", mode="after")
    @classmethod
    def _within_float32(cls, value: Any) -> Any:
        if isinstance(value, float) and math.isfinite(value) and abs(value) > FLOAT32_MAX:
            raise ValueError(f"must be within float32's range (±{FLOAT32_MAX:.3g}), the precision fedhet trains in")
        return value


class Component(Settings):
    """Base of every configurable component: its fields are its parameters (unknown keys are errors).

    A parameter that is itself a component (a strategy's server optimiser, FedGSNR's base strategy) given as a
    mapping without a ``name`` completes its default (`with_defaults`).
    """

    model_config = ConfigDict(extra="forbid", frozen=True, arbitrary_types_allowed=True)
    name: ClassVar[str] = ""
    description: ClassVar[str] = ""

    @model_validator(mode="before")
    @classmethod
    def _complete_nested_components(cls, data: Any) -> Any:
        if not isinstance(data, dict):
            return data
        return {
            key: with_defaults(value, cls.model_fields[key]) if key in cls.model_fields else value
            for key, value in data.items()
        }

    def derived(self) -> dict[str, Any]:
        """The values of parameters that the config left for the run to work out, as the run set them (q-FFL's
        L = 1/η_l when ``lipschitz`` is unset), once the component is set up: written under ``derived`` in the run
        folder's config.yaml, so that it records every value a run used. Default: none."""
        return {}


C = TypeVar("C", bound=Component)


def closest(word: str, options: list[str]) -> str:
    """A ' (did you mean X?)' suffix when `word` looks like one of `options`, else ''."""
    match = difflib.get_close_matches(word, options, n=1, cutoff=0.5)
    return f" (did you mean '{match[0]}'?)" if match else ""


def format_validation_error(err: ValidationError, where: str, cls: type[BaseModel]) -> str:
    """Turn pydantic's multi-line error into one line naming the key and what is allowed."""
    first = err.errors()[0]
    loc = ".".join(str(p) for p in first["loc"])
    key = f"{where}.{loc}" if where and loc else (where or loc)
    key = key.encode("unicode_escape").decode("ascii")  # a key with a newline or tab still prints on one line
    if first["type"] == "extra_forbidden":
        owner: type[BaseModel] = cls
        for part in first["loc"][:-1]:  # walk into nested models to list the right keys
            annotation = owner.model_fields[str(part)].annotation if str(part) in owner.model_fields else None
            if isinstance(annotation, type) and issubclass(annotation, BaseModel):
                owner = annotation
        allowed = sorted(owner.model_fields)
        hint = closest(str(first["loc"][-1]), allowed)
        return f"unknown key '{key}'{hint}; allowed keys: {', '.join(allowed)}"
    got = first.get("input")
    got_text = f" (got {got!r})" if got is not None and not isinstance(got, dict) else ""
    return f"invalid value for '{key}': {str(first['msg']).removeprefix('Value error, ')}{got_text}"


class Registry(Generic[C]):
    """A name → component-class map for one kind of component."""

    def __init__(self, kind: str) -> None:
        self.kind = kind
        self._classes: dict[str, type[C]] = {}

    def register(self, cls: type[C]) -> type[C]:
        """Class decorator: register `cls` under its ``name`` class variable."""
        if not cls.name:
            raise TypeError(f"{cls.__name__} needs a non-empty `name` class variable")
        if cls.name in self._classes:
            raise TypeError(f"{self.kind} '{cls.name}' is registered twice")
        self._classes[cls.name] = cls
        return cls

    def names(self) -> list[str]:
        return sorted(self._classes)

    def origin(self, name: str) -> str:
        """Where component `name` comes from: "fedhet" for a built-in, else the plugin's module (or file)."""
        module_name = self.get(name).__module__
        if module_name == "fedhet" or module_name.startswith("fedhet."):
            return "fedhet"
        file = getattr(sys.modules.get(module_name), "__file__", None)
        if not (module_name.startswith("fedhet_user_") and file):
            return module_name
        path = Path(file)
        return str(path.relative_to(Path.cwd())) if path.is_relative_to(Path.cwd()) else str(path)

    def __iter__(self) -> Iterator[type[C]]:
        return iter(self._classes[n] for n in self.names())

    def get(self, name: str) -> type[C]:
        if name not in self._classes:
            raise ConfigError(
                f"unknown {self.kind} '{name}'{closest(name, self.names())}; choose one of: {', '.join(self.names())}"
            )
        return self._classes[name]

    def build(self, spec: str | Mapping[str, Any], where: str | None = None) -> C:
        """Validate ``spec`` (a name, or a mapping with ``name`` and parameters) into a component."""
        where = where or self.kind
        if isinstance(spec, str):
            spec = {"name": spec}
        params = dict(spec)
        name = params.pop("name", None)
        if not isinstance(name, str):
            raise ConfigError(f"'{where}.name' is required; choose one of: {', '.join(self.names())}")
        cls = self.get(name)
        try:
            return cls(**params)
        except ValidationError as err:
            raise ConfigError(format_validation_error(err, where, cls)) from None
        except SystemExit as err:  # a plugin's sys.exit() must not end fedhet as a success
            raise ConfigError(f"building {where} '{name}' failed: SystemExit: {err.code}") from None


def with_defaults(value: Any, default: Any) -> Any:
    """A mapping of parameters without a ``name`` completed by the `default` component it overrides, else `value`
    as it is: over FedAdam's default server optimiser, ``{tau: 0.01}`` is Adam with τ = 0.01 and its other defaults.

    `default` is a component, a ``{name: ..., **params}`` mapping, or a name; or a pydantic field, whose default is
    taken when it is a component (or, for a field that takes a name or a mapping, a name or such a mapping).
    """
    if not isinstance(value, Mapping) or "name" in value:
        return value
    if isinstance(default, FieldInfo):
        takes_specs = str in get_args(default.annotation) and any(
            getattr(a, "__origin__", a) is dict for a in get_args(default.annotation)
        )
        default = default.get_default(call_default_factory=True)
        if not (isinstance(default, Component) or takes_specs):
            return value
    if isinstance(default, Component):
        return {**spec_of(default), **value}
    if isinstance(default, str):
        return {"name": default, **value}
    if isinstance(default, Mapping) and "name" in default:
        return {**default, **value}
    return value


def spec_of(component: Component) -> dict[str, Any]:
    """The ``{"name": ..., **params}`` mapping that rebuilds `component` (for resolved configs)."""
    return {"name": component.name, **component.model_dump(mode="json")}
