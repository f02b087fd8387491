"""FlexLoRA (`fedhet.strategies.flexlora`): hand-computed aggregation, its reduction, and whole runs."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import torch
from torch import nn

from fedhet.api import run as api_run
from fedhet.engine.functional import FlatModel
from fedhet.experiments.callbacks import Callback
from fedhet.experiments.config import parse_config
from fedhet.experiments.runner import RunState, resume, run
from fedhet.models.lora import LoRALinear
from fedhet.strategies.flexlora import flexlora_aggregate, lora_layers, rank_mask, truncate
from fedhet.strategies.hetlora import hetlora_aggregate
from helpers.hostile import assert_refused


def _model() -> FlatModel:
    """One adapted Linear(3 → 2) layer of rank 2 (parameters: weight, bias, lora_A (2, 3), lora_B (2, 2))."""
    torch.manual_seed(0)
    return FlatModel(nn.Sequential(LoRALinear(nn.Linear(3, 2), rank=2, alpha=2.0)))


def _params(model: FlatModel, global_params: Tensor, a: list[list[float]], b: list[list[float]]) -> Tensor:
    row = global_params.clone()
    row[model.slices["0.lora_A"]] = torch.tensor(a).flatten()
    row[model.slices["0.lora_B"]] = torch.tensor(b).flatten()
    return row


Tensor = torch.Tensor


def test_two_clients_of_ranks_2_and_1_aggregate_as_computed_by_hand() -> None:
    """Client 1 (rank 2, n = 1): B₁A₁ = [[1, 0, 0], [0, 2, 0]]; client 2 (rank 1, n = 3): B₂A₂ = [[0, 0, 2], [0, 0, 0]].
    W = ¼ B₁A₁ + ¾ B₂A₂ = [[0.25, 0, 1.5], [0, 0.5, 0]], whose rows are orthogonal: σ = (√2.3125, 0.5), so its rank-2
    truncation is W and its rank-1 truncation [[0.25, 0, 1.5], [0, 0, 0]]."""
    model = _model()
    w = model.initial_params()
    one = _params(model, w, [[1, 0, 0], [0, 2, 0]], [[1, 0], [0, 1]])
    two = _params(model, w, [[0, 0, 1], [0, 0, 0]], [[2, 0], [0, 0]])  # rank 1: row 2 of A, column 2 of B zero
    new = flexlora_aggregate(model, lora_layers(model), w, torch.stack([one, two]), torch.tensor([0.25, 0.75]))
    a = new[model.slices["0.lora_A"]].reshape(2, 3)
    b = new[model.slices["0.lora_B"]].reshape(2, 2)
    torch.testing.assert_close(b @ a, torch.tensor([[0.25, 0, 1.5], [0, 0.5, 0]]))
    torch.testing.assert_close(b[:, :1] @ a[:1], torch.tensor([[0.25, 0, 1.5], [0, 0, 0]]))  # what rank 1 reads
    torch.testing.assert_close(torch.linalg.svdvals(b @ a), torch.tensor([2.3125**0.5, 0.5]))
    base = ~(rank_mask(model, ["0"], 0))  # the adapters' coordinates
    assert torch.equal(new[~base], w[~base])  # the base weights exactly as they were
    mask = rank_mask(model, ["0"], 1)
    assert mask[model.slices["0.lora_A"]].tolist() == [True] * 3 + [False] * 3
    assert mask[model.slices["0.lora_B"]].tolist() == [True, False, True, False]


def test_every_client_at_full_rank_is_fedavg_of_the_adapters_products() -> None:
    """Same rank r ≥ min(out, in): the truncation is exact, so B A = Σ p_k B_k A_k (FedAvg of the products, which
    is not FedAvg of the factors)."""
    model = _model()
    w = model.initial_params()
    gen = torch.Generator().manual_seed(1)
    rows = torch.stack([w + torch.randn(w.shape, generator=gen) for _ in range(3)])
    p = torch.tensor([0.2, 0.3, 0.5])
    new = flexlora_aggregate(model, lora_layers(model), w, rows, p)
    a, b = (rows[:, model.slices[n]] for n in ("0.lora_A", "0.lora_B"))
    products = sum(p[k] * b[k].reshape(2, 2) @ a[k].reshape(2, 3) for k in range(3))
    got = new[model.slices["0.lora_B"]].reshape(2, 2) @ new[model.slices["0.lora_A"]].reshape(2, 3)
    torch.testing.assert_close(got, products, atol=1e-5, rtol=1e-5)
    factors = (p @ b).reshape(2, 2) @ (p @ a).reshape(2, 3)
    assert not torch.allclose(got, factors, atol=1e-3)


def test_truncation_pads_with_zeros_beyond_the_rank_of_the_matrix() -> None:
    b, a = truncate(torch.tensor([[1.0, 0.0], [0.0, 0.0]], dtype=torch.float64), 3)
    assert b.shape == (2, 3) and a.shape == (3, 2)  # rank 3 of a 2×2 matrix: the third component zero
    assert not b[:, 2].any() and not a[2].any()
    torch.testing.assert_close(b @ a, torch.tensor([[1.0, 0.0], [0.0, 0.0]], dtype=torch.float64))
    b, a = truncate(torch.tensor([[1.0, 0.0], [0.0, 0.0]], dtype=torch.float64), 1)
    assert b.shape == (2, 1) and a.shape == (1, 2)


def _config(base: str | None = None, adapters: bool | None = None, **changes: Any) -> dict[str, Any]:
    """A tiny run; with adapters (by default when a `base` is given) a rank-4 LoRA on q, v and the read-out."""
    model: dict[str, Any] = {"name": "transformer", "d_model": 8, "heads": 2, "layers": 1}
    if adapters or (adapters is None and base is not None):
        model = {**model, "lora": {"rank": 4, "alpha": 4.0, "targets": ["q", "v", "out"]}}
    if base is not None:
        model["base"] = base
    return {
        "dataset": {"name": "markov_text", "vocab": 6, "seq_len": 4, "num_users": 4, "samples_per_user": 20},
        "partition": "natural",
        "model": model,
        "num_clients": 4,
        "clients_per_round": 3,
        "rounds": 3,
        "local": {"steps": 2, "lr": 0.2, "batch_size": 8},
        "algorithm": {"name": "flexlora", "levels": [1, 0.5]},
        **changes,
    }


@pytest.mark.parametrize("algorithm", ["flexlora", "hetlora"])
def test_a_run_keeps_the_base_scores_every_rank_and_resumes_byte_identical(tmp_path: Path, algorithm: str) -> None:
    pre = api_run(_config(algorithm="fedavg", rounds=1), tmp_path / "pre")
    base = str(tmp_path / "pre" / "model.pt")
    ranks = {"name": algorithm, "levels": [1, 0.5]}
    tuned = api_run(_config(base, algorithm=ranks), tmp_path / "full")
    assert tuned.state_dict is not None and pre.state_dict is not None
    for name, value in pre.state_dict.items():
        assert torch.equal(tuned.state_dict[name], value), name  # the pretrained base, untouched
    assert not torch.equal(tuned.state_dict["out.lora_B"], torch.zeros(6, 4))
    assert {"test_accuracy_level1", "test_accuracy_level0.5"} <= set(tuned.final)
    assert sorted(set(tuned.clients["capacity"].tolist())) == [0.5, 1.0]

    class Interrupt(Callback):
        def on_round_end(self, state: RunState, metrics: dict[str, float] | None) -> bool:
            if state.round == 2:
                raise KeyboardInterrupt
            return False

    cfg = parse_config(_config(base, algorithm=ranks))
    with pytest.raises(KeyboardInterrupt):
        run(cfg, tmp_path / "cut", callbacks=[Interrupt()])
    assert json.loads((tmp_path / "cut/summary.json").read_text())["rounds"] == 2
    resume(tmp_path / "cut")
    for name in ("metrics.csv", "clients.csv"):
        assert (tmp_path / "cut" / name).read_bytes() == (tmp_path / "full" / name).read_bytes()


def test_a_model_without_adapters_or_a_server_optimiser_is_refused(tmp_path: Path, monkeypatch: Any) -> None:
    monkeypatch.chdir(tmp_path)
    flags = ["run", "--dataset", "markov_text", "--model", "transformer", "--rounds", "1", "--set", "num_clients=4"]
    assert_refused([*flags, "--algorithm", "flexlora", "--out", "r"], "has none", tmp_path)
    lora = ["--set", "model.lora.rank=2", "--algorithm", "flexlora", "--out", "r"]
    assert_refused([*flags, *lora, "--set", "algorithm.server_optimizer=adam"], "no server optimiser", tmp_path)


def test_hetlora_two_clients_of_ranks_2_and_1_aggregate_as_computed_by_hand() -> None:
    """The clients above: ‖B₁A₁‖_F = √5, ‖B₂A₂‖_F = 2, so p = (√5, 2) / (√5 + 2) = (0.527864, 0.472136), and the
    zero-padded factors average to A = [[p₁, 0, p₂], [0, 2p₁, 0]], B = [[p₁ + 2p₂, 0], [0, p₁]]."""
    model = _model()
    w = model.initial_params()
    one = _params(model, w, [[1, 0, 0], [0, 2, 0]], [[1, 0], [0, 1]])
    two = _params(model, w, [[0, 0, 1], [0, 0, 0]], [[2, 0], [0, 0]])
    new = hetlora_aggregate(model, lora_layers(model), w, torch.stack([one, two]), None)
    p1, p2 = 0.527864, 0.472136
    torch.testing.assert_close(
        new[model.slices["0.lora_A"]].reshape(2, 3), torch.tensor([[p1, 0, p2], [0, 2 * p1, 0]]), atol=1e-6, rtol=0
    )
    torch.testing.assert_close(
        new[model.slices["0.lora_B"]].reshape(2, 2), torch.tensor([[p1 + 2 * p2, 0], [0, p1]]), atol=1e-6, rtol=0
    )
    assert torch.equal(new[rank_mask(model, ["0"], 0)], w[rank_mask(model, ["0"], 0)])  # the base kept
    given = hetlora_aggregate(model, lora_layers(model), w, torch.stack([one, two]), torch.tensor([0.25, 0.75]))
    torch.testing.assert_close(given, 0.25 * one + 0.75 * two)  # FedAvg's weights: FedAvg of the factors


@pytest.mark.parametrize("algorithm", ["flexlora", "hetlora"])
def test_the_sequential_and_vectorised_backends_agree(algorithm: str) -> None:
    runs = [
        run(parse_config(_config(adapters=True, algorithm={"name": algorithm, "levels": [1, 0.5]}, backend=backend)))
        for backend in ("sequential", "vectorised")
    ]
    torch.testing.assert_close(runs[0].params, runs[1].params, atol=1e-5, rtol=1e-5)
    assert runs[0].history[-1]["test_accuracy_level0.5"] == pytest.approx(runs[1].history[-1]["test_accuracy_level0.5"])
