"""A SuperNode that answers its ClientApp tasks itself: ``python -m fedhet.flower.supernode --in-process``.

With ``--isolation process`` a Flower 1.42 SuperNode leaves each message to a ClientApp process that takes it
over the node's Runtime API (fedhet's long-lived `fedhet.flower.worker`, or Flower's ``flwr-clientapp``): about
a dozen HTTP requests per message between two processes (a poll for the task, the task's input, the message and
each of its objects, a confirmation, the reply and each of its objects, the task's output, heartbeats), each a few
ms of Python on both sides. `InProcessTasks` runs the task in the SuperNode's own process instead, as Flower's
SuperNode did before its isolation modes: it reads the message from the node's state and object store, calls the
ClientApp, and stores the reply and the context where the Runtime API would have put them, with the same task
states. Flower's loop then sends the reply to the SuperLink as always. The ClientApp (torch, fedhet, the
partition and the node's engine) stays loaded between messages, as in the worker; a task that raises is answered
with an error reply, as the worker does.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field
from typing import Any

from fedhet.flower.worker import failure, load_client_app, require_flwr_worker

require_flwr_worker()

from flwr.app import Message  # noqa: E402
from flwr.clientapp.client_app import ClientApp  # noqa: E402
from flwr.common.constant import Status, SubStatus  # noqa: E402
from flwr.supercore.constant import TaskType  # noqa: E402
from flwr.supercore.heartbeat import HeartbeatSender  # noqa: E402
from flwr.supercore.inflatable.inflatable_object import iterate_object_tree  # noqa: E402
from flwr.supercore.inflatable.inflatable_utils import inflate_object_from_contents  # noqa: E402
from flwr.supercore.task_identity import TaskIdentity  # noqa: E402
from flwr.supernode.start_client_internal import _insert_message as insert_message  # noqa: E402

log = logging.getLogger("fedhet.flower.inprocess")


@dataclass
class InProcessTasks:
    """Runs a SuperNode's pending ClientApp tasks in the SuperNode's process, one after another."""

    apps: dict[str, ClientApp] = field(default_factory=dict)
    tasks: int = 0

    def run_pending(self, state: Any, store: Any) -> None:
        """Run every pending ClientApp task of `state` (the SuperNode's NodeState; `store` its object store)."""
        for task in state.get_tasks(statuses=[Status.PENDING], order_by="pending_at", ascending=True):
            if task.type == TaskType.CLIENT_APP and state.claim_task(task.task_id) is not None:
                self._run(state, store, task)

    def _run(self, state: Any, store: Any, task: Any) -> None:
        started = time.perf_counter()
        heartbeat = HeartbeatSender(lambda: bool(state.acknowledge_task_heartbeat(task.task_id)))
        status, details = SubStatus.FAILED, "the ClientApp task failed"
        message: Message | None = None
        reply: Message | None = None
        context = None
        run = state.get_run(task.run_id)
        # the task's message as the node's state holds it (metadata only): whatever fails, it gets a reply, for
        # Flower's loop waits for one before it pulls the next message
        incoming = next(iter(state.get_messages_legacy(run_ids=[task.run_id], is_reply=False, limit=1)), None)
        try:
            if run is None or incoming is None or not state.activate_task(task.task_id):
                raise RuntimeError(f"could not start task {task.task_id} of run {task.run_id}")
            heartbeat.start()
            context = state.get_run_series_context(run.series_id)
            # who is sending, for the messages the app makes (as Flower's ClientApp processes set it)
            TaskIdentity.task_id, TaskIdentity.run_id, TaskIdentity.node_id = task.task_id, run.run_id, context.node_id
            message = self._message(state, store, incoming.metadata.message_id)
            fab = state.get_fab(run.fab_hash)
            app = load_client_app(self.apps, run, fab)
            reply = app(message=message, context=context)
            status, details = SubStatus.COMPLETED, ""
        except Exception as err:  # answered with an error reply, as Flower's ClientApp processes do
            log.exception("the ClientApp raised an exception")
            details, reply = failure(err, message if message is not None else incoming)
        finally:
            if heartbeat.is_running:
                heartbeat.stop()
        if incoming is not None and reply is not None:
            state.record_message_processing_end(incoming.metadata.message_id)
            insert_message(reply, state, store)  # as the SuperNode stores the replies it makes itself
        if run is not None and context is not None:  # as the task's output, failed or not (Flower pushes it so)
            state.set_run_series_context(run.series_id, context)
        state.finish_task(task.task_id, status, details)
        self.tasks += 1
        log.info("task %d: %s in %.3f s", self.tasks, status, time.perf_counter() - started)

    @staticmethod
    def _message(state: Any, store: Any, message_id: str) -> Message:
        """The message with its content, read from the node's object store (Flower's loop pulled all its objects
        before it asks for the reply), then dropped from the store as Flower's confirmation does."""
        state.record_message_processing_start(message_id=message_id)
        tree = store.get_object_tree(message_id)
        contents = {node.object_id: store.get(node.object_id) for node in iterate_object_tree(tree)}
        if any(not content for content in contents.values()):
            raise RuntimeError(f"the SuperNode lacks objects of message {message_id}")
        message = inflate_object_from_contents(message_id, contents)
        if not isinstance(message, Message):
            raise RuntimeError(f"object {message_id} is not a message")
        message.metadata.__dict__["_message_id"] = message_id  # as Flower does: the deflated message lacks its id
        store.delete(message_id)
        return message
