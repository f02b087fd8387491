"""System models: each client's compute speed, bandwidth and latency, a registered component like availability.

A run with a system model (``system: {name: lognormal, ...}``) keeps a simulated clock (`fedhet.systems.clock`):
a client's round lasts the download of what the server sends, its local steps, and the upload of its update, so a
synchronous round lasts as long as its slowest client (or a deadline), and asynchronous methods (FedBuff,
FedAsync) run on an event queue in that time. ``system: none`` (the default) keeps rounds as counts: a run is then
exactly what it was before system models existed.

Figures are per client: seconds per training sample (forward and backward), download and upload bandwidth in bytes
per second, and a latency per message. A model may vary them by round (``profiles(round_)``), drawing from the
run's seeded streams.
"""

from __future__ import annotations

import csv
import math
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, ClassVar

import torch
from pydantic import ConfigDict, Field, PrivateAttr
from torch import Tensor

from fedhet.errors import DataError
from fedhet.registry import Component, Registry
from fedhet.seeding import RunAware

MEGABIT = 1e6 / 8  # bytes per second in one Mbit/s


@dataclass(frozen=True)
class Profiles:
    """Every client's figures in one round (K,): seconds per training sample, bytes per second down and up, and
    seconds of latency per message."""

    sample_s: Tensor
    down_bps: Tensor
    up_bps: Tensor
    latency_s: Tensor

    def durations(
        self, clients: Tensor, samples: Tensor, down_bytes: Tensor | float, up_bytes: Tensor | float
    ) -> tuple[Tensor, Tensor, Tensor]:
        """Seconds (m,) each of `clients` spends receiving `down_bytes`, training on `samples` samples and sending
        `up_bytes` back (latency once each way)."""
        lat = self.latency_s[clients].double()
        down = lat + torch.as_tensor(down_bytes, dtype=torch.float64) / self.down_bps[clients].double()
        compute = samples.double() * self.sample_s[clients].double()
        up = lat + torch.as_tensor(up_bytes, dtype=torch.float64) / self.up_bps[clients].double()
        return down, compute, up


class SystemModel(Component, RunAware):
    """Base of system models: ``profiles(round_)`` gives every client's figures in that round (see the module
    docstring). After `setup`, `num_clients` and `seed` are the run's; ``self.rng(purpose, *keys)`` draws from
    the run's seed."""

    model_config = ConfigDict(extra="forbid", frozen=False)
    simulates_time: ClassVar[bool] = True  # False only for `none`: no clock at all
    _num_clients: int | None = PrivateAttr(None)
    _seed: int | None = PrivateAttr(None)

    def setup(self, num_clients: int, seed: int) -> None:
        """Called once before the first round (an override calls ``super().setup(num_clients, seed)`` first)."""
        self._num_clients, self._seed = num_clients, seed

    def profiles(self, round_: int) -> Profiles:
        """Every client's figures in round `round_`."""
        raise NotImplementedError

    def state_dict(self) -> dict[str, Any]:
        return {}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        del state


SYSTEMS: Registry[SystemModel] = Registry("system model")


@SYSTEMS.register
class NoSystem(SystemModel):
    """No system model: rounds are counts, not seconds (the default)."""

    name: ClassVar[str] = "none"
    description: ClassVar[str] = "no simulated time: every client takes the same (no) time"
    simulates_time: ClassVar[bool] = False

    def profiles(self, round_: int) -> Profiles:
        raise RuntimeError("system model 'none' has no profiles: the run keeps no clock")


def _filled(k: int, value: float) -> Tensor:
    return torch.full((k,), float(value), dtype=torch.float64)


@SYSTEMS.register
class Constant(SystemModel):
    """Every client computes and communicates at the same speed."""

    name: ClassVar[str] = "constant"
    description: ClassVar[str] = "the same compute speed, bandwidth and latency for every client"
    sample_ms: float = Field(10.0, gt=0, description="milliseconds per training sample (forward and backward)")
    download_mbps: float = Field(20.0, gt=0, description="download bandwidth, Mbit/s")
    upload_mbps: float = Field(5.0, gt=0, description="upload bandwidth, Mbit/s")
    latency_ms: float = Field(50.0, ge=0, description="latency per message, milliseconds")

    def profiles(self, round_: int) -> Profiles:
        k = self.num_clients
        return Profiles(
            _filled(k, self.sample_ms / 1e3),
            _filled(k, self.download_mbps * MEGABIT),
            _filled(k, self.upload_mbps * MEGABIT),
            _filled(k, self.latency_ms / 1e3),
        )


@SYSTEMS.register
class LogNormal(SystemModel):
    """Each client's compute time per sample and its bandwidths drawn once from log-normal laws (their medians and
    the spread σ of their logarithms), optionally jittered every round.

    Device speeds spread over orders of magnitude with a heavy slow tail (FedScale, Lai et al. ICML 2022, §2 and its
    device trace, which `trace` reads once converted to CSV); a log-normal law gives that shape with two numbers
    each. With σ = 1 the slowest 5% of clients are 5.2× slower than the median and the fastest 5% 5.2× faster, a
    27× range. The medians are ours (a phone-class device training a small model, a mobile connection); every one
    is a parameter."""

    name: ClassVar[str] = "lognormal"
    description: ClassVar[str] = "compute speed and bandwidths per client from log-normal laws (FedScale-like spread)"
    sample_ms: float = Field(10.0, gt=0, description="median milliseconds per training sample")
    compute_sigma: float = Field(1.0, ge=0, description="σ of log(compute time) across clients")
    download_mbps: float = Field(20.0, gt=0, description="median download bandwidth, Mbit/s")
    upload_mbps: float = Field(5.0, gt=0, description="median upload bandwidth, Mbit/s")
    network_sigma: float = Field(1.0, ge=0, description="σ of log(bandwidth) across clients (both directions)")
    latency_ms: float = Field(50.0, ge=0, description="latency per message, milliseconds")
    jitter: float = Field(0.0, ge=0, description="σ of a client's log compute time from round to round (0: fixed)")

    _drawn: Profiles | None = PrivateAttr(None)

    def setup(self, num_clients: int, seed: int) -> None:
        super().setup(num_clients, seed)
        gen = self.torch_rng("system-lognormal")  # drawn once per run (the same every round)
        compute, down, up = (torch.randn(num_clients, generator=gen, dtype=torch.float64) for _ in range(3))
        self._drawn = Profiles(
            self.sample_ms / 1e3 * torch.exp(self.compute_sigma * compute),
            self.download_mbps * MEGABIT * torch.exp(self.network_sigma * down),
            self.upload_mbps * MEGABIT * torch.exp(self.network_sigma * up),
            _filled(num_clients, self.latency_ms / 1e3),
        )

    def profiles(self, round_: int) -> Profiles:
        if self._drawn is None:
            raise RuntimeError("system model 'lognormal' used before setup()")
        if not self.jitter:
            return self._drawn
        noise = torch.randn(self.num_clients, generator=self.torch_rng("system-jitter", round_), dtype=torch.float64)
        return replace(self._drawn, sample_s=self._drawn.sample_s * torch.exp(self.jitter * noise))


TRACE_COLUMNS = ("sample_ms", "download_mbps", "upload_mbps", "latency_ms")


@SYSTEMS.register
class Trace(SystemModel):
    """Measured figures from a CSV file of your own: columns ``sample_ms``, ``download_mbps``, ``upload_mbps`` and
    optionally ``latency_ms`` (default 0), one row per client in client order (``client`` column optional: rows
    are then matched by it). A file with fewer rows than clients is refused unless ``cycle`` reuses its rows in
    turn (client k takes row k mod n)."""

    name: ClassVar[str] = "trace"
    description: ClassVar[str] = "compute and network figures per client from your CSV file"
    path: str = Field(..., description="CSV file: sample_ms, download_mbps, upload_mbps[, latency_ms][, client]")
    cycle: bool = Field(False, description="reuse the rows in turn when the file has fewer rows than clients")
    _table: Profiles | None = PrivateAttr(None)

    def setup(self, num_clients: int, seed: int) -> None:
        super().setup(num_clients, seed)
        self._table = self._read(num_clients)

    def _read(self, k: int) -> Profiles:
        path = Path(self.path)
        if not path.is_file():
            raise DataError(f"system trace '{path}' does not exist; give a CSV file (docs/time.md)")
        try:
            with path.open(newline="", encoding="utf-8") as f:
                rows = list(csv.DictReader(f))
        except (OSError, UnicodeDecodeError, csv.Error) as err:
            raise DataError(f"cannot read system trace '{path}': {err}") from None
        missing = [c for c in TRACE_COLUMNS[:3] if not rows or c not in rows[0]]
        if missing:
            raise DataError(f"system trace '{path}' lacks the column(s) {', '.join(missing)} (or has no rows)")
        if "client" in rows[0]:
            rows.sort(key=lambda r: _number(path, r, "client", 0.0))
        if len(rows) < k and not self.cycle:
            raise DataError(
                f"system trace '{path}' has {len(rows)} rows for {k} clients; add rows, or set system.cycle: true "
                "to reuse them in turn"
            )
        picked = [rows[i % len(rows)] for i in range(k)]
        values = {c: [_number(path, r, c, 0.0 if c == "latency_ms" else None) for r in picked] for c in TRACE_COLUMNS}
        table = {c: torch.tensor(v, dtype=torch.float64) for c, v in values.items()}
        for column in TRACE_COLUMNS[:3]:
            if not bool((table[column] > 0).all()):
                raise DataError(f"system trace '{path}': every {column} must be a positive number")
        return Profiles(
            table["sample_ms"] / 1e3,
            table["download_mbps"] * MEGABIT,
            table["upload_mbps"] * MEGABIT,
            table["latency_ms"].clamp_min(0) / 1e3,
        )

    def profiles(self, round_: int) -> Profiles:
        if self._table is None:
            raise RuntimeError("system model 'trace' used before setup()")
        return self._table


def _number(path: Path, row: dict[str, str], column: str, default: float | None) -> float:
    text = (row.get(column) or "").strip()
    if not text and default is not None:
        return default
    try:
        value = float(text)
    except ValueError:
        raise DataError(f"system trace '{path}': {column} '{text}' is not a number") from None
    if not math.isfinite(value):
        raise DataError(f"system trace '{path}': {column} '{text}' is not a finite number")
    return value
