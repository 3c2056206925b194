"""Ring bookkeeping with fake segments, tested as internals (``shmload._transport.ring``):
pure, no shared memory."""

import pytest

from shmload import RingFullError
from shmload._transport.ring import Ring, SlotState, page_round

pytestmark = pytest.mark.pure

PAGE = page_round(1)


class FakeSegment:
    releases = False  # a page-locked segment's: counted in full until closed

    def __init__(self, sid, size):
        self.id, self.size, self.closed = sid, size, False

    def release(self, offset, nbytes):
        raise AssertionError("release() on a segment that cannot release")

    def close(self):
        self.closed = True


class ReleasingSegment(FakeSegment):
    """A segment that gives a retired free slot's pages back (shm.Segment, not page-locked)."""

    releases = True

    def __init__(self, sid, size):
        super().__init__(sid, size)
        self.released = []

    def release(self, offset, nbytes):
        self.released.append((offset, nbytes))
        return True


def make_ring(target_slots=3, max_bytes=1 << 30, segment=FakeSegment):
    events = []
    ring = Ring(segment, target_slots, max_bytes,
                on_attach=lambda s: events.append(("attach", s.id)),
                on_detach=lambda s: events.append(("detach", s.id)))
    return ring, events


def test_first_sizing_creates_target_slots_of_page_rounded_size():
    ring, events = make_ring()
    assert ring.take() is None and ring.slot_bytes == 0
    ring.grow_capacity(100)
    assert ring.slot_bytes == PAGE and ring.num_slots == 3 and ring.nbytes == 3 * PAGE
    assert events == [("attach", 0)]
    offsets = sorted(ring.take().offset for _ in range(3))
    assert offsets == [0, PAGE, 2 * PAGE] and ring.take() is None


def test_the_target_may_depend_on_the_slot_size_and_growth_follows_it():
    ring, _ = make_ring(target_slots=lambda slot_bytes: 6 if slot_bytes <= PAGE else 3)
    ring.grow_capacity(100)
    assert ring.target_slots == 6 and ring.num_slots == 6
    ring.add_slots()  # past the target: as many again, for batches the consumer holds
    assert ring.num_slots == 12
    ring.grow_capacity(2 * PAGE)  # larger slots: their own target, plus the 6 added for held batches
    assert ring.target_slots == 3 and ring.num_slots == 9 and ring.slot_bytes == 2 * PAGE


def test_a_slot_is_only_reused_after_release():
    ring, _ = make_ring(target_slots=1)
    ring.grow_capacity(10)
    slot = ring.take()
    assert ring.take() is None
    slot.state = SlotState.HELD
    ring.release(slot)
    assert ring.take() is slot
    ring.release(slot)
    with pytest.raises(RuntimeError, match="released twice"):
        ring.release(slot)


def test_capacity_growth_retires_old_slots_when_they_come_back():
    ring, events = make_ring(target_slots=2)
    ring.grow_capacity(PAGE)
    busy = ring.take()
    ring.grow_capacity(3 * PAGE)
    assert ring.slot_bytes >= 3 * PAGE and ring.num_slots == 2
    # the free old slot was dropped at once; the busy one keeps segment 0 alive
    assert ring.counts() == {"free": 2, "filling": 1, "ready": 0, "held": 0}
    assert ("detach", 0) not in events
    ring.release(busy)
    assert ("detach", 0) in events and ring.nbytes == 2 * ring.slot_bytes
    assert ring.take(3 * PAGE).capacity == ring.slot_bytes


def test_growth_is_geometric():
    ring, _ = make_ring(target_slots=1)
    ring.grow_capacity(100 * PAGE)
    ring.grow_capacity(100 * PAGE + 1)
    assert ring.slot_bytes >= 125 * PAGE


def test_add_slots_doubles_within_the_bound():
    ring, _ = make_ring(target_slots=2, max_bytes=5 * PAGE)
    ring.grow_capacity(PAGE)
    ring.add_slots()
    assert ring.num_slots == 4
    ring.add_slots()  # only one more fits
    assert ring.num_slots == 5
    for _ in range(5):
        ring.take().state = SlotState.HELD
    with pytest.raises(RingFullError, match=r"holds 5 batches.*copy batches you keep.*raise the bound"):
        ring.add_slots()


def test_capacity_growth_takes_as_many_larger_slots_as_fit_and_counts_pinned_segments():
    ring, _ = make_ring(target_slots=2, max_bytes=4 * PAGE)
    ring.grow_capacity(PAGE)
    ring.grow_capacity(3 * PAGE)  # the old slots were all free: one larger slot fits
    assert ring.num_slots == 1 and ring.nbytes == 3 * PAGE
    ring, _ = make_ring(target_slots=2, max_bytes=4 * PAGE)
    ring.grow_capacity(PAGE)
    ring.take()  # one busy slot keeps the whole old segment (2 pages) mapped
    with pytest.raises(RingFullError, match=r"grow its slots to 12.0 KiB .*needs 20.0 KiB .*bound of 16.0 KiB"):
        ring.grow_capacity(3 * PAGE)
    assert ring.nbytes <= ring.max_bytes


def test_release_after_close_is_ignored():
    ring, _ = make_ring()
    ring.grow_capacity(1)
    slot = ring.take()
    ring.close()
    ring.release(slot)  # a batch the user dropped after the loader closed: no error, no reuse
    assert slot.ring is None and ring.take() is None and ring.num_slots == 0


def test_filling_to_the_target_takes_a_logarithmic_number_of_segments():
    ring, made = make_ring(target_slots=514)
    ring.grow_capacity(PAGE, count=1)  # the first batch's sizing: one slot
    while ring.num_slots < ring.target_slots:
        ring.add_slots()
    assert ring.num_slots == 514 and len(ring.segments()) <= 11


def test_a_retired_segment_that_gives_pages_back_counts_only_its_busy_slots():
    # NOTE [ What counts against the bound ]: 4 one-page slots, one busy; beside it two
    # 3-page slots fit a bound of 7 pages (one only if the whole old segment counted)
    ring, events = make_ring(target_slots=4, max_bytes=7 * PAGE, segment=ReleasingSegment)
    ring.grow_capacity(PAGE)
    old = ring.segments()[0]
    busy = ring.take()
    assert ring.larger_slots(3 * PAGE) == 2
    ring.grow_capacity(3 * PAGE)
    assert ring.num_slots == 2 and ring.retired_filling()
    assert sorted(old.released) == [(o, PAGE) for o in range(0, 4 * PAGE, PAGE) if o != busy.offset]
    assert ring.nbytes == PAGE + 6 * PAGE <= ring.max_bytes and not old.closed
    ring.release(busy)  # its last slot: the segment goes
    assert old.closed and ("detach", old.id) in events and ring.nbytes == 6 * PAGE and not ring.retired_filling()


def test_the_ring_stops_growing_at_what_shared_memory_gives():
    # NOTE [ The ring stops at what fits ]: a /dev/shm of 3 pages, shared with others
    from shmload import SharedMemoryError

    free = [3 * PAGE]

    def segment(sid, size):
        if size > free[0]:
            raise SharedMemoryError("could not reserve")
        free[0] -= size
        return FakeSegment(sid, size)

    ring, _ = make_ring(target_slots=8, segment=segment)
    ring.grow_capacity(PAGE, count=4)  # 4 slots asked, then 2: made
    assert ring.num_slots == 2 and ring.max_bytes == 1 << 30  # (the shortage may pass: the bound stays)
    ring.add_slots()  # 2 asked, 1 made
    assert ring.num_slots == 3
    with pytest.raises(SharedMemoryError, match="could not reserve"):  # not even one more
        ring.add_slots()
    assert ring.num_slots == 3 and ring.free_slots() == 3  # as it was
    free[0] = PAGE  # the shortage passed
    ring.add_slots()
    assert ring.num_slots == 4
