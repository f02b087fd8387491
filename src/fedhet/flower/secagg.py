"""Flower's own SecAgg+ as the aggregation of a fedhet round (``algorithm: {name: secagg, protocol: flower}`` on
``--engine flower``): `flwr.server.workflow.SecAggPlusWorkflow` on the server, `flwr.client.mod.secaggplus_mod` on
the nodes, with Flower's key agreement, encrypted Shamir shares, masks and recovery of dropped nodes.

A round: the nodes train as on any Flower run (`fedhet.flower.remote.RemoteEngine.train`), and each keeps its
training in its Flower context (`keep_training`), which Flower hands to whichever process answers the node next;
its reply carries no model (`withhold_models`): the server learns the weighted sum only.
The strategy's aggregate then calls `secure_mean`, which runs the workflow's four stages over the nodes that hold
survivors. At its third stage each node's ClientApp answers (`secure_input`) with its input v = Σ_u p_u Δ_u / Σ_u p_u
over its surviving clients (the public weights p_u come with the server's message, Δ_u = w − w_u from the kept
training) and its weight W = Σ_u p_u as ``num_examples`` (an integer: round(W·2^30), with ``max_weight`` 2^30);
the mod multiplies v by W (quantised to 1/T), clips each coordinate to [−c, c], quantises it to T levels with
stochastic rounding, masks it and sends it. The workflow unmasks the sum and divides it by Σ W over the nodes whose
masked vectors arrived: the base's weighted mean of the survivors.

Parameters: c = ``algorithm.clip`` (``clipping_range``), 2^b = ``modulus_range`` (b = ``algorithm.bits`` ≤ 32),
T = ⌊(2^b − 1)/n⌋ (at most 2^30, Flower's rounding works in int32) for n nodes, so that n values in [0, T] never
wrap: the step 2c/T is fedhet's own 1/L = n·c/(2^(b−1) − 1) to within rounding, and the sum is within n·2c/T of
the exact weighted sum per coordinate (stochastic rounding), plus the rounding of W to 1/T. The k-regular graph:
``num_shares`` = k + 1 (Flower counts the node itself), ``reconstruction_threshold`` = max(t, 2) (`workflow`).

The participants of Flower's protocol are nodes: with one client per node they are fedhet's clients; a node
holding several of the cohort's clients adds theirs up in the clear first (one party) and the clip applies to its
sum. Flower draws the rounding from NumPy's global generator: the node seeds it from (seed, "secagg-flower", round,
its first client) before the mod quantises, so that a run is reproducible.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

import numpy as np

from fedhet.flower import require_flwr

require_flwr()

import flwr.compat.common.recorddict_compat as compat  # noqa: E402
from flwr.app import Array, ArrayRecord, ConfigRecord, Context, Message, RecordDict  # noqa: E402
from flwr.client.mod import secaggplus_mod  # noqa: E402
from flwr.common import (  # noqa: E402
    Code,
    FitIns,
    FitRes,
    Parameters,
    Status,
    ndarrays_to_parameters,
    parameters_to_ndarrays,
)
from flwr.server.client_manager import SimpleClientManager  # noqa: E402
from flwr.server.compat.legacy_context import LegacyContext  # noqa: E402
from flwr.server.strategy import Strategy as LegacyStrategy  # noqa: E402
from flwr.server.workflow import SecAggPlusWorkflow  # noqa: E402
from flwr.server.workflow.constant import MAIN_CONFIGS_RECORD, MAIN_PARAMS_RECORD  # noqa: E402
from flwr.server.workflow.constant import Key as WorkflowKey  # noqa: E402
from flwr.serverapp import Grid  # noqa: E402

from fedhet.seeding import numpy_rng  # noqa: E402

MAX_WEIGHT = float(2**30)  # a node's weight W travels as the integer round(W·2^30) (Flower's num_examples)
MAX_LEVELS = 2**30  # Flower's stochastic rounding casts to int32
TRAINED, TRAINED_ROUND = "fedhet-secagg-training", "fedhet-secagg-round"  # a node's kept training
Mod = Callable[[Message, Context, Callable[[Message, Context], Message]], Message]


def levels(bits: int, nodes: int) -> int:
    """T = ⌊(2^b − 1)/n⌋, at most 2^30: n quantised values in [0, T] sum below 2^b."""
    return min(MAX_LEVELS, (2**bits - 1) // max(nodes, 1))


def workflow(nodes: int, degree: int, threshold: int, clip: float, bits: int, timeout: float) -> SecAggPlusWorkflow:
    """Flower's SecAgg+ workflow for `nodes` nodes on fedhet's settings (module docstring). Flower reads an integer
    ``num_shares`` below 3 and an integer threshold of 1 or of all the shares as errors or as proportions: the
    complete graph is the proportion 1.0, and so is a threshold of every share; a threshold of 1 becomes 2 (Flower's
    own floor)."""
    shares = min(degree, nodes - 1) + 1
    least = max(threshold, 2)
    return SecAggPlusWorkflow(
        num_shares=shares if shares < nodes else 1.0,
        reconstruction_threshold=least if least < shares else 1.0,
        max_weight=MAX_WEIGHT,
        clipping_range=float(clip),
        quantization_range=levels(bits, nodes),
        modulus_range=2**bits,
        timeout=timeout,
    )


# ---- the node ----------------------------------------------------------------------------------------------------


def keep_training(
    context: Context, round_: int, global_params: np.ndarray, clients: np.ndarray, params: np.ndarray
) -> None:
    """Keep a node's training of round `round_` in its Flower context, which Flower hands to whichever process
    answers the node's next message (a simulation's actors serve any node): the global model, the clients trained
    and their models."""
    context.state[TRAINED] = ArrayRecord(
        {"global": Array(np.ascontiguousarray(global_params)), "clients": Array(clients), "params": Array(params)}
    )
    context.state[TRAINED_ROUND] = ConfigRecord({"round": round_})


def withhold_models(arrays: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """A node's training reply under SecAgg+ (`fedhet.flower.codec.encode_result`) without the clients' models: what
    the server then learns of each client is what a SecAgg+ deployment sends in the clear besides the masked
    vectors, its id, its steps, its mean training loss and its learning rate (the strategy's metadata; the
    aggregation weights are public sample counts the server already holds)."""
    return {key: value for key, value in arrays.items() if key != "params"}


def contribution(context: Context, config: dict[str, Any]) -> tuple[np.ndarray, int]:
    """The node's input to the sum, v = Σ_u p_u Δ_u / Σ_u p_u over the clients the server names (of its kept
    training, which must be the server's round), and its weight round(Σ_u p_u · 2^30)."""
    round_ = int(config["round"])
    if TRAINED not in context.state or int(context.state[TRAINED_ROUND]["round"]) != round_:
        raise RuntimeError(f"this node holds no training of round {round_ + 1} to aggregate securely")
    kept = context.state[TRAINED]
    global_params = kept["global"].numpy().astype(np.float64)
    params = kept["params"].numpy()
    row = {int(c): i for i, c in enumerate(kept["clients"].numpy().tolist())}
    clients, weights = json.loads(str(config["clients"])), json.loads(str(config["weights"]))
    total = np.zeros(global_params.size, dtype=np.float64)
    for client, p in zip(clients, weights, strict=True):
        total += (global_params - params[row[int(client)]]) * float(p)
    weight = float(sum(weights))
    return total / weight, round(weight * MAX_WEIGHT)


def secure_input(message: Message, context: Context) -> Message:
    """The ClientApp's ``train`` function under `secaggplus_mod`: the node's FitRes for the workflow's third stage
    (`contribution`), which the mod weighs, quantises and masks."""
    config = dict(compat.recorddict_to_fitins(message.content, keep_input=True).config)
    vector, weight = contribution(context, config)
    first = int(json.loads(str(config["clients"]))[0])
    # Flower's rounding draws from NumPy's global generator: seeded, a run is reproducible
    np.random.seed(int(numpy_rng(int(config["seed"]), "secagg-flower", int(config["round"]), first).integers(2**32)))
    fitres = FitRes(Status(Code.OK, ""), ndarrays_to_parameters([vector]), weight, {})
    return Message(compat.fitres_to_recorddict(fitres, keep_input=True), reply_to=message)


MODS: list[Mod] = [secaggplus_mod]


# ---- the server --------------------------------------------------------------------------------------------------


@dataclass
class _Proxy:
    """What the workflow reads of a legacy ``ClientProxy``: the node id."""

    node_id: int
    cid: str = ""


class _Round(LegacyStrategy):
    """The legacy strategy the workflow drives: one FitIns per node (fedhet's config for its contribution), and the
    workflow's unmasked mean kept as it is (every result carries it)."""

    def __init__(self, requests: dict[int, dict[str, Any]]) -> None:
        self.requests = requests
        self.mean: np.ndarray | None = None
        self.included: set[int] = set()

    def initialize_parameters(self, client_manager: Any) -> Parameters | None:
        return None

    def configure_fit(self, server_round: int, parameters: Parameters, client_manager: Any) -> list[Any]:
        empty = ndarrays_to_parameters([])
        return [(_Proxy(node), FitIns(empty, config)) for node, config in self.requests.items()]

    def aggregate_fit(self, server_round: int, results: list[Any], failures: list[Any]) -> tuple[Any, dict[str, Any]]:
        self.included = {int(proxy.node_id) for proxy, _ in results}
        if results:
            self.mean = parameters_to_ndarrays(results[0][1].parameters)[0]
        return None, {}

    def configure_evaluate(self, server_round: int, parameters: Parameters, client_manager: Any) -> list[Any]:
        return []

    def aggregate_evaluate(self, server_round: int, results: list[Any], failures: list[Any]) -> tuple[Any, dict]:
        return None, {}

    def evaluate(self, server_round: int, parameters: Parameters) -> tuple[float, dict[str, Any]] | None:
        return None


class PollingGrid:
    """What the workflow uses of a Grid, ``send_and_receive``, polling for the replies every 5 ms doubling up to
    0.1 s: a deployment's Grid checks every 3 s (flwr/superlink/grid/http_grid.py), which would cost each of the
    workflow's four stages 3 s (as `fedhet.flower.apps.GridTransport.ask` does for fedhet's own calls)."""

    def __init__(self, grid: Grid) -> None:
        self.grid = grid

    def send_and_receive(self, messages: Iterable[Message], *, timeout: float | None = None) -> list[Message]:
        pending = set(self.grid.push_messages(messages))
        replies: list[Message] = []
        deadline, wait = time.monotonic() + (timeout if timeout is not None else float("inf")), 0.005
        while pending:
            for reply in self.grid.pull_messages(list(pending)):
                pending.discard(reply.metadata.reply_to_message_id)
                replies.append(reply)
            if not pending or time.monotonic() >= deadline:
                break
            time.sleep(min(wait, max(0.0, deadline - time.monotonic())))
            wait = min(2 * wait, 0.1)
        return replies


def secure_mean(
    grid: Grid,
    requests: dict[int, dict[str, Any]],
    round_: int,
    sizes: Callable[[int], tuple[int, int]],
    clip: float,
    bits: int,
    timeout: float,
) -> tuple[np.ndarray | None, set[int]]:
    """Run Flower's SecAgg+ workflow over the nodes of `requests` (node → the config of its contribution): the
    unmasked weighted mean (None when the workflow halted: too few nodes, or a secret with fewer than t shares),
    and the nodes whose masked vectors it includes. `sizes(n)` gives (k, t) for n nodes."""
    degree, threshold = sizes(len(requests))
    if len(requests) < 2:
        return None, set()  # Flower's workflow needs two nodes
    state = RecordDict(
        {
            MAIN_CONFIGS_RECORD: ConfigRecord({WorkflowKey.CURRENT_ROUND: round_ + 1}),
            MAIN_PARAMS_RECORD: ArrayRecord(),
        }
    )
    context = Context(run_id=0, node_id=0, node_config={}, state=state, run_config={})
    strategy = _Round(requests)
    legacy = LegacyContext(context, strategy=strategy, client_manager=SimpleClientManager())
    workflow(len(requests), degree, threshold, clip, bits, timeout)(PollingGrid(grid), legacy)
    return strategy.mean, strategy.included


def included_clients(requests: dict[int, dict[str, Any]], nodes: Iterable[int]) -> list[int]:
    """The clients whose updates a secure mean over `nodes` includes."""
    return sorted(int(c) for node in nodes for c in json.loads(str(requests[node]["clients"])))
