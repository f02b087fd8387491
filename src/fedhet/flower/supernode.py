"""Flower's SuperNode with short polls: ``python -m fedhet.flower.supernode [--poll-max S] [--in-process [--warm]]
FLOWER-SUPERNODE-ARGS``.

A Flower 1.42 SuperNode that finds no message at the SuperLink sleeps 3 s before it asks again
(``time.sleep(3)`` in ``flwr.supernode.start_client_internal``), waits for its ClientApp's reply in steps of 0.5 s,
and retries a message's objects that the SuperLink does not hold yet after 1 s, then 2, 4 … It asks right after
pushing a reply, before the server has aggregated and sent the next message, so every exchange of a round waited
about 3 s whatever its work, many times a round of milliseconds in Flower's simulation runtime (docs/flower.md has
the measurements).

This runs Flower's own ``flower-supernode`` (same arguments, same behaviour) with shorter waits (`Backoff`): its
polls of the SuperLink start `FIRST_WAIT_S` after the node's last message and grow by `GROWTH` up to ``--poll-max``
(default `MAX_WAIT_S`, Flower's 3 s), its waits for the reply last `FIRST_WAIT_S`, and its retries for missing
objects start there. A server that answers within milliseconds is heard within milliseconds, and an idle node soon
asks no more often than Flower's. Every poll is a request the SuperLink answers in Python, so a short fixed interval
would slow it for everyone (docs/flower.md, "Polls that keep up with the round"). The waits are internals of the
flwr release the ``flower`` extra pins, so this checks that release, like fedhet's worker.

``--in-process`` also makes the node run its ClientApp tasks itself (`fedhet.flower.inprocess`) instead of leaving
them to a ClientApp process.
"""

from __future__ import annotations

import argparse
import functools
import logging
import sys
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from fedhet.flower.worker import require_flwr_worker

if TYPE_CHECKING:
    from fedhet.flower.inprocess import InProcessTasks

FIRST_WAIT_S = 0.01
IDLE_WAIT_S = 3.0  # what Flower 1.42's SuperNode sleeps when the SuperLink has no message for it
MAX_WAIT_S = IDLE_WAIT_S  # by default an idle node ends up polling as seldom as Flower's
GROWTH = 1.5


class Backoff:
    """Stands in for the `time` module of Flower's SuperNode loop. Its waits of `IDLE_WAIT_S` (Flower's 3 s
    between polls of the SuperLink) start at `first` seconds after a `reset` and grow by `GROWTH` up to `cap`; its
    shorter waits (for the ClientApp's reply, which the node finds in its own memory) last `first`. Anything else
    is `time`'s."""

    def __init__(self, first: float = FIRST_WAIT_S, cap: float = MAX_WAIT_S) -> None:
        self.first, self.cap = first, cap
        self.next = first

    def reset(self) -> None:
        self.next = self.first

    def sleep(self, seconds: float) -> None:
        if seconds < IDLE_WAIT_S:
            time.sleep(min(seconds, self.first))
            return
        wait = min(self.next, self.cap)
        self.next = min(GROWTH * self.next, self.cap)
        time.sleep(wait)

    def __getattr__(self, name: str) -> Any:
        return getattr(time, name)


def resetting(backoff: Backoff, function: Callable[..., Any]) -> Callable[..., Any]:
    """`function`, resetting `backoff` when it returns (a node that has just answered soon gets the next message)."""

    @functools.wraps(function)
    def wrapped(*args: Any, **kwargs: Any) -> Any:
        try:
            return function(*args, **kwargs)
        finally:
            backoff.reset()

    return wrapped


def shorten_waits(first_s: float = FIRST_WAIT_S, cap_s: float = MAX_WAIT_S) -> Backoff:
    """Make the SuperNode loop of ``flwr.supernode.start_client_internal`` back off from `first_s` to `cap_s`."""
    require_flwr_worker()
    from flwr.supernode import start_client_internal as loop

    backoff = Backoff(first_s, cap_s)
    loop.time = backoff  # type: ignore[attr-defined,unused-ignore]
    loop._push_messages = resetting(backoff, loop._push_messages)  # type: ignore[attr-defined,unused-ignore]
    loop.pull_objects = functools.partial(  # type: ignore[attr-defined,unused-ignore]
        loop.pull_objects, initial_backoff=first_s, backoff_cap=cap_s
    )
    return backoff


def answer_in_process() -> InProcessTasks:
    """Make the SuperNode loop run each ClientApp task itself (`fedhet.flower.inprocess`) before it waits for the
    task's reply."""
    from flwr.supernode import start_client_internal as loop

    from fedhet.flower.inprocess import InProcessTasks

    tasks = InProcessTasks()
    push = loop._push_messages

    @functools.wraps(push)
    def answer_then_push(state: Any, object_store: Any, send: Any, push_object: Any) -> None:
        tasks.run_pending(state, object_store)
        push(state=state, object_store=object_store, send=send, push_object=push_object)

    loop._push_messages = answer_then_push  # type: ignore[attr-defined,unused-ignore]
    return tasks


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        prog="python -m fedhet.flower.supernode",
        description="flower-supernode whose polls start 10 ms after a message and grow to --poll-max seconds "
        "(docs/flower.md); "
        "every other argument goes to flower-supernode",
    )
    parser.add_argument(
        "--poll-max", type=float, default=MAX_WAIT_S, help=f"longest wait between polls (default {MAX_WAIT_S} s)"
    )
    parser.add_argument(
        "--in-process",
        action="store_true",
        help="run the ClientApp in this process (no ClientApp process to start; implies --isolation process)",
    )
    parser.add_argument(
        "--warm", action="store_true", help="with --in-process: import fedhet's ClientApp (and torch) at the start"
    )
    args, rest = parser.parse_known_args(argv)
    if not args.poll_max > 0:
        parser.error("--poll-max must be a positive number of seconds")
    if args.warm and not args.in_process:
        parser.error("--warm goes with --in-process (a worker takes its own --warm)")
    if args.in_process:
        if any(arg.startswith("--isolation") for arg in rest):
            parser.error("--in-process sets the isolation itself: leave out --isolation")
        answer_in_process()
        handler = logging.StreamHandler()  # one line per task in the node's log, beside Flower's own
        handler.setFormatter(logging.Formatter("%(asctime)s fedhet-node %(levelname)s %(message)s"))
        logger = logging.getLogger("fedhet.flower.inprocess")
        logger.addHandler(handler)
        logger.setLevel(logging.INFO)
        rest = [*rest, "--isolation", "process"]
        if args.warm:
            import fedhet.flower.apps  # noqa: F401  (torch, fedhet's engine and the ClientApp, before the first task)
    shorten_waits(FIRST_WAIT_S, args.poll_max)
    from flwr.supernode.cli.flower_supernode import flower_supernode

    sys.argv = ["flower-supernode", *rest]
    flower_supernode()


if __name__ == "__main__":
    main()
