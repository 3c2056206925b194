"""Control: the per-batch messages between the main process and each worker, in shared memory.

Each worker has two single-producer single-consumer queues of variable-size records in
one shared-memory segment (:class:`ControlBlock`): *tasks* (main -> worker) and
*completions* (worker -> main). A batch's task and its completion cost no system call
while the other side is awake: a record is copied into the queue and a semaphore's
count goes up. The Unix socket of each worker (``channel.py``) carries only what is
rare: file descriptors, the control segment itself at start-up, and a record too large
for its queue (announced in the queue by a :data:`NOTICE`, so order is kept).

NOTE [ How a record becomes visible ]
    Python and numpy have no atomics, so no index in shared memory is ever read as a
    synchronisation variable. Every queue has two process-shared POSIX semaphores
    (``sem_init(pshared=1)`` in the segment itself, called through ``ctypes``):

    * ``items`` counts records published and not yet taken. The producer copies a
      record into the queue with plain stores, then ``sem_post(items)``; the consumer
      reads a record only after its ``sem_trywait(items)`` (or ``sem_clockwait``)
      succeeded.
    * ``free`` counts records taken whose bytes may be reused. The consumer copies the
      record out (one ``bytes`` slice), then ``sem_post(free)``; the producer overwrites
      a record's bytes only after a ``sem_trywait(free)`` that took that record's token.
      Each side keeps its own position in a private variable: the producer remembers
      the size of each record it wrote, so a free token tells it how far the space
      freed reaches. No head or tail is shared.

    POSIX lists ``sem_post`` and ``sem_wait``/``sem_trywait`` among the functions that
    synchronise memory (XBD 4.12): whatever a process wrote before ``sem_post`` is seen
    by the process whose wait took that post. glibc implements post as an atomic
    fetch-add with release order and the waits as a compare-and-swap with acquire order.
    On x86-64 those are ``lock``-prefixed instructions, full barriers; plain stores are
    not reordered with each other there (TSO), so even without the semaphores the only
    hazard would be the compiler, which cannot move stores across an opaque call. On
    ARM64, where plain stores and loads may be reordered with each other, the release
    (``stlr``/``ldaddl``) orders the record's bytes before the count and the acquire
    (``ldaxr``/``casa``) orders the count before the reads of the record: the same
    argument, made by the instructions instead of by the architecture's default.

NOTE [ A doorbell rung only for a sleeper ]
    glibc's semaphore is a 64-bit word holding the count and the number of waiters.
    ``sem_post`` adds to the count with one atomic instruction and makes the
    ``futex_wake`` system call only if the waiter count says someone is asleep; a waiter
    registers itself *before* it sleeps and sleeps in ``futex_wait``, which rechecks the
    word in the kernel. That is the notification suppression of virtio and io_uring
    ("the receiver has said it is about to sleep"), with the store-then-check ordering
    that a hand-made flag in shared memory would need and Python cannot express done by
    single atomic read-modify-writes. So while a worker is busy loading, a task costs
    the main process no system call, and while the main process is busy training, a
    completion costs the worker none.

    The main process waits for any of its workers, so a completion is also posted to
    one shared ``bell``. Taking a record consumes a bell token when there is one; the
    main process sleeps only after draining the bell and finding every queue empty once
    more (``Supervisor.poll``), so a record published at any moment either is
    found by that last scan or posts the bell after it: no wake-up is lost.

    A worker rings the bell only when its record is the only one of its queue not yet
    taken (:meth:`WorkerEnd.publish`: the queue's ``items`` count, read after its own
    post, is at most 1). With an older record still there, the main process is bound
    to take that one later, and it takes a worker's records until the queue is empty
    before it may sleep: that scan sees the new record, whose post came before the
    older record's take in the one semaphore's order of changes. Why: a woken main
    process waits for a core while both workers run (up to a scheduler slice, 1.4 ms
    on the benchmark machine), and as long as it has not run, glibc still counts it as
    a waiter, so every post made meanwhile was a ``futex_wake`` system call: 0.67 a
    batch from the workers against 0.1 sleeps of the main process, on tiny batches.
    Now a worker makes at most one per sleep.

NOTE [ Deaths and the queues ]
    A process killed at any instruction leaves a queue in one of three states: a
    record written but not posted (never read: the batch is re-sent to a replacement or
    reported), a token taken but its record not yet copied (only the dead worker's own
    queues), or a waiter count raised for a sleeper that will never wake (only its own
    task semaphore, or the bell if the main process died). A dead worker's queues are
    therefore re-initialised for its replacement (:meth:`ControlBlock.reset`), after the
    main process has taken every record it published; nothing the main process waits on
    can be left blocked by a worker, since the main process never waits on a worker's
    semaphore without a time-out and checks for deaths between its waits (``supervisor.py``).
"""

from __future__ import annotations

from typing import Any, NamedTuple

import numpy as np

from .queues import (
    RING_HEADER,
    SEM_SLOT,
    Consumer,
    Producer,
    Queue,
    Semaphore,
    consumer_of,
    producer_of,
    sem_post,
    sem_trywait,
)


# ---------------------------------------------------------------- the segment: a bell and one area per worker
class Area(NamedTuple):
    """Where one worker's two queues lie in the control segment (offsets of their headers)."""

    tasks: int
    task_bytes: int
    completions: int
    completion_bytes: int


TASK_BYTES = 128 * 1024  # per worker: 16 tasks of 1,024 indices each with room to spare; more tasks than
# fit (an automatic depth up to 64 for tiny batches: dispatch.py) wait in the main process's overflow
# (Supervisor._push), in order, and leave as the worker frees room
COMPLETION_BYTES = 64 * 1024


def layout_areas(workers: int, task_bytes: int = TASK_BYTES,
                 completion_bytes: int = COMPLETION_BYTES) -> tuple[list[Area], int]:
    """Each worker's :class:`Area` and the segment's size (the bell at offset 0)."""
    areas, offset = [], SEM_SLOT
    for _ in range(workers):
        tasks = offset
        completions = tasks + RING_HEADER + task_bytes
        areas.append(Area(tasks, task_bytes, completions, completion_bytes))
        offset = completions + RING_HEADER + completion_bytes
    return areas, offset


def _address(mm: Any) -> tuple[np.ndarray, int]:
    anchor = np.frombuffer(mm, dtype=np.uint8)  # an export of the mapping, held while it is used
    return anchor, anchor.ctypes.data


class WorkerEnd:
    """A worker's view of its area: it takes tasks and publishes completions."""

    def __init__(self, mm: Any, area: Area):
        self._anchor: np.ndarray | None
        self._anchor, address = _address(mm)
        self.tasks = consumer_of(Queue(mm, area.tasks, area.task_bytes, address))
        self.completions = producer_of(Queue(mm, area.completions, area.completion_bytes, address))
        self.bell = Semaphore(address)
        self._post = sem_post

    def publish(self, payload: bytes, *more: bytes) -> bool:
        """Put a completion, and ring the bell unless an older one of this queue is still
        to be taken (NOTE [ A doorbell rung only for a sleeper ])."""
        if not self.completions.put(payload, *more):
            return False
        if self.completions.pending() <= 1:
            self._post(self.bell.addr)
        return True

    def close(self) -> None:
        # a closed end is never used again: its queues let go of the mapping
        if self.tasks is not None:
            self.tasks.close()
            self.completions.close()
        self.tasks = self.completions = None  # type: ignore[assignment]
        self._anchor = None


class ControlBlock:
    """The main process's side of the control segment: every worker's queues, and the bell."""

    def __init__(self, mm: Any, workers: int):
        self.areas, size = layout_areas(workers)
        if len(mm) < size:
            raise ValueError(f"control segment of {len(mm)} bytes, {size} needed")
        self._anchor: np.ndarray | None
        self._anchor, address = _address(mm)
        self.bell = Semaphore(address)
        self.bell.init(0)
        self.tasks: list[Producer] = []
        self.completions: list[Consumer] = []
        for area in self.areas:
            self.tasks.append(producer_of(Queue(mm, area.tasks, area.task_bytes, address)))
            self.completions.append(consumer_of(Queue(mm, area.completions, area.completion_bytes, address)))
        for wid in range(workers):
            self.reset(wid)

    @staticmethod
    def size(workers: int) -> int:
        return layout_areas(workers)[1]

    def reset(self, wid: int) -> None:
        """Fresh queues for worker ``wid`` (a new or restarted worker; NOTE [ Deaths and the
        queues ]): both semaphores of both queues re-initialised, positions at 0."""
        for end in (self.tasks[wid], self.completions[wid]):
            end.q.items.init(0)
            end.q.free.init(0)
            end.reset()

    def take(self, wid: int) -> bytes | None:
        """Worker ``wid``'s next completion, or None; consumes a bell token if there is one."""
        record = self.completions[wid].take()
        if record is not None:
            sem_trywait(self.bell.addr)  # (Semaphore.trywait in-line: once a batch)
        return record

    def drain_bell(self) -> None:
        """Before the last scan ahead of a sleep: drop the bell's tokens, so that only a
        completion published after that scan can wake :meth:`sleep` at once (NOTE [ A
        doorbell rung only for a sleeper ])."""
        trywait, bell = sem_trywait, self.bell.addr
        while trywait(bell) == 0:
            pass

    def sleep(self, timeout: float) -> None:
        """Sleep up to ``timeout`` seconds, or until a worker rings the bell."""
        self.bell.wait(timeout)

    def close(self) -> None:
        for producer in self.tasks:
            producer.close()
        for consumer in self.completions:
            consumer.close()
        self.tasks, self.completions = [], []
        self._anchor = None
