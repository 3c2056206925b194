"""Internals, tested on purpose (``shmload._session.allocation``, ``dispatch``,
``shmload._transport.ring``): allocation.py's :class:`SlotAllocator` without processes: a
real ``Ring`` over fake
segments, a real ``Dispatcher``, and the states the session would bring them to (tasks
recorded as ``try_dispatch`` records them, NeedSpace as ``_handle`` passes it on, slots
READY and HELD as ``_handle`` and lifetime.py set them).

Each rule of allocation.py's docstring is a table here: a starting state, one call, the
decision and the ring and dispatcher after it. tests/test_ring_pressure.py checks the
same rules end to end, with workers that sleep to force a timing.
"""

from __future__ import annotations

import re
from collections import deque

import pytest

from shmload import RingFullError, SharedMemoryError
from shmload._core._units import binary_size
from shmload._session.allocation import Grant, SlotAllocator, Waiting
from shmload._session.dispatch import Dispatcher, InFlight
from shmload._transport.messages import NeedSpace, Task
from shmload._transport.ring import Ring, SlotState, page_round

pytestmark = [pytest.mark.timeout(10), pytest.mark.pure]  # pure bookkeeping: anything slower is a loop that does not end

PAGE = page_round(1)
IT = 1  # the current iteration


class FakeSegment:
    releases = False  # a page-locked segment's: counted in full until closed

    def __init__(self, sid, size):
        self.id, self.size, self.closed = sid, size, False

    def release(self, offset, nbytes):
        raise AssertionError("release() on a segment that cannot release")

    def close(self):
        self.closed = True


class World:
    """A ring (``target`` slots, a bound of ``bound`` pages), a dispatcher of ``workers``
    workers and the allocator over them; each method brings them to a state the way the
    session does, and returns the world so that a table row can chain them."""

    def __init__(self, target=3, bound=64, workers=3, per_worker=8, segment=FakeSegment):
        self.events = []
        self.ring = Ring(segment, target, bound * PAGE,
                         on_attach=lambda s: self.events.append(("attach", s.id)),
                         on_detach=lambda s: self.events.append(("detach", s.id)))
        self.dispatcher = Dispatcher(workers, per_worker)
        self.alloc = SlotAllocator(self.ring, self.dispatcher)
        self.grants = None

    # ------------------------------------------------------------ building a state
    def sized(self, count, nbytes=PAGE):
        """The ring sized with ``count`` free slots of ``nbytes``."""
        self.ring.grow_capacity(nbytes, count=count)
        return self

    def slots(self, states):
        """The ring sized with one slot per character: ``.`` free, ``F`` sent with a task
        (FILLING), ``R`` its completion received (READY), ``H`` yielded (HELD). Their
        tasks are later batches (seq 100 on) spread over the workers."""
        self.sized(len(states))
        for i, state in enumerate(states):
            worker, seq = i % self.dispatcher.num_workers, 100 + i
            if state == "F":
                self.task(worker, seq)
            elif state == "R":
                self.task(worker, seq).ready(worker, seq)
            elif state == "H":
                self.held()
            else:
                assert state == ".", state
        return self

    def task(self, worker, seq, slot=True, iteration=IT):
        """Record a task of batch ``seq`` sent to ``worker``, with a free slot (FILLING) or
        without one (sent before the ring was sized), as Session.try_dispatch does."""
        taken = self.ring.take() if slot else None
        assert taken is not None or not slot, "the state asks for more slots than are free"
        task = Task(iteration, 0, seq, [seq], taken.ref if taken is not None else None)
        self.dispatcher.assign(worker, (iteration, seq), InFlight(task, taken))
        return self

    def slotless(self, *seqs, iteration=IT):
        """Batches ``seqs`` in flight without a slot, spread over the workers."""
        for i, seq in enumerate(seqs):
            self.task(i % self.dispatcher.num_workers, seq, slot=False, iteration=iteration)
        return self

    def ready(self, worker, seq, iteration=IT):
        """The batch's completion received: the task completes, its slot READY."""
        self.dispatcher.complete(worker, (iteration, seq)).slot.state = SlotState.READY
        return self

    def give_back(self, worker, seq, iteration=IT):
        """The batch failed (or the consumer already dropped it): the task completes and
        its slot is free again."""
        self.ring.release(self.dispatcher.complete(worker, (iteration, seq)).slot)
        return self

    def held(self, count=1):
        """``count`` slots holding batches the consumer keeps (HELD, no task)."""
        for _ in range(count):
            self.ring.take().state = SlotState.HELD
        return self

    def asks(self, worker, seq, nbytes, iteration=IT):
        """``worker``'s batch ``seq`` needs ``nbytes`` (its NeedSpace)."""
        self.alloc.wants(worker, NeedSpace(iteration, seq, nbytes))
        return self

    def serve(self, iteration=IT):
        self.grants = self.alloc.serve(iteration)
        return self

    # ------------------------------------------------------------ reading it
    def waiting(self):
        return [w.need.seq for w in self.alloc.waiting]

    def slot_of(self, worker, seq, iteration=IT):
        return self.dispatcher.task(worker, (iteration, seq)).slot


def full(what, needed, bound):
    """The start of the ring's RingFullError, as a regex."""
    return re.escape(f"the loader's ring cannot {what}: that needs {binary_size(needed)} of shared memory, "
                     f"over its bound of {binary_size(bound)} (max_shm_bytes).")


# ---------------------------------------------------------------- for_task
SLOT, NO_SLOT_YET, WAIT = "a slot", "sent without a slot", "not now"

FOR_TASK = [
    # (starting state, decision, slots in the ring after)
    pytest.param(lambda: World(), NO_SLOT_YET, 0, id="unsized: sent without a slot"),
    pytest.param(lambda: World().slotless(0, 1), NO_SLOT_YET, 0,
                 id="unsized, slotless batches in flight: still sent without a slot"),
    pytest.param(lambda: World(target=2).slots("F."), SLOT, 2, id="a free slot: taken"),
    pytest.param(lambda: World(target=2).slots("..").task(0, 0).asks(0, 0, 2 * PAGE), WAIT, 2,
                 id="a worker waits for space: no new task, though slots are free"),
    pytest.param(lambda: World().slotless(0).asks(0, 0, PAGE), WAIT, 0,
                 id="unsized and a worker waits for space: no new task"),
    pytest.param(lambda: World(target=4, bound=8).slots("F"), SLOT, 2,
                 id="none free, short of the target: slots added toward it"),
    pytest.param(lambda: World(target=2, bound=8).slots("HH"), SLOT, 4,
                 id="none free, at the target, under the bound: as many slots again"),
    pytest.param(lambda: World(target=2, bound=2).slots("HF"), WAIT, 2,
                 id="past the bound, a slot FILLING: wait for it"),
    pytest.param(lambda: World(target=2, bound=2).slots("HR"), WAIT, 2,
                 id="past the bound, a slot READY: wait for it"),
    pytest.param(lambda: World(target=2, bound=2).slots("HH"),
                 full("add a slot for another batch", 3 * PAGE, 2 * PAGE) + re.escape(
                     f" It has 2 slots of {binary_size(PAGE)}. The consumer holds 2 batches") +
                 r".*copy batches you keep", 2,
                 id="past the bound, every slot HELD: RingFullError (the consumer keeps batches)"),
    pytest.param(lambda: World(target=1, bound=1).slots("H"),
                 full("add a slot for another batch", 2 * PAGE, PAGE) + re.escape(
                     f" It has 1 slots of {binary_size(PAGE)}. A for-loop needs at least two") +
                 r".*Make the ring smaller", 1,
                 id="past the bound, the one slot HELD: RingFullError (the ring is too small)"),
    # the overtaking rule: a new task is later than every batch in flight
    pytest.param(lambda: World(target=2).slots("..").slotless(0, 1), WAIT, 2,
                 id="2 earlier slotless, 2 free: 1 would stay for 2, wait"),
    pytest.param(lambda: World(target=1).slots(".").slotless(0), WAIT, 1,
                 id="1 earlier slotless, 1 free: the last slot stays for it"),
    pytest.param(lambda: World(target=3).slots("...").slotless(0, 1), SLOT, 3,
                 id="2 earlier slotless, 3 free: 2 stay, a slot"),
    pytest.param(lambda: World(target=4).slots(".").slotless(0, 1), SLOT, 4,
                 id="earlier slotless, short of the target: slots added until enough stay"),
    pytest.param(lambda: World(target=4, bound=2).slots(".").slotless(0, 1), WAIT, 2,
                 id="earlier slotless, short of the target: slots added up to the bound, then wait"),
    pytest.param(lambda: World(target=2, bound=2).slots("HH").slotless(0), WAIT, 2,
                 id="past the bound, every slot HELD, an earlier batch slotless: wait, no raise"),
    pytest.param(lambda: World(target=2).slots("..").slotless(0, 1, iteration=IT - 1), SLOT, 2,
                 id="slotless batches of an earlier iteration do not count"),
    pytest.param(lambda: World(target=3, bound=6, workers=2).sized(2).task(0, 0).task(1, 1).asks(1, 1, 2 * PAGE)
                 .serve(), WAIT, 2,
                 id="an earlier batch holds a slot retired by growth (it may not fit): the free slot stays for it"),
]


@pytest.mark.parametrize("state, decision, num_slots", FOR_TASK)
def test_for_task(state, decision, num_slots):
    world = state()
    ring = world.ring
    free_before, filling_before = ring.slots_in(SlotState.FREE), len(ring.slots_in(SlotState.FILLING))
    if decision not in (SLOT, NO_SLOT_YET, WAIT):
        with pytest.raises(RingFullError, match=decision):
            world.alloc.for_task(IT)
        assert ring.num_slots == num_slots and ring.nbytes <= ring.max_bytes
        return
    ok, slot = world.alloc.for_task(IT)
    assert ring.num_slots == num_slots and ring.nbytes <= ring.max_bytes
    if decision == NO_SLOT_YET:
        assert (ok, slot) == (True, None) and ring.slot_bytes == 0
    elif decision == WAIT:
        assert (ok, slot) == (False, None)
        assert len(ring.slots_in(SlotState.FILLING)) == filling_before  # nothing taken
    else:
        assert ok and slot is not None and slot.state is SlotState.FILLING and slot.capacity == ring.slot_bytes
        assert len(ring.slots_in(SlotState.FILLING)) == filling_before + 1
        if free_before:
            assert slot in free_before  # a free slot, no new one made for it


def test_for_task_waits_only_while_a_worker_waits():
    world = World(target=2).slots("..").task(0, 0).asks(0, 0, 2 * PAGE)
    assert world.alloc.for_task(IT) == (False, None)
    world.serve()
    assert [g.seq for g in world.grants] == [0] and not world.alloc.waiting
    ok, slot = world.alloc.for_task(IT)
    assert ok and slot.capacity >= 2 * PAGE


def shm_of(pages):
    """A segment factory for a /dev/shm that holds ``pages`` pages in all (others share it)."""
    free = [pages * PAGE]

    def segment(sid, size):
        if size > free[0]:
            raise SharedMemoryError("could not reserve")
        free[0] -= size
        return FakeSegment(sid, size)
    return segment


def test_for_task_under_a_full_dev_shm_waits_while_a_slot_can_come_back_else_raises():
    # NOTE [ The ring stops at what fits ]: /dev/shm holds 2 pages, the bound says 64
    world = World(target=4, segment=shm_of(2)).slots("F.")
    ok, slot = world.alloc.for_task(IT)  # the free slot, no error from the growth toward the target
    assert ok and slot is not None and world.ring.num_slots == 2
    assert world.alloc.for_task(IT) == (False, None)  # none free, slots FILLING: wait
    world = World(target=2, segment=shm_of(2)).slots("HH")
    with pytest.raises(SharedMemoryError, match="could not reserve"):  # nothing can come back
        world.alloc.for_task(IT)


# ---------------------------------------------------------------- wants
@pytest.mark.parametrize("sized", [True, False], ids=["with a slot: it goes back", "sent without a slot"])
def test_need_space_returns_the_old_slot_and_records_the_wait(sized):
    world = World(target=2, workers=2)
    if sized:
        world.sized(2)
    world.task(1, 0, slot=sized).task(0, 1, slot=sized)
    old = world.slot_of(1, 0)
    free = world.ring.free_slots()
    need = NeedSpace(IT, 0, 3 * PAGE)
    world.alloc.wants(1, need)
    assert world.alloc.waiting == deque([Waiting(1, need)])
    assert world.slot_of(1, 0) is None and world.dispatcher.without_slot == 1 + (not sized)
    if sized:
        assert old.state is SlotState.FREE and world.ring.free_slots() == free + 1
        assert world.ring.take() is old  # really back among the free ones
    else:
        assert world.ring.free_slots() == free == 0
    assert world.alloc.waiting_for(IT, 0) == Waiting(1, need)


# ---------------------------------------------------------------- serve
SERVE = [
    # (starting state, grants as (worker, seq) in order, still waiting, slots, slot size in pages)
    pytest.param(lambda: World(target=2).slots("F."), [], [], 2, 1, id="nothing waits: no grant"),
    pytest.param(lambda: World(target=8).slotless(0, 1, 2).asks(2, 2, PAGE).asks(0, 0, PAGE).asks(1, 1, PAGE),
                 [(0, 0), (1, 1), (2, 2)], [], 3, 1,
                 id="unsized, 3 wait out of order: sized with 3 slots only, earliest first"),
    pytest.param(lambda: World(target=8).slotless(0, 1, 2, 3).asks(1, 1, 100).asks(0, 0, 3 * PAGE - 1),
                 [(0, 0), (1, 1)], [], 2, 3,
                 id="unsized, 2 of 4 wait: 2 slots of the largest size asked"),
    pytest.param(lambda: World(target=3, bound=2).slotless(0, 1, 2).asks(2, 2, PAGE).asks(0, 0, PAGE)
                 .asks(1, 1, PAGE),
                 [(0, 0), (1, 1)], [2], 2, 1,
                 id="unsized, 3 wait, 2 fit the bound: the earliest 2 granted, the first to ask waits"),
    pytest.param(lambda: World(target=8).slotless(0, 1, 2).asks(1, 1, PAGE).asks(2, 2, PAGE),
                 [(1, 1), (2, 2)], [], 4, 1,
                 id="unsized, later batches wait, an earlier has not asked: slots added so one stays for it"),
    pytest.param(lambda: World(target=8, bound=2).slotless(0, 1, 2).asks(1, 1, PAGE).asks(2, 2, PAGE),
                 [(1, 1)], [2], 2, 1,
                 id="as above at the bound: the last slot stays for the earlier batch, the later waits"),
    pytest.param(lambda: World(target=2, workers=2).sized(2).task(0, 0).task(1, 1).asks(1, 1, 3 * PAGE),
                 [(1, 1)], [], 2, 3,
                 id="a batch larger than the slots: larger slots"),
    pytest.param(lambda: World(target=2, workers=2).sized(2).task(0, 0).task(1, 1).asks(1, 1, PAGE + 1)
                 .asks(0, 0, PAGE),
                 [(0, 0), (1, 1)], [], 2, 2,
                 id="the earlier batch fits the old slots, the later needs larger: both, earliest first"),
    pytest.param(lambda: World(target=2, bound=4, workers=2).sized(2).held(1).task(1, 1).asks(1, 1, 3 * PAGE),
                 [], [1], 2, 1,
                 id="larger slots do not fit beside a held batch: no grant, it waits"),
    pytest.param(lambda: World(target=3, bound=4, workers=2).sized(3).held().task(0, 0).task(1, 1, slot=False)
                 .asks(0, 0, 3 * PAGE).asks(1, 1, PAGE),
                 [], [0, 1], 3, 1,
                 id="the earliest cannot be served: a later one that would fit waits behind it"),
    pytest.param(lambda: World(target=2, bound=1).slotless(0).asks(0, 0, 2 * PAGE),
                 [], [0], 0, 0,
                 id="unsized, not even one slot fits: no grant, it waits"),
    pytest.param(lambda: World(target=2, bound=2).slots("HH").task(0, 0, slot=False).asks(0, 0, PAGE),
                 [], [0], 2, 1,
                 id="every slot HELD at the bound: no grant, it waits"),
    pytest.param(lambda: World(target=2, bound=8).slots("HH").task(0, 0, slot=False).asks(0, 0, PAGE),
                 [(0, 0)], [], 4, 1,
                 id="every slot HELD under the bound: slots added for it"),
    # NOTE [ Earliest as the workers see it ]: batch 0 (a split batch loaded again whole)
    # is queued behind batch 2 on worker 0, so batch 2 goes first and batch 1 after both
    pytest.param(lambda: World(target=8, bound=2, workers=2).task(0, 2, slot=False).task(0, 0, slot=False)
                 .task(1, 1, slot=False).asks(0, 2, PAGE).asks(1, 1, PAGE),
                 [(0, 2)], [1], 2, 1,
                 id="a later batch ahead of an earlier one on its worker: it goes first, the last slot stays for it"),
]


@pytest.mark.parametrize("state, grants, waiting, num_slots, slot_pages", SERVE)
def test_serve(state, grants, waiting, num_slots, slot_pages):
    world = state()
    needs = {(w.worker, w.need.seq): w.need.nbytes for w in world.alloc.waiting}
    world.serve()
    assert [(g.worker, g.seq) for g in world.grants] == grants
    assert world.waiting() == waiting
    assert world.ring.num_slots == num_slots and world.ring.slot_bytes == slot_pages * PAGE
    assert world.ring.nbytes <= world.ring.max_bytes
    for grant in world.grants:  # recorded in the dispatcher, each its own slot, large enough
        slot = world.slot_of(grant.worker, grant.seq)
        assert grant == Grant(grant.worker, IT, grant.seq, slot)
        assert slot.state is SlotState.FILLING and slot.capacity >= needs[grant.worker, grant.seq]
    assert len({id(g.slot) for g in world.grants}) == len(world.grants)
    assert world.dispatcher.without_slot == sum(
        e.slot is None for w in range(world.dispatcher.num_workers) for e in world.dispatcher.held_by(w))


def test_serve_grants_nothing_more_once_the_bound_is_hit_and_serves_the_rest_later():
    world = World(target=3, bound=2).slotless(0, 1, 2).asks(2, 2, PAGE).asks(0, 0, PAGE).asks(1, 1, PAGE).serve()
    assert [g.seq for g in world.grants] == [0, 1] and world.waiting() == [2]
    assert world.serve().grants == [] and world.waiting() == [2]  # nothing came back
    world.give_back(0, 0)  # batch 0 arrived and was dropped: its slot is free
    world.serve()
    assert world.grants == [Grant(2, IT, 2, world.slot_of(2, 2))] and world.waiting() == []


def test_growth_keeps_the_overtaking_rule():
    # Bound 7 pages; the consumer holds batch 0 (segment 0, 2 pages, stays mapped); batch 1
    # was sent without a slot and has not asked; batch 2 needs 3 pages. Beside segment 0 only
    # one 3-page slot fits: given to batch 2, batch 1 has none, and no slot can come back
    # (batch 2 READY waits behind batch 1): RingFullError. Batch 2 should wait instead: once
    # batch 1 has a 1-page slot, one 3-page slot still fits beside both, and both load.
    world = World(target=4, bound=7, workers=2).sized(2).held(1).task(0, 1, slot=False).task(1, 2)
    world.asks(1, 2, 3 * PAGE).serve()
    assert world.grants == [] and world.waiting() == [2]
    world.asks(0, 1, PAGE).serve()
    assert [(g.worker, g.seq) for g in world.grants] == [(0, 1), (1, 2)]
    assert world.slot_of(1, 2).capacity >= 3 * PAGE and world.ring.nbytes <= world.ring.max_bytes


def test_growth_waits_while_an_earlier_batch_may_need_a_slot_of_the_new_size():
    # Growth retires batch 0's slot too; only one 3-page slot fits beside its segment, and
    # batch 0 may turn out larger than its old slot: batch 1 waits (no error) until it is in.
    world = World(target=4, bound=6, workers=2).sized(2).task(0, 0).task(1, 1).asks(1, 1, 3 * PAGE).serve()
    assert world.grants == [] and world.waiting() == [1]
    world.alloc.raise_if_stuck(IT, 0)
    world.alloc.raise_if_stuck(IT, None)
    world.ready(0, 0).serve()
    assert [g.seq for g in world.grants] == [1] and world.slot_of(1, 1).capacity >= 3 * PAGE


# ---------------------------------------------------------------- raise_if_stuck
def bound_hit(world, worker, seq):
    """``worker``'s batch ``seq`` asks for 3-page slots that do not fit the ring's bound
    beside its busy slots; serve() fails and records why."""
    world.asks(worker, seq, 3 * PAGE).serve()
    assert world.grants == [] and world.waiting() == [seq]
    return world


def stuck_world(slots=2):
    """``slots`` slots of 1 page in one segment, a bound of one page more: growth to 3
    pages needs every slot free."""
    return World(target=slots, bound=slots + 1).sized(slots)


def loading_world():
    """Batch 1 waits for 3-page slots that do not fit beside the batch the consumer holds;
    batch 0 is still loading without a slot (sent before the ring was sized, or again
    after a restart), and 2 one-page slots are free: one fits it."""
    world = stuck_world(3).held().task(0, 0, slot=False).task(1, 1)
    world = bound_hit(world, 1, 1)
    assert world.ring.free_slots() == 2
    return world


STUCK = [
    # (starting state, head (None: in_order=False), raises)
    pytest.param(lambda: World(target=2).slots("..").task(0, 0).asks(0, 0, 2 * PAGE), 0, False,
                 id="a batch waits, serve() not called: no error pending"),
    pytest.param(lambda: World(target=2).slots("..").task(0, 0).asks(0, 0, 2 * PAGE).serve(), 0, False,
                 id="serve() granted it: no error pending"),
    pytest.param(lambda: bound_hit(stuck_world().task(0, 0).task(1, 1), 1, 1), 0, False,
                 id="error pending, head still loading with a slot: it arrives"),
    pytest.param(loading_world, 0, False,
                 id="error pending, head still loading without a slot: it will ask"),
    pytest.param(lambda: bound_hit(stuck_world().task(0, 0).task(1, 1), 0, 0), 0, False,
                 id="head blocked, another worker holds a task with a slot: it can give it back"),
    pytest.param(lambda: bound_hit(stuck_world().task(0, 0).task(1, 5, iteration=IT - 1), 0, 0), 0, False,
                 id="head blocked, an abandoned iteration's task holds a slot: it comes back"),
    pytest.param(lambda: bound_hit(stuck_world(3).task(0, 0).task(1, 1).held(), 0, 0), 0, False,
                 id="head blocked, the consumer holds a batch, another task holds a slot: wait"),
    pytest.param(lambda: bound_hit(stuck_world().task(0, 0).task(1, 1), 0, 0).ready(1, 1), 0, True,
                 id="head blocked, the other slot READY (a later batch): raise"),
    pytest.param(lambda: bound_hit(stuck_world().task(0, 0).held(), 0, 0), 0, True,
                 id="head blocked, the consumer holds the other slot: raise"),
    pytest.param(lambda: bound_hit(stuck_world().task(0, 0).task(0, 2), 0, 0), 0, True,
                 id="head blocked, only its own waiting worker holds a slot (a later task): raise"),
    pytest.param(lambda: bound_hit(stuck_world(3).task(0, 0).task(1, 1).held(), 0, 0).asks(1, 1, 3 * PAGE).serve(),
                 0, True,
                 id="head blocked, the other task's worker waits for space too: raise"),
    pytest.param(lambda: bound_hit(stuck_world().task(0, 0).held().task(1, 1, slot=False), 0, 0), 0, True,
                 id="head blocked, another worker holds only a task without a slot: raise"),
    # in_order=False: no head; anything else holding a slot may still finish
    pytest.param(lambda: bound_hit(stuck_world().task(0, 0).task(1, 1), 1, 1), None, False,
                 id="no head, another worker holds a task with a slot: wait"),
    pytest.param(lambda: bound_hit(stuck_world().task(0, 0).held(), 0, 0), None, True,
                 id="no head, nothing but the consumer holds a slot: raise"),
    pytest.param(lambda: bound_hit(stuck_world().task(0, 0).task(0, 2), 0, 0), None, True,
                 id="no head, only the waiting worker holds a slot: raise"),
    pytest.param(loading_world, None, False,
                 id="no head, another batch still loading without a slot, a free slot fits it: wait"),
    pytest.param(lambda: bound_hit(stuck_world().task(0, 2).task(0, 0, slot=False).held(), 0, 2), 0, True,
                 id="head queued behind a batch that waits on its worker (a redo): raise"),
]


@pytest.mark.parametrize("state, head, raises", STUCK)
def test_raise_if_stuck(state, head, raises):
    world = state()
    if not raises:
        world.alloc.raise_if_stuck(IT, head)
        return
    message = re.escape(f"grow its slots to {binary_size(3 * PAGE)} for a batch of {binary_size(3 * PAGE)}: that "
                        f"needs {binary_size(world.ring.nbytes + 3 * PAGE)} of shared memory, over its bound of "
                        f"{binary_size(world.ring.max_bytes)} (max_shm_bytes)")
    with pytest.raises(RingFullError, match=message):
        world.alloc.raise_if_stuck(IT, head)
    world.alloc.raise_if_stuck(IT, head)  # raised once: not kept
    world.serve()  # the next attempt recomputes it
    with pytest.raises(RingFullError):
        world.alloc.raise_if_stuck(IT, head)


def test_raise_if_stuck_after_the_blocking_slot_comes_back_and_serve_succeeds():
    world = bound_hit(stuck_world().task(0, 0).task(1, 1), 0, 0)
    world.give_back(1, 1)  # batch 1 failed: its slot comes back
    world.serve()
    assert [g.seq for g in world.grants] == [0] and world.slot_of(0, 0).capacity >= 3 * PAGE
    world.alloc.raise_if_stuck(IT, 0)


# ---------------------------------------------------------------- abandon, forget, waiting_for
def test_abandon_completes_the_waiting_tasks_and_returns_them():
    world = bound_hit(stuck_world().task(0, 0).task(1, 1).task(2, 2, slot=False), 0, 0).asks(2, 2, PAGE)
    waits = list(world.alloc.waiting)
    assert [w.need.seq for w in waits] == [0, 2]
    assert world.alloc.abandon() == waits
    assert not world.alloc.waiting and world.alloc.waiting_for(IT, 0) is None
    assert world.dispatcher.held_by(0) == [] and world.dispatcher.held_by(2) == []
    assert [e.task.seq for e in world.dispatcher.held_by(1)] == [1]  # not waiting: left alone
    assert world.dispatcher.without_slot == 0
    world.alloc.raise_if_stuck(IT, 0)  # the pending error went with them
    assert world.alloc.abandon() == []


def test_forget_drops_only_that_workers_waits():
    world = World(workers=3).slotless(0, 1, 2).asks(0, 0, PAGE).asks(1, 1, PAGE).asks(2, 2, PAGE)
    world.alloc.forget(1)
    assert [(w.worker, w.need.seq) for w in world.alloc.waiting] == [(0, 0), (2, 2)]
    assert world.alloc.waiting_for(IT, 1) is None
    # its task stays in the dispatcher, slotless: the session sends it again to the new worker
    assert world.slot_of(1, 1) is None and world.dispatcher.without_slot == 3
    world.alloc.forget(1)  # nothing left of it: no error
    assert len(world.alloc.waiting) == 2


def test_a_forgotten_wait_leaves_no_error_behind():
    # batch 0 cannot have its larger slot and nothing can give one back: stuck
    world = bound_hit(stuck_world().task(0, 0).held(), 0, 0)
    world.alloc.forget(0)  # its worker died: the batch is sent again (slotless) and asks again
    world.serve()  # as the session does before it blocks: nothing waits now
    world.alloc.raise_if_stuck(IT, None)
    world.alloc.raise_if_stuck(IT, 0)


@pytest.mark.parametrize("iteration, seq, found", [
    (IT, 3, (0, 3 * PAGE)),
    (IT, 4, (1, 5 * PAGE)),
    (IT, 5, None),  # in flight, not waiting
    (IT, 6, None),  # not in flight at all
    (IT - 1, 3, None),  # the same seq of another iteration
])
def test_waiting_for(iteration, seq, found):
    world = World(workers=2).task(0, 3, slot=False).task(1, 4, slot=False).task(0, 5, slot=False)
    world.asks(0, 3, 3 * PAGE).asks(1, 4, 5 * PAGE)
    wait = world.alloc.waiting_for(iteration, seq)
    if found is None:
        assert wait is None
    else:
        worker, nbytes = found
        assert wait == Waiting(worker, NeedSpace(IT, seq, nbytes))
