"""Dispatch: how many tasks each worker may hold, and which worker gets the next one
(credit accounting, pure).

Each worker may hold at most ``per_worker`` tasks (torch's ``prefetch_factor``). The next
task goes to the live worker holding the fewest, so a slow worker is given less work
instead of stalling a fixed round-robin turn. The dispatcher also remembers every task
in flight, so a failure can name the indices a worker was holding.
"""

from __future__ import annotations

import math
import time
from typing import Any, NamedTuple

from .._transport.messages import Indices, Task

DEFAULT_PREFETCH = 2  # torch's default prefetch_factor
AUTO_PREFETCH_BYTES = 1 << 20  # per worker, for prefetch_factor=None
MAX_AUTO_PREFETCH = 64
# An automatic depth queues at most about this much of a worker's work, once its pace is
# measured: enough to outlast a few scheduler slices (below), while batches that are small
# but slow to load (a tokenizer, a remote read) stay at torch's depth, so that a ``break``
# leaves little queued work behind it (a persistent worker still loads what it holds).
DEPTH_SECONDS = 0.02


def prefetch_depth(prefetch_factor: int | None, slot_bytes: int, num_workers: int, max_bytes: int,
                   batch_seconds: float | None = None) -> int:
    """Tasks each worker may hold: ``prefetch_factor`` when given; with None (the default),
    2 for large batches and deeper for small ones, up to about 1 MiB a worker and a
    quarter of the ring's bound ``max_bytes`` for all workers (a tight /dev/shm is better
    left for the ring to grow into), and once ``batch_seconds`` (a worker's measured time
    per batch) is known, at most :data:`DEPTH_SECONDS` of work.

    Why deeper: each hand-off between a worker and the main process costs context
    switches (tens of microseconds here, and colder caches after), which a small batch
    cannot hide; and with more busy processes than cores, the main process, woken when a
    batch is ready, waits for a core until a running worker's time slice ends (Linux's
    EEVDF lets the running task reach its deadline: a slice of 1.4 ms on the benchmark
    machine). Meanwhile the workers live on their queues, and a queue shorter than a
    few slices of work runs dry, leaving a core idle. Measured on 2 cores with batches of
    256 x 32 floats (about 150 us each): next() stalled 1-3.6 ms about every 4 ms at
    depth 16, each stall one sleep of the main process; depths 16 / 28 / 56 gave 9,109 /
    9,361 / 9,506 batches/s with 7.2 / 5.6 / 5.5% of the CPU idle (medians of 6; earlier:
    3,530 at depth 2, 4,420 at 8, 4,620 at 16). Deep queues of small batches cost little
    memory (at most 1 MiB per worker: 28 x 36 KiB there). ``slot_bytes`` is 0 until the
    first batch sizes the ring.
    """
    if prefetch_factor is not None:
        return prefetch_factor
    if not slot_bytes:
        return DEFAULT_PREFETCH
    budget = min(AUTO_PREFETCH_BYTES, max_bytes // (4 * max(1, num_workers)))
    depth = min(MAX_AUTO_PREFETCH, budget // slot_bytes)
    if batch_seconds:
        depth = min(depth, math.ceil(DEPTH_SECONDS / batch_seconds))
    return max(DEFAULT_PREFETCH, depth)


class InFlight(NamedTuple):
    """A task a worker holds, and the slot it is to be written into (None: not known yet,
    or waiting for a larger one; see allocation.py). The slot is a ``ring.Slot``. ``fits``:
    the slot was granted for the batch's size, as the worker asked (a slot sent with the
    task may turn out too small)."""

    task: Task
    slot: Any
    fits: bool = False


class Dispatcher:
    def __init__(self, num_workers: int, per_worker: int):
        self.per_worker = per_worker
        self._tasks: list[dict[tuple[int, int], InFlight]] = [{} for _ in range(num_workers)]
        # How many tasks in flight have no slot (``task.slot is None``): zero in steady
        # state, which spares the session a scan of every task on each dispatch.
        self.without_slot = 0
        # When each worker's current task began, as far as this process knows: when its
        # previous one ended, or when it was sent one while it held none (parts.tail_wait).
        self.busy_since: list[float | None] = [None] * num_workers
        self.completed = 0  # tasks that came back, ever (when to measure the pace again: Session)
        # Which workers are given new tasks: all of them, except with num_workers="auto",
        # where a stopped worker (or one still starting) is left out (scaling.py). A worker
        # left out keeps and finishes what it holds.
        self.accepting = [True] * num_workers
        self.active = num_workers  # how many accept

    @property
    def num_workers(self) -> int:
        return len(self._tasks)

    def pick(self) -> int | None:
        """The worker to send the next task to, or None if every worker is full."""
        best, best_load = None, self.per_worker
        accepting = self.accepting
        for wid, tasks in enumerate(self._tasks):
            if len(tasks) < best_load and accepting[wid]:
                best, best_load = wid, len(tasks)
        return best

    def idle(self) -> bool:
        """Does some worker that accepts tasks hold none? (A loop, not ``any()`` over a
        generator, which costs a microsecond more: this is asked at most next() calls.)"""
        for tasks, ok in zip(self._tasks, self.accepting):
            if ok and not tasks:
                return True
        return False

    def idle_workers(self) -> int:
        """How many workers that accept tasks hold none."""
        return sum(1 for tasks, ok in zip(self._tasks, self.accepting) if ok and not tasks)

    def accept(self, wid: int, ok: bool) -> None:
        """Give worker ``wid`` new tasks from now on (``ok``), or no more."""
        self.accepting[wid] = ok
        self.active = sum(self.accepting)

    def holds(self, wid: int) -> int:
        """How many tasks worker ``wid`` holds."""
        return len(self._tasks[wid])

    def has_room(self, wid: int) -> bool:
        """May worker ``wid`` be sent one more task? (An iterable source's draws go to the
        worker whose stream it is, whatever the others hold.)"""
        return len(self._tasks[wid]) < self.per_worker and self.accepting[wid]

    def assign(self, wid: int, key: tuple[int, int], task: InFlight) -> None:
        """Record ``task`` as held by ``wid``, replacing what was recorded under ``key``
        (iteration, seq)."""
        tasks = self._tasks[wid]
        old = tasks.get(key)
        self.without_slot += (task.slot is None) - (old is not None and old.slot is None)
        if not tasks:
            self.busy_since[wid] = time.monotonic()
        tasks[key] = task

    def complete(self, wid: int, key: tuple[int, int]) -> InFlight:
        self.completed += 1
        task = self._tasks[wid].pop(key)
        self.without_slot -= task.slot is None
        self.busy_since[wid] = time.monotonic() if self._tasks[wid] else None
        return task

    def task(self, wid: int, key: tuple[int, int]) -> InFlight:
        return self._tasks[wid][key]

    def loads(self) -> list[int]:
        """The rows each worker still holds (a task of one index, or a draw, counts one):
        how ``parts.plan_spans`` tells idle workers from busy ones."""
        return [sum(map(_rows, tasks.values())) for tasks in self._tasks]

    def held_by(self, wid: int) -> list[InFlight]:
        """The tasks worker ``wid`` holds, oldest first."""
        return list(self._tasks[wid].values())


def _rows(entry: InFlight) -> int:
    task = entry.task
    if task.span is not None:
        return task.span.stop - task.span.start
    return len(task.load) if isinstance(task.load, (list, Indices)) else 1
