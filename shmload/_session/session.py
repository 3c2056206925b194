"""Session: the workers, their ring and the tasks in flight, for one or more epochs.

An epoch iterator (``epoch.py``) asks the session to dispatch batches and to report
results; everything that must survive from one epoch to the next with
``persistent_workers=True`` lives here. Each ``iter()`` begins a new *iteration*; results
of an earlier one (an epoch left with ``break``) are recognised by their iteration
number, and their slots go straight back to the ring.

Slots. Which batch gets which slot, and when waiting for one can no longer help, is
decided by the :class:`~shmload._session.allocation.SlotAllocator`; the session carries it out
(a task sent with its slot, a :class:`Reassign` for a worker that waited for a larger one).

Worker deaths are recovery.py's (a restart that picks up the dead worker's tasks, or the
error); which workers are given tasks, with num_workers="auto", is scaling.py's."""

from __future__ import annotations

import functools
import os
import threading
from typing import Any

from .._batching.layout import LayoutCache
from .._core import _signals
from .._core._platform import owned_here
from .._loading.worker import UserCode
from .._transport import messages, wire
from .._transport.limits import default_bound
from .._transport.messages import Done, Exhausted, Failed, NeedSpace, Ready, Reassign, StartupFailed, Task
from .._transport.ring import Ring, Slot, SlotState
from .._transport.shm import Segment
from ..errors import ShmloadError, WorkerStartupError, death_error
from ..profiler.profile import workers_cpu
from . import lifetime, waiting
from .allocation import SlotAllocator
from .config import LoaderConfig
from .dispatch import Dispatcher, InFlight
from .mappings import WorkerMappings
from .pacing import Pacing, busy
from .recovery import Recovery, RestartBudget
from .results import Ended, Loaded, LoadFailed, failed_where, unpicklable
from .scaling import Scaling
from .spans import SplitBatches
from .supervisor import Supervisor

# Seconds close() waits for another thread's next() in progress to see the session
# closed and let go (it looks after every wait, at most worker_epoch.POLL_INTERVAL); past it, a
# next() stuck elsewhere is not waited for.
CLOSE_WAIT = 5.0


class Session:
    ring: Ring  # (declared: the pacing reads the ring's bound and the count, made after it)
    scaling: Scaling

    def __init__(self, cfg: LoaderConfig, restarts: RestartBudget | None = None, profile: Any = None,
                 workers: int | None = None):  # (workers: how many run at first; scaling.py)
        self.cfg = cfg
        self.profile = profile  # the loader's Profile (profile.py), told when this session closes
        self.owner_pid, self.iteration = os.getpid(), 0
        self.lock = threading.RLock()  # NOTE [ Threads sharing a session ] (re-entered by close())
        self.closed = False
        self._released = False  # NOTE [ A close() that did not finish ]
        self._cpu: dict | None = None  # the workers' CPU seconds, read as close() begins
        self.releases = lifetime.ReleaseQueue()
        self._layouts = LayoutCache()
        self._carried: list = []  # results read by a poll() that then raised (see poll())
        self.splits = SplitBatches(self)  # split batches in flight (spans.py)
        # (without max_shm_bytes, the bound is read once the loader's own segments exist: below)
        self.pacing = Pacing(cfg, lambda: self.ring.max_bytes, lambda: self.scaling.target)
        self.ring = Ring(functools.partial(Segment, pinner=cfg.pinner, backend=cfg.shm_backend),
                         self.pacing.target_slots, cfg.max_shm_bytes or 0, bound_source="max_shm_bytes",
                         on_attach=self._attach, on_detach=self._detach)
        self.dispatcher = Dispatcher(cfg.num_workers, self.pacing.depth(self.ring.slot_bytes))
        self.scaling = Scaling(self.dispatcher, cfg.num_workers if workers is None else workers)
        self.allocator = SlotAllocator(self.ring, self.dispatcher)
        self.recovery = Recovery(cfg.max_worker_restarts, restarts if restarts is not None else RestartBudget(),
                                 self.dispatcher, self.allocator, self._layouts, self.splits, self.give_back)
        self._maps = WorkerMappings(cfg.num_workers, cfg.shm_backend)
        self._supervisor: Supervisor | None = None  # None only while the session starts (supervisor)
        # From here on anything may raise, a Ctrl-C included: close() releases what exists.
        try:
            self._maps.open_board()
            self._supervisor = Supervisor(cfg.context, cfg.num_workers, cfg.seed, cfg.rank, cfg.auto_batch,
                                          UserCode(cfg.dataset, cfg.collate_fn, cfg.worker_init_fn),
                                          cfg.stream_shuffle, shm_backend=cfg.shm_backend, start=self.scaling.target)
            for h in self.supervisor.workers:
                self._maps.send_board(self.supervisor, h.id)
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

    @property
    def supervisor(self) -> Supervisor:  # (a session that could not start its workers was closed as it raised)
        assert self._supervisor is not None, "a session's workers are started by its constructor"
        return self._supervisor

    @property
    def board(self) -> Any:  # the profiler's counters, a row per worker; None once closed (mappings.py)
        return self._maps.board

    # ------------------------------------------------------------ split batches' view (spans.SpanHost)
    def send(self, wid: int, msg: Any, defer: bool = False) -> None:
        self.supervisor.send(wid, msg, defer=defer)

    def worker_ids(self) -> list[int]:
        # (every worker dead, their deaths not yet reported: a restarted one is sent what it held)
        taking = self.dispatcher.accepting
        return [h.id for h in self.supervisor.live() if taking[h.id]] or \
            [h.id for h in self.supervisor.workers if taking[h.id]]

    def load_layout(self, wid: int, layout_id: int, layout: Any) -> Any:
        return self._layouts.load(wid, layout_id, layout)

    # ------------------------------------------------------------ the profile's view (profiler.profile.ProfiledSession)
    def worker_pids(self) -> dict[int, int]:
        """Worker id -> pid of the live workers."""
        return {h.id: h.pid for h in self._supervisor.workers if not h.exited} if self._supervisor else {}

    def profile_settings(self) -> tuple[int, int, int, int]:
        """(workers run, tasks each worker may hold, ring slots, bytes per slot)."""
        return self.scaling.target, self.dispatcher.per_worker, self.ring.num_slots, self.ring.slot_bytes

    # ------------------------------------------------------------ num_workers="auto" (scaling.py)
    def set_workers(self, count: int, now: float) -> None:  # (NOTE [ Changing the count mid-epoch ])
        self.scaling.set(count, self.supervisor, self._started, now)

    def _started(self, wid: int) -> None:  # a new process for ``wid``: no layout known, the board and the ring
        self._layouts.forget(wid)
        self._maps.attach_all(self.supervisor, wid, self.ring.segments())

    # ------------------------------------------------------------ depth (pacing.py)
    def _retune(self) -> None:
        self.pacing.retune(self.dispatcher, self.ring.slot_bytes, self.board)

    @property
    def outstanding(self) -> int:
        """Batches an epoch keeps outstanding (dispatched, or ready and not yet yielded), as
        torch counts them: the workers given tasks times the prefetch depth."""
        return self.dispatcher.active * self.dispatcher.per_worker

    def seconds_per_sample(self) -> float | None:
        """The workers' mean time per sample so far (the profiler's counters: loading,
        not waiting); None before any sample."""
        measured = busy(self.board)
        return measured.seconds / measured.samples if measured is not None and measured.samples else None

    def worth_dispatching(self, room: int) -> bool:
        """Whether to send tasks now, with ``room`` more batches allowed outstanding (pacing.py)."""
        return self.pacing.worth_dispatching(self.dispatcher, room)

    # ------------------------------------------------------------ segments
    def _attach(self, seg: Segment) -> None:
        # The slot size changes only with a new segment, so the depth follows it here.
        self._retune()
        self._maps.attach(self.supervisor, seg, [h.id for h in self.supervisor.live()])

    def _detach(self, seg: Segment) -> None:
        self._maps.detach(self.supervisor, seg, [h.id for h in self.supervisor.live()])

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
        self.recovery.begin_iteration()
        self._retune()
        return self.iteration

    def collect_releases(self) -> None:
        if self.releases.dead:  # (empty at most calls: a look instead of a call)
            for slot in self.releases.drain():
                self.ring.release(slot)

    def try_dispatch(self, epoch: int, seq: int, load: Any, worker: int | None = None, parts: int = 1) -> bool:
        """Send one batch to ``worker`` (None: the least busy one). False if that worker
        (every worker) is full, or the allocator has no slot for it now. ``parts``: the
        batch's parts, each seeded for itself (NOTE [ Parts of a batch ], parts.py)."""
        self.collect_releases()
        wid = self.dispatcher.pick() if worker is None else worker if self.dispatcher.has_room(worker) else None
        if wid is None:
            return False
        ok, slot = self.allocator.for_task(self.iteration)
        if not ok:
            return False
        if self.recovery.pending:  # (a restarted worker's first draw: rare, so looked at in-line)
            load = self.recovery.restored(wid, load)
        task = Task(self.iteration, epoch, seq, load, slot.ref if slot is not None else None, parts,
                    position=messages.position_of(load))
        self.dispatcher.assign(wid, (self.iteration, seq), InFlight(task, slot))
        self.supervisor.send(wid, task, defer=True)  # leaves with the fill's other tasks: see flush()
        return True

    def try_dispatch_spans(self, epoch: int, seq: int, load: Any, parts: int, spans: list) -> bool:
        """Send one batch in spans, ``(worker, parts.Span)`` pairs, each worker's rows into
        the batch's one slot (spans.py). False if the allocator has no slot for it now."""
        self.collect_releases()
        ok, slot = self.allocator.for_task(self.iteration)
        if ok:
            self.splits.send(epoch, seq, load, parts, spans, slot)
        return ok

    def ready_to_send(self) -> bool:
        """Before a round of dispatches: released slots collected, and waiting workers served
        (only :meth:`poll` makes one wait: once a round does); False while one still waits."""
        self.collect_releases()
        self._serve()
        return not self.allocator.waiting

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
        if self.pacing.due(self.dispatcher.completed):
            self._retune()
        return results

    def _handle(self, wid: int, msg: Any) -> Loaded | LoadFailed | Ended | None:
        kind = type(msg)
        if kind is Ready:
            self.supervisor.workers[wid].ready = True
            self.scaling.ready(wid)
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
                self.give_back(self.dispatcher.complete(wid, key).slot)
                self.supervisor.send(wid, Reassign(msg.iteration, msg.seq, None))
            else:
                self.allocator.wants(wid, msg)  # served by the next poll() or try_dispatch()
            return None
        entry = self.dispatcher.complete(wid, key)
        layout, broken = None, None
        if kind is Done:
            try:  # every layout sent is loaded, a stale batch's too: the worker counts it as known
                layout = self._layouts.load(wid, msg.layout_id, msg.layout)
            except Exception as exc:
                broken = exc
        if stale or kind is not Done:
            self.give_back(entry.slot)
            if stale:
                return None
            if kind is Exhausted:
                return Ended(msg.seq, wid)
        stream = None
        if msg.stream is not None:
            self.recovery.finished_draw(wid, msg.stream)
            stream = (wid, msg.stream)
        if kind is Failed:
            return LoadFailed(msg.seq, msg.error.rebuild(failed_where(wid, msg.seq, entry.task.load)), stream)
        if broken is not None:
            self.give_back(entry.slot)
            return LoadFailed(msg.seq, unpicklable(wid, msg.seq, broken), stream)
        if entry.slot is not None:
            entry.slot.state = SlotState.READY
        return Loaded(msg.seq, entry.slot, layout, stream)

    def give_back(self, slot: Slot | None) -> None:
        if slot is not None:
            self.ring.release(slot)

    def _report_deaths(self, dead: list) -> None:
        for h in dead:
            if not self.recovery.replaces(h):
                held = [(e.task.seq, e.task.load) for e in self.dispatcher.held_by(h.id)]
                self.close()
                raise death_error(h, held, self.cfg.max_worker_restarts)
            self.recovery.restart(h, self.supervisor, self.iteration, self._started)

    def why_waiting(self, seq: int) -> str:
        """What batch ``seq`` of this iteration is waiting for, for time-out messages."""
        return waiting.why_waiting(seq, self.iteration, self.allocator, self.dispatcher, self.supervisor.workers,
                                   self.ring, self.cfg)

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
            self._cpu = workers_cpu(self.profile, self.worker_pids())
        try:
            if self._supervisor is not None:  # (None: the session's start was interrupted)
                self._supervisor.shutdown()
        finally:
            try:
                if self.profile is not None and self.board is not None:
                    self.profile.retire(self, self._cpu)  # after shutdown: the workers' last batches are in
            finally:
                self._maps.close()
                self.ring.close()
        self._released = True

    def describe_ring(self) -> str:
        return waiting.describe_ring(self.ring, self.cfg.shm_backend)
