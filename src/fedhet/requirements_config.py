"""The config's ``requirements`` settings, apart from the code that computes ρ_k (`fedhet.requirements`), so that
the config validates without importing torch."""

from __future__ import annotations

from pydantic import ConfigDict, Field

from fedhet.registry import Settings


class RequirementsConfig(Settings):
    """How clients set their requirement ρ_k."""

    model_config = ConfigDict(extra="forbid")
    steps: int = Field(100, ge=0, description="τ_l: solo SGD steps of the local model ŵ_k")
    lr: float | None = Field(None, gt=0, description="learning rate of the solo training (default: local.lr)")
    batch_size: int | None = Field(None, ge=1, description="batch size of the solo training (default: local)")
    constant: float | None = Field(None, description="use this ρ for every client instead")
    file: str | None = Field(None, description="text/CSV file with one ρ per client instead")
