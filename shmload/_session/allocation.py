"""Slot allocation: which batch gets which ring slot, and when waiting for one cannot help.

Pure bookkeeping over the ring (``ring.py``) and the tasks in flight (``dispatch.py``):
no processes, no messages. The session asks and carries out what it is told: a slot to
send with a new task (:meth:`SlotAllocator.for_task`), the larger slots to reassign to
workers waiting for one (:meth:`SlotAllocator.serve`, a list of :class:`Grant`), and
before it blocks, whether waiting can still help (:meth:`SlotAllocator.raise_if_stuck`).

The rules, each enforced once, below:

* A task is sent with a free slot (credit-based dispatch); before the ring is sized (the
  first batches), without one: the worker's :class:`~shmload._transport.messages.NeedSpace` sizes it.
* While any worker waits for a larger slot, no new task is dispatched: new tasks would
  only pin the old, smaller slots.
* Earliest first. Workers load their tasks in order, so a later batch given the last slot
  would hold it while its worker waits for an earlier batch's slot: with few slots (a
  small /dev/shm) nothing would ever move. A batch may take a slot ahead of earlier
  batches that have none only while enough free slots stay for them (``_may_overtake``),
  counted after any growth it needs (growth retires the free slots). "Earlier" is the
  order in which workers reach their tasks (NOTE [ Earliest as the workers see it ]).
* Grow rather than wait forever: a consumer holding batches gets more slots, a batch
  larger than the slots a larger segment, both up to the ring's bound.
* Past the bound, wait only while waiting can help: while a slot can still come back.
  Once the batch the consumer needs next waits for space itself, or sits behind a batch
  that does on its worker (or, with ``in_order=False``, nothing that holds a slot, or may
  still take a free one, can still finish), no slot will come back, and the ring's
  :class:`~shmload.errors.RingFullError` is raised instead of hanging. /dev/shm itself
  full (NOTE [ The ring stops at what fits ], ring.py) is the same: wait while a slot can
  come back, else its SharedMemoryError.
"""

from __future__ import annotations

from collections import deque
from typing import NamedTuple

from .._transport.messages import NeedSpace
from .._transport.ring import Ring, Slot, SlotState
from ..errors import SharedMemoryError
from .dispatch import Dispatcher


class Grant(NamedTuple):
    """Reassign: worker ``worker``'s batch ``seq`` of ``iteration`` is to be written into ``slot``."""

    worker: int
    iteration: int
    seq: int
    slot: Slot


class Waiting(NamedTuple):
    """Worker ``worker`` holds a loaded batch that needs a larger slot (its NeedSpace)."""

    worker: int
    need: NeedSpace


class SlotAllocator:
    def __init__(self, ring: Ring, dispatcher: Dispatcher):
        self.ring = ring
        self.dispatcher = dispatcher
        self.waiting: deque[Waiting] = deque()  # in the order asked
        # why the earliest waiting batch still waits: the ring's bound, or /dev/shm itself
        self._error: SharedMemoryError | None = None

    # ------------------------------------------------------------ new tasks
    def for_task(self, iteration: int) -> tuple[bool, Slot | None]:
        """May a new task of ``iteration`` be dispatched, and with which slot (None: the
        ring is not sized yet, the worker's NeedSpace will size it)? Takes the slot."""
        if self.waiting:
            return False, None
        if not self.ring.slot_bytes:
            return True, None
        earlier = len(self._unplaced(iteration)) if self.dispatcher.without_slot or self.ring.retired_filling() else 0
        if not self._room_for(earlier):
            return False, None  # earlier batches need the free slots
        slot = self.ring.take()
        if slot is None:
            slot = self._grow_for_held()
        return slot is not None, slot

    def _grow_for_held(self) -> Slot | None:
        """No slot is free: the consumer holds batches. Add slots rather than wait forever;
        past the bound (or what /dev/shm holds), wait if a slot can still come back, else
        raise."""
        try:
            self.ring.add_slots()
        except SharedMemoryError:  # the bound, or /dev/shm itself (NOTE [ The ring stops at what fits ])
            if self.ring.slots_in(SlotState.FILLING) or self.ring.slots_in(SlotState.READY):
                return None
            raise
        return self.ring.take()

    # NOTE [ Earliest as the workers see it ]
    # "Earliest first" rests on each worker loading its tasks in order. A worker's queue is
    # in batch order, except where a split batch is loaded again whole (spans.py): when
    # every worker already holds a later batch, the redo goes behind one of them. If that
    # later batch then waits for a larger slot, ordering by batch number alone deadlocks:
    # it may not overtake the redo (an earlier batch without a slot), and the redo cannot
    # ask before its worker is past it. (4 workers on a 16 MiB /dev/shm hung this way.) So
    # a task ranks as the earliest batch it holds up: the lowest batch number among it
    # and the tasks queued after it on its worker, then its place in that queue. It is
    # the batch number whenever queues are in order, so nothing else changes.
    def _ranks(self, iteration: int) -> dict[tuple[int, int], tuple[int, int]]:
        """(worker, batch) -> the task's rank (NOTE [ Earliest as the workers see it ]),
        for the tasks of ``iteration`` in flight."""
        ranks = {}
        for wid in range(self.dispatcher.num_workers):
            held = [e.task for e in self.dispatcher.held_by(wid) if e.task.iteration == iteration]
            first = None
            for place in range(len(held) - 1, -1, -1):
                seq = held[place].seq
                first = seq if first is None else min(first, seq)
                ranks[(wid, seq)] = (first, place)
        return ranks

    def _unplaced(self, iteration: int, ranks: dict | None = None) -> list[tuple[int, int]]:
        """The ranks of the batches of ``iteration`` in flight that may still ask for a slot
        of the current size, earliest first: those without one (sent before the ring was
        sized, or waiting for a larger slot) and those holding a slot of an older, smaller
        size (retired by a growth) not known to fit them."""
        ranks = self._ranks(iteration) if ranks is None else ranks
        return sorted(ranks[(wid, e.task.seq)] for wid in range(self.dispatcher.num_workers)
                      for e in self.dispatcher.held_by(wid)
                      if e.task.iteration == iteration and (e.slot is None or (e.slot.retired and not e.fits)))

    def _unsized_before(self, iteration: int, ranks: dict, rank: tuple[int, int]) -> int:
        """How many batches of ``iteration`` in flight rank before ``rank`` and may need a
        slot of a new size after a growth: every one not granted its slot for its size."""
        return sum(1 for wid in range(self.dispatcher.num_workers) for e in self.dispatcher.held_by(wid)
                   if e.task.iteration == iteration and not e.fits and ranks[(wid, e.task.seq)] < rank)

    def _may_overtake(self, earlier: int) -> bool:
        """May a batch take a slot while ``earlier`` batches before it still have none?
        Only if the free slots left after it still cover them."""
        return earlier == 0 or self.ring.free_slots() - 1 >= earlier

    def _room_for(self, earlier: int) -> bool:
        """``_may_overtake``, after adding slots while the ring is still short of its
        target size (it is filled on demand, see ring.py)."""
        while not (self._may_overtake(earlier) and self.ring.free_slots()):
            if self.ring.num_slots >= self.ring.target_slots:
                break
            try:
                self.ring.add_slots()
            except SharedMemoryError:  # the bound, or /dev/shm itself: the ring stays as it is
                break
        return self._may_overtake(earlier)

    # ------------------------------------------------------------ batches waiting for space
    def wants(self, worker: int, need: NeedSpace) -> None:
        """``worker`` said NeedSpace: its task's slot (if any) goes back to the ring, and
        the batch waits for :meth:`serve`."""
        key = (need.iteration, need.seq)
        entry = self.dispatcher.task(worker, key)
        if entry.slot is not None:
            self.ring.release(entry.slot)
        self.dispatcher.assign(worker, key, entry._replace(slot=None, fits=False))
        self.waiting.append(Waiting(worker, need))

    def serve(self, iteration: int) -> list[Grant]:
        """Give waiting batches their larger slots, earliest first, so the next batch the
        consumer needs is never held up behind a later, larger one. The grants are
        recorded in the dispatcher; the caller sends them."""
        self._error = None
        if not self.waiting:  # the common case, on every poll and dispatch
            return []
        if not self.ring.slot_bytes and not self._size_ring():
            return []
        grants: list[Grant] = []
        ranks = self._ranks(iteration)
        for wait in sorted(self.waiting, key=lambda w: ranks[(w.worker, w.need.seq)]):
            need, rank = wait.need, ranks[(wait.worker, wait.need.seq)]
            earlier = sum(1 for r in self._unplaced(iteration, ranks) if r < rank)
            if not self._room_for(earlier):
                break  # earlier batches have not asked yet, and they need the free slots
            slot = self._larger_slot(need.nbytes, self._unsized_before(iteration, ranks, rank))
            if slot is None:
                break
            self.waiting.remove(wait)
            key = (need.iteration, need.seq)
            self.dispatcher.assign(wait.worker, key,
                                   self.dispatcher.task(wait.worker, key)._replace(slot=slot, fits=True))
            grants.append(Grant(wait.worker, need.iteration, need.seq, slot))
        return grants

    def _size_ring(self) -> bool:
        """The first batches size the ring: only the slots asked for now, so the first
        batch need not wait for the whole ring."""
        try:
            self.ring.grow_capacity(max(w.need.nbytes for w in self.waiting), count=len(self.waiting))
        except SharedMemoryError as exc:  # (a RingFullError, or /dev/shm cannot give even one slot)
            self._error = exc
            return False
        return True

    def _larger_slot(self, nbytes: int, earlier: int = 0) -> Slot | None:
        """A slot of ``nbytes``, the ring grown for it if need be; None if it cannot be had
        now. Growth retires every slot, so any of the ``earlier`` batches in flight may
        then need a new one: it waits (None, no error) while the larger slots it would make
        leave too few for them. They ask first, or finish in their old slots."""
        slot = self.ring.take(nbytes)
        if slot is not None:
            return slot
        try:
            if nbytes > self.ring.slot_bytes:
                if 0 < self.ring.larger_slots(nbytes) <= earlier:
                    return None
                self.ring.grow_capacity(nbytes)
            else:
                self.ring.add_slots()
        except SharedMemoryError as exc:  # (a RingFullError, or /dev/shm cannot give even one slot)
            self._error = exc
            return None
        return self.ring.take(nbytes)

    def slot_for_split(self, nbytes: int) -> Slot | None:
        """A slot of ``nbytes`` for a split batch sent before the ring was sized (its spans
        share one: splitting.py); the first such batch sizes the ring. None if the ring
        cannot give one now (the batch is then loaded again whole, by the rules above).

        This runs while the session reads its workers' messages, where an exception would
        lose the rest of them and leave the span's worker waiting for an answer: so a
        failure to make a segment (a full ring, a full /dev/shm) is None here too, and the
        batch loaded whole meets it again where growth is safe to raise from
        (``Session._serve``), and raises it there if waiting cannot help. Not other
        errors: one while the workers are told of a new segment (no descriptor left to
        send it) leaves slots some worker cannot write, and must not be hidden."""
        error = self._error
        try:
            if not self.ring.slot_bytes:
                self.ring.grow_capacity(nbytes, count=1)
            return self._larger_slot(nbytes)
        except SharedMemoryError:
            return None
        finally:
            self._error = error  # (its failure is not for raise_if_stuck to raise)

    def waiting_for(self, iteration: int, seq: int) -> Waiting | None:
        return next((w for w in self.waiting if (w.need.iteration, w.need.seq) == (iteration, seq)), None)

    def forget(self, worker: int) -> None:
        """``worker`` died: what it waited for is re-sent with its tasks."""
        self.waiting = deque(w for w in self.waiting if w.worker != worker)

    def abandon(self) -> list[Waiting]:
        """A new iteration begins: every waiting batch is dropped (its task completes);
        the caller tells each worker to drop it."""
        dropped = list(self.waiting)
        for wait in dropped:
            self.dispatcher.complete(wait.worker, (wait.need.iteration, wait.need.seq))
        self.waiting.clear()
        self._error = None
        return dropped

    # ------------------------------------------------------------ before blocking
    def raise_if_stuck(self, iteration: int, head: int | None) -> None:
        """Raise the ring's RingFullError (or /dev/shm's SharedMemoryError) if waiting cannot
        help: a batch waits for space
        that cannot be had (the last :meth:`serve` failed), and nothing still running can
        give a slot back.

        ``head`` is the batch the consumer needs next (None with ``in_order=False``). While
        it is still being loaded, and not queued behind a batch that waits, it will arrive
        and slots with it. Otherwise only a task that can still finish and holds a slot can
        free one (by finishing, failing, or needing a larger slot itself), or with
        ``in_order=False`` a task that may still take a free slot; a worker waiting for
        space finishes nothing, nor anything queued behind it."""
        if self._error is None:
            return
        waiting_workers = {w.worker for w in self.waiting}
        # a waiting worker is stuck on its current task, and so are the tasks behind it
        blocked = {e.task.seq for wid in waiting_workers for e in self.dispatcher.held_by(wid)
                   if e.task.iteration == iteration}
        if head is not None and head not in blocked:
            return
        free = self.ring.free_slots()
        for wid in range(self.dispatcher.num_workers):
            if wid in waiting_workers:
                continue
            for e in self.dispatcher.held_by(wid):
                # with in_order=False a batch without a slot may still take a free one and
                # be delivered (with in_order=True only the head's delivery helps: above)
                if e.slot is not None or (head is None and free and e.task.iteration == iteration):
                    return
        # Not kept: a stored exception's traceback would hold the iterator's frames, and
        # through them the session, alive. The next attempt recomputes it.
        error, self._error = self._error, None
        raise error
