"""The ring: preallocated slots in shared memory, and the rules for reusing them.

Pure bookkeeping: the segments themselves come from a factory (``shm.Segment`` in the
loader, a fake in the unit tests), and workers are told about new and retired segments
through the ``on_attach`` / ``on_detach`` callbacks.

A slot moves FREE -> FILLING (sent with a task) -> READY (completion received) -> HELD
(yielded to the user) -> FREE (the user dropped the last view). Only the main process
changes these states, so a slot is written by one worker at a time and read only after
its completion message (credit-based dispatch: a task is sent with its slot).

Sizing. Steady state needs ``num_workers * prefetch_factor`` slots for the batches in
flight, plus the batches the consumer holds: a ``for`` loop still holds the previous
batch while ``next()`` runs, so the ring aims for two more (``target_slots``). It does not
make them all at once: the first batch's size creates only the slots asked for at that
moment, and the rest come one at a time as tasks need them (:meth:`add_slots`). Creating
shared memory is slow (reserving and zeroing the pages: 114 ms for 150 MB, docs/performance.md),
so the first batch should not wait for the whole ring. Growth:

* a batch larger than the slots (variable-size samples): :meth:`grow_capacity` maps a
  new segment of larger slots and retires every old slot; free ones go at once, busy
  ones when they come back. One growth serves all later batches up to the new size
  (at least 1.25x the old one), so growth happens O(log) times per run.
* a consumer holding many batches (``list(loader)``): :meth:`add_slots` maps another
  segment with as many slots again, so held data is never overwritten.

Both are bounded by ``max_bytes``; past it, :class:`RingFullError` says what to do.
Retired slots are never resized in place: an mmap with live exports cannot be resized;
their pages are given back instead (NOTE [ What counts against the bound ]).
"""

from __future__ import annotations

import enum
import mmap
import weakref
from operator import attrgetter, countOf
from typing import Callable, Generic, Protocol, TypeVar

from .._core._units import binary_size
from ..errors import RingFullError, SharedMemoryError
from .limits import Bound
from .messages import SlotRef

GROWTH = 1.25


class SegmentLike(Protocol):
    """What the ring needs of a segment (``shm.Segment``; a fake in the unit tests):
    made by ``make_segment(id, size)`` (a shortage of shared memory raises
    :class:`SharedMemoryError`), closed once no slot of it is in use. ``releases``: whether
    ``release(offset, nbytes)`` gives a retired free slot's pages back (False: the whole
    segment counts until it is closed, e.g. page-locked memory)."""

    id: int
    size: int
    releases: bool

    def release(self, offset: int, nbytes: int) -> bool: ...

    def close(self) -> None: ...


# the segment type a ring is made with (shm.Segment; a fake in the unit tests)
SegmentT = TypeVar("SegmentT", bound=SegmentLike)


def page_round(nbytes: int) -> int:
    return max(mmap.PAGESIZE, -(-nbytes // mmap.PAGESIZE) * mmap.PAGESIZE)


class SlotState(enum.Enum):
    FREE = "free"
    FILLING = "filling"  # sent with a task: a worker writes it
    READY = "ready"
    HELD = "held"


_state = attrgetter("state")
_STATES = tuple((state.value, state) for state in SlotState)


class Slot(Generic[SegmentT]):
    __slots__ = ("ring", "segment", "offset", "capacity", "state", "retired", "watch", "ref")

    def __init__(self, ring: Ring[SegmentT], segment: SegmentT, offset: int, capacity: int):
        self.ring: Ring[SegmentT] | None = ring  # None once the ring is closed
        self.segment = segment
        self.offset = offset
        self.capacity = capacity
        self.state = SlotState.FREE
        self.retired = False
        self.watch: weakref.ref | None = None  # the weakref that reports the batch's release (see lifetime.py)
        self.ref = SlotRef(segment.id, offset, capacity)  # what a task names it by (made once: a slot never moves)

    def __repr__(self) -> str:
        return f"Slot(segment={self.segment.id}, offset={self.offset}, {self.state.value})"


class Ring(Generic[SegmentT]):
    def __init__(self, make_segment: Callable[[int, int], SegmentT], target_slots: int | Callable[[int], int],
                 max_bytes: int,
                 bound_source: str = "max_shm_bytes",
                 on_attach: Callable[[SegmentT], None] = lambda seg: None,
                 on_detach: Callable[[SegmentT], None] = lambda seg: None):
        self._make_segment = make_segment
        # the target number of slots, for a given slot size (the prefetch depth may depend on it)
        self._target_for = target_slots if callable(target_slots) else (lambda slot_bytes: target_slots)
        self.max_bytes = max_bytes
        self.bound_source = bound_source  # where max_bytes came from, for error messages
        self.bound_remedy = "max_shm_bytes="  # what raises it, for error messages
        self._on_attach, self._on_detach = on_attach, on_detach
        self.slot_bytes = 0  # 0 until the first batch (or slot_bytes=) sizes the ring
        self._segments: dict[int, SegmentT] = {}
        self._live: dict[int, int] = {}  # segment id -> slots not yet dropped
        self._given_back: dict[int, int] = {}  # segment id -> bytes of its dropped slots released
        self._retired: list[Slot[SegmentT]] = []  # retired slots still busy (a batch in them, or on its way)
        self._free: list[Slot[SegmentT]] = []
        self._slots: list[Slot[SegmentT]] = []
        self._next_id = 0

    @property
    def bound(self) -> Bound:
        return Bound(self.max_bytes, self.bound_source, self.bound_remedy)

    @bound.setter
    def bound(self, bound: Bound) -> None:
        """A default bound (limits.py), read once the loader's own segments exist."""
        self.max_bytes, self.bound_source = bound.bytes, bound.source
        self.bound_remedy = f"max_shm_bytes=, or {bound.remedy}"

    # ------------------------------------------------------------ queries
    # NOTE [ What counts against the bound ]
    # A retired segment stays mapped while any of its slots is busy, and it used to count
    # in full: one batch the for-loop held (or a later batch already loaded) kept a whole
    # segment of smaller slots, so a ring that had filled its bound with them could never
    # grow, and whether it could depended on which slots were busy when a larger batch
    # came (a RingFullError in some runs of the same program). Now a retired slot's pages
    # are given back as soon as it is free (``Segment.release``: MADV_REMOVE punches them
    # out of the tmpfs file, for every process that maps it), and a retired segment counts
    # only its busy slots. A segment that cannot give pages back (page-locked memory)
    # still counts in full until it is closed.
    @property
    def nbytes(self) -> int:
        """The bytes that count against the bound: every segment, less what retired slots
        gave back."""
        return sum(seg.size for seg in self._segments.values()) - sum(self._given_back.values())

    def segments(self) -> list[SegmentT]:
        """Every mapped segment, retired ones that still hold busy slots included."""
        return list(self._segments.values())

    @property
    def target_slots(self) -> int:
        return self._target_for(self.slot_bytes)

    @property
    def num_slots(self) -> int:
        """Slots of the current size (retired ones excluded)."""
        return sum(1 for s in self._slots if not s.retired)

    def free_slots(self) -> int:
        return len(self._free)

    def counts(self) -> dict[str, int]:
        states = list(map(_state, self._slots))  # (counted by identity: an enum's .value or hash per
        return {value: countOf(states, state) for value, state in _STATES}  # slot is a Python call)

    def retired_filling(self) -> bool:
        """Is a task in flight with a slot of an older size (one a worker may not fit)?"""
        return bool(self._retired) and any(slot.state is SlotState.FILLING for slot in self._retired)

    def slots_in(self, state: SlotState) -> list[Slot[SegmentT]]:
        return [s for s in self._slots if s.state is state]

    # ------------------------------------------------------------ taking and returning
    def take(self, nbytes: int = 0) -> Slot[SegmentT] | None:
        """A free slot holding at least ``nbytes``, now FILLING; None if there is none."""
        for i in range(len(self._free) - 1, -1, -1):  # newest first: its pages are warm
            if self._free[i].capacity >= nbytes:
                slot = self._free.pop(i)
                slot.state = SlotState.FILLING
                return slot
        return None

    def release(self, slot: Slot[SegmentT]) -> None:
        if slot.ring is not self:
            return  # a batch from a ring that has since been closed
        if slot.state is SlotState.FREE:
            raise RuntimeError(f"{slot!r} released twice")
        slot.state = SlotState.FREE
        slot.watch = None
        if slot.retired:
            self._drop(slot)
        else:
            self._free.append(slot)

    def _drop(self, slot: Slot[SegmentT]) -> None:
        """A retired slot is free: it goes, and its pages with it (NOTE [ What counts
        against the bound ]); the segment goes with its last slot."""
        self._slots.remove(slot)
        self._retired.remove(slot)
        seg = slot.segment
        self._live[seg.id] -= 1
        if self._live[seg.id] == 0:
            del self._live[seg.id], self._segments[seg.id]
            self._given_back.pop(seg.id, None)
            self._on_detach(seg)
            seg.close()
        elif seg.releases and seg.release(slot.offset, slot.capacity):
            self._given_back[seg.id] = self._given_back.get(seg.id, 0) + slot.capacity

    def _kept_bytes(self) -> int:
        """What would still count against the bound once every slot is retired and the
        free ones dropped: the busy slots, or their whole segment if it cannot give pages
        back."""
        busy: dict[int, int] = {}
        for slot in self._slots:
            if slot.state is not SlotState.FREE:
                busy[slot.segment.id] = busy.get(slot.segment.id, 0) + slot.capacity
        return sum(nbytes if self._segments[sid].releases else self._segments[sid].size
                   for sid, nbytes in busy.items())

    # ------------------------------------------------------------ growth
    def larger_slots(self, nbytes: int, count: int | None = None) -> int:
        """How many slots :meth:`grow_capacity` would make for ``nbytes`` (0: it would raise)."""
        return self._growth(nbytes, count)[1]

    def _growth(self, nbytes: int, count: int | None) -> tuple[int, int, int]:
        """(capacity, count, bytes kept) of a growth to slots holding ``nbytes``."""
        capacity = page_round(max(nbytes, int(self.slot_bytes * GROWTH)) if self.slot_bytes else nbytes)
        kept = self._kept_bytes()
        # as many as the target for the new size, plus those added for held batches
        target = self._target_for(capacity)
        wanted = target + max(0, self.num_slots - self.target_slots) if count is None else count
        return capacity, max(0, min(wanted, (self.max_bytes - kept) // capacity)), kept

    def grow_capacity(self, nbytes: int, count: int | None = None) -> None:
        """Replace the slots with larger ones holding at least ``nbytes``: ``count`` of them,
        by default as many as the ring had (at least ``target_slots``), or as many as fit
        under the bound beside the busy old slots (NOTE [ What counts against the bound ])."""
        capacity, count, kept = self._growth(nbytes, count)
        if count < 1:
            raise self._full(f"grow its slots to {binary_size(capacity)} for a batch of {binary_size(nbytes)}",
                             kept + capacity)
        for slot in self._slots:
            slot.retired = True
        self._retired = list(self._slots)
        for slot in self._free[:]:
            self._free.remove(slot)
            self._drop(slot)
        self.slot_bytes = capacity
        self._add_segment(count)

    def add_slots(self) -> None:
        """Add slots while the ring has fewer than ``target_slots`` (it is being filled on
        demand after a small first sizing): as many as it has, up to the target, so that
        filling a ring of n slots takes O(log n) segments, each one descriptor in the main
        process and one mapping in every worker (one segment per slot ran 32 workers at
        depth 16 out of the usual 1024 descriptors). Past the target, as many slots again,
        for batches the consumer holds."""
        if not self.slot_bytes:
            raise RuntimeError("add_slots() before the ring was sized")
        have, target = self.num_slots, self.target_slots
        wanted = min(target - have, max(1, have)) if have < target else have
        count = min(wanted, (self.max_bytes - self.nbytes) // self.slot_bytes)
        if count < 1:
            raise self._full("add a slot for another batch", self.nbytes + self.slot_bytes)
        self._add_segment(count)

    def _full(self, what: str, needed: int) -> RingFullError:
        held = self.counts()["held"]
        if held > 1:  # a for-loop holds one (the previous batch): more is the consumer keeping them
            advice = (f"The consumer holds {held} batches ({binary_size(held * self.slot_bytes)}) whose memory "
                      "the loader may not reuse: copy batches you keep (np.array(x) or tensor.clone()) so their "
                      "slots can be reused, or raise the bound.")
        else:
            advice = ("Make the ring smaller (lower prefetch_factor, num_workers or batch_size), pass "
                      "slot_bytes= the largest batch's size so the ring is sized once, or raise the bound "
                      f"({self.bound_remedy}).")
        has = f"It has {self.num_slots} slots of {binary_size(self.slot_bytes)}." if self.slot_bytes else \
            f"It needs {self.target_slots} slots."
        if self.slot_bytes and self.num_slots < 2:
            has += " A for-loop needs at least two: one for the batch it holds, one for the next."
        return RingFullError(
            f"the loader's ring cannot {what}: that needs {binary_size(needed)} of shared memory, over its bound of "
            f"{binary_size(self.max_bytes)} ({self.bound_source}). {has} {advice}")

    # NOTE [ The ring stops at what fits ]
    # The bound is an estimate: /dev/shm's free space is read once, and other processes
    # (another loader, the user's own segments) share it; the address space may be
    # limited too (ulimit -v). A ring that asked for all the slots its bound allowed in one
    # segment failed with SharedMemoryError though fewer would have fitted, and the loader
    # stopped where it could have gone on with the slots it had. So when a segment cannot
    # be had, the ring asks for half as many slots, down to one: it stops growing at what
    # fits. Only when not even one slot can be had does the SharedMemoryError reach the
    # caller, and the allocator takes it as it takes the bound's RingFullError: a batch
    # waits while a slot can still come back, and the error is raised once none can
    # (allocation.py). The bound itself stays: the shortage may pass.
    def _add_segment(self, count: int) -> None:
        while True:
            try:
                seg = self._make_segment(self._next_id, count * self.slot_bytes)
                break
            except SharedMemoryError:
                if count == 1:
                    raise
                count //= 2
        self._next_id += 1
        self._segments[seg.id] = seg
        self._live[seg.id] = count
        new = [Slot(self, seg, i * self.slot_bytes, self.slot_bytes) for i in range(count)]
        self._slots.extend(new)
        self._free[:0] = new  # behind the warm ones
        self._on_attach(seg)

    def close(self) -> None:
        for seg in self._segments.values():
            seg.close()
        self._segments.clear()
        self._live.clear()
        self._given_back.clear()
        self._retired.clear()
        self._free.clear()
        for slot in self._slots:
            slot.ring = None  # late releases of held batches are ignored
        self._slots.clear()
