"""Session: the workers, their ring and the tasks in flight, for one or more epochs.

An epoch iterator (``epoch.py``) asks the session to dispatch batches and to report
results; everything that must survive from one epoch to the next with
``persistent_workers=True`` lives here. Each ``iter()`` begins a new *iteration*; results
of an earlier one (an epoch left with ``break``) are recognised by their iteration
number, and their slots go straight back to the ring.

Slots. Which batch gets which slot, and when waiting for one can no longer help, is
decided by the :class:`~shmload._session.allocation.SlotAllocator`; the session carries it out
(a task sent with its slot, a :class:`Reassign` for a worker that waited for a larger one).

Worker deaths. A dead worker is reported as :class:`WorkerDiedError`, unless the loader
still has restarts left (``max_worker_restarts``): then a replacement with the same id
is started and sent the dead one's tasks again, unchanged, in order: same batch
positions, hence the same seeds, and the same slots (nothing else can write them: their
only writer is dead). The epoch then yields exactly what it would have without the
fault. A worker that dies before it reported ready is never restarted, since its
replacement would most likely die the same way.
"""

from __future__ import annotations

import functools
import os
import threading
import warnings
from typing import Any, NamedTuple

from .._batching.layout import LayoutCache
from .._core import _signals
from .._core._units import binary_size
from .._loading.worker import UserCode
from .._transport import wire
from .._transport.limits import default_bound
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
    StartupFailed,
    StreamPoint,
    Task,
)
from .._transport.ring import Ring, Slot, SlotState
from .._transport.shm import Segment
from ..errors import (
    ShmloadError,
    ShmloadWarning,
    WorkerError,
    WorkerStartupError,
    death_error,
    describe_load,
    restart_message,
    starting_steps,
)
from ..profiler import counters
from ..profiler.profile import cpu_seconds
from . import lifetime
from .allocation import SlotAllocator
from .config import LoaderConfig
from .dispatch import DEFAULT_PREFETCH, Dispatcher, InFlight, prefetch_depth
from .results import Ended, Loaded, LoadFailed
from .spans import SplitBatches
from .supervisor import Supervisor, owned_here

# Seconds close() waits for another thread's next() in progress to see the session
# closed and let go (it looks after every wait, at most epoch.POLL_INTERVAL); past it, a
# next() stuck elsewhere is not waited for.
CLOSE_WAIT = 5.0


class WorkersBusy(NamedTuple):
    """The workers' loading so far, from the profiler's counters (Session._busy)."""

    seconds: float  # loading, not waiting
    batches: int
    samples: int


class RestartBudget:
    """The worker restarts one loader has used, shared by its sessions: the bound
    ``max_worker_restarts`` is per loader, not per epoch."""

    def __init__(self) -> None:
        self.used = 0


class Session:
    def __init__(self, cfg: LoaderConfig, restarts: RestartBudget | None = None, profile: Any = None):
        self.cfg = cfg
        self.profile = profile  # the loader's Profile (profile.py), told when this session closes
        self.restarts = restarts if restarts is not None else RestartBudget()
        self.owner_pid = os.getpid()
        self.iteration = 0
        self.lock = threading.RLock()  # NOTE [ Threads sharing a session ] (re-entered by close())
        self.closed = False
        self._released = False  # NOTE [ A close() that did not finish ]
        self._cpu: dict | None = None  # the workers' CPU seconds, read as close() begins
        self.releases = lifetime.ReleaseQueue()
        self._layouts = LayoutCache()
        self._carried: list = []  # results read by a poll() that then raised (see poll())
        self.splits = SplitBatches(self)  # split batches in flight (spans.py)
        # For an iterable source: each worker's stream position after its last finished
        # draw of this iteration, where a restarted worker takes up its stream (_restart).
        self._stream_points: dict[int, StreamPoint] = {}
        # A restarted worker that held no draw: where its stream starts, for its next draw.
        self._pending_restores: dict[int, StreamPoint] = {}
        # (without max_shm_bytes, the bound is read once the loader's own segments exist: below)
        self.ring = Ring(functools.partial(Segment, pinner=cfg.pinner, backend=cfg.shm_backend), self._target_slots,
                         cfg.max_shm_bytes or 0,
                         bound_source="max_shm_bytes", on_attach=self._attach, on_detach=self._detach)
        self.dispatcher = Dispatcher(cfg.num_workers, self._depth(self.ring.slot_bytes))
        self._retune_at = 4 * cfg.num_workers  # completions after which the depth is retuned (_retune)
        self.allocator = SlotAllocator(self.ring, self.dispatcher)
        self._board_segment: Segment | None = None
        self.board = None
        self.supervisor: Supervisor | None = None
        # From here on anything may raise, a Ctrl-C included: close() releases what exists.
        try:
            # The profiler's board: one row of counters per worker (counters.py), ~256 KiB each.
            self._board_segment = Segment(-1, counters.board_bytes(cfg.num_workers), backend=cfg.shm_backend)
            self.board = counters.board(self._board_segment.mmap, cfg.num_workers)
            self.supervisor = Supervisor(cfg.context, cfg.num_workers, cfg.seed, cfg.rank, cfg.auto_batch,
                                         UserCode(cfg.dataset, cfg.collate_fn, cfg.worker_init_fn), cfg.stream_shuffle,
                                         shm_backend=cfg.shm_backend)
            for h in self.supervisor.workers:
                self._send_board(h.id)
            if cfg.max_shm_bytes is None:
                # NOTE [ The default bound leaves out the loader's own segments ]
                # The memory left (limits.py) is read after the board and the control
                # segment (about 1 MiB with 4 workers) took their share. Read before, it
                # counted them as room for the ring, which then grew to a size it could not
                # reserve (a SharedMemoryError on a 37 MiB /dev/shm, where 24 MiB loaded fine).
                self.ring.bound = default_bound(cfg.shm_backend)
            if profile is not None:
                profile.attach(self)
            if cfg.slot_bytes:
                self.ring.grow_capacity(cfg.slot_bytes)
        except BaseException:
            self.close()
            raise

    def _send_board(self, wid: int) -> None:
        seg = self._board_segment
        self.supervisor.send(wid, AttachBoard(seg.size, self.cfg.num_workers, wid), fd=seg.fd)

    def _close_board(self) -> None:
        self.board = None
        if self._board_segment is not None:
            self._board_segment.close()  # (idempotent, as ring.close() and supervisor.shutdown() are)

    # ------------------------------------------------------------ the profile's view (profiler.profile.ProfiledSession)
    def worker_pids(self) -> dict[int, int]:
        """Worker id -> pid of the live workers."""
        return {h.id: h.pid for h in self.supervisor.workers if not h.exited} if self.supervisor else {}

    def profile_settings(self) -> tuple[int, int, int, int]:
        """(num_workers, tasks each worker may hold, ring slots, bytes per slot)."""
        return self.cfg.num_workers, self.dispatcher.per_worker, self.ring.num_slots, self.ring.slot_bytes

    # ------------------------------------------------------------ depth
    def _target_slots(self, slot_bytes: int) -> int:
        """The ring's target: the batches in flight, plus two the consumer may hold (ring.py)."""
        return self.cfg.num_workers * self._depth(slot_bytes) + 2

    def _depth(self, slot_bytes: int, batch_seconds: float | None = None) -> int:
        """The depth for slots of ``slot_bytes`` (and a measured ``batch_seconds``). By bytes
        alone, it is what the ring is sized for: an upper bound, so that a depth retuned by
        pace never needs a larger ring."""
        return prefetch_depth(self.cfg.prefetch_factor, slot_bytes, self.cfg.num_workers, self.ring.max_bytes,
                              batch_seconds)

    def _retune(self) -> None:
        """The automatic depth again, with the workers' pace as measured so far (the
        profiler's counters; ``dispatch.DEPTH_SECONDS``): torch's 2 until a batch has been
        measured, so that small batches slow to load never queue deep. At the ring's
        sizing, at every iteration, and after 4, 16, 64... times ``num_workers`` batches
        have come back."""
        done = self.dispatcher.completed
        while self._retune_at <= done:
            self._retune_at *= 4
        if self.cfg.prefetch_factor is not None or not self.ring.slot_bytes:
            return
        busy = self._busy()
        if busy is None or not busy.batches:
            self.dispatcher.per_worker = DEFAULT_PREFETCH
        else:
            self.dispatcher.per_worker = self._depth(self.ring.slot_bytes, busy.seconds / busy.batches)

    @property
    def outstanding(self) -> int:
        """How many batches an epoch keeps outstanding (dispatched, or ready and not yet
        yielded), as torch counts them: ``num_workers`` times the prefetch depth, which
        for ``prefetch_factor=None`` is known once the first batch has sized the ring."""
        return self.cfg.num_workers * self.dispatcher.per_worker

    def seconds_per_sample(self) -> float | None:
        """The workers' mean time per sample so far (the profiler's counters: loading,
        not waiting); None before any sample."""
        busy = self._busy()
        return busy.seconds / busy.samples if busy is not None and busy.samples else None

    def _busy(self) -> WorkersBusy | None:
        """The workers' loading so far; None without the profiler's counters."""
        if self.board is None:
            return None
        t = counters.totals(self.board)
        f = {name: i for i, name in enumerate(counters.FIELDS)}
        busy = t[:, f["fetch"]].sum() + t[:, f["collate"]].sum() + t[:, f["other"]].sum()
        return WorkersBusy(float(busy), int(t[:, f["batches"]].sum()), int(t[:, f["samples"]].sum()))

    def worth_dispatching(self, room: int) -> bool:
        """Whether to send tasks now, with ``room`` more batches allowed outstanding.

        With deep queues (small batches, ``prefetch_factor=None``) tasks go out in bursts:
        once a quarter of every worker's depth is free, or as soon as a worker holds
        nothing. Each task sent to a sleeping worker costs a wake-up (a system call and a
        context switch, tens of microseconds here: docs/performance.md), so sending four
        at once wakes a worker once per four batches; a worker that still holds three
        quarters of its depth has plenty to do meanwhile. Depths under 4 (large batches,
        where a wake-up is nothing beside the batch) send every task at once."""
        burst = self.dispatcher.per_worker // 4
        return room >= max(1, burst * self.cfg.num_workers) or (room > 0 and self.dispatcher.idle())

    # ------------------------------------------------------------ segments
    def _attach(self, seg: Segment) -> None:
        # The slot size changes only with a new segment, so the depth follows it here.
        self._retune()
        for h in self.supervisor.live():
            self.supervisor.send(h.id, Attach(seg.id, seg.size), fd=seg.fd)

    def _detach(self, seg: Segment) -> None:
        for h in self.supervisor.live():
            self.supervisor.send(h.id, Detach(seg.id))

    # ------------------------------------------------------------ epochs
    # NOTE [ Threads sharing a session ]
    # With persistent_workers=True every iter() of the loader gets an iterator over the
    # same session: one set of workers, queues, ring slots and results in flight. Two
    # threads each running `for b in loader` would otherwise poll the same workers at
    # once and file each other's results (batches of the other epoch or of zeros, a
    # sequence number "arrived twice", a half-done reassignment). So an iterator's
    # next() and a new iterator's begin_iteration() run under the session's one lock: a
    # newer iter() waits for the older iterator's next() in progress to return, then
    # takes over, and the older iterator's following next() sees a newer iteration and
    # raises its clear ShmloadError. A non-persistent session has one iterator, for which
    # the lock is what keeps threads sharing that iterator to one next() at a time. And
    # close() from another thread (loader.close(), a finalizer) marks the session closed,
    # then takes the lock: a next() waiting for workers sees the mark after its wait (at
    # most POLL_INTERVAL), raises the same error and lets go, and only then are the
    # mappings it was waiting in unmapped (before: a segfault). The lock is re-entrant:
    # a next() closes its own session at the epoch's end or on a worker's death.
    def begin_iteration(self) -> int:
        """Start a new iteration (under :attr:`lock`). What an abandoned one left is given
        back: batches that were ready but never yielded, and batches still waiting for a
        larger slot."""
        if self.closed:
            raise ShmloadError("this loader's workers were shut down (close() was called, or a worker failed)")
        self.iteration += 1
        self.collect_releases()
        for slot in self.ring.slots_in(SlotState.READY):
            self.ring.release(slot)
        for wait in self.allocator.abandon():
            self.supervisor.send(wait.worker, Reassign(wait.need.iteration, wait.need.seq, None))
        self._stream_points.clear()
        self._pending_restores.clear()
        self._retune()
        return self.iteration

    def collect_releases(self) -> None:
        for slot in self.releases.drain():
            self.ring.release(slot)

    def try_dispatch(self, epoch: int, seq: int, load: Any, worker: int | None = None, parts: int = 1) -> bool:
        """Send one batch to ``worker`` (None: the least busy one). False if that worker
        (every worker) is full, or the allocator has no slot for it now. ``parts``: the
        batch's parts, each seeded for itself (NOTE [ Parts of a batch ], parts.py)."""
        self.collect_releases()
        self._serve()
        if self.allocator.waiting:
            return False
        wid = self.dispatcher.pick() if worker is None else worker if self.dispatcher.has_room(worker) else None
        if wid is None:
            return False
        ok, slot = self.allocator.for_task(self.iteration)
        if not ok:
            return False
        if self._pending_restores:
            load = self._restored(wid, load)
        task = Task(self.iteration, epoch, seq, load, slot.ref if slot is not None else None, parts)
        self.dispatcher.assign(wid, (self.iteration, seq), InFlight(task, slot))
        self.supervisor.send(wid, task, defer=True)  # leaves with the fill's other tasks: see flush()
        return True

    def try_dispatch_spans(self, epoch: int, seq: int, load: Any, parts: int, spans: list) -> bool:
        """Send one batch in spans, ``(worker, parts.Span)`` pairs, each worker's rows into
        the batch's one slot (spans.py). False if the allocator has no slot for it now."""
        self.collect_releases()
        self._serve()
        if self.allocator.waiting:
            return False
        ok, slot = self.allocator.for_task(self.iteration)
        if ok:
            self.splits.send(epoch, seq, load, parts, spans, slot)
        return ok

    def flush(self) -> None:
        """Send the tasks dispatched since the last flush. The epoch calls it after each
        round of dispatching (and :meth:`poll` before it waits)."""
        self.supervisor.flush()

    def _serve(self) -> None:
        """Send the larger slots the allocator grants to workers waiting for one."""
        for grant in self.allocator.serve(self.iteration):
            self.supervisor.send(grant.worker, Reassign(grant.iteration, grant.seq, grant.slot.ref))

    def raise_if_stuck(self, head: int | None) -> None:
        """Called before the epoch blocks: raise if no batch can arrive by waiting
        (allocation.py; ``head`` is the batch the consumer needs next)."""
        self.collect_releases()
        self._serve()
        self.allocator.raise_if_stuck(self.iteration, head)

    # ------------------------------------------------------------ results
    def poll(self, timeout: float) -> list[Loaded | LoadFailed]:
        """Results of the current iteration that arrived within ``timeout`` seconds.

        Ring growth happens here, before any message is read, so an error it raises never
        loses results already received."""
        self.collect_releases()
        self._serve()
        records, dead = self.supervisor.poll(timeout)
        results, self._carried = self._carried, []
        for wid, record in records:
            result = self._handle(wid, wire.decode_to_main(record))
            if result is not None:
                results.append(result)
        if dead:
            try:
                self._report_deaths(dead)
            except BaseException:
                # e.g. the restart warning turned into an error by a warnings filter: the
                # session goes on, and these results must not be lost with the exception
                self._carried = results
                raise
        if self.dispatcher.completed >= self._retune_at:
            self._retune()
        return results

    def _handle(self, wid: int, msg: Any) -> Loaded | LoadFailed | Ended | None:
        kind = type(msg)
        if kind is Ready:
            self.supervisor.workers[wid].ready = True
            return None
        if kind is StartupFailed:
            self.close()
            raise WorkerStartupError(
                f"DataLoader worker process {wid} failed during start-up, before loading any batch "
                f"({msg.error.type_name}: {msg.error.message}).\nOriginal {msg.error.traceback}")
        key = (msg.iteration, msg.seq)
        stale = msg.iteration != self.iteration
        if key in self.splits:
            return self.splits.result(wid, kind, msg, key, stale)
        if kind is NeedSpace:
            if stale:
                self._give_back(self.dispatcher.complete(wid, key).slot)
                self.supervisor.send(wid, Reassign(msg.iteration, msg.seq, None))
            else:
                self.allocator.wants(wid, msg)  # served by the next poll() or try_dispatch()
            return None
        entry = self.dispatcher.complete(wid, key)
        if kind is Done:
            try:  # every layout sent is loaded, a stale batch's too: the worker counts it as known
                layout = self._layouts.load(wid, msg.layout_id, msg.layout)
            except Exception as exc:
                layout = exc
        if stale or kind is not Done:
            self._give_back(entry.slot)
            if stale:
                return None
            if kind is Exhausted:
                return Ended(msg.seq, wid)
        stream = None
        if msg.stream is not None:
            self._stream_points[wid] = msg.stream
            stream = (wid, msg.stream)
        if kind is Failed:
            where = (f"in DataLoader worker process {wid} while loading batch {msg.seq} "
                     f"({describe_load(entry.task.load)})")
            return LoadFailed(msg.seq, msg.error.rebuild(where), stream)
        if isinstance(layout, Exception):
            exc = layout
            self._give_back(entry.slot)
            return LoadFailed(msg.seq, WorkerError(
                f"batch {msg.seq} from DataLoader worker process {wid} could not be unpickled in the main "
                f"process ({type(exc).__name__}: {exc}): its non-array values must be importable here too"), stream)
        if entry.slot is not None:
            entry.slot.state = SlotState.READY
        return Loaded(msg.seq, entry.slot, layout, stream)

    def _give_back(self, slot: Slot | None) -> None:
        if slot is not None:
            self.ring.release(slot)

    def _report_deaths(self, dead: list) -> None:
        for h in dead:
            if h.ready and self.restarts.used < self.cfg.max_worker_restarts:
                self._restart(h)
            else:
                self._raise_death(h)

    def _restart(self, h: Any) -> None:
        """Replace dead worker ``h`` and send its replacement what ``h`` held."""
        self.restarts.used += 1
        held = self.dispatcher.held_by(h.id)
        self.allocator.forget(h.id)
        self._layouts.forget(h.id)
        new = self.supervisor.restart(h.id)
        self._send_board(h.id)  # it carries on the dead worker's row
        for seg in self.ring.segments():
            self.supervisor.send(h.id, Attach(seg.id, seg.size), fd=seg.fd)
        restore = self._restore_point(h.id)
        if restore is not None:
            self._pending_restores[h.id] = restore  # for its first draw, held or yet to come
        for entry in held:
            task = entry.task
            if task.iteration != self.iteration:  # an abandoned epoch's batch: drop it
                key = (task.iteration, task.seq)
                self.dispatcher.complete(h.id, key)
                if key in self.splits:  # the batch's slot goes back with its last span
                    self.splits.dropped(h.id, key)
                else:
                    self._give_back(entry.slot)
                continue
            task = task._replace(load=self._restored(h.id, task.load))
            self.supervisor.send(h.id, task._replace(slot=entry.slot.ref if entry.slot is not None else None))
        seqs = [e.task.seq for e in held if e.task.iteration == self.iteration]
        warnings.warn(restart_message(h, new.pid, self.restarts.used, self.cfg.max_worker_restarts, seqs),
                      ShmloadWarning, stacklevel=2)

    def _restored(self, wid: int, load: Any) -> Any:
        """``load``, or if it is the first draw sent to a restarted worker ``wid``, that draw
        with where the stream starts (see _restore_point)."""
        if type(load) is Draw and wid in self._pending_restores:
            return load._replace(restore=self._pending_restores.pop(wid))
        return load

    def _restore_point(self, wid: int) -> StreamPoint | None:
        """Where worker ``wid``'s replacement takes up an iterable source's stream: from the
        source's state after the dead worker's last finished draw, if the source has a
        ``state_dict``; else (None) it re-reads the stream from the start and skips the
        draws made (the same batches again if the stream is deterministic)."""
        point = self._stream_points.get(wid)
        return point if point is not None and point.state is not None else None

    def _raise_death(self, h: Any) -> None:
        held = [(e.task.seq, e.task.load) for e in self.dispatcher.held_by(h.id)]
        self.close()
        raise death_error(h, held, self.cfg.max_worker_restarts)

    def why_waiting(self, seq: int) -> str:
        """What batch ``seq`` of this iteration is waiting for, for time-out messages."""
        wait = self.allocator.waiting_for(self.iteration, seq)
        if wait is not None:
            return (f"worker {wait.worker} has loaded it and is waiting for a ring slot of "
                    f"{binary_size(wait.need.nbytes)} ({self.describe_ring()})")
        for h in self.supervisor.workers:
            for entry in self.dispatcher.held_by(h.id):
                if entry.task.iteration == self.iteration and entry.task.seq == seq:
                    what = describe_load(entry.task.load)
                    if entry.task.span is not None:  # one of the workers loading a split batch
                        sp = entry.task.span
                        what += f" (rows {sp.start} to {sp.stop - 1} of the batch's {sp.rows}, a part of it)"
                    if not h.ready:  # it has the task, but has not even begun to run
                        return (f"worker {h.id} (pid {h.pid}) has not finished starting: it is still in "
                                f"{starting_steps(self.cfg.context.get_start_method(), self.cfg.worker_init_fn)} "
                                f"(it was given {what}). A worker_init_fn that blocks, or a dataset slow to unpickle "
                                "under spawn or forkserver, does this")
                    return f"worker {h.id} (pid {h.pid}) is loading {what}"
        held = len(self.ring.slots_in(SlotState.HELD))
        return f"it is not dispatched yet: no ring slot is free (the consumer holds {held} batches)"

    def deliver(self, loaded: Loaded) -> Any:
        return lifetime.deliver(loaded.slot, loaded.layout, self.releases, self.cfg.output)

    # ------------------------------------------------------------ closing
    # NOTE [ A close() that did not finish ]
    # An interrupt (Ctrl-C, a preemption handler's SystemExit) can come at any moment of
    # close(), and the user, the iterator's or the loader's finalizer, or interpreter exit
    # calls close() again. So close() runs as one window (NOTE [ Interrupts wait for a
    # window ], _signals.py): a descriptor is never closed but still listed, nor a worker
    # reaped but still believed alive. Only the waits for workers to exit are open to an
    # interrupt (supervisor._reap), with nothing half done. close() marks the session
    # closed at once (no more batches from it) but counts it released only at its very
    # end, and every step is idempotent: the next call does what the interrupted one did
    # not. The workers' CPU times are read before they stop (a reaped process has none).
    def close(self, finalizing: bool = False) -> None:
        """``finalizing``: run by a finalizer (NOTE [ An interrupt during a finalizer ])."""
        if self._released or not owned_here(self.owner_pid):
            return
        self.closed = True  # first: a next() of another thread's sees it and lets the lock go
        with _signals.finalizer_window() if finalizing else _signals.signals_deferred():
            # another thread's next() in progress must not be cut off its mappings
            # (NOTE [ Threads sharing a session ]); one stuck in a dataset's code holds no lock
            locked = _signals.acquire(self.lock, CLOSE_WAIT)
            try:
                self._release()
            finally:
                if locked:
                    self.lock.release()

    def _release(self) -> None:
        if self._released:  # (by a next() that saw closed while this close() waited for it)
            return
        if self._cpu is None:
            self._cpu = self._workers_cpu()
        try:
            if self.supervisor is not None:  # (None: the session's start was interrupted)
                self.supervisor.shutdown()
        finally:
            try:
                if self.profile is not None and self.board is not None:
                    self.profile.retire(self, self._cpu)  # after shutdown: the workers' last batches are in
            finally:
                self._close_board()
                self.ring.close()
        self._released = True

    def _workers_cpu(self) -> dict[int, tuple[int, float | None]]:
        """Worker id -> (pid, CPU seconds), for the profile; {} if it cannot be read: the
        profile must never keep close() from releasing what it holds."""
        if self.profile is None:
            return {}
        try:
            return {wid: (pid, cpu_seconds(pid)) for wid, pid in self.worker_pids().items()}
        except Exception:
            return {}

    def describe_ring(self) -> str:
        r, backend = self.ring, self.cfg.shm_backend
        if not r.slot_bytes:
            return f"ring not sized yet (sized from the first batch; {backend} segments)"
        return (f"ring {r.num_slots} slots x {binary_size(r.slot_bytes)} = {binary_size(r.nbytes)} of shared memory "
                f"({backend} segments, bound {binary_size(r.max_bytes)})")
