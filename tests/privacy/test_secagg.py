"""Secure aggregation (SecAgg+, simulated): quantisation by hand, the Harary graph, Shamir's threshold, masks that
cancel exactly over seeds and dropout patterns, failed rounds, the bytes formula, and the wrapper against FedAvg."""

from __future__ import annotations

import csv
import itertools
import json
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest
import torch
from typer.testing import CliRunner

from fedhet.catalog import STRATEGIES
from fedhet.cli.main import app
from fedhet.engine.engine import Engine
from fedhet.engine.plan import LocalPlan, LocalResult
from fedhet.errors import ConfigError, FedhetNote
from fedhet.experiments.callbacks import Callback
from fedhet.experiments.config import parse_config
from fedhet.experiments.runner import RunState, resume, run
from fedhet.privacy.secagg import (
    Keys,
    SecAgg,
    client_bytes,
    default_degree,
    default_threshold,
    dequantise,
    dp_noise,
    harary_graph,
    masked_inputs,
    masked_sum,
    prg,
    prg_sum,
    quantise,
    reconstruct,
    share,
    unmask,
)
from fedhet.seeding import torch_gen
from fedhet.strategies.base import Strategy
from helpers.hostile import assert_refused
from helpers.tiny import linear_model, make_context, tiny_data

SIZES = [6, 9, 4, 12, 7, 5]


def test_quantise_by_hand() -> None:
    # b = 8, c = 1, n = 1: L = 127; 0.5 -> 63.5 -> 64 (to even), -0.25 -> -31.75 -> -32 = 224 mod 256, 3 -> clip 127
    q = quantise(torch.tensor([[0.5, -0.25, 3.0]]), 8, 1.0, 1, "deterministic")
    assert q.tolist() == [[64, 224, 127]]
    assert dequantise(q[0], 8, 1.0, 1).tolist() == pytest.approx([64 / 127, -32 / 127, 1.0])


def test_stochastic_rounding_is_unbiased() -> None:
    x = torch.full((1, 20000), 0.3 / 127)  # 0.3 of a level: rounds to 0 or 1
    q = quantise(x, 8, 1.0, 1, "stochastic", np.random.SFC64(1))
    assert set(np.unique(q).tolist()) == {0, 1}
    assert q.mean() == pytest.approx(0.3, abs=0.02)


@pytest.mark.parametrize("rounding", ["stochastic", "deterministic"])
@pytest.mark.parametrize("bits", [8, 32, 51, 52, 62])
def test_quantise_gives_the_reference_integers_and_overwrites_only_when_asked(rounding: str, bits: int) -> None:
    # the reference: the textbook float64 expression (clip, scale, + U, floor / round half to even), mod 2^b, with
    # U = j·2^-32 for the 32-bit halves j of SFC64(7)'s raw draws, 501 draws a row of 1001 (the last half unused)
    x = torch.randn(3, 1001, generator=torch.Generator().manual_seed(0), dtype=torch.float64) * 0.3
    v = x.clamp(-1.0, 1.0) * ((2 ** (bits - 1) - 1) / 4)
    raw = np.random.SFC64(7).random_raw(3 * 501).reshape(3, 501)
    u = torch.from_numpy(np.stack([row.view(np.uint32)[:1001] for row in raw]).astype(np.float64) / 2**32)
    v = (v + u).floor() if rounding == "stochastic" else v.round()
    want = v.to(torch.int64).numpy().view(np.uint64) & np.uint64(2**bits - 1)
    kept = x.clone()
    got = quantise(x, bits, 1.0, 4, rounding, np.random.SFC64(7))
    assert np.array_equal(got, want) and torch.equal(x, kept)
    again = quantise(x, bits, 1.0, 4, rounding, np.random.SFC64(7), overwrite=True)  # type: ignore[arg-type]
    assert np.array_equal(again, want)
    assert not torch.equal(x, kept)  # asked to: x was the workspace
    assert quantise(x.float().t(), bits, 1.0, 4, "deterministic").shape == (1001, 3)  # a float32 view: copied
    leaf = kept.clone().requires_grad_()  # x itself was the workspace above
    assert np.array_equal(quantise(leaf, bits, 1.0, 4, rounding, np.random.SFC64(7)), want)  # type: ignore[arg-type]
    assert torch.equal(leaf.detach(), kept)


def test_self_masks_are_expanded_once_and_rebuilt_seeds_reuse_them() -> None:
    keys = Keys(6, 4, 3, np.random.default_rng(0))
    seeds = keys.self_seed[:4]
    first = keys.self_masks(seeds, 50, 16)
    assert np.array_equal(first, prg(np.array(seeds, dtype=np.uint64), 50, 16).sum(axis=0, dtype=np.uint64))
    assert np.array_equal(prg_sum(seeds, 50, 16), first)
    assert keys.self_masks(list(seeds), 50, 16) is first  # the same seeds (e.g. rebuilt from shares): reused
    other = keys.self_masks(keys.self_seed[1:5], 50, 16)  # other seeds: expanded afresh
    assert other is not first
    assert np.array_equal(other, prg_sum(keys.self_seed[1:5], 50, 16))


@pytest.mark.parametrize(("n", "k"), [(5, 2), (10, 4), (11, 6), (7, 6), (9, 20)])
def test_harary_graph_is_k_regular_and_symmetric(n: int, k: int) -> None:
    graph = harary_graph(n, k, np.random.default_rng(n))
    assert all(len(g) == min(k, n - 1) for g in graph)
    assert all(u in graph[v] and u != v for u in range(n) for v in graph[u])


def test_default_degree_and_threshold() -> None:
    assert default_degree(100) == 20  # 2⌈1.5 log2 100⌉ = 2⌈9.97⌉
    assert default_degree(5) == 4  # capped at n − 1: SecAgg's complete graph
    assert default_threshold(20) == 11


def test_shamir_any_t_shares_rebuild_and_t_minus_1_do_not() -> None:
    secret, t = 123456789012345678901234567890, 3
    shares = share(secret, 5, t, np.random.default_rng(2))
    for subset in itertools.combinations(shares, t):
        assert reconstruct(list(subset), t) == secret
    for subset in itertools.combinations(shares, t - 1):
        with pytest.raises(ValueError, match="cannot rebuild"):
            reconstruct(list(subset), t)
        assert reconstruct(list(subset), t - 1) != secret  # interpolating too few points gives another value


@pytest.mark.parametrize("seed", [0, 1, 2])
@pytest.mark.parametrize("lost", [(), (0,), (3, 7), (1, 2, 9)])
def test_unmasked_sum_is_the_plain_sum(seed: int, lost: tuple[int, ...]) -> None:
    n, bits, clip = 10, 32, 1.0
    rng = np.random.default_rng(seed)
    keys = Keys(n, 6, 3, rng)
    x = torch.randn(n, 40, generator=torch.Generator().manual_seed(seed)) * 0.1
    q = quantise(x, bits, clip, n, "stochastic", np.random.SFC64(seed))
    alive = np.ones(n, dtype=bool)
    alive[list(lost)] = False
    y = masked_inputs(q, keys, bits)
    assert not (y == q).all(axis=1).any()  # every input is masked
    summed = y[alive].sum(axis=0, dtype=np.uint64) % 2**bits
    assert (masked_sum(q, alive, keys, bits) == summed).all()  # the shortcut gives the very same integers
    total = unmask(summed, alive, keys, bits)
    if not all(alive[keys.graph[u]].sum() >= keys.threshold for u in range(n)):
        assert total is None  # some secret kept fewer than t surviving share holders
        return
    assert total is not None
    assert (total == q[alive].sum(axis=0, dtype=np.uint64) % 2**bits).all()
    step = n / (2 ** (bits - 1) - 1) * n * clip  # n values, each within one level 1/L of itself
    assert torch.allclose(dequantise(total, bits, clip, n), x[alive].double().sum(0), atol=step)


def test_too_many_dropouts_fail() -> None:
    n = 8
    rng = np.random.default_rng(0)
    keys = Keys(n, 4, 3, rng)
    y = masked_inputs(np.zeros((n, 5), dtype=np.uint64), keys, 32)
    dead = keys.graph[0][:2]  # two of client 0's four share holders: 2 < t = 3 shares of b_0 remain
    alive = np.ones(n, dtype=bool)
    alive[dead] = False
    assert unmask(y[alive].sum(axis=0, dtype=np.uint64), alive, keys, 32) is None
    alive = np.zeros(n, dtype=bool)
    alive[:2] = True  # fewer than t survivors
    assert unmask(y[alive].sum(axis=0, dtype=np.uint64), alive, keys, 32) is None


def test_client_bytes_formula() -> None:
    # P = 10 coordinates of 32 bits, k = 4: 40 + 2·4·16 (shares) + 5·16 (keys)
    assert client_bytes(10, 32, 4) == 248


def _engine(dim: int = 3, classes: int = 2) -> Engine:
    return Engine(linear_model(dim, classes), tiny_data(SIZES, dim, classes, seed=1), backend="dense", seed=3)


def _round(strategy: Strategy, engine: Engine, drop: list[int] | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """One round from the initial model with every client; `drop`: rows lost after training (as the runner does)."""
    strategy.setup(make_context(engine, steps=3, lr=0.5, m=len(SIZES)))
    w = engine.initial_params()
    clients = torch.arange(len(SIZES))

    def train(plan: LocalPlan) -> LocalResult:
        out = engine.train(w, plan, 0)
        lost = torch.zeros(len(SIZES), dtype=torch.bool)
        lost[drop or []] = True
        return replace(out, dropped=lost)

    result = strategy.local_training(0, clients, w, train)
    assert result.dropped is not None
    return w, strategy.aggregate(0, w, result.rows(~result.dropped))


@pytest.mark.parametrize(("weighting", "masks"), [("samples", "net"), ("uniform", "all")])
@pytest.mark.parametrize("drop", [[], [1, 4]])
def test_wrapper_gives_fedavg_within_the_quantisation_error(weighting: str, masks: str, drop: list[int]) -> None:
    engine = _engine()
    base = {"name": "fedavg", "weighting": weighting}
    w, plain = _round(STRATEGIES.build(base), engine, drop)
    secure = STRATEGIES.build({"name": "secagg", "base": base, "degree": 4, "threshold": 2, "masks": masks})
    _, new = _round(secure, engine, drop)
    assert not torch.equal(new, w)
    assert torch.allclose(new, plain, atol=1e-6)
    columns = secure.round_metrics()
    assert columns["secagg_failed"] == 0 and columns["secagg_dropouts"] == len(drop)
    assert columns["secagg_client_bytes"] == client_bytes(w.numel(), 32, 4)


def test_wrapper_round_with_too_many_dropouts_leaves_the_model() -> None:
    engine = _engine()
    secure = STRATEGIES.build({"name": "secagg", "degree": 2, "threshold": 2})
    with pytest.warns(FedhetNote, match="secure aggregation failed"):
        w, new = _round(secure, engine, [0, 1, 2, 3])  # 2 survivors of 6, each with at most one surviving neighbour
    assert torch.equal(new, w)
    assert secure.round_metrics()["secagg_failed"] == 1


class _Interrupt(Callback):
    def on_round_end(self, state: RunState, metrics: dict[str, float] | None) -> bool:
        if state.round == 2:
            raise KeyboardInterrupt
        return False


def test_a_run_with_dropouts_reports_them_and_resumes_identically(tmp_path: Path) -> None:
    config = {
        "dataset": "digits",
        "model": {"name": "mlp", "hidden": [8]},
        "num_clients": 12,
        "clients_per_round": 8,
        "rounds": 4,
        "local": {"steps": 2, "lr": 0.1, "batch_size": 8},
        "algorithm": {"name": "secagg", "degree": 4, "threshold": 2},
        "system": "lognormal",
        "deadline": {"seconds": 0.85},  # 50 ms latency × 2 × 4 of SecAgg+'s round trips, the bytes, the steps
        "seed": 1,
    }
    cfg = parse_config(config)
    run(cfg, tmp_path / "full")
    with pytest.raises(KeyboardInterrupt):
        run(cfg, tmp_path / "cut", callbacks=[_Interrupt()])
    resume(tmp_path / "cut")
    text = (tmp_path / "full/metrics.csv").read_text()
    assert (tmp_path / "cut/metrics.csv").read_text() == text
    rows = list(csv.DictReader(text.splitlines()))
    assert [float(r["secagg_dropouts"]) for r in rows] == [float(r["late_clients"]) for r in rows]
    assert any(float(r["secagg_dropouts"]) > 0 for r in rows)
    assert all(float(r["secagg_failed"]) == 0 for r in rows)  # recovered from the neighbours' shares


def test_the_protocols_bytes_and_round_trips_are_on_the_simulated_clock(tmp_path: Path) -> None:
    # the same run with and without secure aggregation on a constant system model: each round of the secagg run
    # lasts longer by (client_bytes − 4P)/upload bandwidth + 3 more round trips × 2 latencies, and sends those bytes
    config = {
        "dataset": "digits",
        "model": {"name": "mlp", "hidden": [8]},
        "num_clients": 8,
        "clients_per_round": 6,
        "rounds": 2,
        "local": {"steps": 2, "lr": 0.1, "batch_size": 8},
        "system": {"name": "constant", "upload_mbps": 0.5, "latency_ms": 40},
        "seed": 1,
    }
    plain = run(parse_config({**config, "algorithm": "fedavg"}), tmp_path / "fedavg")
    secure = run(parse_config({**config, "algorithm": {"name": "secagg", "degree": 4}}), tmp_path / "secagg")
    size = plain.experiment.engine.model.size
    extra = client_bytes(size, 32, 4) - 4 * size
    assert extra == 4 * 16 * 2 + 5 * 16  # b = 32: the masked vector is the update's size; the shares and keys
    rounds = [list(csv.DictReader((tmp_path / name / "metrics.csv").open())) for name in ("fedavg", "secagg")]
    for t, (a, b) in enumerate(zip(*rounds, strict=True), start=1):
        seconds = float(b["time_s"]) - float(a["time_s"])
        assert seconds == pytest.approx(t * (extra / (0.5e6 / 8) + 3 * 2 * 0.040), rel=1e-9)
        assert float(b["bytes_up"]) - float(a["bytes_up"]) == pytest.approx(t * 6 * extra)
        assert float(b["bytes_down"]) == float(a["bytes_down"])
    assert secure.status == "finished"


def test_wrapper_refuses_a_base_without_weights() -> None:
    with pytest.raises(ConfigError, match="weighted sum"):
        STRATEGIES.build({"name": "secagg", "base": "median"})
    assert isinstance(STRATEGIES.build("secagg"), SecAgg)


def test_cli_refuses_a_median_base_in_one_line(tmp_path: Path) -> None:
    out = tmp_path / "run"
    args = ["run", "--algorithm", "secagg", "--set", "algorithm.base=median", "--out", str(out), "--quiet"]
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 2
    assert len(result.stderr.strip().splitlines()) == 1
    assert not out.exists()


@pytest.mark.parametrize("threshold", [1, 2, 4])
def test_share_draws_its_coefficients_as_16_byte_draws_would(threshold: int) -> None:
    # f(z) = s + a_1 z + … with a_i from successive 16-byte draws; the generator ends where those draws leave it
    rng, ref = np.random.default_rng(5), np.random.default_rng(5)
    shares = share(42, 5, threshold, rng)
    coeffs = [42] + [int.from_bytes(ref.bytes(16), "little") % (2**127 - 1) for _ in range(threshold - 1)]
    assert shares == [(x, sum(c * x**i for i, c in enumerate(coeffs)) % (2**127 - 1)) for x in range(1, 6)]
    assert rng.integers(0, 2**63) == ref.integers(0, 2**63)


# --- distributed DP -----------------------------------------------------------------------------------------------


def test_dp_noise_clips_to_the_norm_then_adds_the_client_streams_noise() -> None:
    updates = torch.tensor([[3.0, 4.0], [0.3, 0.4]])  # norms 5 and 0.5 against C = 1
    clipped, which = dp_noise(updates, torch.tensor([7, 2]), 1.0, 0.0, seed=0, round_=0)
    assert torch.allclose(clipped, torch.tensor([[0.6, 0.8], [0.3, 0.4]], dtype=torch.float64))
    assert which.tolist() == [True, False]
    noised, _ = dp_noise(updates, torch.tensor([7, 2]), 1.0, 0.5, seed=0, round_=3)
    draw = torch.randn(2, generator=torch_gen(0, "secagg-dp-noise", 3, 7), dtype=torch.float64)
    assert torch.allclose(noised[0], clipped[0] + 0.5 * draw)


@pytest.mark.parametrize("drop", [[], [1, 4]])
def test_dp_with_no_noise_and_no_clip_gives_todays_numbers(drop: list[int]) -> None:
    engine = _engine()
    base = {"name": "fedavg", "weighting": "uniform"}
    spec = {"name": "secagg", "base": base, "degree": 4, "threshold": 2}
    _, plain = _round(STRATEGIES.build(spec), engine, drop)
    private = STRATEGIES.build({**spec, "dp_clip": float("inf"), "noise_multiplier": 0.0})
    _, new = _round(private, engine, drop)
    assert torch.equal(new, plain)
    assert private.round_metrics()["dp_noise_std"] == 0


@pytest.mark.parametrize("drop", [[], [1]])
def test_each_client_adds_noise_of_sd_zc_over_root_t(drop: list[int]) -> None:
    # z = 1, C = 0.5, t = 3: σ_u = 0.5/√3; the unmasked mean minus the mean of the clipped quantised updates is the
    # survivors' noise over s, each client's drawn from its own stream, and its sum has sd √s·σ_u ≥ zC over P = 4010
    engine = _engine(dim=400, classes=10)
    spec = {"name": "secagg", "degree": 4, "threshold": 3, "dp_clip": 0.5}
    _, quiet = _round(STRATEGIES.build({**spec, "noise_multiplier": 0.0}), engine, drop)
    noisy_strategy = STRATEGIES.build({**spec, "noise_multiplier": 1.0})
    _, noisy = _round(noisy_strategy, engine, drop)
    survivors = [c for c in range(len(SIZES)) if c not in drop]
    sigma = 0.5 / 3**0.5
    total = (quiet - noisy).double() * len(survivors)  # new = w − mean(clipped Δ_u + noise_u)
    draws = sum(
        torch.randn(total.shape, generator=torch_gen(0, "secagg-dp-noise", 0, c), dtype=torch.float64)
        for c in survivors
    )
    assert torch.allclose(total, sigma * draws, atol=1e-4)
    assert float(total.std()) == pytest.approx(len(survivors) ** 0.5 * sigma, rel=0.05)
    assert len(survivors) ** 0.5 * sigma >= 0.5  # ≥ t survivors: at least central DP-FedAvg's zC
    assert noisy_strategy.round_metrics()["dp_noise_std"] == pytest.approx(sigma)


def _dp_config(tmp: dict) -> dict:
    return {
        "dataset": "digits",
        "model": {"name": "mlp", "hidden": [8]},
        "num_clients": 12,
        "clients_per_round": 6,
        "rounds": 4,
        "local": {"steps": 2, "lr": 0.1, "batch_size": 8},
        "algorithm": {"name": "secagg", "degree": 4, "dp_clip": 1.0},
        "seed": 2,
        **tmp,
    }


@pytest.mark.slow
def test_a_target_epsilon_sets_z_lands_on_the_target_and_resumes_identically(tmp_path: Path) -> None:
    cfg = parse_config(_dp_config({"privacy": {"target_epsilon": 6.0}, "checkpoint_every": 1}))
    run(cfg, tmp_path / "full")
    with pytest.raises(KeyboardInterrupt):
        run(cfg, tmp_path / "cut", callbacks=[_Interrupt()])
    resume(tmp_path / "cut")
    text = (tmp_path / "full/metrics.csv").read_text()
    assert (tmp_path / "cut/metrics.csv").read_text() == text
    rows = list(csv.DictReader(text.splitlines()))
    assert float(rows[-1]["dp_epsilon"]) == pytest.approx(6.0, rel=1e-3)
    assert float(rows[0]["dp_epsilon"]) < float(rows[-1]["dp_epsilon"])
    z = float(rows[-1]["dp_noise_multiplier"])
    assert z > 0 and float(rows[-1]["dp_noise_std"]) == pytest.approx(z / 3**0.5)  # C = 1, t = 3 of k = 4
    summary = json.loads((tmp_path / "full/summary.json").read_text())["privacy"]["client"]
    assert summary["epsilon"] == pytest.approx(6.0, rel=1e-3) and summary["noise"] == "distributed"


@pytest.mark.parametrize(
    ("extra", "fragment"),
    [
        (["--set", "algorithm.dp_clip=1", "--set", "algorithm.base.weighting=samples"], "weighs them by samples"),
        (["--set", "algorithm.noise_multiplier=1"], "set algorithm.dp_clip too"),
        (
            ["--set", "algorithm.dp_clip=1", "--set", "algorithm.noise_multiplier=1", "--target-epsilon", "3"],
            "not both",
        ),
    ],
)
def test_cli_refuses_inconsistent_distributed_dp_in_one_line(
    extra: list[str], fragment: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    assert_refused(["run", "--algorithm", "secagg", *extra, "--out", "run", "--quiet"], fragment, tmp_path)


def test_the_ledger_finds_the_mechanism_without_naming_it() -> None:
    from fedhet.privacy.ledger import strategy_mechanisms

    assert strategy_mechanisms(STRATEGIES.build("secagg")) == []  # no DP: no ledger, today's run
    private = STRATEGIES.build({"name": "secagg", "dp_clip": 1.0})
    assert strategy_mechanisms(private) == [private]
    ledger = Path(__file__).parents[2] / "src/fedhet/privacy/ledger.py"
    assert "secagg" not in ledger.read_text().lower()


@pytest.mark.parametrize("rounding", ["stochastic", "deterministic"])
@pytest.mark.parametrize("bits", [32, 51, 62])
def test_the_wrapper_quantises_row_by_row_into_the_integers_of_all_rows_at_once(rounding: str, bits: int) -> None:
    # `SecAgg._quantised` streams one survivor at a time; the reference quantises the whole (m, P) weighted matrix
    engine = _engine(dim=40, classes=3)
    secure = STRATEGIES.build({"name": "secagg", "bits": bits, "rounding": rounding, "degree": 4, "masks": "all"})
    secure.setup(make_context(engine, steps=2, lr=0.5, m=len(SIZES)))
    w = engine.initial_params()
    result = engine.train(w, secure.inner.configure(0, torch.arange(len(SIZES)), w), 0).rows(torch.tensor([0, 2, 3, 5]))
    weights = secure.inner.aggregation_weights(0, result)
    weighted = (result.updates(w).double() * weights.double()[:, None]).contiguous()
    want = quantise(weighted, bits, 1.0, len(SIZES), rounding, np.random.SFC64(9))
    order = np.array([0, 2, 3, 5])
    total, every = secure._quantised(w, result, None, weights, len(SIZES), np.random.SFC64(9), order)
    assert every is not None and np.array_equal(every[order], want) and not every[[1, 4]].any()
    mod = np.uint64(2**bits - 1)
    assert np.array_equal(total & mod, want.sum(axis=0, dtype=np.uint64) & mod)
    unreduced, none = secure._quantised(w, result, None, weights, len(SIZES), np.random.SFC64(9), None)
    assert none is None and np.array_equal(unreduced & mod, total & mod)


# --- Flower's own SecAgg+ (tests/flower/test_secagg.py runs it) -----------------------------------------------------


@pytest.mark.parametrize(
    ("extra", "fragment"),
    [
        ({"bits": 40}, "at most 32 bits"),
        ({"rounding": "deterministic"}, "rounds stochastically"),
        ({"masks": "all"}, "masks: all"),
        ({"dp_clip": 1.0}, "dp_clip"),
    ],
)
def test_flowers_protocol_refuses_what_flowers_secagg_lacks(extra: dict, fragment: str) -> None:
    with pytest.raises(ConfigError, match=fragment):
        STRATEGIES.build({"name": "secagg", "protocol": "flower", **extra})


def test_flowers_protocol_is_refused_in_one_line_off_flower(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    args = ["run", "--algorithm", "secagg", "--set", "algorithm.protocol=flower", "--out", "run", "--quiet"]
    assert_refused(args, "--engine flower", tmp_path)


def test_keys_draw_their_secrets_and_shares_as_draws_one_by_one_would() -> None:
    # Keys takes the bytes of all its 16-byte draws in one call per kind: the same stream as one call per draw
    rng, ref = np.random.default_rng(3), np.random.default_rng(3)
    keys = Keys(9, 4, 3, rng)
    harary_graph(9, 4, ref)  # the graph's draws come first
    secrets = [1 + int.from_bytes(ref.bytes(16), "little") % (2**127 - 3) for _ in range(9)]
    seeds = [int(s) for s in ref.integers(0, 2**63, size=9)]
    assert keys.secret == secrets and keys.self_seed == seeds
    assert keys.secret_shares == [share(s, 4, 3, ref) for s in secrets]
    assert keys.seed_shares == [share(s, 4, 3, ref) for s in seeds]
    assert rng.integers(0, 2**63) == ref.integers(0, 2**63)


def test_the_pair_masks_towards_dropouts_are_expanded_once_and_rebuilt_seeds_reuse_them() -> None:
    keys = Keys(6, 4, 3, np.random.default_rng(0))
    signed = ((11, True), (12, False), (13, True))
    first = keys.pair_masks(signed, 50, 16)
    rows = prg(np.array([11, 12, 13], dtype=np.uint64), 50, 16)
    assert np.array_equal(first, rows[0] - rows[1] + rows[2])  # uint64, mod 2^64
    assert keys.pair_masks(tuple(signed), 50, 16) is first  # the same seeds (the server's, rebuilt): reused
    other = keys.pair_masks(((11, True), (14, False), (13, True)), 50, 16)  # another seed: expanded afresh
    assert other is not first and not np.array_equal(other, first)
