"""Internals, tested on purpose (``shmload._transport.control``, ``wire`` and
``messages``): control.py and wire.py, the shared-memory queues and the records in them.

In one process first (both ends of every queue on one anonymous shared mapping), then
across a fork, where the two ends run at once: every record arrives once, in order,
intact, across thousands of wrap-arounds; a full queue refuses instead of overwriting; a
sleeper is woken by the bell and only waits its time-out when nothing comes. Every wait
has a time-out: a bug fails a test instead of hanging it.
"""

from __future__ import annotations

import mmap
import multiprocessing
import os
import pickle
import random
import time
import zlib

import numpy as np
import pytest

from shmload._batching.layout import ArraySpec, Layout, LayoutCache, Leaf, ObjectValue, Seq
from shmload._core import native as native_mod
from shmload._transport import queues, wire
from shmload._transport.control import ControlBlock, WorkerEnd, layout_areas
from shmload._transport.messages import (
    Attach,
    Done,
    Draw,
    Failed,
    Indices,
    NeedSpace,
    Reassign,
    Shutdown,
    SlotRef,
    StreamPoint,
    Task,
)
from shmload.errors import RemoteError

pytestmark = pytest.mark.timeout(60)


@pytest.fixture(params=["compiled", "python"])
def kind(request, monkeypatch):
    """The queues' ends: compiled (_core/_queue.c) or control.py's Python ones."""
    if request.param == "python":
        monkeypatch.setattr(queues, "native", None)
    elif not hasattr(queues.native, "QueueWriter"):
        pytest.skip(f"no compiled core: {native_mod.DESCRIPTION}")
    return request.param


def block(workers: int = 1):
    mm = mmap.mmap(-1, ControlBlock.size(workers))
    cb = ControlBlock(mm, workers)
    ends = [WorkerEnd(mm, area) for area in cb.areas]
    return mm, cb, ends


def record(n: int, tag: int) -> bytes:
    body = (tag.to_bytes(4, "little") * (n // 4 + 1))[:n]
    return zlib.crc32(body).to_bytes(4, "little") + body


def intact(rec: bytes) -> bool:
    return zlib.crc32(rec[4:]).to_bytes(4, "little") == rec[:4]


# ---------------------------------------------------------------- one process
@pytest.mark.pure
def test_records_of_every_size_arrive_once_in_order_across_many_wraps(kind):
    _, cb, (end,) = block()
    producer, consumer = cb.tasks[0], end.tasks
    rng = random.Random(0)
    sent = taken = 0
    expected = []
    while taken < 5000:
        while rng.random() < 0.7:  # a few puts, then a few takes: every fill level is reached
            rec = record(rng.randrange(0, producer.max_record - 4), sent)
            if not producer.put(rec):
                break
            expected.append(rec)
            sent += 1
        for _ in range(rng.randrange(1, 4)):
            got = consumer.take()
            if got is None:
                assert not expected, "a published record was not found"
                break
            assert got == expected.pop(0) and intact(got)
            taken += 1
    assert consumer.take() is None or expected


@pytest.mark.pure
def test_a_full_queue_refuses_and_takes_again_once_a_record_is_freed(kind):
    _, cb, (end,) = block()
    producer = cb.tasks[0]
    sent = []
    while producer.put(rec := record(1000, len(sent))):
        sent.append(rec)
        assert len(sent) < 1000, "the queue never filled"
    assert len(sent) >= 100
    assert not producer.put(record(1000, 99999))  # refused again: nothing was overwritten
    assert end.tasks.take() == sent.pop(0)
    assert producer.put(last := record(1000, 7777))  # the freed record's room
    assert not producer.put(record(1000, 99999))
    sent.append(last)
    while (got := end.tasks.take()) is not None:
        assert got == sent.pop(0)
    assert not sent


@pytest.mark.pure
def test_a_record_of_max_record_bytes_fits_an_empty_queue_wherever_it_stands(kind):
    _, cb, (end,) = block()
    producer = cb.tasks[0]
    rng = random.Random(1)
    for _ in range(300):
        assert producer.put(b"a" * rng.randrange(0, 4000))
        end.tasks.take()  # empty again, at a new position
        assert producer.put(b"b" * producer.max_record), "an empty queue refused a record of max_record bytes"
        assert end.tasks.take() == b"b" * producer.max_record


@pytest.mark.pure
def test_parts_are_one_record(kind):
    _, cb, (end,) = block()
    assert cb.tasks[0].put(b"head", b"", memoryview(b"body"), b"!")
    assert end.tasks.take() == b"headbody!"


@pytest.mark.pure
def test_completions_ring_the_bell_and_the_main_side_takes_them_per_worker(kind):
    _, cb, ends = block(3)
    assert ends[2].publish(b"two", b"") and ends[0].publish(b"zero", b"")
    assert cb.take(1) is None
    assert cb.take(2) == b"two" and cb.take(0) == b"zero"
    t0 = time.monotonic()
    cb.drain_bell()
    cb.sleep(0.2)  # nothing published since the drain: the whole time-out
    assert time.monotonic() - t0 >= 0.15
    ends[1].publish(b"one", b"")
    t0 = time.monotonic()
    cb.sleep(5)  # rung: at once
    assert time.monotonic() - t0 < 1
    assert cb.take(1) == b"one"


@pytest.mark.pure
def test_a_worker_rings_the_bell_only_for_the_first_record_the_main_side_has_not_taken(kind):
    """NOTE [ A doorbell rung only for a sleeper ]: a burst of completions is one token;
    once the main side has taken them all, the next completion rings again."""
    _, cb, ends = block(2)

    def tokens() -> int:
        n = 0
        while cb.bell.trywait():
            n += 1
        return n

    for i in range(5):
        assert ends[0].publish(b"burst %d" % i, b"")
    assert ends[1].publish(b"other", b"")  # another worker's queue was empty: it rings too
    assert tokens() == 2
    assert cb.take(0) == b"burst 0"
    assert ends[0].publish(b"late", b"")  # four older records still there: no ring
    assert tokens() == 0
    assert [cb.take(0) for _ in range(6)] == [b"burst 1", b"burst 2", b"burst 3", b"burst 4", b"late", None]
    assert cb.take(1) == b"other"
    assert ends[0].publish(b"next", b"")  # the queue was empty again
    assert tokens() == 1


@pytest.mark.pure
def test_reset_gives_a_replacement_empty_queues_whatever_the_dead_one_left(kind):
    _, cb, (end,) = block()
    cb.tasks[0].put(b"held by the dead worker")
    end.completions.put(b"published, never posted to the bell")
    cb.reset(0)
    assert end.tasks.take() is None and cb.take(0) is None
    assert cb.tasks[0].put(b"fresh")
    assert end.tasks.take() == b"fresh"


@pytest.mark.pure
def test_areas_do_not_overlap_and_fit_the_segment():
    areas, size = layout_areas(4)
    spans = sorted((a.tasks, a.completions + a.completion_bytes) for a in areas)
    assert all(end <= start for (_, end), (start, _) in zip(spans, spans[1:]))
    assert spans[-1][1] <= size
    with pytest.raises(ValueError, match="control segment of"):
        ControlBlock(mmap.mmap(-1, size - 1), 4)


# ---------------------------------------------------------------- two processes at once
def _echo(mm, area, count: int) -> None:
    """A worker's end: take each task and publish it back, until ``count`` were echoed."""
    end = WorkerEnd(mm, area)
    for _ in range(count):
        rec = end.tasks.wait(10)
        if rec is None:
            os._exit(3)
        while not end.publish(rec, b""):
            end.completions.wait_for_room(1)
    os._exit(0)


@pytest.mark.parametrize("records", [20000])
def test_two_processes_exchange_every_record_intact_and_in_order(records, kind):
    mm, cb, _ = block(1)
    child = multiprocessing.get_context("fork").Process(target=_echo, args=(mm, cb.areas[0], records))
    child.start()
    try:
        rng = random.Random(2)
        sent = received = 0
        pending: list[bytes] = []
        deadline = time.monotonic() + 40
        while received < records:
            assert time.monotonic() < deadline, f"only {received} of {records} records came back"
            while sent < records and len(pending) < 50:
                rec = record(rng.choice((8, 60, 600, 6000)), sent)
                if not cb.tasks[0].put(rec):
                    break
                pending.append(rec)
                sent += 1
            got = cb.take(0)
            if got is None:
                cb.drain_bell()
                got = cb.take(0)
                if got is None:
                    cb.sleep(0.05)
                    continue
            assert intact(got) and got == pending.pop(0)
            received += 1
    finally:
        child.join(10)
        if child.exitcode is None:
            child.kill()
            child.join()
    assert child.exitcode == 0


def _sleepy_publisher(mm, area, delays) -> None:
    end = WorkerEnd(mm, area)
    for i, delay in enumerate(delays):
        time.sleep(delay)
        end.publish(i.to_bytes(4, "little"), b"")
    os._exit(0)


def test_no_wake_up_is_lost_when_completions_come_while_the_main_side_goes_to_sleep(kind):
    """The main side's sleep protocol (drain, scan, sleep), against completions published
    at every moment of it: each one is taken within a short time, never after the
    sleep's full time-out."""
    mm, cb, _ = block(1)
    rng = random.Random(3)
    delays = [rng.choice((0, 0, 1e-5, 1e-4, 1e-3)) for _ in range(3000)]
    child = multiprocessing.get_context("fork").Process(target=_sleepy_publisher, args=(mm, cb.areas[0], delays))
    child.start()
    try:
        got, slow = 0, 0
        deadline = time.monotonic() + 40
        while got < len(delays):
            assert time.monotonic() < deadline
            rec = cb.take(0)
            if rec is None:
                cb.drain_bell()
                rec = cb.take(0)
            if rec is None:
                t0 = time.monotonic()
                cb.sleep(2.0)
                slow += time.monotonic() - t0 >= 1.9
                continue
            assert int.from_bytes(rec, "little") == got
            got += 1
        assert slow == 0, f"{slow} sleeps ran their whole time-out while a completion was published"
    finally:
        child.join(10)


def test_no_wake_up_is_lost_with_two_workers_whose_records_pile_up(kind):
    """The main process's own protocol (Supervisor.poll: every queue taken until empty,
    then drain, scan again, sleep) against two workers publishing in bursts, so that most
    records come behind an older one and ring no bell (NOTE [ A doorbell rung only for a
    sleeper ]): every record arrives, in order per worker, and no sleep runs to its
    time-out."""
    mm, cb, _ = block(2)
    counts = (2000, 2000)
    children = []
    for wid, count in enumerate(counts):
        rng = random.Random(10 + wid)
        delays = [rng.choice((0, 0, 0, 0, 1e-5, 1e-4, 1e-3)) for _ in range(count)]
        child = multiprocessing.get_context("fork").Process(target=_sleepy_publisher, args=(mm, cb.areas[wid], delays))
        child.start()
        children.append(child)
    try:
        got, slow, sleeps = [0, 0], 0, 0
        deadline = time.monotonic() + 40

        def take_all() -> bool:
            found = False
            for wid in (0, 1):
                while (rec := cb.take(wid)) is not None:
                    assert int.from_bytes(rec, "little") == got[wid], f"worker {wid}'s records out of order"
                    got[wid] += 1
                    found = True
            return found

        while tuple(got) != counts:
            assert time.monotonic() < deadline, f"only {got} of {counts} records came"
            if take_all():
                continue
            cb.drain_bell()
            if take_all():
                continue
            t0 = time.monotonic()
            cb.sleep(2.0)
            sleeps += 1
            slow += time.monotonic() - t0 >= 1.9
        assert slow == 0, f"{slow} of {sleeps} sleeps ran their whole time-out while a completion was published"
    finally:
        for child in children:
            child.join(10)
            if child.exitcode is None:
                child.kill()
                child.join()
    assert [c.exitcode for c in children] == [0, 0]


# ---------------------------------------------------------------- wire
def roundtrip_task(task: Task) -> Task:
    head, body = wire.encode_task(task)
    return wire.decode_to_worker(head + bytes(body))


@pytest.mark.pure
def test_a_task_of_python_ints_travels_raw_and_arrives_as_python_ints():
    task = Task(3, 1, 7, [5, 0, 2**40, -3], SlotRef(2, 4096, 1 << 20))
    head, body = wire.encode_task(task)
    assert len(body) == 32  # four int64: no pickle
    back = roundtrip_task(task)
    assert back._replace(bound=None) == task and all(type(i) is int for i in back.load)


@pytest.mark.pure
@pytest.mark.parametrize("load, bound", [
    ([5, 0, 9], 10),
    ([7], 8),
    ([3, -1, 2], 2**64),  # a negative index reads as a huge one: never below len(dataset)
    ([2**63 - 1], 2**63),
])
def test_raw_indices_arrive_with_a_bound_above_every_one(load, bound):
    assert roundtrip_task(Task(1, 0, 0, load, None)).bound == bound


@pytest.mark.pure
@pytest.mark.parametrize("load", [np.array([1, 2]), [1, 2**70], ["a"], 7, []])
def test_pickled_loads_arrive_without_a_bound(load):
    assert roundtrip_task(Task(1, 0, 0, load, None)).bound is None


@pytest.mark.pure
def test_indices_arrive_as_the_list_the_sampler_would_have_given():
    arr = np.arange(10, 0, -3, dtype=np.int64)
    back = roundtrip_task(Task(1, 0, 0, Indices(arr[::2]), None))  # strided too
    assert back.load == arr[::2].tolist() and all(type(i) is int for i in back.load)
    assert back.slot is None


@pytest.mark.pure
@pytest.mark.parametrize("load", [
    np.array([1, 2, 3]),  # a custom batch sampler's array: the dataset gets numpy ints, as in torch
    [1, 2**70],  # beyond int64
    ["a", "b"],  # keys of a dict-like dataset
    [True, 1],  # a bool is not an int here
    7,  # batch_size=None
    Draw(1, 4, 32, False, StreamPoint(3, {"pos": 9})),
    [],
])
def test_any_other_load_is_pickled_and_arrives_as_it_was(load):
    back = roundtrip_task(Task(1, 0, 5, load, None)).load
    if isinstance(load, np.ndarray):
        assert type(back) is np.ndarray and back.tolist() == load.tolist()
    else:
        assert back == load and list(map(type, back if isinstance(back, list) else [back])) == \
            list(map(type, load if isinstance(load, list) else [load]))


@pytest.mark.pure
@pytest.mark.parametrize("msg", [
    Done(4, 9, 3, None), Done(4, 9, 0, b"a layout"), Done(1, 2, -1, b"x" * 100, StreamPoint(5, {"k": [1, 2]})),
    Done(1, 2, 7, None, StreamPoint(0, None)), NeedSpace(1, 3, 1 << 30), Shutdown(), Reassign(1, 2, None),
    Attach(3, 1 << 20),
])
def test_every_message_survives_its_record(msg):
    head, body = wire.encode_to_main(msg) if type(msg) in (Done, NeedSpace) else wire.encode_to_worker(msg)
    decode = wire.decode_to_main if type(msg) in (Done, NeedSpace) else wire.decode_to_worker
    assert decode(head + bytes(body)) == msg


@pytest.mark.pure
def test_a_failure_survives_its_record():
    try:
        raise ValueError("bad sample 3")
    except ValueError as exc:
        error = RemoteError.capture(exc)
    head, body = wire.encode_to_main(Failed(1, 2, error, None))
    back = wire.decode_to_main(head + body)
    assert type(back) is Failed and back.error.message == error.message


@pytest.mark.pure
def test_bundles_keep_order_and_stay_under_the_limit():
    msgs = [wire.encode_task(Task(1, 0, seq, list(range(seq * 10)), None)) for seq in range(40)]
    records = wire.bundles(msgs, 2000)
    assert len(records) > 1
    seqs = []
    for parts in records:
        rec = b"".join(bytes(p) for p in parts)
        assert len(rec) <= 2000 or len(wire.unbundle(rec)) == 1
        seqs += [wire.decode_to_worker(part).seq for part in wire.unbundle(rec)]
    assert seqs == list(range(40))
    (single,) = wire.bundles(msgs[:1], 10)  # one message is its own record, whatever its size
    assert wire.decode_to_worker(b"".join(bytes(p) for p in single)).seq == 0


def layout(n: int, dtype=np.float32) -> Layout:
    return Layout(Seq("list", tuple, (Leaf(0),)), (ArraySpec(0, (n,), np.dtype(dtype)),), 4 * n)


@pytest.mark.pure
def test_worker_numbers_and_main_cache_agree_whatever_order_layouts_come_in():
    ids, cache = wire.LayoutIds(), LayoutCache()
    rng = random.Random(4)
    pool = [layout(n) for n in range(1, 40)]
    for _ in range(2000):
        sent = rng.choice(pool[:rng.choice((3, 39))])
        number, data = ids.ref(sent)
        assert cache.load(0, number, data) == sent


@pytest.mark.pure
def test_a_layout_with_object_leaves_is_pickled_every_time_and_never_kept():
    ids, cache = wire.LayoutIds(), LayoutCache()
    lay = Layout(Seq("list", tuple, (Leaf(0),)), (ObjectValue(["a", "b"]),), 0)
    for _ in range(3):
        number, data = ids.ref(lay)
        assert number == -1 and data is not None
        assert cache.load(0, number, data) == lay


@pytest.mark.pure
def test_a_layout_that_cannot_be_unpickled_fails_every_batch_that_names_it():
    cache = LayoutCache()
    with pytest.raises(Exception):
        cache.load(0, 0, b"\x80\x05not a pickle")
    with pytest.raises(Exception):
        cache.load(0, 0, None)
    cache.forget(0)
    good = layout(3)
    assert cache.load(0, 0, pickle.dumps(good)) == good
