"""The worker loop: receive a task, load and collate the batch straight into its slot,
report completion. Runs in each worker process.

A worker never waits for space: the main process sends each task with a free slot
(credit-based dispatch). If the batch is larger than the slot, the worker keeps the
collated batch, says :class:`NeedSpace`, and goes on with its next task until a
:class:`Reassign` names a larger slot; nothing is loaded twice.

A worker exits when told (:class:`Shutdown`), when its socket reaches end-of-file (the
main process closed it, or died: see ``_platform`` for why no other process holds that
end), or when its parent process changes (checked every ``WATCHDOG_INTERVAL`` seconds,
for the case where a descendant still holds the socket).
"""

from __future__ import annotations

import os
import pickle
import signal
import traceback
from multiprocessing import reduction
from typing import Any, Callable, NamedTuple

from . import collate as _collate
from . import layout as _layout
from . import seeding
from .errors import RemoteError, WorkerError
from .fetch import fetch
from .messages import (Attach, Detach, Done, Failed, NeedSpace, Ready, Reassign, Shutdown, SlotRef,
                       StartupFailed, Task)
from .shm import AttachedSegment

WATCHDOG_INTERVAL = 0.5


class WorkerInfo(NamedTuple):
    """What :func:`get_worker_info` returns inside a worker."""

    id: int
    num_workers: int
    seed: int
    dataset: Any


_worker_info: WorkerInfo | None = None


def get_worker_info() -> WorkerInfo | None:
    """In a worker process: its id, the number of workers, the loader's base seed and the
    worker's copy of the dataset. ``None`` in the main process."""
    return _worker_info


class UserCode(NamedTuple):
    """The user's objects a worker runs. Sent pickled under spawn/forkserver."""

    dataset: Any
    collate_fn: Callable | None
    worker_init_fn: Callable | None


class WorkerArgs(NamedTuple):
    worker_id: int
    num_workers: int
    seed: int
    auto_batch: bool
    user: UserCode | bytes  # bytes: pickled in the main process (spawn, forkserver)
    conn: Any  # this worker's end of its socket to the main process


class _ParentGone(Exception):
    pass


def worker_main(args: WorkerArgs) -> None:
    """Process entry point. Ctrl-C is the main process's to handle: workers ignore SIGINT,
    so an interrupted run prints one traceback, not one per worker."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    loop = _WorkerLoop(args)
    try:
        if loop.start():
            loop.run()
    except (_ParentGone, EOFError, OSError):
        pass  # the main process is gone or closed our socket: nothing left to report to
    finally:
        loop.close()


class _WorkerLoop:
    def __init__(self, args: WorkerArgs):
        self.args = args
        self.conn = args.conn
        self.parent = os.getppid()
        self.segments: dict[int, AttachedSegment] = {}
        self.pending: dict[tuple[int, int], _layout.Plan] = {}
        self.user: UserCode | None = None

    # ------------------------------------------------------------ start-up
    def start(self) -> bool:
        global _worker_info
        a = self.args
        try:
            self.user = pickle.loads(a.user) if isinstance(a.user, bytes) else a.user
            _worker_info = WorkerInfo(a.worker_id, a.num_workers, a.seed, self.user.dataset)
            if self.user.worker_init_fn is not None:
                self.user.worker_init_fn(a.worker_id)
        except Exception as exc:
            self.send(StartupFailed(a.worker_id, RemoteError.capture(exc, traceback.format_exc())))
            return False
        self.send(Ready(a.worker_id, os.getpid()))
        return True

    # ------------------------------------------------------------ messages
    def recv(self) -> Any:
        while not self.conn.poll(WATCHDOG_INTERVAL):
            if os.getppid() != self.parent:
                raise _ParentGone()
        return self.conn.recv()

    def send(self, msg: Any) -> None:
        try:
            data = reduction.ForkingPickler.dumps(msg)
        except Exception as exc:
            if not isinstance(msg, Done):
                raise
            err = WorkerError(f"the batch holds a value that cannot be pickled to the main process: {exc}")
            data = reduction.ForkingPickler.dumps(
                Failed(msg.iteration, msg.seq, msg.worker_id, RemoteError.capture(err, traceback.format_exc())))
        self.conn.send_bytes(data)

    def run(self) -> None:
        while True:
            msg = self.recv()
            kind = type(msg)
            if kind is Task:
                self.load(msg)
            elif kind is Reassign:
                plan = self.pending.pop((msg.iteration, msg.seq))
                if msg.slot is not None:
                    self.place(msg.iteration, msg.seq, plan, msg.slot)
            elif kind is Attach:
                fd = reduction.recv_handle(self.conn)
                self.segments[msg.segment] = AttachedSegment(fd, msg.size)
            elif kind is Detach:
                self.segments.pop(msg.segment).close()
            elif kind is Shutdown:
                return
            else:
                raise TypeError(f"worker got an unknown message {msg!r}")

    # ------------------------------------------------------------ the data path
    def load(self, task: Task) -> None:
        a, user = self.args, self.user
        try:
            seeding.seed_globals(a.seed, task.epoch, task.seq)
            samples = fetch(user.dataset, task.indices, a.auto_batch)
            plan = _collate.make_plan(samples, task.indices, user.collate_fn, a.auto_batch)
        except Exception as exc:
            self.fail(task.iteration, task.seq, exc)
            return
        self.place(task.iteration, task.seq, plan, task.slot)

    def place(self, iteration: int, seq: int, plan: _layout.Plan, slot: SlotRef | None) -> None:
        """Write the batch into its slot and report it, or ask for a larger slot."""
        if plan.layout.nbytes == 0:  # nothing but small Python objects: no slot needed
            self.send(Done(iteration, seq, self.args.worker_id, slot, plan.layout))
            return
        if slot is None or plan.layout.nbytes > slot.capacity:
            self.pending[(iteration, seq)] = plan
            self.send(NeedSpace(iteration, seq, self.args.worker_id, plan.layout.nbytes))
            return
        try:
            target = self.segments[slot.segment].array[slot.offset:slot.offset + slot.capacity]
            _layout.write(plan, _layout.slot_destination(target))
            del target
        except Exception as exc:
            self.fail(iteration, seq, exc)
            return
        self.send(Done(iteration, seq, self.args.worker_id, slot, plan.layout))

    def fail(self, iteration: int, seq: int, exc: Exception) -> None:
        self.send(Failed(iteration, seq, self.args.worker_id, RemoteError.capture(exc, traceback.format_exc())))

    def close(self) -> None:
        for seg in self.segments.values():
            try:
                seg.close()
            except BufferError:
                pass
        self.segments.clear()
        try:
            self.conn.close()
        except OSError:
            pass
