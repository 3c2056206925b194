"""Reorder buffer and dispatcher, tested as internals (``shmload._loader.reorder``,
``shmload._session.dispatch``): pure, no processes."""

from typing import NamedTuple

import pytest

from shmload._loader.reorder import ReorderBuffer, ReorderError
from shmload._session.dispatch import Dispatcher, prefetch_depth

pytestmark = pytest.mark.pure


def test_in_order_delivery_whatever_the_arrival_order():
    r = ReorderBuffer(in_order=True)
    for seq in range(4):
        r.expect(seq)
    r.put(2, "c")
    r.put(1, "b")
    assert r.pop() is None  # 0 has not arrived
    r.put(0, "a")
    assert [r.pop(), r.pop(), r.pop(), r.pop()] == [(0, "a"), (1, "b"), (2, "c"), None]
    r.put(3, "d")
    assert r.pop() == (3, "d") and len(r) == 0


def test_out_of_order_delivers_by_arrival():
    r = ReorderBuffer(in_order=False)
    for seq in range(3):
        r.expect(seq)
    r.put(2, "c")
    r.put(0, "a")
    assert [r.pop(), r.pop(), r.pop()] == [(2, "c"), (0, "a"), None]
    assert r.missing == {1} and len(r) == 1


@pytest.mark.parametrize("in_order", [True, False])
def test_duplicates_and_unexpected_results_are_errors(in_order):
    r = ReorderBuffer(in_order=in_order)
    r.expect(0)
    r.put(0, "a")
    with pytest.raises(ReorderError, match="twice"):
        r.put(0, "again")
    with pytest.raises(ReorderError, match="before it was dispatched"):
        r.put(5, "x")
    with pytest.raises(ReorderError, match="expected seq 1 or later to be dispatched next, got 0"):
        r.expect(0)


@pytest.mark.parametrize("in_order", [True, False])
def test_gaps_in_expected_numbers_are_skipped(in_order):
    """A resumed epoch skips the positions delivered before the save."""
    r = ReorderBuffer(in_order=in_order)
    for seq in (2, 5, 6):
        r.expect(seq)
    r.put(6, "g")
    assert (r.pop() is None) == in_order  # in order, 6 waits for 2 and 5
    r.put(5, "f")
    r.put(2, "c")
    popped = [r.pop() for _ in range(3 if in_order else 2)]
    assert [p[0] for p in popped if p] == ([2, 5, 6] if in_order else [5, 2])
    assert r.pop() is None and len(r) == 0


def test_dispatcher_prefers_the_least_loaded_worker_and_respects_credits():
    d = Dispatcher(num_workers=2, per_worker=2)
    picks = []
    tasks = [Held(f"task{seq}", slot=None if seq == 3 else seq) for seq in range(4)]
    for seq in range(4):
        wid = d.pick()
        picks.append(wid)
        d.assign(wid, (1, seq), tasks[seq])
    assert picks == [0, 1, 0, 1]
    assert d.pick() is None  # every worker holds prefetch_factor tasks
    assert d.complete(1, (1, 1)) == tasks[1]
    assert d.pick() == 1
    assert d.held_by(0) == [tasks[0], tasks[2]] and d.task(0, (1, 2)) == tasks[2]
    assert d.complete(0, (1, 0)) == tasks[0] and d.complete(0, (1, 2)) == tasks[2]
    assert d.pick() == 0  # now the least loaded


def test_dispatcher_counts_the_tasks_without_a_slot():
    d = Dispatcher(num_workers=2, per_worker=4)
    d.assign(0, (1, 0), Held("a", None))
    d.assign(1, (1, 1), Held("b", None))
    d.assign(1, (1, 2), Held("c", 5))
    assert d.without_slot == 2
    d.assign(0, (1, 0), Held("a", 7))  # given a slot (a Reassign)
    assert d.without_slot == 1
    d.assign(1, (1, 2), Held("c", None))  # gave its slot back (a NeedSpace)
    assert d.without_slot == 2
    d.complete(1, (1, 1))
    d.complete(1, (1, 2))
    d.complete(0, (1, 0))
    assert d.without_slot == 0


class Held(NamedTuple):
    name: str
    slot: int | None


KIB, MIB, GIB = 1 << 10, 1 << 20, 1 << 30


def test_an_explicit_prefetch_factor_is_honoured_whatever_the_batch_size():
    for slot_bytes in (0, 4 * KIB, 100 * MIB):
        assert prefetch_depth(3, slot_bytes, 2, GIB) == 3
        assert prefetch_depth(1, slot_bytes, 2, 64 * KIB) == 1


def test_automatic_prefetch_goes_deep_only_for_small_batches():
    assert prefetch_depth(None, 0, 2, GIB) == 2  # the ring is not sized yet
    assert prefetch_depth(None, 10 * MIB, 2, GIB) == 2  # images: as torch
    assert prefetch_depth(None, 600 * KIB, 2, GIB) == 2
    assert prefetch_depth(None, 256 * KIB, 2, GIB) == 4  # about 1 MiB per worker
    assert prefetch_depth(None, 36 * KIB, 2, GIB) == 28  # tiny rows: 1 MiB per worker
    assert prefetch_depth(None, 4 * KIB, 8, GIB) == 64  # capped


def test_a_measured_pace_caps_the_automatic_depth_at_a_few_milliseconds_of_work():
    from shmload._session.dispatch import DEPTH_SECONDS
    assert prefetch_depth(None, 4 * KIB, 2, GIB, batch_seconds=1e-5) == 64  # fast: the bytes rule
    assert prefetch_depth(None, 36 * KIB, 2, GIB, batch_seconds=150e-6) == 28
    assert prefetch_depth(None, 4 * KIB, 2, GIB, batch_seconds=DEPTH_SECONDS / 10) == 10
    assert prefetch_depth(None, 4 * KIB, 2, GIB, batch_seconds=0.64) == 2  # slow small batches: torch's depth
    assert prefetch_depth(None, 10 * MIB, 2, GIB, batch_seconds=1e-6) == 2  # never deeper than the bytes allow
    assert prefetch_depth(16, 4 * KIB, 2, GIB, batch_seconds=0.64) == 16  # an explicit factor as given


def test_automatic_prefetch_leaves_a_tight_bound_for_the_ring_to_grow_into():
    # 2 workers may use a quarter of 1 MiB: 128 KiB each, 4 slots of 32 KiB
    assert prefetch_depth(None, 32 * KIB, 2, MIB) == 4
    assert prefetch_depth(None, 32 * KIB, 2, 256 * KIB) == 2  # never below torch's default
