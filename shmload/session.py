"""Session: the workers, their ring and the tasks in flight, for one or more epochs.

An epoch iterator (``epoch.py``) asks the session to dispatch batches and to report
results; everything that must survive from one epoch to the next with
``persistent_workers=True`` lives here. Each ``iter()`` begins a new *iteration*; results
of an earlier one (an epoch left with ``break``) are recognised by their iteration
number, and their slots go straight back to the ring.
"""

from __future__ import annotations

import os
from collections import deque
from typing import Any, NamedTuple

from . import lifetime
from .config import LoaderConfig
from .dispatch import Dispatcher
from .errors import RingFullError, ShmloadError, WorkerDiedError, WorkerStartupError
from .messages import Attach, Detach, Done, Failed, NeedSpace, Ready, Reassign, StartupFailed, Task
from .ring import Ring, Slot, SlotState
from .shm import Segment, shm_free_bytes
from .supervisor import Supervisor, owned_here
from .worker import UserCode


class Loaded(NamedTuple):
    seq: int
    slot: Slot | None  # None: the batch holds no arrays
    done: Done


class LoadFailed(NamedTuple):
    seq: int
    error: BaseException


class _InFlight(NamedTuple):
    task: Task
    slot: Slot | None


def default_max_shm_bytes() -> int:
    """The free space of /dev/shm, at most half the machine's memory."""
    half_ram = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") // 2
    free = shm_free_bytes()
    return min(free, half_ram) if free is not None else half_ram


class Session:
    def __init__(self, cfg: LoaderConfig):
        self.cfg = cfg
        self.owner_pid = os.getpid()
        self.iteration = 0
        self.closed = False
        self.releases = lifetime.ReleaseQueue()
        self.dispatcher = Dispatcher(cfg.num_workers, cfg.prefetch_factor)
        self._space_wanted: deque[tuple[int, NeedSpace]] = deque()
        max_bytes = cfg.max_shm_bytes if cfg.max_shm_bytes is not None else default_max_shm_bytes()
        self.ring = Ring(Segment, cfg.num_workers * cfg.prefetch_factor + 2, max_bytes,
                         on_attach=self._attach, on_detach=self._detach)
        self.supervisor = Supervisor(cfg.context, cfg.num_workers, cfg.seed, cfg.auto_batch,
                                     UserCode(cfg.dataset, cfg.collate_fn, cfg.worker_init_fn))
        try:
            if cfg.slot_bytes:
                self.ring.grow_capacity(cfg.slot_bytes)
        except BaseException:
            self.close()
            raise

    # ------------------------------------------------------------ segments
    def _attach(self, seg: Segment) -> None:
        for h in self.supervisor.live():
            self.supervisor.send(h.id, Attach(seg.id, seg.size), fd=seg.fd)

    def _detach(self, seg: Segment) -> None:
        for h in self.supervisor.live():
            self.supervisor.send(h.id, Detach(seg.id))

    # ------------------------------------------------------------ epochs
    def begin_iteration(self) -> int:
        """Start a new iteration; batches of an abandoned one that were never yielded go back."""
        self._check_usable()
        self.iteration += 1
        self.collect_releases()
        for slot in self.ring.slots_in(SlotState.READY):
            self.ring.release(slot)
        return self.iteration

    def _check_usable(self) -> None:
        if self.closed:
            raise ShmloadError("this loader's workers were shut down (close() was called, or a worker failed)")

    def collect_releases(self) -> None:
        for slot in self.releases.drain():
            self.ring.release(slot)

    def try_dispatch(self, epoch: int, seq: int, indices: Any) -> bool:
        """Send one batch to a worker. False if no worker has room or no slot is free."""
        self.collect_releases()
        self._serve_space_wanted()
        wid = self.dispatcher.pick()
        if wid is None:
            return False
        slot = None
        if self.ring.slot_bytes:  # else: sent without a slot; the worker's NeedSpace sizes the ring
            slot = self._slot_for(0)
            if slot is None:
                return False
        task = Task(self.iteration, epoch, seq, indices, slot.ref if slot is not None else None)
        self.dispatcher.assign(wid, (self.iteration, seq), _InFlight(task, slot))
        self.supervisor.send(wid, task)
        return True

    def _slot_for(self, nbytes: int) -> Slot | None:
        """A free slot of at least ``nbytes``, growing the ring if none is free.

        None means: wait, a slot will come back (tasks are in flight or batches ready).
        With nothing in flight, the consumer holds every slot: past the ring's bound that
        is a RingFullError, because waiting would be a deadlock."""
        slot = self.ring.take(nbytes)
        if slot is not None:
            return slot
        try:
            if nbytes > self.ring.slot_bytes or not self.ring.slot_bytes:
                self.ring.grow_capacity(nbytes)
            else:
                self.ring.add_slots()
        except RingFullError:
            if self.ring.slots_in(SlotState.ASSIGNED) or self.ring.slots_in(SlotState.READY):
                return None
            raise
        return self.ring.take(nbytes)

    def _serve_space_wanted(self) -> None:
        while self._space_wanted:
            wid, need = self._space_wanted[0]
            slot = self._slot_for(need.nbytes)
            if slot is None:
                return
            self._space_wanted.popleft()
            key = (need.iteration, need.seq)
            entry = self.dispatcher.task(wid, key)
            self.dispatcher.assign(wid, key, entry._replace(slot=slot))
            self.supervisor.send(wid, Reassign(need.iteration, need.seq, slot.ref))

    # ------------------------------------------------------------ results
    def poll(self, timeout: float) -> list[Loaded | LoadFailed]:
        """Results of the current iteration that arrived within ``timeout`` seconds.

        Growing the ring may raise (RingFullError, SharedMemoryError); it happens here,
        before any message is read, so an error never loses results already received."""
        self.collect_releases()
        self._serve_space_wanted()
        messages, dead = self.supervisor.poll(timeout)
        results = []
        for wid, msg in messages:
            result = self._handle(wid, msg)
            if result is not None:
                results.append(result)
        if dead:
            self._report_deaths(dead)
        return results

    def _handle(self, wid: int, msg: Any) -> Loaded | LoadFailed | None:
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
        if kind is NeedSpace:
            if msg.iteration != self.iteration:
                entry = self.dispatcher.complete(wid, key)
                self._give_back(entry.slot)
                self.supervisor.send(wid, Reassign(msg.iteration, msg.seq, None))
                return None
            entry = self.dispatcher.task(wid, key)
            self._give_back(entry.slot)
            self.dispatcher.assign(wid, key, entry._replace(slot=None))
            self._space_wanted.append((wid, msg))  # served by the next poll() or try_dispatch()
            return None
        entry = self.dispatcher.complete(wid, key)
        if msg.iteration != self.iteration:
            self._give_back(entry.slot)
            return None
        if kind is Done:
            if entry.slot is not None:
                entry.slot.state = SlotState.READY
            return Loaded(msg.seq, entry.slot, msg)
        if kind is Failed:
            self._give_back(entry.slot)
            where = (f"in DataLoader worker process {wid} while loading batch {msg.seq} "
                     f"(dataset indices {entry.task.indices})")
            return LoadFailed(msg.seq, msg.error.rebuild(where))
        raise TypeError(f"unexpected message from worker {wid}: {msg!r}")

    def _give_back(self, slot: Slot | None) -> None:
        if slot is not None:
            self.ring.release(slot)

    def _report_deaths(self, dead: list) -> None:
        h = dead[0]
        held = self.dispatcher.held_by(h.id)
        started = h.ready
        self.close()
        if not started:
            raise WorkerStartupError(
                f"DataLoader worker process {h.id} (pid {h.pid}) {h.exit_description()} during start-up, "
                "before it could report an error; see its output above (an import error under spawn "
                "or forkserver is a common cause)")
        doing = ("; it was loading " + ", ".join(f"batch {e.task.seq} (dataset indices {e.task.indices})"
                                                 for e in held)) if held else ""
        raise WorkerDiedError(
            f"DataLoader worker process {h.id} (pid {h.pid}) {h.exit_description()} unexpectedly{doing}. "
            "If it was killed for memory (SIGKILL), lower num_workers, prefetch_factor or batch_size.")

    def holder_of(self, seq: int) -> str:
        """Who is loading batch ``seq`` of this iteration, for time-out messages."""
        for h in self.supervisor.workers:
            for entry in self.dispatcher.held_by(h.id):
                if entry.task.iteration == self.iteration and entry.task.seq == seq:
                    return f"worker {h.id} (pid {h.pid}) is loading dataset indices {entry.task.indices}"
        return "no worker holds it"

    def deliver(self, loaded: Loaded) -> Any:
        return lifetime.deliver(loaded.slot, loaded.done.layout, self.releases, self.cfg.output)

    # ------------------------------------------------------------ closing
    def close(self) -> None:
        if self.closed or not owned_here(self.owner_pid):
            return
        self.closed = True
        try:
            self.supervisor.shutdown()
        finally:
            self.ring.close()

    def describe_ring(self) -> str:
        r = self.ring
        if not r.slot_bytes:
            return "ring not sized yet (sized from the first batch)"
        return (f"ring {r.num_slots} slots x {r.slot_bytes / 2**20:.2f} MiB = {r.nbytes / 2**20:.1f} MiB "
                "of shared memory")
