"""The Flower side: a ServerApp that runs fedhet's round loop with a `RemoteEngine`, and a ClientApp that answers
it with fedhet's engine on the node's partition. Both travel as ``query`` messages on Flower's Message API.

Deployment (``flwr run`` against a SuperLink; see docs/flower.md) reads the run config keys below; simulation
(`fedhet.flower.simulation`) builds the same apps in-process.

Run config (``[tool.flwr.app.config]`` or ``flwr run --run-config``): ``config`` (path of a fedhet YAML file on the
server), ``out`` (the run folder: an existing checkpoint there is resumed), ``nodes`` (nodes to wait for),
``timeout`` (seconds a node has per call), ``wait`` (seconds to wait for the nodes), ``trust-imports`` (without
``config``: import the code the run folder's config.yaml names, as ``fedhet run --resume --trust-imports``).
Node config (``flower-supernode --node-config``): ``partition-id`` and ``num-partitions`` (derive the partition
from the run's config), or ``data-file`` (a partition file written by ``python -m fedhet.flower.partitions``);
``state-dir`` (where the node also saves its clients' state, so that it survives a restarted server);
``allow-imports`` (comma-separated modules and ``.py`` files or folders the server's config may import: plugins and a
torch model target; default none). A node builds only what its own configuration allows (`NodePolicy`): the config
the server sends is not the node operator's request (docs/reliability.md, "What can run code").
"""

from __future__ import annotations

import functools
import json
import logging
import re
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from fedhet.flower import require_flwr

require_flwr()

from flwr.app import Array, ArrayRecord, ConfigRecord, Context, Message, RecordDict  # noqa: E402
from flwr.app.error import Error  # noqa: E402
from flwr.clientapp import ClientApp  # noqa: E402
from flwr.common.constant import ErrorCode  # noqa: E402
from flwr.serverapp import Grid, ServerApp  # noqa: E402

from fedhet.atomic import write_bytes, write_text  # noqa: E402
from fedhet.errors import ConfigError, FedhetError  # noqa: E402
from fedhet.experiments.callbacks import Callback  # noqa: E402
from fedhet.experiments.checkpoint import load_state, save_state  # noqa: E402
from fedhet.experiments.config import RunConfig, load_yaml, parse_config  # noqa: E402
from fedhet.experiments.runner import CHECKPOINT, CONFIG, SUMMARY, resume, run, same_run  # noqa: E402
from fedhet.experiments.state import RunState  # noqa: E402
from fedhet.flower.codec import Arrays, Config, Payload  # noqa: E402
from fedhet.flower.node import (  # noqa: E402
    NO_STATE,
    STATEFUL,
    NodeWorker,
    Stamp,
    config_from_text,
    config_text,
    derived_partition,
    fingerprint,
    load_partition,
)
from fedhet.flower.remote import RemoteEngine, Settings, remote_builder  # noqa: E402
from fedhet.flower.secagg import MODS, keep_training, secure_input, secure_mean, withhold_models  # noqa: E402
from fedhet.imports import ImportPolicy, import_policy  # noqa: E402

log = logging.getLogger("fedhet.flower")
STATE_KEY, STAMP_KEY = "fedhet-client-state", "fedhet-client-state-stamp"  # the blob, and its `Stamp`
PACKED, LAYOUT = "fedhet.packed", "fedhet.layout"  # a message's small arrays as one, and their layout
PACK_BELOW = 64 << 10  # bytes
POLL_S, MAX_POLL_S = 0.005, 0.1  # how often the server looks for the nodes' replies


def _record(arrays: Arrays, config: Config) -> RecordDict:
    """A payload as a Flower record: arrays of `PACK_BELOW` bytes or more as their own ``Array``, the smaller
    ones as one bytes value of the ``ConfigRecord`` (`PACKED`, their layout under `LAYOUT`). Every object of a
    message (the record dict, each record, each array and its chunks) is stored by the SuperLink and pushed and
    pulled with requests of its own: with the small arrays in the config, a message without large arrays is three
    objects instead of six, and a large one kept apart (the global model, the same in every node's message) is
    stored and pushed once for all nodes."""
    small = {name: a for name, a in arrays.items() if a.nbytes < PACK_BELOW}
    layout = [(name, a.dtype.str, list(a.shape)) for name, a in small.items()]
    packed = b"".join(np.ascontiguousarray(a).tobytes() for a in small.values())
    records: dict[str, ArrayRecord | ConfigRecord] = {
        "config": ConfigRecord({**config, LAYOUT: json.dumps(layout), PACKED: packed})
    }
    large = {name: Array(a) for name, a in arrays.items() if name not in small}
    if large:
        records["arrays"] = ArrayRecord(large)
    return RecordDict(records)


def _payload(content: RecordDict) -> Payload:
    config = dict(content["config"])
    raw = config.pop(PACKED)
    if not isinstance(raw, bytes):
        raise ValueError("a message without fedhet's packed arrays: the sender runs another fedhet version")
    packed = np.frombuffer(raw, np.uint8)
    arrays: Arrays = {name: a.numpy() for name, a in content["arrays"].items()} if "arrays" in content else {}
    start = 0
    for name, dtype, shape in json.loads(str(config.pop(LAYOUT))):
        kind = np.dtype(dtype)
        if kind.kind not in "biufc":  # numbers only: bytes are never read as object references
            raise ValueError(f"a message's array {name!r} has dtype {dtype}, not a numeric one")
        size = int(np.prod(shape, dtype=np.int64)) * kind.itemsize
        arrays[name] = packed[start : start + size].view(kind).reshape(shape).copy()
        start += size
    return arrays, config


class GridTransport:
    """`fedhet.flower.remote.Transport` over a Flower Grid: one ``query`` message per node and call."""

    def __init__(self, grid: Grid) -> None:
        self.grid = grid
        self.failures: dict[int, str] = {}  # node -> the reason of its last error reply
        self.refusals: dict[int, str] = {}  # node -> what it refused (`refusal`): the run stops

    def nodes(self) -> list[int]:
        return sorted(int(n) for n in self.grid.get_node_ids())

    def ask(self, requests: dict[int, Payload], timeout: float) -> dict[int, Payload]:
        """Send one message per node and collect the replies that come within `timeout` seconds.

        Flower's ``Grid.send_and_receive`` on a deployment checks for replies every 3 s; a fedhet round is several
        such exchanges, so this polls with `POLL_S` doubling up to `MAX_POLL_S` instead (the public
        ``push_messages``/``pull_messages`` pair it is built on)."""
        messages = [
            Message(
                _record(arrays, config), dst_node_id=node, message_type="query", group_id=str(config.get("round", ""))
            )
            for node, (arrays, config) in requests.items()
        ]
        ids = list(self.grid.push_messages(messages))
        sent_to = dict(zip(ids, requests, strict=True))  # an error reply may come from the SuperLink, not the node
        pending = set(ids)
        replies: dict[int, Payload] = {}
        deadline, wait = time.monotonic() + timeout, POLL_S
        while pending:
            for reply in self.grid.pull_messages(list(pending)):
                pending.discard(reply.metadata.reply_to_message_id)
                node = sent_to.get(reply.metadata.reply_to_message_id, int(reply.metadata.src_node_id))
                if reply.has_error():
                    refused = refusal(str(reply.error.reason))
                    if refused is not None:  # the server stops with it (`RemoteEngine`): no warning each time
                        self.refusals[node] = refused
                        continue
                    self.failures[node] = failure_reason(str(reply.error.reason))
                    log.warning("node %s failed: %s", node, self.failures[node])
                    continue
                replies[node] = _payload(reply.content)
            left = deadline - time.monotonic()
            if not pending or left <= 0:
                break
            time.sleep(min(wait, left))
            wait = min(2 * wait, MAX_POLL_S)
        return replies

    def secure_mean(
        self,
        requests: dict[int, Config],
        round_: int,
        sizes: Callable[[int], tuple[int, int]],
        clip: float,
        bits: int,
        timeout: float,
    ) -> tuple[np.ndarray | None, set[int]]:
        """Flower's SecAgg+ over the grid's nodes (`fedhet.flower.secagg.secure_mean`)."""
        return secure_mean(self.grid, requests, round_, sizes, clip, bits, timeout)


# ---- ClientApp ---------------------------------------------------------------------------------------------------

RUN_KEY = re.compile(r"[0-9a-f]{16}")  # what `run_key` makes: a node names its state files by it, nothing else


def failure_reason(reason: str) -> str:
    """The message of a node's error reply (Flower's ``<class ...>:<'message'>``), on one line."""
    found = re.fullmatch(r"<class '[\w.]+'>:<'(.*)'>", reason.strip(), re.DOTALL)
    text = found.group(1) if found else reason
    return " ".join(text.split())[:500]


def refusal(reason: str) -> str | None:
    """The message of a node's error reply when the node refused (raised one of fedhet's errors for people, a
    `FedhetError`: a config it does not allow, a stale client state), else None. The class is looked up among the
    modules already imported here, never imported by its name."""
    found = re.fullmatch(r"<class '([\w.]+)'>:<'.*'>", reason.strip(), re.DOTALL)
    if found is None:
        return None
    module, _, name = found.group(1).rpartition(".")
    kind = getattr(sys.modules.get(module), name, None)
    return failure_reason(reason) if isinstance(kind, type) and issubclass(kind, FedhetError) else None


def error_reply(err: Exception, message: Message) -> Message:
    """The error reply Flower's ClientApp processes make of an exception (its reason: ``<class ...>:<'...'>``)."""
    return Message(Error(code=ErrorCode.CLIENT_APP_RAISED_EXCEPTION, reason=f"{type(err)}:<'{err}'>"), reply_to=message)


@dataclass(frozen=True)
class NodePolicy:
    """What a node lets the server's config do: import what `imports` permits (a deployed node: the modules and files
    of its ``allow-imports``; none by default), and keep its clients' state in `state_dir` (its ``state-dir``; None:
    in Flower's context only). Paths the node derives from server values stay inside `state_dir`."""

    imports: ImportPolicy
    state_dir: Path | None = None

    @classmethod
    def of(cls, node_config: dict[str, Any]) -> NodePolicy:
        """A deployed node's policy, from its ``--node-config``."""
        allowed = tuple(a.strip() for a in str(node_config.get("allow-imports", "")).split(",") if a.strip())
        refusal = (
            "the server's config names code this node does not allow; its operator allows modules and files with "
            "flower-supernode --node-config \"allow-imports='module,path/to/file.py'\""
        )
        state = str(node_config.get("state-dir", "") or "")
        return cls(ImportPolicy(allowed, refusal), Path(state) if state else None)


_WORKERS: dict[str, NodeWorker] = {}  # by (config, partition): kept while this process lives


def _worker(config: Config, node_config: dict[str, Any], policy: NodePolicy) -> NodeWorker:
    text = str(config["fedhet_config"])
    data_file = str(node_config.get("data-file", ""))
    allowed = "*" if policy.imports.allowed is None else ",".join(policy.imports.allowed)
    key = fingerprint(
        f"{text}|{data_file}|{node_config.get('partition-id')}|{node_config.get('num-partitions')}|{allowed}"
    )
    if key not in _WORKERS:
        with import_policy(policy.imports):  # before anything the config names is imported or built
            run_config = config_from_text(text)
            if data_file:
                data, clients = load_partition(Path(data_file))
            else:
                part, parts = int(node_config.get("partition-id", 0)), int(node_config.get("num-partitions", 1))
                data, clients = derived_partition(run_config, text, part, parts)
            worker = NodeWorker(run_config, data, clients)
        if len(_WORKERS) >= 8:  # a simulation actor serves several nodes; keep a few, drop the oldest
            _WORKERS.pop(next(iter(_WORKERS)))
        _WORKERS[key] = worker
    return _WORKERS[key]


def _state_file(config: Config, node_config: dict[str, Any], policy: NodePolicy) -> Path | None:
    """The node's state file: in its own state folder, named by the server's run key (checked: 16 hex digits)."""
    if policy.state_dir is None:
        return None
    key = str(config.get("run_key", ""))
    if not RUN_KEY.fullmatch(key):
        raise ValueError(f"the server's run_key {key[:40]!r} is not a fedhet run key (16 hex digits); refused")
    node = str(node_config.get("partition-id", node_config.get("data-file", "node")))
    path = policy.state_dir / f"{key}-{fingerprint(node)}.pt"
    if path.resolve().parent != policy.state_dir.resolve():  # a link in its place: never written through
        raise ValueError(f"node state file '{path}' leads out of the node's state folder; refused")
    return path


def _sync_state(
    worker: NodeWorker, context: Context, config: Config, node_config: dict[str, Any], policy: NodePolicy
) -> None:
    """Give `worker` the clients' state this node saved last: from Flower's context (this run's; the worker's own
    copy when it is that one, by its stamp: a simulation's node may be answered by another actor each time), else
    from the node's state file (a resumed run), else none. Both are read weights-only and checksummed
    (`fedhet.experiments.checkpoint.load_state`); whether it is the version the server expects is the worker's
    check (`NodeWorker.check_state`)."""
    if STATE_KEY in context.state:
        saved = context.state.get(STAMP_KEY)
        if saved is None or Stamp(int(saved["version"]), str(saved["token"])) != worker.stamp:
            blob = context.state[STATE_KEY]["blob"].numpy().tobytes()
            worker.load(load_state(blob, "the node's client state"))
        return
    path = _state_file(config, node_config, policy)
    if path is not None and path.is_file():
        worker.load(load_state(path, f"node state file '{path}'"))
    elif worker.stamp != NO_STATE:  # the state of another run this process served
        worker.reset()


def _save_state(
    worker: NodeWorker, context: Context, config: Config, node_config: dict[str, Any], policy: NodePolicy
) -> None:
    data = save_state(worker.state())
    context.state[STATE_KEY] = ArrayRecord({"blob": Array(np.frombuffer(data, dtype=np.uint8).copy())})
    context.state[STAMP_KEY] = ConfigRecord({"version": worker.stamp.version, "token": worker.stamp.token})
    path = _state_file(config, node_config, policy)
    if path is not None:
        path.parent.mkdir(parents=True, exist_ok=True)
        write_bytes(path, data)


def answer_with(message: Message, context: Context, policy: NodePolicy) -> Message:
    """Run one fedhet engine call on this node's partition, as `policy` allows. A refusal (a `FedhetError`) is the
    reply: an error reply with its one line, which stops the run at the server, and no traceback in any log."""
    try:
        return _answer(message, context, policy)
    except FedhetError as err:
        log.warning("node %s refused the server's call: %s", context.node_id, err)
        return error_reply(err, message)


def _answer(message: Message, context: Context, policy: NodePolicy) -> Message:
    arrays, config = _payload(message.content)
    node_config = dict(context.node_config)
    worker = _worker(config, node_config, policy)
    op = str(config["op"])
    if op in STATEFUL:
        _sync_state(worker, context, config, node_config, policy)
    out_arrays, out_config = worker.handle(op, arrays, config)
    if op == "train":
        _save_state(worker, context, config, node_config, policy)
        if config.get("keep_training"):  # for Flower's SecAgg+ (`fedhet.flower.secagg`), whichever process answers
            keep_training(context, int(config["round"]), arrays["params"], out_arrays["clients"], out_arrays["params"])
            out_arrays = withhold_models(out_arrays)  # the server learns the models' sum only, by SecAgg+
    return Message(_record(out_arrays, out_config), reply_to=message)


client_app = ClientApp()


@client_app.query()
def answer(message: Message, context: Context) -> Message:
    """A deployed node's answer: what its ``--node-config`` allows (`NodePolicy.of`)."""
    return answer_with(message, context, NodePolicy.of(dict(context.node_config)))


client_app.train(mods=MODS)(secure_input)  # Flower's SecAgg+ (`fedhet.flower.secagg`)


def make_client_app(policy: NodePolicy) -> ClientApp:
    """A ClientApp whose nodes follow `policy` (the simulation's: the user's own config, state in the run folder)."""
    app = ClientApp()

    @app.query()
    def answer_in_simulation(message: Message, context: Context) -> Message:
        return answer_with(message, context, policy)

    app.train(mods=MODS)(secure_input)
    return app


# ---- ServerApp ---------------------------------------------------------------------------------------------------


def serve(
    grid: Grid,
    config: RunConfig | None,
    out: Path,
    settings: Settings,
    callbacks: list[Callback] | None = None,
    trust: bool = False,
) -> RunState:
    """Run `config` into `out` across the grid's nodes, or resume the run in `out` if it has a checkpoint (the code
    its config.yaml names is imported when it is `config`'s, or with `trust`)."""
    builder = remote_builder(GridTransport(grid), settings)
    if (out / CHECKPOINT).is_file() or (config is None and (out / CONFIG).is_file()):
        if config is not None and not same_run(config, out):
            raise ConfigError(f"'{out}' holds the checkpoint of another config; give another 'out' or remove it")
        state = resume(out, callbacks, builder, trust=trust or config is not None)
    elif config is None:
        raise ConfigError(f"'{out}' holds no run to resume and no config was given")
    else:  # a server restarted before its first checkpoint starts the run again
        state = run(config, out, callbacks, builder, overwrite=True)
    engine = state.experiment.engine
    assert isinstance(engine, RemoteEngine)
    summary_path = out / SUMMARY
    summary = json.loads(summary_path.read_text())
    summary.update({"engine": "flower", "nodes": len(engine.nodes), "nodes_lost": sorted(engine.lost)})
    write_text(summary_path, json.dumps(summary, indent=2) + "\n")
    return state


def run_key(config: RunConfig | None, out: Path) -> str:
    """Names the nodes' saved state: the run folder (a resumed run keeps it)."""
    del config
    return fingerprint(str(out.resolve()))


def make_server_app(
    config: RunConfig | None,
    out: Path,
    settings: Settings,
    callbacks: list[Callback] | None = None,
    done: Callable[[RunState], None] | None = None,
    trust: bool = False,
) -> ServerApp:
    """A ServerApp bound to one run (simulation)."""
    app = ServerApp()

    @app.main()
    def main(grid: Grid, context: Context) -> None:
        state = serve(grid, config, out, settings, callbacks, trust)
        if done is not None:
            done(state)

    return app


def _one_line(main: Callable[[Grid, Context], None]) -> Callable[[Grid, Context], None]:
    """`main`, whose `FedhetError` (a node's refusal, a config the server refuses) the user reads as one ``error:``
    line in ``flwr run``'s output (scripts/flower_local.sh then exits 2), not as a ServerApp traceback and Flower's
    "Exit Code 201"; the run then ends without a traceback in Flower's logs either."""

    @functools.wraps(main)
    def wrapped(grid: Grid, context: Context) -> None:
        try:
            main(grid, context)
        except FedhetError as err:
            print(f"error: {' '.join(str(err).split())}", file=sys.stderr, flush=True)

    return wrapped


server_app = ServerApp()


@server_app.main()
@_one_line
def deployed(grid: Grid, context: Context) -> None:
    """`flwr run`: the run config names the fedhet config file and the run folder."""
    rc = dict(context.run_config)
    out = Path(str(rc.get("out", "runs/flower")))
    path = str(rc.get("config", ""))
    config = parse_config(load_yaml(Path(path))) if path else None
    settings = Settings(
        timeout=float(rc.get("timeout", 120.0)),
        min_nodes=int(rc.get("nodes", 1)),
        wait=float(rc.get("wait", 120.0)),
        run_key=run_key(config, out),
    )
    shorten_reply_pulls()
    serve(grid, config, out, settings, trust=bool(rc.get("trust-imports", False)))


def shorten_reply_pulls() -> None:
    """Retry a reply's objects that the SuperLink does not hold yet after `POLL_S`, doubling up to `MAX_POLL_S`.

    On a deployment (flwr 1.42's ``HttpGrid``) a node pushes its reply, then the reply's objects; a pull that finds
    the reply before its objects retried after 1 s, then 2 … (``pull_objects``' defaults), about a second lost in
    most exchanges. Leaves other flwr releases as they are."""
    try:
        from flwr.superlink.grid import http_grid
    except ImportError:
        return
    pull = getattr(http_grid, "pull_objects", None)
    if pull is not None and not isinstance(pull, functools.partial):
        http_grid.pull_objects = functools.partial(pull, initial_backoff=POLL_S, backoff_cap=MAX_POLL_S)


__all__ = [
    "GridTransport",
    "NodePolicy",
    "client_app",
    "config_text",
    "make_client_app",
    "make_server_app",
    "serve",
    "server_app",
]
