"""A worker process's notes reach the sweep through the executor's queue, beside the rounds it reports."""

from __future__ import annotations

import warnings
from queue import SimpleQueue

from fedhet.errors import FedhetNote
from fedhet.experiments.executor import NOTE, Executor, Monitor


class Rounds(Monitor):
    def __init__(self) -> None:
        self.seen: list[tuple[int, int, int]] = []

    def rounds(self, key: int, done: int, total: int) -> None:
        self.seen.append((key, done, total))


def test_drain_shows_a_workers_note_and_passes_rounds_to_the_monitor() -> None:
    monitor = Rounds()
    executor = Executor(2, monitor=monitor)
    queue: SimpleQueue[tuple[int, object, object]] = SimpleQueue()
    for item in [(0, 1, 3), (NOTE, "note", "dropped 1 row"), (1, 2, 3)]:
        queue.put(item)
    executor._queue = queue
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        executor._drain()
    assert monitor.seen == [(0, 1, 3), (1, 2, 3)]
    assert [(w.category, str(w.message)) for w in caught] == [(FedhetNote, "dropped 1 row")]
