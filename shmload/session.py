"""Session: the workers, their ring and the tasks in flight, for one or more epochs.

An epoch iterator (``epoch.py``) asks the session to dispatch batches and to report
results; everything that must survive from one epoch to the next with
``persistent_workers=True`` lives here. Each ``iter()`` begins a new *iteration*; results
of an earlier one (an epoch left with ``break``) are recognised by their iteration
number, and their slots go straight back to the ring.

Waiting for space. A worker whose batch does not fit its slot waits for a
:class:`Reassign`. While any such request is pending, no new task is dispatched (new
tasks would only pin the old, smaller slots). If the ring cannot grow within its bound,
the request waits, but only while waiting can help: once the batch it belongs to is the
next one the consumer needs (or, with ``in_order=False``, nothing else is in flight), no
slot can come back and the ring's :class:`RingFullError` is raised instead of hanging.

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
import pickle
import warnings
from collections import deque
from typing import Any, NamedTuple

from . import _platform, counters, lifetime
from .config import LoaderConfig
from .dispatch import Dispatcher, prefetch_depth
from .layout import ObjectValue
from .errors import (RingFullError, ShmloadError, ShmloadWarning, WorkerDiedError, WorkerError, WorkerStartupError,
                     describe_load, format_bytes)
from .messages import (Attach, AttachBoard, Detach, Done, Draw, Exhausted, Failed, NeedSpace, Ready, Reassign, Restore,
                       StartupFailed, StreamPoint, Task)
from .profile import cpu_seconds
from .ring import Ring, Slot, SlotState
from .shm import Segment, shm_free_bytes
from .supervisor import Supervisor, owned_here
from .worker import UserCode


class Loaded(NamedTuple):
    seq: int
    slot: Slot | None  # None: the batch holds no array bytes
    layout: Any
    stream: tuple[int, StreamPoint] | None = None  # a draw's worker and its stream's position after it


class LoadFailed(NamedTuple):
    seq: int
    error: BaseException
    stream: tuple[int, StreamPoint] | None = None


class Ended(NamedTuple):
    """A draw found ``worker``'s stream ended: no batch at this position."""

    seq: int
    worker: int


class _InFlight(NamedTuple):
    task: Task
    slot: Slot | None


class RestartBudget:
    """The worker restarts one loader has used, shared by its sessions: the bound
    ``max_worker_restarts`` is per loader, not per epoch."""

    def __init__(self) -> None:
        self.used = 0


def default_max_shm_bytes() -> tuple[int, str]:
    """The free space of /dev/shm, at most half the machine's memory, and where it came from."""
    half_ram = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") // 2
    free = shm_free_bytes()
    if free is not None and free < half_ram:
        return free, "the free space of /dev/shm when the workers started"
    return half_ram, "half of this machine's memory"


class Session:
    def __init__(self, cfg: LoaderConfig, restarts: RestartBudget | None = None, profile: Any = None):
        self.cfg = cfg
        self.profile = profile  # the loader's Profile (profile.py), told when this session closes
        self.restarts = restarts if restarts is not None else RestartBudget()
        self.owner_pid = os.getpid()
        self.iteration = 0
        self.closed = False
        self._released = False  # NOTE [ A close() that did not finish ]
        self._cpu: dict | None = None  # the workers' CPU seconds, read as close() begins
        self.releases = lifetime.ReleaseQueue()
        self._space_wanted: deque[tuple[int, NeedSpace]] = deque()
        self._space_error: RingFullError | None = None  # why the head of _space_wanted waits
        self._layouts: dict[bytes, Any] = {}  # see _layout()
        self._carried: list = []  # results read by a poll() that then raised (see poll())
        # For an iterable source: each worker's stream position after its last finished
        # draw of this iteration, where a restarted worker takes up its stream (_restart).
        self._stream_points: dict[int, StreamPoint] = {}
        # A restarted worker that held no draw: where its stream starts, for its next draw.
        self._pending_restores: dict[int, Restore] = {}
        if cfg.max_shm_bytes is not None:
            bound, source = cfg.max_shm_bytes, "max_shm_bytes"
        else:
            bound, source = default_max_shm_bytes()
        self.ring = Ring(functools.partial(Segment, pinner=cfg.pinner), self._min_slots, bound, bound_source=source,
                         on_attach=self._attach, on_detach=self._detach)
        self.dispatcher = Dispatcher(cfg.num_workers, self._depth(self.ring.slot_bytes))
        self._board_segment: Segment | None = None
        self.board = None
        self.supervisor: Supervisor | None = None
        # From here on anything may raise, a Ctrl-C included: close() releases what exists.
        try:
            # The profiler's board: one row of counters per worker (counters.py), ~256 KiB each.
            self._board_segment = Segment(-1, counters.board_bytes(cfg.num_workers))
            self.board = counters.board(self._board_segment.mmap, cfg.num_workers)
            self.supervisor = Supervisor(cfg.context, cfg.num_workers, cfg.seed, cfg.rank, cfg.auto_batch,
                                         UserCode(cfg.dataset, cfg.collate_fn, cfg.worker_init_fn))
            for h in self.supervisor.workers:
                self._send_board(h.id)
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

    def worker_pids(self) -> dict[int, int]:
        """Worker id -> pid of the live workers (for the profiler)."""
        return {h.id: h.pid for h in self.supervisor.workers if not h.exited} if self.supervisor else {}

    # ------------------------------------------------------------ depth
    def _min_slots(self, slot_bytes: int) -> int:
        """The ring's target: the batches in flight, plus two the consumer may hold (ring.py)."""
        return self.cfg.num_workers * self._depth(slot_bytes) + 2

    def _depth(self, slot_bytes: int) -> int:
        return prefetch_depth(self.cfg.prefetch_factor, slot_bytes, self.cfg.num_workers, self.ring.max_bytes)

    @property
    def outstanding(self) -> int:
        """How many batches an epoch keeps outstanding (dispatched, or ready and not yet
        yielded), as torch counts them: ``num_workers`` times the prefetch depth, which
        for ``prefetch_factor=None`` is known once the first batch has sized the ring."""
        return self.cfg.num_workers * self.dispatcher.per_worker

    # ------------------------------------------------------------ segments
    def _attach(self, seg: Segment) -> None:
        # The slot size changes only with a new segment, so the depth follows it here.
        self.dispatcher.per_worker = self._depth(self.ring.slot_bytes)
        for h in self.supervisor.live():
            self.supervisor.send(h.id, Attach(seg.id, seg.size), fd=seg.fd)

    def _detach(self, seg: Segment) -> None:
        for h in self.supervisor.live():
            self.supervisor.send(h.id, Detach(seg.id))

    # ------------------------------------------------------------ epochs
    def begin_iteration(self) -> int:
        """Start a new iteration. What an abandoned one left is given back: batches that
        were ready but never yielded, and batches still waiting for a larger slot."""
        if self.closed:
            raise ShmloadError("this loader's workers were shut down (close() was called, or a worker failed)")
        self.iteration += 1
        self.collect_releases()
        for slot in self.ring.slots_in(SlotState.READY):
            self.ring.release(slot)
        for wid, need in self._space_wanted:
            self.dispatcher.complete(wid, (need.iteration, need.seq))
            self.supervisor.send(wid, Reassign(need.iteration, need.seq, None))
        self._space_wanted.clear()
        self._space_error = None
        self._stream_points.clear()
        self._pending_restores.clear()
        return self.iteration

    def collect_releases(self) -> None:
        for slot in self.releases.drain():
            self.ring.release(slot)

    def try_dispatch(self, epoch: int, seq: int, indices: Any, worker: int | None = None) -> bool:
        """Send one batch to ``worker`` (None: the least busy one). False if that worker
        (every worker) is full, no slot is free, or a worker is waiting for a larger slot."""
        self.collect_releases()
        self._serve_space_wanted()
        if self._space_wanted:
            return False
        wid = self.dispatcher.pick() if worker is None else worker if self.dispatcher.has_room(worker) else None
        if wid is None:
            return False
        slot = None
        if self.ring.slot_bytes:  # else: sent without a slot; the worker's NeedSpace sizes the ring
            if not self._room_for(len(self._slotless()) if self.dispatcher.without_slot else 0):
                return False  # earlier batches need the free slots
            slot = self.ring.take()
            if slot is None:
                slot = self._grow_for_held()
                if slot is None:
                    return False
        if self._pending_restores:
            indices = self._restored(wid, indices)
        task = Task(self.iteration, epoch, seq, indices, slot.ref if slot is not None else None)
        self.dispatcher.assign(wid, (self.iteration, seq), _InFlight(task, slot))
        self.supervisor.send(wid, task, defer=True)  # leaves with the fill's other tasks: see flush()
        return True

    def flush(self) -> None:
        """Send the tasks dispatched since the last flush. The epoch calls it after each
        round of dispatching (and :meth:`poll` before it waits)."""
        self.supervisor.flush()

    def _slotless(self) -> list[int]:
        """The batches of this iteration in flight without a slot, earliest first: sent
        before the ring was sized, or waiting for a larger slot.

        Workers load their tasks in order, so a later batch given the last slot first would
        hold it while its worker waits for an earlier batch's slot: with few slots (a small
        /dev/shm), nothing would ever move. So a batch may overtake earlier slotless ones
        only while enough slots stay free for them (``_may_overtake``)."""
        return sorted(e.task.seq for h in self.supervisor.workers for e in self.dispatcher.held_by(h.id)
                      if e.slot is None and e.task.iteration == self.iteration)

    def _may_overtake(self, earlier: int) -> bool:
        """May a batch take a slot while ``earlier`` batches before it still have none?
        Only if the free slots left after it still cover them."""
        return earlier == 0 or self.ring.free_slots() - 1 >= earlier

    def _room_for(self, earlier: int) -> bool:
        """``_may_overtake``, after adding slots while the ring is still short of its
        target size (it is filled on demand, see ring.py)."""
        while not (self._may_overtake(earlier) and self.ring.free_slots()):
            if self.ring.num_slots >= self.ring.min_slots:
                break
            try:
                self.ring.add_slots()
            except RingFullError:
                break
        return self._may_overtake(earlier)

    def _grow_for_held(self) -> Slot | None:
        """No slot is free: the consumer holds batches. Add slots rather than wait forever;
        past the bound, wait if a slot can still come back, else raise."""
        try:
            self.ring.add_slots()
        except RingFullError:
            if self.ring.slots_in(SlotState.ASSIGNED) or self.ring.slots_in(SlotState.READY):
                return None
            raise
        return self.ring.take()

    def _serve_space_wanted(self) -> None:
        """Give waiting batches their larger slots, earliest first, so the next batch the
        consumer needs is never held up behind a later, larger one; a later batch goes
        before an earlier one that has not asked yet only if enough slots stay free for
        it (see ``_slotless`` for why)."""
        self._space_error = None
        if not self._space_wanted:  # the common case, on every poll and dispatch
            return
        if not self.ring.slot_bytes:  # the first batches size the ring
            try:
                # only the slots asked for now: the first batch need not wait for the whole ring
                self.ring.grow_capacity(max(need.nbytes for _, need in self._space_wanted),
                                        count=len(self._space_wanted))
            except RingFullError as exc:
                self._space_error = exc
                return
        slotless = self._slotless()
        for wid, need in sorted(self._space_wanted, key=lambda item: item[1].seq):
            if not self._room_for(sum(1 for seq in slotless if seq < need.seq)):
                return  # earlier batches have not asked yet, and they need the free slots
            slot = self.ring.take(need.nbytes)
            if slot is None:
                try:
                    if need.nbytes > self.ring.slot_bytes:
                        self.ring.grow_capacity(need.nbytes)
                    else:
                        self.ring.add_slots()
                except RingFullError as exc:
                    self._space_error = exc
                    return
                slot = self.ring.take(need.nbytes)
                if slot is None:
                    return
            self._space_wanted.remove((wid, need))
            slotless.remove(need.seq)
            key = (need.iteration, need.seq)
            entry = self.dispatcher.task(wid, key)
            self.dispatcher.assign(wid, key, entry._replace(slot=slot))
            self.supervisor.send(wid, Reassign(need.iteration, need.seq, slot.ref))

    def check_progress(self, head: int | None) -> None:
        """Called before the epoch blocks. Raise if waiting cannot help: a batch waits for
        space that cannot be had, and nothing still running can give a slot back.

        ``head`` is the batch the consumer needs next (None with ``in_order=False``). While
        it is still being loaded, it will arrive and slots with it. Otherwise only a task
        that can still finish and holds a slot can free one (by finishing, failing, or
        needing a larger slot itself); a worker waiting for space finishes nothing."""
        self.collect_releases()
        self._serve_space_wanted()
        if self._space_error is None:
            return
        blocked = {need.seq for _, need in self._space_wanted if need.iteration == self.iteration}
        if head is not None and head not in blocked:
            return
        waiting_workers = {wid for wid, _ in self._space_wanted}
        for h in self.supervisor.workers:
            if h.id not in waiting_workers and any(e.slot is not None for e in self.dispatcher.held_by(h.id)):
                return
        # Not kept: a stored exception's traceback would hold the iterator's frames, and
        # through them this session, alive. The next attempt recomputes it.
        error, self._space_error = self._space_error, None
        raise error

    # ------------------------------------------------------------ results
    def poll(self, timeout: float) -> list[Loaded | LoadFailed]:
        """Results of the current iteration that arrived within ``timeout`` seconds.

        Ring growth happens here, before any message is read, so an error it raises never
        loses results already received."""
        self.collect_releases()
        self._serve_space_wanted()
        frames, dead = self.supervisor.poll(timeout)
        results, self._carried = self._carried, []
        for wid, frame in frames:
            result = self._handle(wid, pickle.loads(frame))
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
        if kind is NeedSpace:
            entry = self.dispatcher.task(wid, key)
            self._give_back(entry.slot)
            if stale:
                self.dispatcher.complete(wid, key)
                self.supervisor.send(wid, Reassign(msg.iteration, msg.seq, None))
            else:
                self.dispatcher.assign(wid, key, entry._replace(slot=None))
                self._space_wanted.append((wid, msg))  # served by the next poll() or try_dispatch()
            return None
        entry = self.dispatcher.complete(wid, key)
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
                     f"({describe_load(entry.task.indices)})")
            return LoadFailed(msg.seq, msg.error.rebuild(where), stream)
        try:
            layout = self._layout(msg.layout)
        except Exception as exc:
            self._give_back(entry.slot)
            return LoadFailed(msg.seq, WorkerError(
                f"batch {msg.seq} from DataLoader worker process {wid} could not be unpickled in the main "
                f"process ({type(exc).__name__}: {exc}): its non-array values must be importable here too"), stream)
        if entry.slot is not None:
            entry.slot.state = SlotState.READY
        return Loaded(msg.seq, entry.slot, layout, stream)

    def _layout(self, data: bytes) -> Any:
        """Unpickle a batch's layout. Batches of one dataset mostly share theirs, so layouts
        of arrays alone are kept by their pickle (immutable, so they can be shared); one
        with object leaves is never kept: those leaves become the user's own lists."""
        layout = self._layouts.get(data)
        if layout is None:
            layout = pickle.loads(data)
            if not any(type(leaf) is ObjectValue for leaf in layout.leaves):
                if len(self._layouts) >= 16:
                    self._layouts.clear()
                self._layouts[data] = layout
        return layout

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
        self._space_wanted = deque(item for item in self._space_wanted if item[0] != h.id)
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
                self.dispatcher.complete(h.id, (task.iteration, task.seq))
                self._give_back(entry.slot)
                continue
            task = task._replace(indices=self._restored(h.id, task.indices))
            self.supervisor.send(h.id, task._replace(slot=entry.slot.ref if entry.slot is not None else None))
        seqs = [e.task.seq for e in held if e.task.iteration == self.iteration]
        lost = ("no batch" if not seqs else f"batch {seqs[0]}" if len(seqs) == 1 else
                "batches " + ", ".join(map(str, seqs[:8])) + (f", ... ({len(seqs)} in all)" if len(seqs) > 8 else ""))
        warnings.warn(
            f"DataLoader worker process {h.id} (pid {h.pid}) {h.exit_description()} unexpectedly; started "
            f"pid {new.pid} in its place (restart {self.restarts.used} of max_worker_restarts="
            f"{self.cfg.max_worker_restarts}) and sent it {lost} again.", ShmloadWarning, stacklevel=2)

    def _restored(self, wid: int, load: Any) -> Any:
        """``load``, or if it is the first draw sent to a restarted worker ``wid``, that draw
        with where the stream starts (see _restore_point)."""
        if type(load) is Draw and wid in self._pending_restores:
            return load._replace(restore=self._pending_restores.pop(wid))
        return load

    def _restore_point(self, wid: int) -> Restore | None:
        """Where worker ``wid``'s replacement takes up an iterable source's stream: from the
        source's state after the dead worker's last finished draw, if the source has a
        ``state_dict``; else (None) it re-reads the stream from the start and skips the
        draws made (the same batches again if the stream is deterministic)."""
        point = self._stream_points.get(wid)
        if point is None or point.state is None:
            return None
        return Restore(point.draws, point.state)

    def _raise_death(self, h: Any) -> None:
        held = self.dispatcher.held_by(h.id)
        started = h.ready
        self.close()
        if not started:
            raise WorkerStartupError(
                f"DataLoader worker process {h.id} (pid {h.pid}) {h.exit_description()} during start-up, "
                "before it could report an error; see its output above (an import error under spawn "
                "or forkserver is a common cause)")
        doing = ("; it was loading " + ", ".join(
            f"batch {e.task.seq} ({describe_load(e.task.indices)})" for e in held)) if held else ""
        if self.cfg.max_worker_restarts:
            restarts = f" All {self.cfg.max_worker_restarts} restarts allowed (max_worker_restarts) were used."
        else:
            restarts = " Pass max_worker_restarts=N to replace up to N dead workers instead of failing."
        raise WorkerDiedError(
            f"DataLoader worker process {h.id} (pid {h.pid}) {h.exit_description()} unexpectedly{doing}. "
            f"If it was killed for memory (SIGKILL), lower num_workers, prefetch_factor or batch_size.{restarts}")

    def holder_of(self, seq: int) -> str:
        """What batch ``seq`` of this iteration is waiting for, for time-out messages."""
        for wid, need in self._space_wanted:
            if (need.iteration, need.seq) == (self.iteration, seq):
                return (f"worker {wid} has loaded it and is waiting for a ring slot of "
                        f"{format_bytes(need.nbytes)} ({self.describe_ring()})")
        for h in self.supervisor.workers:
            for entry in self.dispatcher.held_by(h.id):
                if entry.task.iteration == self.iteration and entry.task.seq == seq:
                    what = describe_load(entry.task.indices)
                    if not h.ready:  # it has the task, but has not even begun to run
                        return (f"worker {h.id} (pid {h.pid}) has not finished starting: it is still in "
                                f"{self._starting_in()} (it was given {what}). A worker_init_fn that "
                                "blocks, or a dataset slow to unpickle under spawn or forkserver, does this")
                    return f"worker {h.id} (pid {h.pid}) is loading {what}"
        held = len(self.ring.slots_in(SlotState.HELD))
        return f"it is not dispatched yet: no ring slot is free (the consumer holds {held} batches)"

    def _starting_in(self) -> str:
        method = self.cfg.context.get_start_method()
        steps = ["worker_init_fn"] if self.cfg.worker_init_fn is not None else []
        if method != "fork":
            steps.insert(0, "unpickling the dataset")
        steps.insert(0, f"its start ({method})")
        return " or ".join(steps)

    def deliver(self, loaded: Loaded) -> Any:
        return lifetime.deliver(loaded.slot, loaded.layout, self.releases, self.cfg.output)

    # ------------------------------------------------------------ closing
    # NOTE [ A close() that did not finish ]
    # A Ctrl-C can land anywhere in close(), and the user (or the loader's finalizer)
    # calls close() again. So close() marks the session closed at once (no more batches
    # from it) but counts it released only at its very end, and every step is idempotent:
    # the next call does what the interrupted one did not. The workers' CPU times are read
    # before they stop (a reaped process has none), in a window of its own.
    def close(self) -> None:
        if self._released or not owned_here(self.owner_pid):
            return
        self.closed = True
        if self._cpu is None:
            with _platform.sigint_deferred():  # psutil's reads, whole (a Ctrl-C cut would leave a file open)
                self._cpu = ({wid: (pid, cpu_seconds(pid)) for wid, pid in self.worker_pids().items()}
                             if self.profile is not None else {})
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

    def describe_ring(self) -> str:
        r = self.ring
        if not r.slot_bytes:
            return "ring not sized yet (sized from the first batch)"
        return f"ring {r.num_slots} slots x {format_bytes(r.slot_bytes)} = {format_bytes(r.nbytes)} of shared memory"
