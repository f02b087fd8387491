"""Low-rank adapters (LoRA, Hu et al., ICLR 2022) on the Linear layers of any model, written for the flat-vector
engine (`peft` would pull in `transformers`, and its modules hold state the functional engine does not need).

A target layer y = W x + b becomes (Hu et al., Eq. 3)

    y = W x + b + (α / r) B A x,    A ∈ R^{r×in} (Kaiming-uniform init), B ∈ R^{out×r} (zero init),

so the adapted model starts as the base model. W and b are frozen (``requires_grad = False``; the engine leaves
every such parameter as it starts, `fedhet.engine.functional.FlatModel.frozen`), A and B are trained. The
parameters are named ``<layer>.lora_A`` and ``<layer>.lora_B``; ``<layer>.weight`` and ``<layer>.bias`` keep
their names, so a state dict of the base model loads into the adapted one (`load_base`).

Clients of different ranks (FlexLoRA, `fedhet.strategies.flexlora`) share one model of the largest rank r_max:
a client of rank r_k trains the first r_k rows of A and columns of B (the rest held at zero by the engine's
masks), which is exactly a rank-r_k adapter with the scale α / r_max.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Annotated

import torch
import torch.nn.functional as F
from pydantic import Field
from torch import Tensor, nn

from fedhet.errors import ConfigError
from fedhet.registry import Settings

LORA_A, LORA_B = "lora_A", "lora_B"


class LoRA(Settings):
    """Low-rank adapters on the Linear layers named in `targets` (the base weights frozen)."""

    rank: Annotated[int, Field(gt=0, le=4096)] = Field(8, description="r: the adapters' rank (the largest one)")
    alpha: float = Field(16.0, gt=0, description="α: the adapter's output is scaled by α / r")
    targets: list[str] = Field(
        default_factory=lambda: ["q", "v"],
        min_length=1,
        description="Linear layers to adapt, by the last part of their name (transformer: q, k, v, o, fc1, fc2, out)",
    )


class LoRALinear(nn.Module):
    """A Linear layer with a frozen weight and bias and a trained low-rank adapter (module doc)."""

    def __init__(self, base: nn.Linear, rank: int, alpha: float) -> None:
        super().__init__()
        self.weight = nn.Parameter(base.weight.detach().clone(), requires_grad=False)
        self.bias = nn.Parameter(base.bias.detach().clone(), requires_grad=False) if base.bias is not None else None
        self.lora_A = nn.Parameter(torch.empty(rank, base.in_features))
        self.lora_B = nn.Parameter(torch.zeros(base.out_features, rank))
        nn.init.kaiming_uniform_(self.lora_A, a=math.sqrt(5))  # as peft and the LoRA reference code
        self.scale = alpha / rank

    def forward(self, x: Tensor) -> Tensor:
        return F.linear(x, self.weight, self.bias) + self.scale * F.linear(F.linear(x, self.lora_A), self.lora_B)


def add_lora(module: nn.Module, settings: LoRA, what: str) -> nn.Module:
    """`module` with every Linear layer whose last name part is in ``settings.targets`` replaced by a `LoRALinear`
    (in place); every other parameter frozen. A target that names no Linear layer is a `ConfigError`."""
    found = set()
    for parent in list(module.modules()):
        for child_name, child in list(parent.named_children()):
            if isinstance(child, nn.Linear) and child_name in settings.targets:
                setattr(parent, child_name, LoRALinear(child, settings.rank, settings.alpha))
                found.add(child_name)
    missing = sorted(set(settings.targets) - found)
    if missing:
        linear = sorted({n.rpartition(".")[2] for n, m in module.named_modules() if isinstance(m, nn.Linear)})
        raise ConfigError(f"{what}: lora.targets {missing} name no Linear layer; it has: {', '.join(linear)}")
    for name, p in module.named_parameters():
        if not name.endswith((LORA_A, LORA_B)):
            p.requires_grad_(False)
    return module


def load_base(module: nn.Module, path: str, what: str) -> None:
    """Load the state dict saved at `path` (``torch.save(model.state_dict())``, or a run's ``model.pt``; read
    with ``weights_only=True``) into `module`'s base parameters; adapters keep their initial values. A missing
    file, or a state dict of another architecture, is a one-line `ConfigError`."""
    file = Path(path).expanduser()
    if not file.is_file():
        raise ConfigError(f"{what}: base weights '{path}' is not a file")
    try:
        state = torch.load(file, map_location="cpu", weights_only=True)
    except Exception as err:
        raise ConfigError(f"{what}: cannot read base weights '{path}' ({type(err).__name__})") from None
    if not isinstance(state, dict) or not all(isinstance(v, Tensor) for v in state.values()):
        raise ConfigError(f"{what}: '{path}' does not hold a state dict (names to tensors)")
    own = {n: p for n, p in module.named_parameters() if not n.endswith((LORA_A, LORA_B))}
    if set(state) != set(own):
        extra, lacking = sorted(set(state) - set(own)), sorted(set(own) - set(state))
        raise ConfigError(f"{what}: '{path}' is another model's state dict (extra {extra[:3]}, missing {lacking[:3]})")
    with torch.no_grad():
        for name, p in own.items():
            if state[name].shape != p.shape:
                raise ConfigError(
                    f"{what}: '{path}' has {name} of shape {tuple(state[name].shape)}, the model {tuple(p.shape)}"
                )
            p.copy_(state[name].float())
