"""The shared-memory control path (control.py, wire.py) through the public API: what is
rare must still arrive whole and in its place. A message too large for its queue goes by
the socket (both ways), tasks the queue has no room for wait in the main process, and
the batches are those of ``num_workers=0``. To know the rare path was taken, the tests
read the queues' sizes and count what goes by the socket, reaching into
``shmload._transport`` on purpose.
"""

from __future__ import annotations

import sys
import time

import numpy as np
import pytest

import shmload
from shmload._transport import wire
from shmload._transport.channel import Channel
from shmload._transport.control import COMPLETION_BYTES, TASK_BYTES
from shmload._transport.messages import Task

pytestmark = pytest.mark.timeout(60)


class Rows:
    def __init__(self, n=4000, width=16):
        self.data = np.arange(n * width, dtype=np.float32).reshape(n, width)

    def __len__(self):
        return len(self.data)

    def __getitem__(self, i):
        return self.data[i], i


class Named(Rows):
    """Each sample carries a long string: a batch's layout (its object leaves) is larger
    than a completion queue takes."""

    def __getitem__(self, i):
        return self.data[i], f"sample {i} " + "x" * 400


class Keyed:
    """A dict-like dataset with long string keys: a batch's task is larger than a task queue takes."""

    def __init__(self, n=64):
        self.keys = [f"key-{i:04d}-" + "k" * 2000 for i in range(n)]
        self.values = {k: np.full(3, i, np.int64) for i, k in enumerate(self.keys)}

    def __len__(self):
        return len(self.keys)

    def __getitem__(self, key):
        return self.values[key]


def batches(loader):
    return [tuple(np.array(x) if isinstance(x, np.ndarray) else list(x) for x in b) for b in loader]


def equal(a, b):
    return len(a) == len(b) and all(
        all(np.array_equal(x, y) if isinstance(x, np.ndarray) else x == y for x, y in zip(p, q)) for p, q in zip(a, b))


def counting(monkeypatch, owner, name):
    calls = []
    real = getattr(owner, name)

    def counted(*args, **kwargs):
        calls.append(args)
        return real(*args, **kwargs)

    monkeypatch.setattr(owner, name, counted)
    return calls


def test_completions_larger_than_their_queue_arrive_whole_and_in_order(all_start_methods, monkeypatch):
    start_method = all_start_methods
    ds = Named(2000)
    assert 128 * 420 > COMPLETION_BYTES // 4  # each batch's layout goes by the socket
    frames = counting(monkeypatch, wire, "frame_record")
    kw = dict(batch_size=128, shuffle=True, seed=1)
    want = batches(shmload.DataLoader(ds, **kw))
    with shmload.DataLoader(ds, num_workers=2, multiprocessing_context=start_method, timeout=30, **kw) as loader:
        assert equal(batches(loader), want)
    assert len(frames) >= len(want)  # they did come by the socket


def test_tasks_larger_than_their_queue_arrive_whole(start_method, monkeypatch):
    ds = Keyed()
    sent = counting(monkeypatch, Channel, "send")
    order = [ds.keys[i:i + 32] for i in range(0, len(ds), 32)]
    assert sum(map(len, order[0])) > TASK_BYTES // 4  # each task goes by the socket
    got = list(shmload.DataLoader(ds, batch_sampler=order, num_workers=2, multiprocessing_context=start_method,
                                  timeout=30, split_batches=False))  # (spans are pickled: this is about tasks)
    assert [b[:, 0].tolist() for b in got] == [list(range(i, i + 32)) for i in range(0, len(ds), 32)]
    assert sum(type(args[1]) is Task for args in sent) == len(order)  # they did go by the socket


def test_more_tasks_than_a_task_queue_holds_wait_their_turn_in_order():
    ds = Rows(60_000, width=4)
    # 40 tasks of 1,000 indices (8 KB each) per worker: more than a 128 KiB task queue holds
    kw = dict(batch_size=1000, shuffle=True, seed=3)
    want = [batches(loader) for loader in [shmload.DataLoader(ds, **kw)] for _ in range(2)]
    with shmload.DataLoader(ds, num_workers=2, prefetch_factor=40, timeout=10, persistent_workers=True,
                            **kw) as loader:
        # the second epoch, its ring sized, dispatches all 60 batches in one round: what
        # overflows then leaves with no later task to carry it (Supervisor.flush)
        assert all(equal(batches(loader), w) for w in want)


def test_a_flush_cut_short_by_an_error_is_done_again_whole(monkeypatch):
    from shmload._session.supervisor import Supervisor

    ds = Rows(6_000, width=4)
    kw = dict(batch_size=100, shuffle=True, seed=4)
    want = [batches(loader) for loader in [shmload.DataLoader(ds, **kw)] for _ in range(2)]
    real, armed = Supervisor._push, []

    def push(self, h):  # the armed epoch's first flush fails at its first worker, before the other's
        if armed and sys._getframe(1).f_code.co_name == "flush" and armed.pop():
            raise OSError("injected: a queue's semaphore failed")
        return real(self, h)

    monkeypatch.setattr(Supervisor, "_push", push)
    with shmload.DataLoader(ds, num_workers=2, prefetch_factor=40, timeout=10, persistent_workers=True,
                            **kw) as loader:
        assert equal(batches(loader), want[0])
        armed.append(True)  # the second epoch sends all 60 batches in its first round: no later task carries them
        it = iter(loader)
        with pytest.raises(OSError, match="injected"):
            next(it)
        assert equal(batches(it), want[1])  # the next next() sends what the cut flush did not


def test_an_error_larger_than_its_queue_is_raised_at_its_batch():
    class Loud(Rows):
        def __getitem__(self, i):
            if i == 777:
                raise ValueError("bad sample 777: " + "why " * 30000)  # a traceback of ~120 KB
            return super().__getitem__(i)

    loader = shmload.DataLoader(Loud(2000), batch_size=100, num_workers=2, timeout=30)
    it = iter(loader)
    got = [next(it) for _ in range(7)]
    with pytest.raises(ValueError, match=r"bad sample 777: why why"):
        next(it)
    assert [int(b[1][0]) for b in got] == list(range(0, 700, 100))
    assert int(next(it)[1][0]) == 800  # the iterator goes on after the failed batch
    del it


class SomeNamed(Rows):
    """Every other batch (of 64) carries long strings: its completion goes by the socket,
    the next by the queue, so announced frames and queue records alternate."""

    def __getitem__(self, i):
        if (i // 64) % 2:
            return self.data[i], f"sample {i} " + "x" * 400
        return self.data[i], f"s{i}"


def test_several_announced_frames_in_flight_keep_their_places(start_method):
    """Several large completions queued before the main process reads the socket: each
    frame goes in its announcement's place, and the records between them after it."""
    ds = SomeNamed(64 * 40)
    kw = dict(batch_size=64, in_order=False)  # arrival order shows any reordering within a worker
    with shmload.DataLoader(ds, num_workers=1, multiprocessing_context=start_method, timeout=30,
                            prefetch_factor=16, **kw) as loader:
        it = iter(loader)
        got = [int(next(it)[0][0, 0]) // 16]  # the batch's first index
        time.sleep(1)  # the worker queues its next completions, frames and records, meanwhile
        got += [int(b[0][0, 0]) // 16 for b in it]
    assert got == list(range(0, 64 * 40, 64))  # one worker: its completions, in its order
