"""num_workers="auto" at work: which worker ids take tasks, starting the ones not yet
started, and the tuner that measures windows and applies the policy's count
(``autotune.py``, NOTE [ How the worker count is chosen ]).

NOTE [ Changing the count mid-epoch ]
A session with num_workers="auto" has the cap's worker ids: its control block, board and
queues are made for all of them, and the first ``count`` are started. The count then
moves by which workers are *given new tasks* (``Dispatcher.accepting``), never by taking
a task back:

* **stop**: the highest ids stop being given tasks. Each finishes and returns what it
  holds, through the usual path, so nothing is lost or loaded twice; then it waits on its
  empty queue, using no CPU. Its process stays :data:`PARKED` seconds, so that a count
  coming back soon costs no start-up; then, holding nothing, it is asked to exit
  (``Supervisor.stop``: not watched any more, so its exit is no death) and its memory
  is given back. It is reaped when its id starts again or the session closes.
* **start**: an id never started, or whose process exited, gets a process now (and the
  ring's segments and the board, as a restarted worker does); it is given tasks only
  once it has said it is ready, so that no batch waits behind a worker still importing
  (spawn takes seconds). An id whose process is parked is given tasks again at once.

What a batch holds never depends on which worker loads it (its seed is its position:
seeding.py; spans split it by rows: parts.py), so the batches are the same as with any
fixed count, in order. Restarts after a worker's death, split batches and
``persistent_workers`` see only workers; a parked one that dies is replaced as any other.
"""

from __future__ import annotations

import os
import threading
import warnings
import weakref
from typing import Any, Callable, NamedTuple

import psutil

from .._core._platform import usable_cpus
from ..errors import ShmloadWarning
from ..profiler.profile import machine_cpu_seconds
from .autotune import Policy, Window, enough
from .dispatch import Dispatcher
from .pacing import busy

POLL = 0.05  # seconds between looks at a window that is not long enough yet
HISTORY = 4096  # changes of the count kept for the profile
PARKED = 10.0  # seconds a worker given no task keeps its process, for a count that comes back
MEMORY_RESERVE = 0.10  # of the machine's memory, left free when starting workers


class Scaling:
    """Which of a session's worker ids are given tasks (``target`` of them: the lowest)."""

    def __init__(self, dispatcher: Dispatcher, count: int):
        self._dispatcher = dispatcher
        self.target = count
        self.parked: dict[int, float] = {}  # worker id -> since when it is given no task
        for wid in range(count, dispatcher.num_workers):
            dispatcher.accept(wid, False)

    def set(self, count: int, supervisor: Any, started: Callable[[int], None], now: float) -> None:
        """Run ``count`` workers; a process started now is passed to ``started`` (to be
        attached to the shared memory). If a start fails, the count is the workers below
        it, and the error is raised."""
        d, handles = self._dispatcher, supervisor.workers
        count = max(1, min(count, d.num_workers))
        self.target = min(self.target, count)
        for wid in range(count, d.num_workers):
            if d.accepting[wid]:
                d.accept(wid, False)
            if wid < len(handles) and not handles[wid].stopped:  # (also one still starting)
                self.parked.setdefault(wid, now)
        for wid in range(count):
            self.parked.pop(wid, None)
            if not d.accepting[wid]:
                if wid >= len(handles):
                    started(supervisor.add().id)  # (ids start in order: this one is the next)
                elif handles[wid].stopped:
                    supervisor.restart(wid)  # (a new process, given tasks once ready)
                    started(wid)
                elif handles[wid].ready and not handles[wid].exited:
                    d.accept(wid, True)
            self.target = wid + 1

    def ready(self, wid: int) -> None:
        """Worker ``wid`` said it is ready: it takes tasks if it is among the target."""
        if wid < self.target and not self._dispatcher.accepting[wid]:
            self._dispatcher.accept(wid, True)

    @property
    def settled(self) -> bool:
        """Is the count in effect: every worker of the target taking tasks (none still
        starting), and no worker stopped still finishing tasks it held?"""
        d = self._dispatcher
        return d.active == self.target and not any(d.holds(wid) for wid in self.parked)

    def stop_parked(self, supervisor: Any, now: float, stopping: Callable[[int, int], None]) -> None:
        """End the processes of workers given no task for :data:`PARKED` seconds, once they
        hold none: a count that went down and stayed down gives back their memory.
        ``stopping(wid, pid)`` is told first (the profile reads its CPU time)."""
        for wid, since in list(self.parked.items()):
            h = supervisor.workers[wid]
            if now - since >= PARKED and not self._dispatcher.holds(wid) and h.ready:
                del self.parked[wid]
                if not h.exited:
                    stopping(wid, h.pid)
                    supervisor.stop(wid)
        supervisor.reap_stopped()


class Totals(NamedTuple):
    """Cumulative figures, a window being the difference of two."""

    at: float
    batches: int
    stall: float
    step: float
    busy: float
    machine: float | None


class Tuner:
    """A loader's num_workers="auto": the policy, the count it chose over time, and the
    window being measured. Lives as long as the loader (the count carries over to the
    next epoch's workers); ``script`` (tests: ``shmload.testing.script_workers``) sets the
    count at given batches instead of measuring."""

    def __init__(self, cap: int, count: int | None = None, script: dict[int, int] | None = None):
        self.cap = cap
        self.policy = Policy(cap, count if count is not None else 1)
        self.script = script
        self.history: list[tuple[float, int]] = []  # (time.perf_counter(), count) at each change
        self.due = 0.0
        self._base: Totals | None = None
        # the session and iteration the window belongs to (a weak reference: a closed
        # session must not be kept alive, with its ring mapped, by its loader's tuner)
        self._owner: tuple[Callable[[], Any], int] | None = None
        self._running: Callable[[], Any] = lambda: None  # the session last told the count
        self._lock = threading.Lock()  # two threads' iterators of one loader (non-persistent sessions)
        self._cpus = usable_cpus()

    @property
    def count(self) -> int:
        return self.policy.count

    def runs(self, session: Any) -> bool:
        """Was ``session`` started with (or told) this tuner's count?"""
        return self._running() is session

    def attach(self, session: Any, now: float) -> None:
        """``session`` runs this tuner's count from now on (a session started with it, or a
        persistent one kept while the tuner was made anew: a loaded state, a script)."""
        self._running = weakref.ref(session)
        self._owner, self._base, self.policy.probe = None, None, None
        if session.scaling.target != self.count:
            session.set_workers(self.count, now)
        self._note(now, self.count)

    def on_batch(self, session: Any, profile: Any, seq: int, now: float) -> None:
        """A batch was delivered: apply the script, or decide if a window is due. Never
        raises: a worker that cannot be started lowers the cap to the count that runs
        (with a warning), and the batch is delivered all the same."""
        if now < self.due and self.script is None:
            return  # (the common case, at every batch: nothing to do)
        if not self._lock.acquire(blocking=False):
            return  # (another thread's iterator is deciding)
        try:
            self._step(session, profile, seq, now)
        except Exception as exc:
            self._lower_cap(session, exc)
        finally:
            self._lock.release()

    def _step(self, session: Any, profile: Any, seq: int, now: float) -> None:
        if self.script is not None:
            count = self.script.get(seq)
            if count is not None:
                self._apply(session, count, now)
        if now < self.due:
            return
        self.due = now + POLL
        session.scaling.stop_parked(session.supervisor, now, profile.worker_stopped)
        if self.script is not None:
            return
        owner, base = self._owner, self._base
        if owner is None or owner[0]() is not session or owner[1] != session.iteration or base is None:
            # a new window: once the count is in effect, and in each epoch anew (the time
            # between epochs is no one's: NOTE [ How the worker count is chosen ])
            if owner is not None and owner[0]() is session and owner[1] != session.iteration:
                self.policy.probe = None  # (its window would span the epochs' end)
            if session.scaling.settled:
                self._owner = (weakref.ref(session), session.iteration)
                self._base = self._measure(session, profile, now)
            return
        batches, _, stall, step = profile.consumer.figures()
        if not enough(stall + step - base.stall - base.step, batches - base.batches):
            return  # (the workers' counters and the machine's are read only for a whole window)
        totals = self._measure(session, profile, now)
        count = self.policy.decide(self._window(base, totals, session))
        if count != session.scaling.target:
            self._apply(session, count, now)
            self._base = None  # the next window begins once the change is in effect
        else:
            self._base = totals

    def _apply(self, session: Any, count: int, now: float) -> None:
        count = max(1, min(count, self.cap))
        self.policy.count = count
        if count != session.scaling.target:
            try:
                session.set_workers(count, now)
            finally:
                self.policy.count = session.scaling.target  # (what runs, if a start failed)
                self._note(now, self.policy.count)

    def _lower_cap(self, session: Any, exc: Exception) -> None:
        running = max(1, session.scaling.target)
        self.cap = self.policy.cap = running
        self.policy.count, self.policy.probe, self._base = running, None, None
        warnings.warn(f"num_workers='auto' could not change its worker count and stays at {running} for this "
                      f"loader ({type(exc).__name__}: {exc})", ShmloadWarning, stacklevel=2)

    def _note(self, now: float, count: int) -> None:
        if not self.history or self.history[-1][1] != count:
            self.history.append((now, count))
            del self.history[:-HISTORY]

    def _measure(self, session: Any, profile: Any, now: float) -> Totals:
        batches, _, stall, step = profile.consumer.figures()
        loading = busy(session.board)
        return Totals(now, batches, stall, step, loading.seconds if loading is not None else 0.0,
                      machine_cpu_seconds(self._cpus))

    def _window(self, a: Totals, b: Totals, session: Any) -> Window:
        """The window from ``a`` to ``b``, within one epoch. Its length is the consumer's
        time (in next() and between calls), not the clock's: a pause in the loop (another
        loader's validation pass, a checkpoint) would make a probe's rate look worse."""
        wall, stall, step = b.at - a.at, b.stall - a.stall, b.step - a.step
        free = None
        if a.machine is not None and b.machine is not None and wall > 0:
            free = len(self._cpus) - (b.machine - a.machine) / wall
        seconds = stall + step
        busy = (b.busy - a.busy) * seconds / wall if wall > 0 else 0.0  # (the workers' share of the clock's time)
        return Window(seconds, b.batches - a.batches, stall, step, busy, free,
                      lambda: room_for(session.worker_pids()))


def room_for(pids: dict[int, int]) -> int | None:
    """How many more workers memory allows, each taking what the first one's resident
    memory is (workers are alike; reading one costs ~0.2 ms), with :data:`MEMORY_RESERVE`
    of the machine left free; None if unknown."""
    try:
        largest = psutil.Process(min(pids.items())[1]).memory_info().rss if pids else 0
        memory = psutil.virtual_memory()
    except (psutil.Error, OSError):
        return None
    if not largest:
        return None
    return max(0, int((memory.available - MEMORY_RESERVE * memory.total) // largest))


def default_cap(max_workers: int | None) -> int:
    """The most workers "auto" may run: ``max_workers``, else the usable cores."""
    return max_workers if max_workers is not None else max(1, len(usable_cpus()) or (os.cpu_count() or 1))
