"""Any PyTorch model: ``model: {name: torch, target: "my_package.nets:Net", kwargs: {...}}``.

The target is an `nn.Module` subclass, a module instance (copied for each build), or a function its author marked
with `model_factory`, named ``"package.module:Name"`` or ``"path/to/file.py:Name"`` (see `fedhet.imports`); what
the name resolves to is checked before anything is called, so a config cannot make fedhet call an arbitrary
function (``subprocess:getoutput``). From Python, `fedhet.run` and `fedhet.Config` also accept the class, any
function or the instance itself (`hold_model`): an object you pass is your own request.

Buffers: fedhet trains, sends and aggregates parameters. A buffer (a fixed positional encoding, a mask) keeps the
value the model was built with, on every client and in the global model, except the running statistics of
normalisation layers (BatchNorm1d/2d/3d, SyncBatchNorm, InstanceNorm with ``track_running_stats=True``:
``running_mean``, ``running_var``, ``num_batches_tracked``). Those are model state: each client trains from the
statistics it receives (updating them in every training forward pass, as torch does; the weight-0 rows that pad
the batch of a client with fewer samples than ``batch_size`` count in no BatchNorm statistic), returns them, and
the server treats them by the run's
``batch_norm`` policy: ``aggregate`` (averaged as the parameters are: FedAvg's weighted mean), ``local`` (each
client keeps its own, with its BN layers' affine parameters: ``algorithm: fedbn``) or ``recompute`` (worked out
from the training data before the global model is scored: HeteroFL's static batch norm). docs/batchnorm.md has
the details; ``BatchNorm2d(..., track_running_stats=False)`` (always the batch's statistics) needs none of this.
"""

from __future__ import annotations

import copy
import hashlib
import inspect
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any, ClassVar, TypeVar

import torch
from pydantic import Field, field_validator, model_validator
from torch import nn

from fedhet.errors import ConfigError
from fedhet.imports import load_object, object_path
from fedhet.models.base import MODELS, ModelSpec, Statistics, batch_norm_field

IN_MEMORY = "<python>"
_HELD: dict[str, Any] = {}
INJECTED = ("input_shape", "num_classes")
FACTORY_MARK = "__fedhet_model_factory__"
F = TypeVar("F", bound=Callable[..., Any])


def model_factory(function: F) -> F:
    """Mark `function` (returning an `nn.Module`) as one a config may name as a model ``target``; fedhet calls no
    other function named in a config."""
    setattr(function, FACTORY_MARK, True)
    return function


def is_model_class(obj: Any) -> bool:
    return isinstance(obj, type) and issubclass(obj, nn.Module)


def is_marked_factory(obj: Any) -> bool:
    return inspect.isfunction(obj) and getattr(obj, FACTORY_MARK, False) is True


def hold_model(obj: Any) -> str:
    """A `target` string for a model class, factory or instance given from Python.

    `nn.Module` classes and `model_factory` functions importable by name get their ``"module:Name"`` (so the run
    folder's config.yaml works from the CLI too); anything else (instances, other functions, objects defined in
    ``__main__`` or inside functions) is kept for this process under ``"<python>:Name@key"``."""
    if is_model_class(obj) or is_marked_factory(obj):
        path = object_path(obj)
        if path is not None:
            return path
    label = type(obj).__name__ if isinstance(obj, nn.Module) else getattr(obj, "__qualname__", type(obj).__name__)
    h = hashlib.sha256(label.encode())
    if isinstance(obj, nn.Module):
        obj = copy.deepcopy(obj)  # later changes to the caller's instance do not leak into runs
        for key, tensor in obj.state_dict().items():
            h.update(key.encode())
            h.update(tensor.detach().cpu().contiguous().numpy().tobytes())
    else:
        h.update(str(id(obj)).encode())
    target = f"{IN_MEMORY}:{label}@{h.hexdigest()[:12]}"
    _HELD[target] = obj
    return target


def resolve_target(target: str) -> Any:
    """The object `target` names: one held from Python, or one loaded by `fedhet.imports.load_object`."""
    if target.startswith(f"{IN_MEMORY}:"):
        if target not in _HELD:
            raise ConfigError(
                f"model target '{target}' was given from Python in another process; pass the model again with "
                "fedhet.run, or name it as 'package.module:Name' or 'file.py:Name'"
            )
        return _HELD[target]
    return load_object(target)


def call_factory(factory: Any, kwargs: dict[str, Any], input_shape: tuple[int, ...], num_classes: int) -> Any:
    """Call `factory` with `kwargs`, adding ``input_shape`` and ``num_classes`` when it takes them by name."""
    try:
        params: Mapping[str, inspect.Parameter] = inspect.signature(factory).parameters
    except (TypeError, ValueError):
        params = {}  # builtins without a signature: call with kwargs only
    given = dict(kwargs)
    for name, value in zip(INJECTED, (input_shape, num_classes), strict=True):
        param = params.get(name)
        if param is not None and name not in given and param.kind is not inspect.Parameter.POSITIONAL_ONLY:
            given[name] = value
    return factory(**given)


def check_trainable(module: nn.Module, where: str) -> None:
    """Refuse modules the functional engine cannot train faithfully (one line each)."""
    params = list(module.named_parameters())
    if not params:
        raise ConfigError(f"{where} has no parameters to train")
    for name, p in params:
        if isinstance(p, nn.parameter.UninitializedParameter):
            raise ConfigError(f"{where}: parameter '{name}' is lazy (uninitialised); give its layer's input size")
        if p.dtype != torch.float32:
            raise ConfigError(f"{where}: parameter '{name}' is {p.dtype}; fedhet trains float32 models (call .float())")


@MODELS.register
class TorchModel(ModelSpec):
    """Your PyTorch model, named by import path: ``target: "my_package.nets:Net"`` or ``"nets.py:Net"``.

    The target is an `nn.Module` class or a `model_factory` function returning a module (called with ``kwargs``, plus
    ``input_shape`` (per sample, e.g. ``[3, 32, 32]``; the sequence length for token inputs) and
    ``num_classes`` when it takes parameters of those names), or a module instance (copied). The module must
    return outputs ``(batch, num_classes)``: the logits of a classifier; one logit for ``task: binary`` and one
    column per target for ``task: regression`` (num_classes is then that width). Parameters are trained; buffers
    stay as built, except batch norm's running statistics, which follow ``batch_norm`` (see this module's docstring).
    """

    name: ClassVar[str] = "torch"
    description: ClassVar[str] = "your PyTorch nn.Module, by import path 'package.module:Class' or 'file.py:Class'"
    target: str = Field(
        ..., description="'package.module:Name' or 'path/to/file.py:Name' (nn.Module class or instance, model_factory)"
    )
    kwargs: dict[str, Any] = Field(default_factory=dict, description="keyword arguments for the class or factory")
    batch_norm: Statistics | None = batch_norm_field()

    @field_validator("target")
    @classmethod
    def _absolute_file(cls, value: str) -> str:
        """'file.py:Name' with the file as an absolute path (a run folder's config.yaml then works from anywhere)."""
        file, sep, rest = value.rpartition(":")
        if sep and file.endswith(".py") and Path(file).expanduser().is_file():
            return f"{Path(file).expanduser().resolve()}:{rest}"
        return value

    @model_validator(mode="after")
    def _buildable(self) -> TorchModel:
        self.resolve()  # a target fedhet may not build is refused with the config, before anything runs
        return self

    def resolve(self) -> Any:
        """The object the target names, checked to be one fedhet builds (nothing of it is called): an `nn.Module`
        class or instance, a `model_factory` function, or any callable given from Python (held in memory)."""
        where = f"model '{self.target}'"
        with torch.random.fork_rng():  # importing the target may draw random numbers; the seeded init must not see it
            obj = resolve_target(self.target)
        held = self.target.startswith(f"{IN_MEMORY}:")  # an object given from Python: any function is the user's
        if isinstance(obj, nn.Module):
            if self.kwargs:
                raise ConfigError(f"{where} is a module instance; it takes no kwargs (give its class instead)")
        elif not (is_model_class(obj) or is_marked_factory(obj) or (held and callable(obj))):
            kind = "class" if isinstance(obj, type) else type(obj).__name__
            raise ConfigError(
                f"{where} is a {kind}, not an nn.Module class or instance; fedhet calls nothing else a config names "
                "(a function that builds a model needs @fedhet.model_factory)"
            )
        return obj

    def build(self, input_shape: tuple[int, ...], num_classes: int) -> nn.Module:
        where = f"model '{self.target}'"
        obj = self.resolve()
        if isinstance(obj, nn.Module):
            module: Any = copy.deepcopy(obj)
        else:
            try:
                module = call_factory(obj, self.kwargs, input_shape, num_classes)
            except ConfigError:
                raise
            except (Exception, SystemExit) as err:  # sys.exit() in the model's code must not end fedhet with 0
                text = str(err).strip().splitlines()
                raise ConfigError(
                    f"building {where} failed: {type(err).__name__}: {text[0] if text else ''} "
                    f"(kwargs {self.kwargs}, input_shape {list(input_shape)}, num_classes {num_classes})"
                ) from err
        if not isinstance(module, nn.Module):
            raise ConfigError(f"{where} returned a {type(module).__name__}, not an nn.Module")
        check_trainable(module, where)
        return module
