"""A SuperNode answering its ClientApp tasks itself (`fedhet.flower.inprocess`), on Flower's own node state and
object store: the message stored as the SuperNode's loop stores it, the reply and the context where Flower's
Runtime API would have put them, the task's states, an error reply for an app that raises, heartbeats while the
app works. (A whole deployment through it gives the native numbers: tests/flower/test_worker.py.)"""

from __future__ import annotations

import hashlib
import subprocess
import sys
import threading

import pytest
from flwr.app import ConfigRecord, Context, Message, RecordDict
from flwr.clientapp import ClientApp
from flwr.common.constant import Status, SubStatus
from flwr.supercore.constant import TaskType
from flwr.supercore.fab import Fab
from flwr.supercore.object_store import ObjectStoreFactory
from flwr.supercore.run import Run
from flwr.supercore.task_identity import TaskIdentity
from flwr.supernode import start_client_internal as loop
from flwr.supernode.nodestate import NodeStateFactory

from fedhet.flower import supernode
from fedhet.flower.inprocess import InProcessTasks

RUN, NODE = 7, 11
FAB_CONTENT = b"a FAB"
FAB_HASH = hashlib.sha256(FAB_CONTENT).hexdigest()


@pytest.fixture(autouse=True)
def server_side(monkeypatch: pytest.MonkeyPatch) -> None:
    """The messages the tests make come from the server's task (restored after each test)."""
    for name, value in (("_task_id", 1), ("_run_id", RUN), ("_node_id", 0)):
        monkeypatch.setattr(TaskIdentity, name, value)


def node_with_a_message(app: ClientApp, value: float = 3.0) -> tuple[InProcessTasks, object, object, int, str]:
    """A SuperNode's state after its loop pulled one query for `app` (`_pull_and_store_message`)."""
    objects = ObjectStoreFactory()
    state = NodeStateFactory(objects).state()
    store = state.object_store
    state.set_node_id(NODE)
    run = Run.create_empty(RUN)
    run.fab_id, run.fab_version, run.fab_hash, run.series_id = "fedhet/test", "1.0.0", FAB_HASH, 5
    state.store_run(run)
    state.store_fab(Fab(FAB_HASH, FAB_CONTENT, {}))
    context = Context(run_id=RUN, node_id=NODE, node_config={}, state=RecordDict(), run_config={})
    state.set_run_series_context(run.series_id, context)
    message = Message(RecordDict({"in": ConfigRecord({"x": value})}), dst_node_id=NODE, message_type="query")
    task = state.create_task(task_type=TaskType.CLIENT_APP, run_id=RUN, fab_hash=FAB_HASH)
    assert task is not None
    loop._insert_message(message, state, store)
    tasks = InProcessTasks()
    tasks.apps[FAB_HASH] = app
    return tasks, state, store, task, message.metadata.message_id


def doubling_app() -> ClientApp:
    app = ClientApp()

    @app.query()
    def answer(message: Message, context: Context) -> Message:
        x = float(message.content["in"]["x"])  # type: ignore[arg-type]
        context.state["seen"] = ConfigRecord({"x": x})
        return Message(RecordDict({"out": ConfigRecord({"y": 2 * x})}), reply_to=message)

    return app


def finished(state: object, task: int) -> tuple[str, str]:
    [info] = state.get_tasks(task_ids=[task])  # type: ignore[attr-defined]
    return info.status.status, info.status.sub_status


def test_a_task_is_answered_in_the_supernodes_process() -> None:
    tasks, state, store, task, asked = node_with_a_message(doubling_app())
    tasks.run_pending(state, store)
    [reply] = state.get_messages_legacy(is_reply=True)  # type: ignore[attr-defined]
    assert reply.metadata.reply_to_message_id == asked and not reply.has_error()
    tree = store.get_object_tree(reply.metadata.message_id)  # type: ignore[attr-defined]
    assert store.get(tree.object_id)  # type: ignore[attr-defined]  # its objects are there for the loop to push
    assert finished(state, task) == (Status.FINISHED, SubStatus.COMPLETED)
    context = state.get_run_series_context(5)  # type: ignore[attr-defined]
    assert float(context.state["seen"]["x"]) == 3.0
    assert store.get(asked) is None  # type: ignore[attr-defined]  # the message dropped, as a confirmation does
    assert tasks.tasks == 1
    # the messages the app makes come from the node's task, as in Flower's ClientApp processes
    assert (TaskIdentity.task_id, TaskIdentity.run_id, TaskIdentity.node_id) == (task, RUN, NODE)
    tasks.run_pending(state, store)  # nothing pending: nothing runs again
    assert tasks.tasks == 1


def test_the_reply_carries_the_apps_answer() -> None:
    from flwr.supercore.inflatable.inflatable_object import iterate_object_tree
    from flwr.supercore.inflatable.inflatable_utils import inflate_object_from_contents

    tasks, state, store, _, _ = node_with_a_message(doubling_app(), value=4.5)
    tasks.run_pending(state, store)
    [reply] = state.get_messages_legacy(is_reply=True)  # type: ignore[attr-defined]
    tree = store.get_object_tree(reply.metadata.message_id)  # type: ignore[attr-defined]
    contents = {t.object_id: store.get(t.object_id) for t in iterate_object_tree(tree)}  # type: ignore[attr-defined]
    sent = inflate_object_from_contents(tree.object_id, contents)
    assert isinstance(sent, Message) and float(sent.content["out"]["y"]) == 9.0  # type: ignore[arg-type]


def test_an_app_that_raises_is_answered_with_an_error() -> None:
    app = ClientApp()

    @app.query()
    def answer(message: Message, context: Context) -> Message:
        context.state["seen"] = ConfigRecord({"x": 1.0})
        raise ValueError("no such client")

    tasks, state, store, task, asked = node_with_a_message(app)
    tasks.run_pending(state, store)
    [reply] = state.get_messages_legacy(is_reply=True)  # type: ignore[attr-defined]
    assert reply.metadata.reply_to_message_id == asked and reply.has_error()
    assert "no such client" in reply.error.reason
    assert finished(state, task) == (Status.FINISHED, SubStatus.FAILED)
    # the context goes back as Flower's ClientApp processes push it back after a failure too
    assert float(state.get_run_series_context(5).state["seen"]["x"]) == 1.0  # type: ignore[attr-defined]


def test_a_task_that_cannot_start_fails_and_its_message_still_gets_a_reply() -> None:
    """Flower's loop waits for a reply before it pulls the next message: without one the node would hang."""
    tasks, state, store, task, asked = node_with_a_message(doubling_app())
    state.activate_task = lambda task_id: False  # type: ignore[attr-defined]  # e.g. its claim expired meanwhile
    tasks.run_pending(state, store)  # no exception reaches the SuperNode's loop
    assert finished(state, task) == (Status.FINISHED, SubStatus.FAILED)
    [reply] = state.get_messages_legacy(is_reply=True)  # type: ignore[attr-defined]
    assert reply.metadata.reply_to_message_id == asked and reply.has_error()


def test_the_task_sends_heartbeats_while_the_app_works() -> None:
    """Flower expires a running task that sends no heartbeat for a minute (its error reply would replace the
    app's); the task's heartbeats go to the node's state while the app runs."""
    beat = threading.Event()
    app = ClientApp()

    @app.query()
    def answer(message: Message, context: Context) -> Message:
        assert beat.wait(timeout=30)
        return Message(RecordDict({"out": ConfigRecord({"y": 0.0})}), reply_to=message)

    tasks, state, store, task, _ = node_with_a_message(app)
    acknowledge = state.acknowledge_task_heartbeat  # type: ignore[attr-defined]

    def heard(task_id: int) -> bool:
        beat.set()
        return bool(acknowledge(task_id))

    state.acknowledge_task_heartbeat = heard  # type: ignore[attr-defined]
    tasks.run_pending(state, store)
    assert beat.is_set()
    assert finished(state, task) == (Status.FINISHED, SubStatus.COMPLETED)


def test_the_supernode_loop_answers_before_it_waits_for_the_reply(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(loop, "_push_messages", loop._push_messages)  # restored after the test
    replies_seen: list[int] = []

    def push(*, state: object, object_store: object, send: object, push_object: object) -> None:
        replies_seen.append(len(state.get_messages_legacy(is_reply=True)))  # type: ignore[attr-defined]

    monkeypatch.setattr(loop, "_push_messages", push)
    tasks = supernode.answer_in_process()
    _, state, store, task, _ = node_with_a_message(doubling_app())
    tasks.apps[FAB_HASH] = doubling_app()
    loop._push_messages(state=state, object_store=store, send=None, push_object=None)  # as Flower's loop calls it
    assert replies_seen == [1] and tasks.tasks == 1
    assert finished(state, task) == (Status.FINISHED, SubStatus.COMPLETED)


@pytest.mark.parametrize(
    ("arguments", "error"),
    [
        (["--in-process", "--isolation", "process"], "leave out --isolation"),
        (["--in-process", "--isolation=subprocess"], "leave out --isolation"),
        (["--warm"], "--warm goes with --in-process"),
    ],
)
def test_the_launcher_refuses_what_does_not_go_with_in_process(arguments: list[str], error: str) -> None:
    done = subprocess.run(
        [sys.executable, "-m", "fedhet.flower.supernode", *arguments], capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 2 and error in done.stderr
