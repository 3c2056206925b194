"""The worker loop: receive a task, load and collate the batch straight into its slot,
report completion. Runs in each worker process.

A worker does not wait for space in steady state: the main process sends each task with
a free slot (credit-based dispatch). Only when a batch is larger than its slot (the first
batch, before the ring is sized; variable-size data) does the worker keep the collated
batch, say :class:`NeedSpace`, and wait for the :class:`Reassign` that names a larger
slot; nothing is loaded twice.

A worker exits when told (:class:`Shutdown`), when its socket reaches end-of-file (the
main process closed it, or died: see ``_platform`` for why no other process holds that
end), or when its parent process changes (checked every ``port.WATCHDOG_INTERVAL`` seconds,
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
import threading
import time
from collections import deque
from typing import Any, Callable, NamedTuple

from .._batching.batcher import Plan
from .._batching.collate import StackPlans, write
from .._batching.layout import SlotViews, span_destination, widened
from .._core._torch import loaded_torch
from .._ordering import seeding
from .._ordering.shuffle import StreamShuffle
from .._ordering.sources import is_iterable_source, share_worker_info_with_torch
from .._ordering.stream import Stream
from .._transport import wire
from .._transport.messages import (
    Attach,
    AttachBoard,
    Detach,
    Done,
    Draw,
    Exhausted,
    Failed,
    NeedSpace,
    Ready,
    Reassign,
    Shutdown,
    SlotRef,
    StartupFailed,
    StreamPoint,
    Task,
)
from .._transport.shm import AttachedSegment
from ..errors import RemoteError, WorkerError
from ..profiler import counters
from . import rowwise
from .loading import ENDED, BatchSource, BatchTimer, load_batch
from .port import ParentGone, Port
from .port import close_mapping as _close_mapping

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
    # a UserCode under fork; under spawn and forkserver the main process gives a PerWorker
    # (_session/shipping.py), which pickles into the bytes this worker gets (unpickled in start())
    user: Any
    conn: Any  # this worker's end of its socket to the main process
    stream_shuffle: StreamShuffle | None = None  # an iterable source's shuffling (shuffle.py)




def worker_main(args: WorkerArgs) -> None:
    """Process entry point. Ctrl-C is the main process's to handle: workers ignore SIGINT,
    so an interrupted run prints one traceback, not one per worker."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    # started with SIGINT blocked (NOTE [ Interrupts wait for a window ], _signals.py): a
    # Ctrl-C that came meanwhile is now ignored, not a traceback from this worker
    signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGINT})
    threading.Thread(target=_exit_when_orphaned, args=(args.conn.fileno(),), name="shmload-orphan-watch",
                     daemon=True).start()
    loop = _WorkerLoop(args)
    try:
        if loop.start():
            loop.run()
    except (ParentGone, EOFError, ConnectionError):
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
    torch = loaded_torch()
    if torch is not None:
        torch.set_num_threads(1)


class _WorkerLoop:
    def __init__(self, args: WorkerArgs):
        self.args = args
        self.segments: dict[int, AttachedSegment] = {}
        self.views = SlotViews()  # kept views into the slots (layout.py), forgotten before a segment closes
        self.backlog: deque[Any] = deque()  # messages read while waiting for a Reassign
        self.user: UserCode | None = None
        self.layout_ids = wire.LayoutIds()  # the layouts the main process has (see done())
        # The profiler (profiler/counters.py): this worker's row of the board, and the
        # figures of the batch at hand, recorded once (see record()).
        self.board: AttachedSegment | None = None
        self.recorder: counters.Recorder | None = None
        self.timer = BatchTimer()
        self.recording = False
        self.stream: Stream | None = None  # an iterable source's (stream.py)
        # what batches are loaded from (loading.py): set by start(), and run() follows only a start() that succeeded
        self.source: BatchSource
        self.task: Task | None = None  # the task at hand, and the slot it is to be written into
        self.slot: SlotRef | None = None
        self.torch_info = False  # has torch's get_worker_info() been told about this worker?
        self.port = Port(args.conn)  # messages in and out (port.py)

    # ------------------------------------------------------------ start-up
    def start(self) -> bool:
        global _worker_info
        a = self.args
        try:
            self.port.attach_control()
            user: UserCode = pickle.loads(a.user) if isinstance(a.user, bytes) else a.user
            self.user = user
            _worker_info = WorkerInfo(a.worker_id, a.num_workers, a.seed, user.dataset)
            self.share_info_with_torch(user.dataset)
            limit_torch_threads()
            seeding.seed_worker(a.seed, a.worker_id)
            if user.worker_init_fn is not None:
                user.worker_init_fn(a.worker_id)
            if is_iterable_source(user.dataset):
                self.stream = Stream(user.dataset)  # calls reset_state(), after worker_init_fn
            self.source = BatchSource(user.dataset, user.collate_fn, a.auto_batch, a.seed, a.rank,
                                      self.stream, a.worker_id, a.num_workers, StackPlans(), a.stream_shuffle)
        except Exception as exc:
            self.send(StartupFailed(a.worker_id, RemoteError.capture(exc)))
            return False
        self.send(Ready(a.worker_id, os.getpid()))
        return True

    def share_info_with_torch(self, dataset: Any) -> None:
        """Tell torch's ``get_worker_info()`` too, once torch is imported (checked again at
        every draw's epoch start: a dataset may import torch late)."""
        if not self.torch_info:
            a = self.args
            self.torch_info = share_worker_info_with_torch(a.worker_id, a.num_workers, a.seed, dataset)

    # ------------------------------------------------------------ messages
    def recv(self) -> Any:
        return self.port.recv()

    def recv_fd(self) -> int:
        return self.port.recv_fd()

    def send(self, msg: Any) -> None:
        self.port.send(msg)

    def run(self) -> None:
        while True:
            waited_from = _clock()
            msg = self.backlog.popleft() if self.backlog else self.recv()
            if type(msg) is Task:
                self.load(msg, waited_from)
            elif type(msg) is Shutdown:
                return
            else:
                self.control(msg)

    def control(self, msg: Any) -> None:
        if type(msg) is Attach:
            fd = self.recv_fd()
            self.segments[msg.segment] = AttachedSegment(fd, msg.size)
        elif type(msg) is Detach:
            self.views.forget(msg.segment)
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
    def load(self, task: Task, waited_from: float) -> None:
        """Load ``task`` into its slot and report it; its figures go to this worker's
        counters (about 1.5 us a batch with the clock readings, docs/performance.md)."""
        self.timer.begin(task.seq, waited_from)
        self.recording = True
        self.task, self.slot = task, task.slot
        try:
            self.load_and_report(task)
        finally:
            self.record()  # if no result was sent (an abandoned epoch's batch)
            self.task = self.slot = None

    def load_and_report(self, task: Task) -> None:
        src, load = self.source, task.load
        draw = type(load) is Draw
        if draw and not self.torch_info:
            self.share_info_with_torch(src.dataset)
        point = None
        try:
            by_rows = self.load_rowwise if not draw and rowwise.applies(
                src.dataset, src.collate_fn, src.auto_batch, load, src.plans) else None
            plan = load_batch(src, task.epoch, task.seq, load, task.iteration, self.timer, by_rows, task.parts,
                              task.span, task.bound, task.position)
            if plan is ENDED:
                self.recording = False  # no batch: the profiler does not count it
                self.send(Exhausted(task.iteration, task.seq))
                return
            if plan is None:
                return  # its epoch was abandoned while it waited for a slot
            if draw:
                point = self.drawn().point()
        except Exception as exc:
            self.fail(task, exc, self.drawn().point(failed=True) if draw else None)
            return
        self.place(task, plan, point)

    def drawn(self) -> Stream:
        """The stream a Draw is from: only an iterable source's tasks are draws."""
        assert self.stream is not None, "a Draw, but the source is not iterable"
        return self.stream

    def load_rowwise(self, indices: Any, timer: BatchTimer, cuts: Any, reseed: Any, bound: int | None) -> Plan | None:
        """The batch written row by row into its slot as it is fetched (rowwise.py)."""
        task = self.task
        assert task is not None, "load_rowwise() outside load()"  # called back by load_batch, from load()
        return rowwise.load_rowwise(self.source.dataset, indices, timer, self.slot_space, self.source.plans, cuts,
                                    reseed, task.span, bound)

    def slot_space(self, nbytes: int) -> Any:
        """The slot of the batch at hand as a uint8 array holding ``nbytes``: the task's,
        or a larger one asked for (None: the epoch was abandoned meanwhile)."""
        slot = self.slot_for(nbytes)
        return None if slot is None else self.slot_array(slot)

    def slot_for(self, nbytes: int) -> SlotRef | None:
        """The batch at hand's slot if it holds ``nbytes``, else a larger one asked for
        (None: the epoch was abandoned meanwhile)."""
        task = self.task
        assert task is not None, "slot_for() outside load()"  # (from place(), or rowwise's slot_space)
        while self.slot is None or nbytes > self.slot.capacity:
            self.send(NeedSpace(task.iteration, task.seq, nbytes))
            self.slot = self.await_reassign(task.iteration, task.seq)
            if self.slot is None:
                return None
        return self.slot

    def slot_array(self, slot: SlotRef):
        return self.segments[slot.segment].array[slot.offset:slot.offset + slot.capacity]

    def place(self, task: Task, plan: Plan, point: StreamPoint | None) -> None:
        """Write the batch into its slot and report it, or ask for a larger slot. (A
        stream's batch waits here for a larger slot too: it cannot be read again.) Leaves
        written already (row by row) have no source in ``plan`` and are skipped. A span's
        plan is of its rows: it is written into those rows of the whole batch's layout,
        which is what it reports (the main process puts the spans together)."""
        span = task.span
        layout = plan.layout if span is None else widened(plan.layout, span.rows)
        if layout.nbytes == 0:  # nothing but small Python objects: no slot needed
            self.done(task, plan, point, layout)
            return
        slot = self.slot_for(layout.nbytes)
        if slot is None:
            return  # its epoch was abandoned
        self.timer.to_other()
        try:
            if span is None:
                recur = self.source.plans is not None and self.source.plans.holds(layout)
                write(plan, self.views.destination(slot, self.segments[slot.segment].array, layout, recur))
            else:
                write(plan, span_destination(self.slot_array(slot), plan.layout, layout, span.start, span.stop))
        except Exception as exc:
            self.timer.to_collate()
            self.fail(task, exc, point)
            return
        self.timer.to_collate()
        self.done(task, plan, point, layout)

    def done(self, task: Task, plan: Plan, point: StreamPoint | None, layout: Any = None) -> None:
        """Report the batch; ``layout``: the whole batch's, of which ``plan`` is a span's."""
        try:
            layout_id, data = self.layout_ids.ref(layout if layout is not None else plan.layout)
        except Exception as exc:
            try:
                raise WorkerError("the batch holds a value that cannot be pickled to the main process "
                                  f"(only arrays go through shared memory; other leaves are pickled): {exc}") from exc
            except WorkerError as err:
                self.fail(task, err, point)
            return
        self.timer.nbytes = plan.layout.nbytes  # (a span's own rows)
        self.record()
        self.send(Done(task.iteration, task.seq, layout_id, data, point))

    def record(self) -> None:
        """Add the batch at hand to the counters, once. Called just before its result is
        sent, so the counters already hold a batch when the main process sees it, and
        nothing is lost when the worker is stopped right after its last result."""
        if self.recording and self.recorder is not None:
            self.timer.record(self.recorder)
        self.recording = False

    def fail(self, task: Task, exc: BaseException, point: StreamPoint | None = None) -> None:
        error = RemoteError.capture(exc)
        self.record()
        self.send(Failed(task.iteration, task.seq, error, point))

    def close(self) -> None:
        self.views.forget()
        for seg in self.segments.values():
            _close_mapping(seg)
        self.segments.clear()
        if self.recorder is not None:
            self.recorder.close()
            self.recorder = None
        if self.board is not None:
            _close_mapping(self.board)
        self.port.close()

