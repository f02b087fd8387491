"""System models: each client's compute speed, bandwidth and latency, a registered component like availability.

A run with a system model (``system: {name: lognormal, ...}``) keeps a simulated clock (`fedhet.systems.clock`):
a client's round lasts the download of what the server sends, its local steps, and the upload of its update, so a
synchronous round lasts as long as its slowest client (or a deadline), and asynchronous methods (FedBuff,
FedAsync) run on an event queue in that time. ``system: none`` (the default) keeps rounds as counts: a run is then
exactly what it was before system models existed.

Figures are per client: seconds per training sample (forward and backward), download and upload bandwidth in bytes
per second, and a latency per message. A model may vary them by round (``profiles(round_)``), drawing from the
run's seeded streams.

Every system model may also give each client a **capacity** (``system: {..., capacity: {levels, proportions, by}}``):
the largest share r ∈ (0, 1] of the model's width it can hold (HeteroFL's levels; a sub-model method with
``assignment: system`` trains each client at its capacity). It is drawn once per run from the seed, at random or
by speed (the fastest clients hold the largest models), and reported in clients.csv (``system_capacity``). On the
clock a client that trains a sub-model computes for its share of the full model's FLOPs
(`fedhet.models.flops`).
"""

from __future__ import annotations

import csv
import math
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, ClassVar, Literal

import numpy as np
import torch
from pydantic import ConfigDict, Field, PrivateAttr, field_validator, model_validator
from torch import Tensor

from fedhet.errors import DataError
from fedhet.registry import Component, Registry, Settings
from fedhet.seeding import RunAware

MEGABIT = 1e6 / 8  # bytes per second in one Mbit/s

# Bounds on the figures (docs/time.md, "System models"), so that the clock stays finite: with them a run's longest
# clock (10⁶ rounds of 10⁶ steps of 10⁶ samples at 10⁶ ms each, slowed twice by e^(σ·z), spread and jitter, for |z|
# up to ~8 over 10¹² draws) is below 10⁶⁰ s, far inside a double (10³⁰⁸); each bound is far beyond any device or
# network measured.
MAX_MS = 1e6  # milliseconds per sample or of latency: 1,000 s
MIN_MBPS, MAX_MBPS = 1e-3, 1e6  # 1 kbit/s to 1 Tbit/s
MAX_SIGMA = 5.0  # σ of a log-normal spread: the slowest 5% of clients 3,700× slower than the median


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


class Capacity(Settings):
    """Each client's capacity: the largest width level r ∈ (0, 1] of the model it can hold (HeteroFL's levels)."""

    levels: list[float] = Field(
        [1.0, 0.5, 0.25, 0.125, 0.0625], min_length=1, description="the width levels r in (0, 1] clients may hold"
    )
    proportions: list[float] | None = Field(
        None, description="the share of clients at each level (default: equal shares)"
    )
    by: Literal["random", "speed"] = Field(
        "random", description="random: drawn from the seed; speed: the fastest clients hold the largest levels"
    )

    @model_validator(mode="after")
    def _consistent(self) -> Capacity:
        if any(not 0 < r <= 1 for r in self.levels):
            raise ValueError("capacity levels must be in (0, 1]")
        if self.proportions is not None and (
            len(self.proportions) != len(self.levels) or min(self.proportions) < 0 or sum(self.proportions) <= 0
        ):
            raise ValueError("capacity proportions: one share (>= 0, not all 0) for each level")
        return self

    def shares(self) -> np.ndarray:
        p = np.asarray(self.proportions if self.proportions is not None else [1.0] * len(self.levels), dtype=float)
        return p / p.sum()


def assign_capacity(capacity: Capacity, k: int, rng: np.random.Generator, sample_s: Tensor | None = None) -> Tensor:
    """(K,) float64 each client's level: drawn with the shares (``random``), or, ``by: speed``, the levels from the
    largest down given to the clients from the fastest down in the shares' counts (largest remainders; ties in
    speed broken by the client's number)."""
    shares, levels = capacity.shares(), np.asarray(capacity.levels, dtype=float)
    if capacity.by == "random" or sample_s is None:
        return torch.from_numpy(levels[rng.choice(len(levels), size=k, p=shares)])
    exact = shares * k
    counts = np.floor(exact).astype(int)
    counts[np.argsort(-(exact - counts), kind="stable")[: k - counts.sum()]] += 1
    order = np.argsort(-levels, kind="stable")  # largest level first
    ranked = np.repeat(levels[order], counts[order])
    fastest = torch.argsort(sample_s, stable=True).numpy()
    out = np.empty(k)
    out[fastest] = ranked
    return torch.from_numpy(out)


class SystemModel(Component, RunAware):
    """Base of system models: ``profiles(round_)`` gives every client's figures in that round (see the module
    docstring). After `setup`, `num_clients` and `seed` are the run's; ``self.rng(purpose, *keys)`` draws from
    the run's seed."""

    model_config = ConfigDict(extra="forbid", frozen=False, allow_inf_nan=False)
    simulates_time: ClassVar[bool] = True  # False only for `none`: no clock at all
    capacity: Capacity | None = Field(
        None, description="each client's largest width level {levels, proportions, by: random|speed} (none: 1)"
    )
    _num_clients: int | None = PrivateAttr(None)
    _seed: int | None = PrivateAttr(None)
    _capacities: Tensor | None = PrivateAttr(None)  # drawn at the first `capacities` after `setup`

    def capacities(self) -> Tensor:
        """(K,) float64 each client's capacity level (1 for every client without ``capacity``), the same all run
        (drawn once: every evaluation reports it)."""
        if self._capacities is None:
            if self.capacity is None:
                self._capacities = torch.ones(self.num_clients, dtype=torch.float64)
            else:
                speeds = self.profiles(0).sample_s if self.capacity.by == "speed" else None
                self._capacities = assign_capacity(self.capacity, self.num_clients, self.rng("system-capacity"), speeds)
        return self._capacities

    def setup(self, num_clients: int, seed: int) -> None:
        """Called once before the first round (an override calls ``super().setup(num_clients, seed)`` first)."""
        self._num_clients, self._seed, self._capacities = num_clients, seed, None

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

    @model_validator(mode="after")
    def _no_speeds(self) -> NoSystem:
        if self.capacity is not None and self.capacity.by == "speed":
            raise ValueError(
                "capacity.by: speed needs the clients' speeds, and system none has none; set a system model"
            )
        return self

    def profiles(self, round_: int) -> Profiles:
        raise RuntimeError("system model 'none' has no profiles: the run keeps no clock")


def _filled(k: int, value: float) -> Tensor:
    return torch.full((k,), float(value), dtype=torch.float64)


@SYSTEMS.register
class Constant(SystemModel):
    """Every client computes and communicates at the same speed."""

    name: ClassVar[str] = "constant"
    description: ClassVar[str] = "the same compute speed, bandwidth and latency for every client"
    sample_ms: float = Field(
        10.0, gt=0, le=MAX_MS, description="milliseconds per training sample (forward and backward)"
    )
    download_mbps: float = Field(20.0, ge=MIN_MBPS, le=MAX_MBPS, description="download bandwidth, Mbit/s")
    upload_mbps: float = Field(5.0, ge=MIN_MBPS, le=MAX_MBPS, description="upload bandwidth, Mbit/s")
    latency_ms: float = Field(50.0, ge=0, le=MAX_MS, description="latency per message, milliseconds")

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
    sample_ms: float = Field(10.0, gt=0, le=MAX_MS, description="median milliseconds per training sample")
    compute_sigma: float = Field(1.0, ge=0, description="σ of log(compute time) across clients (at most 5)")
    download_mbps: float = Field(20.0, ge=MIN_MBPS, le=MAX_MBPS, description="median download bandwidth, Mbit/s")
    upload_mbps: float = Field(5.0, ge=MIN_MBPS, le=MAX_MBPS, description="median upload bandwidth, Mbit/s")
    network_sigma: float = Field(
        1.0, ge=0, description="σ of log(bandwidth) across clients (both directions; at most 5)"
    )
    latency_ms: float = Field(50.0, ge=0, le=MAX_MS, description="latency per message, milliseconds")
    jitter: float = Field(
        0.0, ge=0, description="σ of a client's log compute time from round to round (0: fixed; at most 5)"
    )

    @field_validator("compute_sigma", "network_sigma", "jitter")
    @classmethod
    def _spread(cls, value: float) -> float:
        if value > MAX_SIGMA:
            raise ValueError(
                f"at most {MAX_SIGMA:g}: σ = {MAX_SIGMA:g} already makes the slowest 5% of clients "
                "3,700× slower than the median, and much larger spreads overflow the simulated clock"
            )
        return value

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
TRACE_RANGES = {  # column: (lowest, highest, whether the lowest is allowed)
    "sample_ms": (0.0, MAX_MS, False),
    "download_mbps": (MIN_MBPS, MAX_MBPS, True),
    "upload_mbps": (MIN_MBPS, MAX_MBPS, True),
    "latency_ms": (0.0, MAX_MS, True),
}


@SYSTEMS.register
class Trace(SystemModel):
    """Measured figures from a CSV file of your own: columns ``sample_ms``, ``download_mbps``, ``upload_mbps`` and
    optionally ``latency_ms`` (default 0), one row per client in client order (``client`` column optional: rows
    are then matched by it, and its ids must be 0, 1, ..., n − 1, each once). A file with fewer rows than clients is
    refused unless ``cycle`` reuses its rows in turn (client k takes row k mod n). Values out of the ranges of
    `constant`'s parameters are refused, naming the line."""

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
            with path.open(newline="", encoding="utf-8-sig") as f:  # -sig: a byte-order mark is not a column name
                reader = csv.DictReader(f)
                rows = [(reader.line_num, row) for row in reader]
        except (OSError, UnicodeDecodeError, csv.Error) as err:
            raise DataError(f"cannot read system trace '{path}': {err}") from None
        missing = [c for c in TRACE_COLUMNS[:3] if not rows or c not in rows[0][1]]
        if missing:
            raise DataError(f"system trace '{path}' lacks the column(s) {', '.join(missing)} (or has no rows)")
        if "client" in rows[0][1]:
            rows = _by_client(path, rows)
        if len(rows) < k and not self.cycle:
            raise DataError(
                f"system trace '{path}' has {len(rows)} rows for {k} clients; add rows, or set system.cycle: true "
                "to reuse them in turn"
            )
        picked = [rows[i % len(rows)] for i in range(k)]
        values = {c: [_figure(path, line, row, c) for line, row in picked] for c in TRACE_COLUMNS}
        table = {c: torch.tensor(v, dtype=torch.float64) for c, v in values.items()}
        return Profiles(
            table["sample_ms"] / 1e3,
            table["download_mbps"] * MEGABIT,
            table["upload_mbps"] * MEGABIT,
            table["latency_ms"] / 1e3,
        )

    def profiles(self, round_: int) -> Profiles:
        if self._table is None:
            raise RuntimeError("system model 'trace' used before setup()")
        return self._table


Row = tuple[int, dict[str, str]]  # a CSV row and the line it ends on


def _by_client(path: Path, rows: list[Row]) -> list[Row]:
    """`rows` in the order of their ``client`` ids, which must be 0, 1, ..., n − 1, each once."""
    where: dict[int, Row] = {}  # client id -> its row
    for line, row in rows:
        value = _number(path, line, row, "client", None)
        client = int(value)
        if client != value or client < 0:
            raise DataError(
                f"system trace '{path}', line {line}: client '{row['client']}' is not a client id (0, 1, ...)"
            )
        if client in where:
            raise DataError(f"system trace '{path}', lines {where[client][0]} and {line}: both are client {client}")
        where[client] = (line, row)
    gap = next(i for i in range(len(rows) + 1) if i not in where)
    if gap < len(rows):
        largest = max(where)
        raise DataError(
            f"system trace '{path}' has no row for client {gap} (its {len(rows)} rows must be clients 0 to "
            f"{len(rows) - 1}; the largest id, {largest}, is on line {where[largest][0]})"
        )
    return [where[i] for i in range(len(rows))]


def _figure(path: Path, line: int, row: dict[str, str], column: str) -> float:
    """The `column` figure of a row, in its range (`TRACE_RANGES`); latency_ms may be left empty (0)."""
    value = _number(path, line, row, column, 0.0 if column == "latency_ms" else None)
    low, high, low_ok = TRACE_RANGES[column]
    if not (low <= value <= high) or (value == low and not low_ok):
        bound = f"{'from' if low_ok else 'above'} {low:g} up to {high:g}"
        raise DataError(f"system trace '{path}', line {line}: {column} {value:g} is out of range ({bound})")
    return value


def _number(path: Path, line: int, row: dict[str, str], column: str, default: float | None) -> float:
    text = (row.get(column) or "").strip()
    if not text and default is not None:
        return default
    try:
        value = float(text)
    except ValueError:
        raise DataError(f"system trace '{path}', line {line}: {column} '{text}' is not a number") from None
    if not math.isfinite(value):
        raise DataError(f"system trace '{path}', line {line}: {column} '{text}' is not a finite number")
    return value
