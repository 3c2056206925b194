"""The worker loop: receive a task, load and collate the batch straight into its slot,
report completion. Runs in each worker process.

A worker does not wait for space in steady state: the main process sends each task with
a free slot (credit-based dispatch). Only when a batch is larger than its slot (the first
batch, before the ring is sized; variable-size data) does the worker keep the collated
batch, say :class:`NeedSpace`, and wait for the :class:`Reassign` that names a larger
slot; nothing is loaded twice.

A worker exits when told (:class:`Shutdown`), when its socket reaches end-of-file (the
main process closed it, or died: see ``_platform`` for why no other process holds that
end), or when its parent process changes (checked every ``WATCHDOG_INTERVAL`` seconds,
for the case where a descendant still holds the socket).

End-of-file is also watched *while the worker is busy*, by a thread that sleeps in
``poll(POLLRDHUP)`` on the socket (:func:`_exit_when_orphaned`): a worker stuck in a long
``__getitem__`` when the main process is SIGKILLed exits at once instead of when the
call returns. It works under every start method, unlike ``PR_SET_PDEATHSIG``, which
under forkserver watches the fork server, and otherwise the *thread* that started the
worker (a loader iterated from a thread that later ends would lose its workers). The
thread cannot run while the user's code holds the GIL in a long C call; such a worker
exits when the call returns.
"""

from __future__ import annotations

import os
import pickle
import select
import signal
import sys
import threading
import time
from collections import deque
from multiprocessing import reduction
from typing import Any, Callable, NamedTuple

from . import collate as _collate
from . import counters
from . import layout as _layout
from . import seeding
from .errors import RemoteError, WorkerError
from .channel import Inbox
from .fetch import check_indices, fetch
from .iterable import Stream, is_iterable_source, share_worker_info_with_torch
from .messages import (Attach, AttachBoard, Detach, Done, Draw, Exhausted, Failed, NeedSpace, Ready, Reassign,
                       Shutdown, SlotRef, StartupFailed, StreamPoint, Task)
from .shm import AttachedSegment
from .stream import MIN_SAMPLE_BYTES, StreamedBatch

WATCHDOG_INTERVAL = 0.5
_clock = time.perf_counter


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
    rank: int
    auto_batch: bool
    user: UserCode | bytes  # bytes: pickled in the main process (spawn, forkserver)
    conn: Any  # this worker's end of its socket to the main process


class _ParentGone(Exception):
    pass



def worker_main(args: WorkerArgs) -> None:
    """Process entry point. Ctrl-C is the main process's to handle: workers ignore SIGINT,
    so an interrupted run prints one traceback, not one per worker."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    # started with SIGINT blocked (NOTE [ Ctrl-C waits for a window ], _platform.py): a
    # Ctrl-C that came meanwhile is now ignored, not a traceback from this worker
    signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGINT})
    threading.Thread(target=_exit_when_orphaned, args=(args.conn.fileno(),), name="shmload-orphan-watch",
                     daemon=True).start()
    loop = _WorkerLoop(args)
    try:
        if loop.start():
            loop.run()
    except (_ParentGone, EOFError, ConnectionError):
        pass  # the main process is gone or closed our socket: nothing left to report to
    finally:
        loop.close()


def _exit_when_orphaned(fd: int) -> None:
    """Exit the process as soon as the main process's end of the socket is closed. Only a
    hang-up wakes this thread (POLLRDHUP, with POLLHUP and POLLERR, which poll always
    reports), never the data the worker's main thread reads."""
    watch = select.poll()
    watch.register(fd, select.POLLRDHUP)
    watch.poll()  # no time-out, and signals are retried (PEP 475): it returns only on a hang-up
    os._exit(0)  # nothing named to clean up: segments are unlinked, the socket dies with us


def limit_torch_threads() -> None:
    """One intra-op thread, as torch's workers have, if torch is imported (never import
    it: that costs a worker about a second). Not only against oversubscription: a
    worker forked after the parent used torch's thread pool (OpenMP) hangs in its first
    parallel torch op, since the pool's threads were not forked with it. Done before
    ``worker_init_fn``, which may raise it again."""
    torch = sys.modules.get("torch")
    if torch is not None:
        torch.set_num_threads(1)


class _WorkerLoop:
    def __init__(self, args: WorkerArgs):
        self.args = args
        self.conn = args.conn
        self.parent = os.getppid()
        self.segments: dict[int, AttachedSegment] = {}
        self.backlog: deque[Any] = deque()  # messages read while waiting for a Reassign
        self.user: UserCode | None = None
        self.last_layout: tuple[Any, bytes] = (None, b"")  # see pickled_layout()
        # The profiler (counters.py): this worker's row of the board, and the current
        # batch's seconds in the dataset and in collate, and its bytes.
        self.board: AttachedSegment | None = None
        self.recorder: counters.Recorder | None = None
        self.fetch_s = self.collate_s = 0.0
        self.nbytes = 0
        self.recording: tuple[Task, float, float] | None = None  # the batch being loaded, see record()
        self.samples = 0  # samples in the batch being loaded
        self.stream: Stream | None = None  # an iterable source's (iterable.py)
        self.torch_info = False  # has torch's get_worker_info() been told about this worker?
        self.inbox = Inbox(self.conn.fileno())
        # One poll object for the worker's life: Connection.poll() builds a selector per
        # call, ~10 us a batch.
        self.poller = select.poll()
        self.poller.register(self.inbox.sock.fileno(), select.POLLIN)

    # ------------------------------------------------------------ start-up
    def start(self) -> bool:
        global _worker_info
        a = self.args
        try:
            self.user = pickle.loads(a.user) if isinstance(a.user, bytes) else a.user
            _worker_info = WorkerInfo(a.worker_id, a.num_workers, a.seed, self.user.dataset)
            self.share_info_with_torch()
            limit_torch_threads()
            seeding.seed_worker(a.seed, a.worker_id)
            if self.user.worker_init_fn is not None:
                self.user.worker_init_fn(a.worker_id)
            if is_iterable_source(self.user.dataset):
                self.stream = Stream(self.user.dataset)  # calls reset_state(), after worker_init_fn
        except Exception as exc:
            self.send(StartupFailed(a.worker_id, RemoteError.capture(exc)))
            return False
        self.send(Ready(a.worker_id, os.getpid()))
        return True

    def share_info_with_torch(self) -> None:
        """Tell torch's ``get_worker_info()`` too, once torch is imported (checked again at
        every draw's epoch start: a dataset may import torch late)."""
        if not self.torch_info:
            a = self.args
            self.torch_info = share_worker_info_with_torch(a.worker_id, a.num_workers, a.seed, self.user.dataset)

    # ------------------------------------------------------------ messages
    def recv(self) -> Any:
        """The next message: from what was read already if it holds one (no system call),
        else after waiting for more."""
        return self.next_from(self.inbox.next_message)

    def recv_fd(self) -> int:
        return self.next_from(self.inbox.take_fd)

    def next_from(self, take: Callable[[], Any]) -> Any:
        """``take()``'s first result that is not None, reading the socket until then."""
        while (item := take()) is None:
            self.wait_readable()
        return item

    def wait_readable(self) -> None:
        while not self.poller.poll(WATCHDOG_INTERVAL * 1000):
            if os.getppid() != self.parent:
                raise _ParentGone()
        self.inbox.read()

    def send(self, msg: Any) -> None:
        self.conn.send_bytes(pickle.dumps(msg, pickle.HIGHEST_PROTOCOL))  # plain data, see messages.py

    def run(self) -> None:
        while True:
            waited_from = _clock()
            msg = self.backlog.popleft() if self.backlog else self.recv()
            if type(msg) is Task:
                self.load_recorded(msg, waited_from)
            elif type(msg) is Shutdown:
                return
            else:
                self.control(msg)

    def control(self, msg: Any) -> None:
        if type(msg) is Attach:
            fd = self.recv_fd()
            self.segments[msg.segment] = AttachedSegment(fd, msg.size)
        elif type(msg) is Detach:
            self.segments.pop(msg.segment).close()
        elif type(msg) is AttachBoard:
            self.board = AttachedSegment(self.recv_fd(), msg.size)
            self.recorder = counters.Recorder(counters.board(self.board.mmap, msg.rows), msg.row)
        else:
            raise TypeError(f"worker got an unexpected message {msg!r}")

    def await_reassign(self, iteration: int, seq: int) -> SlotRef | None:
        """Wait for the larger slot. Tasks that arrive meanwhile wait in the backlog: the
        batch at hand is the oldest this worker holds, so it goes first (in-order delivery
        would wait for it anyway). This costs one round trip, only when the ring grows."""
        while True:
            msg = self.recv()
            if type(msg) is Reassign and (msg.iteration, msg.seq) == (iteration, seq):
                return msg.slot
            if type(msg) in (Task, Shutdown):
                self.backlog.append(msg)
            else:
                self.control(msg)

    # ------------------------------------------------------------ the data path
    def load_recorded(self, task: Task, waited_from: float) -> None:
        """Load ``task`` and add its times to this worker's counters (about 2 us)."""
        self.fetch_s = self.collate_s = 0.0
        self.nbytes = self.samples = 0
        self.recording = (task, waited_from, _clock())
        try:
            self.load(task)
        finally:
            self.record()  # if no result was sent (an abandoned epoch's batch)

    def record(self) -> None:
        """Add the batch being loaded to the counters. Called just before its result is
        sent, so the counters already hold a batch when the main process sees it, and
        nothing is lost when the worker is stopped right after its last result."""
        if self.recording is None or self.recorder is None:
            return
        task, waited_from, started = self.recording
        self.recording = None
        self.recorder.batch(task.seq, waited_from, started, self.fetch_s, self.collate_s, _clock(), self.samples,
                            self.nbytes)

    def load(self, task: Task) -> None:
        a, user = self.args, self.user
        if type(task.indices) is Draw:
            self.load_draw(task)
            return
        self.samples = len(task.indices) if a.auto_batch else 1
        written = False
        try:
            seeding.seed_globals(a.seed, task.epoch, task.seq, a.rank)
            if self.streams(task):
                streamed = self.load_streamed(task)
                if streamed is None:
                    return  # its epoch was abandoned while it waited for a slot
                plan, written = streamed
            else:
                t0 = _clock()
                samples = fetch(user.dataset, task.indices, a.auto_batch)
                t1 = _clock()
                plan = _collate.make_plan(samples, task.indices, user.collate_fn, a.auto_batch)
                self.fetch_s, self.collate_s = t1 - t0, _clock() - t1
        except Exception as exc:
            self.fail(task.iteration, task.seq, exc)
            return
        if written:
            self.done(task.iteration, task.seq, plan)
        else:
            self.place(task.iteration, task.seq, plan, task.slot)

    def load_draw(self, task: Task) -> None:
        """Load the next batch of this worker's stream (an iterable source)."""
        a, draw = self.args, task.indices
        if not self.torch_info:
            self.share_info_with_torch()
        stream = self.stream
        try:
            t0 = _clock()
            samples = stream.draw(task.iteration, draw, lambda n: seeding.seed_globals(
                a.seed, task.epoch, seeding.stream_position(n, a.worker_id, a.num_workers), a.rank))
            if samples is None:
                self.recording = None  # no batch: the profiler does not count it
                self.send(Exhausted(task.iteration, task.seq))
                return
            point = stream.point()
            t1 = _clock()
            self.samples = len(samples) if a.auto_batch else 1
            plan = _collate.make_plan(samples, None, self.user.collate_fn, a.auto_batch)
            self.fetch_s, self.collate_s = t1 - t0, _clock() - t1
        except Exception as exc:
            self.fail(task.iteration, task.seq, exc, stream.point(failed=True))
            return
        self.place(task.iteration, task.seq, plan, task.slot, point)

    def streams(self, task: Task) -> bool:
        """May this batch be fetched and written one sample at a time (see stream.py)?"""
        user = self.user
        return (self.args.auto_batch and user.collate_fn is None and len(task.indices) > 0
                and not hasattr(user.dataset, "__getitems__"))

    def load_streamed(self, task: Task) -> tuple[_layout.Plan, bool] | None:
        """The batch's plan, and whether it is written already: streamed into its slot, or,
        if its samples are small, fetched whole and planned the default way (reusing what
        sample 0 told). None if the epoch was abandoned while waiting for a slot.

        The first sample tells the batch's size, so a batch without a (large enough) slot
        asks for one right then, before fetching the rest: even the batches that size the
        ring never sit whole in the worker's heap."""
        dataset, indices = self.user.dataset, task.indices
        t0 = _clock()
        check_indices(dataset, indices)
        first = dataset[indices[0]]
        t1 = _clock()
        batch = StreamedBatch(first, indices)
        if batch.sample_bytes < MIN_SAMPLE_BYTES:
            t2 = _clock()
            rest = [dataset[i] for i in indices[1:]]
            t3 = _clock()
            plan = batch.plan([first] + rest)
            self.fetch_s, self.collate_s = (t1 - t0) + (t3 - t2), (t2 - t1) + (_clock() - t3)
            return plan, False
        del first
        self.fetch_s = t1 - t0
        slot = self.slot_for(task.iteration, task.seq, batch.nbytes, task.slot)
        if slot is None:
            return None
        target = self.slot_array(slot)
        t2 = _clock()
        plan = batch.write(_layout.slot_destination(target), self.timed_fetch(indices[1:]))
        _layout.write(plan, _layout.slot_destination(target))  # the small leaves (Python scalars)
        self.collate_s = _clock() - t2 - (self.fetch_s - (t1 - t0))  # writing, without the fetches within
        return plan, True

    def timed_fetch(self, indices: Any) -> Any:
        """The samples at ``indices``, one at a time, their fetch time added to ``fetch_s``."""
        dataset = self.user.dataset
        for i in indices:
            t = _clock()
            sample = dataset[i]
            self.fetch_s += _clock() - t
            yield sample
            del sample

    def slot_for(self, iteration: int, seq: int, nbytes: int, slot: SlotRef | None) -> SlotRef | None:
        """``slot`` if it holds ``nbytes``, else a larger one asked for (None: the epoch
        was abandoned meanwhile)."""
        while slot is None or nbytes > slot.capacity:
            self.send(NeedSpace(iteration, seq, nbytes))
            slot = self.await_reassign(iteration, seq)
            if slot is None:
                return None
        return slot

    def slot_array(self, slot: SlotRef):
        return self.segments[slot.segment].array[slot.offset:slot.offset + slot.capacity]

    def place(self, iteration: int, seq: int, plan: _layout.Plan, slot: SlotRef | None,
              stream: StreamPoint | None = None) -> None:
        """Write the batch into its slot and report it, or ask for a larger slot. (A
        stream's batch waits here for a larger slot too: it cannot be read again.)"""
        if plan.layout.nbytes == 0:  # nothing but small Python objects: no slot needed
            self.done(iteration, seq, plan, stream)
            return
        slot = self.slot_for(iteration, seq, plan.layout.nbytes, slot)
        if slot is None:
            return  # its epoch was abandoned
        t = _clock()
        try:
            _layout.write(plan, _layout.slot_destination(self.slot_array(slot)))
        except Exception as exc:
            self.fail(iteration, seq, exc, stream)
            return
        finally:
            self.collate_s += _clock() - t
        self.done(iteration, seq, plan, stream)

    def done(self, iteration: int, seq: int, plan: _layout.Plan, stream: StreamPoint | None = None) -> None:
        try:
            layout = self.pickled_layout(plan.layout)
        except Exception as exc:
            try:
                raise WorkerError("the batch holds a value that cannot be pickled to the main process "
                                  f"(only arrays go through shared memory; other leaves are pickled): {exc}") from exc
            except WorkerError as err:
                self.fail(iteration, seq, err, stream)
            return
        self.nbytes = plan.layout.nbytes
        self.record()
        self.send(Done(iteration, seq, layout, stream))

    def pickled_layout(self, layout: _layout.Layout) -> bytes:
        """The layout's pickle, reused while batches keep the same layout. Only layouts of
        arrays alone are compared: object leaves hold the user's values, whose ``==`` may
        be expensive or not a plain bool."""
        if any(type(leaf) is _layout.ObjectValue for leaf in layout.leaves):
            return bytes(reduction.ForkingPickler.dumps(layout))
        if layout == self.last_layout[0]:
            return self.last_layout[1]
        data = pickle.dumps(layout, pickle.HIGHEST_PROTOCOL)
        self.last_layout = (layout, data)
        return data

    def fail(self, iteration: int, seq: int, exc: BaseException, stream: StreamPoint | None = None) -> None:
        error = RemoteError.capture(exc)
        self.record()
        self.send(Failed(iteration, seq, error, stream))

    def close(self) -> None:
        for seg in self.segments.values():
            try:
                seg.close()
            except BufferError:
                pass
        self.segments.clear()
        if self.recorder is not None:
            self.recorder.close()
            self.recorder = None
        if self.board is not None:
            try:
                self.board.close()
            except BufferError:
                pass
        self.inbox.close()
        try:
            self.conn.close()
        except OSError:
            pass
