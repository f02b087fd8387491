"""A strategy that wraps a base strategy (``base:``), as FedGSNR and client-level DP do: the base is built from its
spec when the config is validated, the wrapper has no server step of its own, and selection, setup and the parts
list go through to the base unless the wrapper overrides them."""

from __future__ import annotations

from typing import Any, ClassVar

from pydantic import Field, PrivateAttr, field_validator
from torch import Tensor

from fedhet.errors import ConfigError
from fedhet.registry import spec_of
from fedhet.strategies.base import STRATEGIES, ServerContext, Strategy
from fedhet.strategies.server import ServerOptimizer


class Wrapper(Strategy):
    """Base class of wrapping strategies; a subclass may refuse a base in `check_base` (raise ValueError)."""

    base: str | dict[str, Any] = Field("fedavg", validate_default=True, description="the base strategy")
    # its `select` is the base's (or a uniform sample of its own): the cohort is a uniform sample when the base's
    # is (what privacy accounting checks, `fedhet.privacy.ledger`); a subclass that chooses otherwise sets False
    keeps_base_selection: ClassVar[bool] = True

    _base: Strategy | None = PrivateAttr(None)

    @classmethod
    def check_base(cls, built: Strategy) -> None:
        """Refuse a base this wrapper cannot wrap (ValueError, one line); by default only one of its own kind."""
        if any(isinstance(part, cls) for part in built.parts()):
            raise ValueError(f"the base of {cls.name} cannot be {cls.name} itself")

    @field_validator("server_lr")
    @classmethod
    def _no_server_lr(cls, value: float) -> float:
        if value != 1.0:
            raise ValueError(f"the {cls.name} wrapper has no server step of its own; set algorithm.base.server_lr")
        return value

    @field_validator("server_optimizer", mode="after")
    @classmethod
    def _no_server_optimizer(cls, value: ServerOptimizer) -> ServerOptimizer:
        if value.name != "sgd":
            raise ValueError(
                f"the {cls.name} wrapper has no server step of its own; set algorithm.base.server_optimizer"
            )
        return value

    @field_validator("base", mode="before")
    @classmethod
    def _resolve_base(cls, value: Any) -> dict[str, Any]:
        try:
            built = STRATEGIES.build(value, where="algorithm.base")
        except ConfigError as err:
            raise ValueError(str(err)) from None
        cls.check_base(built)
        return spec_of(built)

    def model_post_init(self, context: Any, /) -> None:
        self._base = STRATEGIES.build(self.base, where="algorithm.base")

    @property
    def inner(self) -> Strategy:
        """The base strategy (built from `base`)."""
        assert self._base is not None
        return self._base

    def setup(self, ctx: ServerContext) -> None:
        super().setup(ctx)
        self.inner.setup(ctx)

    def parts(self) -> list[Strategy]:
        return [self, *self.inner.parts()]

    def select(self, round_: int, available: Tensor) -> Tensor:
        return self.inner.select(round_, available)

    def evaluation_params(self, params: Tensor) -> Tensor:
        return self.inner.evaluation_params(params)
