"""A long-lived ClientApp process for one SuperNode: ``python -m fedhet.flower.worker``.

In its default ``subprocess`` isolation a Flower 1.42 SuperNode hands every message to a new ``flwr-clientapp``
process, which imports torch and fedhet, loads the node's partition and builds an engine before it can answer, and
the SuperExec that starts those processes polls for work once a second. A round of fedhet on a deployment is two
to four messages per node, so that start-up is most of its time.

``flower-supernode --isolation process`` leaves running the node's tasks to a process of the operator's choice.
This module is that process: it takes the node's ClientApp tasks from the SuperNode's Runtime API one after
another (as Flower's SuperExec does) and runs each in itself (as ``flwr-clientapp`` does), with Flower's own task
protocol: pull the message and context, run the ClientApp, push the reply and the context back, heartbeats while
it works. torch, fedhet, the partition and the node's `NodeWorker` (its engine) stay loaded between messages.

    python -m fedhet.flower.supernode --isolation process --port 19301 ...   (or Flower's flower-supernode)
    python -m fedhet.flower.worker --runtime-api-address 127.0.0.1:19301 --insecure --parent-pid <supernode pid>

The task protocol is Flower's internal API (``flwr.supernode.runtime``), so this module needs the flwr release
the ``flower`` extra pins (1.42); `require_flwr_worker` says so in one line otherwise.
"""

from __future__ import annotations

import argparse
import logging
import os
import signal
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from fedhet.flower import require_flwr_release

log = logging.getLogger("fedhet.flower.worker")


def require_flwr_worker() -> None:
    """Stop with one line when flwr is missing or is not the release whose task protocol this worker speaks."""
    require_flwr_release("node worker speaks the task protocol", "or run the SuperNode without --isolation process")


require_flwr_worker()

from flwr.app import Message  # noqa: E402
from flwr.app.error import Error  # noqa: E402
from flwr.cli.install import install_from_fab  # noqa: E402
from flwr.clientapp.client_app import ClientApp, LoadClientAppError  # noqa: E402
from flwr.clientapp.utils import get_load_client_app_fn  # noqa: E402
from flwr.common.constant import ErrorCode, SubStatus  # noqa: E402
from flwr.common.serde import context_from_proto, fab_from_proto, run_from_proto  # noqa: E402
from flwr.proto.node_pb2 import Node  # noqa: E402
from flwr.proto.runtime_pb2 import (  # noqa: E402
    AcquireTaskRequest,
    PullAppMessagesRequest,
    PullTaskInputRequest,
)
from flwr.supercore.app_utils import start_parent_process_monitor  # noqa: E402
from flwr.supercore.constant import TaskType  # noqa: E402
from flwr.supercore.heartbeat import HeartbeatSender, make_task_heartbeat_fn_http  # noqa: E402
from flwr.supercore.inflatable.inflatable_protobuf_utils import (  # noqa: E402
    make_confirm_message_received_fn_protobuf,
    make_pull_object_fn_protobuf,
)
from flwr.supercore.inflatable.inflatable_utils import pull_and_inflate_object_from_tree  # noqa: E402
from flwr.supercore.interceptors import RuntimeTokenHttpInterceptor, RuntimeVersionHttpInterceptor  # noqa: E402
from flwr.supercore.retry import make_simple_http_retry_invoker  # noqa: E402
from flwr.supercore.runtime import RuntimeHttpClient  # noqa: E402
from flwr.supercore.task_identity import TaskIdentity  # noqa: E402
from flwr.supercore.tls import validate_and_resolve_root_certificates  # noqa: E402
from flwr.supernode.runtime.run_clientapp import push_message, push_task_output  # noqa: E402

PULL_BACKOFF_S = 0.01  # first wait for a message object the SuperNode is still receiving (Flower's default: 1 s)
PULL_MAX_S = 300.0  # a message whose objects never come (its run was stopped meanwhile) fails after this long


def pull_task_input(client: RuntimeHttpClient) -> tuple[Message, Any, Any, Any]:
    """The task's message, context, run and FAB, as ``flwr.supernode.runtime.run_clientapp.pull_task_input`` pulls
    them, but retrying a message object the SuperNode does not hold yet after 10 ms rather than 1 s (the worker asks
    as soon as the task exists; a fresh flwr-clientapp process asked seconds later)."""
    res = client.PullTaskInput(PullTaskInputRequest())
    TaskIdentity.task_id, TaskIdentity.run_id, TaskIdentity.node_id = res.task_id, res.run.run_id, res.context.node_id
    context, run, fab = context_from_proto(res.context), run_from_proto(res.run), fab_from_proto(res.fab)
    pulled = client.PullMessages(PullAppMessagesRequest())
    if not pulled.messages_list:
        raise RuntimeError("the SuperNode granted a task but holds no message for it")
    node, tree = Node(node_id=context.node_id), pulled.message_object_trees[0]
    message = pull_and_inflate_object_from_tree(
        tree,
        make_pull_object_fn_protobuf(client.PullObject, node, context.run_id),
        make_confirm_message_received_fn_protobuf(client.ConfirmMessageReceived, node, context.run_id),
        return_type=Message,
        initial_backoff=PULL_BACKOFF_S,
        max_time=PULL_MAX_S,
    )
    message.metadata.__dict__["_message_id"] = tree.object_id  # as Flower does: the deflated message lacks its id
    return message, context, run, fab


def load_client_app(apps: dict[str, ClientApp], run: Any, fab: Any) -> ClientApp:
    """The run's ClientApp, installed from its FAB and loaded as ``flwr-clientapp`` does, kept in `apps` by the
    FAB's hash for the next message."""
    if fab.hash_str not in apps:
        install_from_fab(fab.content, skip_prompt=True)
        load = get_load_client_app_fn(default_app_ref="", app_path=None, multi_app=True)
        apps[fab.hash_str] = load(run.fab_id, run.fab_version, fab.hash_str)
    return apps[fab.hash_str]


def failure(err: Exception, message: Message | None) -> tuple[str, Message | None]:
    """A failed task's details, and the error reply Flower's ClientApp processes send (none without a message)."""
    loading = isinstance(err, LoadClientAppError)
    code = ErrorCode.LOAD_CLIENT_APP_EXCEPTION if loading else ErrorCode.CLIENT_APP_RAISED_EXCEPTION
    details = f"{type(err)}:<'{err}'>"
    return details, None if message is None else Message(Error(code=code, reason=details), reply_to=message)


@dataclass
class Connection:
    """How to reach the SuperNode's Runtime API."""

    address: str
    insecure: bool = True
    certificates: bytes | None = None

    def client(self, component: str, token: str | None = None, retry: bool = True) -> RuntimeHttpClient:
        """A Runtime API client; with `retry`, Flower's retries (for ever, while the SuperNode is away), else one
        try per call, so that a caller can stop while the SuperNode is gone."""
        interceptors: list[Any] = [RuntimeVersionHttpInterceptor(component_name=component)]
        if token is not None:
            interceptors.append(RuntimeTokenHttpInterceptor(token))
        invoker = make_simple_http_retry_invoker()
        if not retry:
            invoker.max_tries = 1
        return RuntimeHttpClient.from_server_address(
            server_address=self.address,
            insecure=self.insecure,
            root_certificates=self.certificates,
            interceptors=interceptors,
            retry_invoker=invoker,
        )


@dataclass
class TaskRunner:
    """Runs a SuperNode's ClientApp tasks in this process, keeping each app (by FAB hash) loaded.

    Each task runs on a thread of its own, as each had a process of its own in Flower's subprocess isolation: a task
    whose message never arrives (the SuperNode keeps the tasks of a run that a killed server left behind) waits on
    its own while the next run's tasks go on. The ClientApp itself answers one task at a time (`lock`)."""

    connection: Connection
    apps: dict[str, ClientApp] = field(default_factory=dict)
    tasks: int = 0
    lock: threading.Lock = field(default_factory=threading.Lock)

    def run(self, token: str) -> bool:
        """Run the task `token` grants: pull it, answer it, push the reply and the context. True if it completed."""
        client = self.connection.client("flwr-clientapp", token)
        heartbeat = HeartbeatSender(make_task_heartbeat_fn_http(client))
        heartbeat.start()
        message: Message | None = None
        reply: Message | None = None
        context = None
        status, details = SubStatus.FAILED, "the ClientApp task failed"
        started = time.perf_counter()
        try:
            message, context, run, fab = pull_task_input(client)
            with self.lock:
                app = load_client_app(self.apps, run, fab)
                reply = app(message=message, context=context)
            status, details = SubStatus.COMPLETED, ""
        except Exception as err:  # a failed task is reported to the server, and the worker goes on
            log.exception("the ClientApp raised an exception")
            details, reply = failure(err, message)
        finally:
            try:
                if reply is not None and context is not None:
                    push_message(client, reply, context)
            except Exception:  # the SuperNode went away; the next AcquireTask will tell
                log.exception("could not push the reply")
                status = SubStatus.FAILED
            push_task_output(client=client, context=context, sub_status=status, details=details)
            heartbeat.stop()
            client.close()
        with self.lock:
            self.tasks += 1
            log.info("task %d: %s in %.3f s", self.tasks, status, time.perf_counter() - started)
        return status == SubStatus.COMPLETED

    def start(self, token: str) -> threading.Thread:
        thread = threading.Thread(target=self.run, args=(token,), daemon=True, name="fedhet-task")
        thread.start()
        return thread


def serve(
    connection: Connection,
    stop: threading.Event,
    poll_s: float = 0.01,
    idle_poll_s: float = 0.2,
) -> TaskRunner:
    """Take and run the SuperNode's ClientApp tasks until `stop` is set. The poll interval starts at `poll_s` after
    a task and grows to `idle_poll_s` while there is none (a round's next message comes within milliseconds)."""
    runner = TaskRunner(connection)
    control = connection.client("SuperExec", retry=False)
    request = AcquireTaskRequest(supported_task_types=[str(TaskType.CLIENT_APP)])
    wait = poll_s
    try:
        while not stop.is_set():
            try:
                response = control.AcquireTask(request)
            except Exception as err:  # the SuperNode is not answering (starting, restarting, or gone for good)
                log.warning("the SuperNode at %s does not answer (%s); asking again in 1 s", connection.address, err)
                stop.wait(1.0)
                continue
            if response.HasField("task") and response.token:
                runner.start(response.token)
                wait = poll_s
                continue
            stop.wait(wait)
            wait = min(idle_poll_s, wait * 2)
    finally:
        control.close()
    return runner


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m fedhet.flower.worker",
        description="Run a SuperNode's ClientApp tasks in one long-lived process "
        "(for flower-supernode --isolation process; see docs/flower.md).",
    )
    parser.add_argument("--runtime-api-address", required=True, help="the SuperNode's --port address, host:port")
    security = parser.add_mutually_exclusive_group(required=True)
    security.add_argument("--insecure", action="store_true", help="plain HTTP (loopback only)")
    security.add_argument("--root-certificates", type=Path, help="CA certificate of the SuperNode's TLS")
    parser.add_argument("--parent-pid", type=int, help="stop when this process (the SuperNode) ends")
    parser.add_argument(
        "--warm", action="store_true", help="import fedhet's ClientApp (and torch) before the first task"
    )
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s fedhet-worker %(levelname)s %(message)s")
    logging.getLogger("httpx").setLevel(logging.WARNING)  # one line per HTTP request otherwise
    certificates = validate_and_resolve_root_certificates(
        str(args.root_certificates) if args.root_certificates else None, args.insecure
    )
    stop = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: stop.set())
    if args.parent_pid is not None:  # the SuperNode gone: Flower's monitor raises SIGINT, which stops the loop
        start_parent_process_monitor(args.parent_pid)
    if args.warm:
        import fedhet.flower.apps  # noqa: F401  (torch, fedhet's engine and the ClientApp, before the first message)
    log.info("serving the ClientApp tasks of the SuperNode at %s", args.runtime_api_address)
    runner = serve(Connection(args.runtime_api_address, args.insecure, certificates), stop)
    log.info("stopped after %d tasks", runner.tasks)
    return 0


def exit_now(code: int) -> None:
    """End the process without joining its threads: a task still pulling its message from a SuperNode that is gone
    retries inside Flower's own (non-daemon) thread pool for ever, which a normal exit would wait for."""
    logging.shutdown()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


if __name__ == "__main__":
    exit_now(main())
