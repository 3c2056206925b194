"""Profile: the main process's side of the always-on profiler.

Each loader has one :class:`Profile`. It times the consumer (:class:`ConsumerClock`: how
long each ``next()`` takes, the *stall*, and the time between calls, the consumer's own
*step*), samples the ring's occupancy, and gathers the workers' counters from their
boards (``counters.py``): from live sessions when asked, and from each session as it
closes, so ``loader.stats()`` still answers after an epoch whose workers have exited.

A *window* starts when the loader is created and again at each :meth:`Profile.reset`;
counters are cumulative, so a window's figures are today's totals minus those at its
start. :meth:`Profile.snapshot` turns a window into a frozen :class:`~shmload.profiler.stats.LoaderStats`.

While batches flow it also samples each worker's private memory (USS) now and then, to
tell whether it grows (``memory.py``).

The window also reads the machine's CPU time on the usable cores (``/proc/stat``) at
both ends, so the snapshot can tell the cores' load by other programs from its own.
"""

from __future__ import annotations

import os
import struct
import time
import weakref
from typing import Any, Protocol

import numpy as np

# At import, not in cpu_seconds(): close() reads the workers' CPU times, and a close()
# run by a finalizer during the first `import psutil` (the garbage collector runs them
# anywhere) found a half-initialized module and stopped part-way.
import psutil

from .._core import native
from .._core._platform import usable_cpus
from . import counters
from .dataset import describe_dataset
from .memory import MEMORY_INTERVAL, MemoryHistory, memory_trend
from .stats import LoaderStats, MainStats, RingStats, WorkerStats

CALLS = 16384  # next() calls of history kept for the trace
OCCUPANCY = 8192  # ring occupancy samples kept
OCCUPANCY_INTERVAL = 0.005  # seconds between ring occupancy samples, at most
INLINE = -1  # the worker id of in-process loading (num_workers=0)

_clock = time.perf_counter


class ProfiledSession(Protocol):
    """What the profile reads of a live session (``session.Session``), and nothing more."""

    closed: bool

    @property
    def board(self) -> Any:
        """counters.board(): a row of counters per worker; None once closed."""

    def worker_pids(self) -> dict[int, int]:
        """Worker id -> pid of the live workers."""

    def profile_settings(self) -> tuple[int, int, int, int]:
        """(num_workers, tasks each worker may hold, ring slots, bytes per slot)."""


class ConsumerClock:
    """Times every ``next()``: about 0.6 us a call, its clock readings included (docs/performance.md).

    Each delivered batch stores one record in ``calls`` (entered, left, bytes, step) with
    one ``struct.pack_into``; the totals (batches, bytes, stall, step) are summed from the
    records every :data:`counters.FLUSH <shmload.profiler.counters.FLUSH>` calls and on demand, as
    the workers' counters are (see ``counters.py``).

    ``step`` is the time from one ``next()`` returning to the next one being called: the
    consumer's own work. After an epoch ends (StopIteration) the gap to the next epoch's
    first call is not counted: the consumer was not waiting for this loader's data.
    """

    _CALL = struct.Struct("4d")

    def __init__(self) -> None:
        self._left: float | None = None
        # entered, left, bytes delivered, the step before it (0.0 after an epoch's end)
        self.calls = np.zeros((CALLS, 4))
        self._buffer = self.calls.data.cast("B")
        self.count = 0
        self._stored = np.zeros(4)  # batches, bytes, stall, step of calls before _covered
        self._covered = 0
        self._ended_stall = self._ended_step = 0.0  # next() calls that raised (StopIteration, errors)
        self.occupancy = np.zeros((OCCUPANCY, 5))  # time, free, filling, ready, held
        self.occupancy_count = 0
        self.next_sample = 0.0  # when ring occupancy is next due

    def enter(self) -> float:
        return _clock()

    def leave(self, entered: float, nbytes: int) -> None:
        """``next()`` returned a batch of ``nbytes`` array bytes."""
        now = _clock()
        left, k = self._left, self.count
        self._CALL.pack_into(self._buffer, 32 * (k % CALLS), entered, now, nbytes,
                             0.0 if left is None else entered - left)
        self._left = now
        self.count = k + 1
        if k + 1 - self._covered >= counters.FLUSH:
            self._stored = self.totals()
            self._covered = self.count

    def ended(self, entered: float) -> None:
        """``next()`` raised (StopIteration, or an error)."""
        self._ended_stall += _clock() - entered
        if self._left is not None:
            self._ended_step += entered - self._left  # the consumer's work on the last batch
        self._left = None

    def totals(self) -> np.ndarray:
        """batches, bytes, stall and step of the calls that delivered a batch."""
        c = self.calls[np.arange(self._covered, self.count) % CALLS]
        return self._stored + np.array([len(c), c[:, 2].sum(), (c[:, 1] - c[:, 0]).sum(), c[:, 3].sum()])

    def figures(self) -> tuple[int, int, float, float]:
        """batches, bytes, stall and step so far, the calls that raised included."""
        t = self.totals()
        return int(t[0]), int(t[1]), float(t[2]) + self._ended_stall, float(t[3]) + self._ended_step

    @property
    def batches(self) -> int:
        return self.figures()[0]

    @property
    def bytes(self) -> int:
        return self.figures()[1]

    @property
    def stall(self) -> float:
        return self.figures()[2]

    @property
    def step(self) -> float:
        return self.figures()[3]

    def sample_ring(self, counts: dict[str, int]) -> None:
        """Store the ring's slots per state (``ring.Ring.counts()``)."""
        now = _clock()
        self.next_sample = now + OCCUPANCY_INTERVAL
        c = counts
        row = self.occupancy[self.occupancy_count % OCCUPANCY]
        row[:] = (now, c["free"], c["filling"], c["ready"], c["held"])
        self.occupancy_count += 1


def cpu_seconds(pid: int) -> float | None:
    try:
        t = psutil.Process(pid).cpu_times()
    except (psutil.Error, OSError):
        return None
    return t.user + t.system


def in_window(counts: list[tuple[float, int]], origin: float) -> tuple[tuple[float, int], ...]:
    """(clock, count) changes as (seconds from ``origin``, count): the count at ``origin``
    first, at 0.0 (None before any, if it has not started yet)."""
    before = [n for t, n in counts if t <= origin]
    head = ((0.0, before[-1]),) if before else ()
    return head + tuple((round(t - origin, 6), n) for t, n in counts if t > origin)


def workers_cpu(profile: Any, pids: dict[int, int]) -> dict[int, tuple[int, float | None]]:
    """Worker id -> (pid, CPU seconds), read as a session closes, for ``profile``; {} without
    a profile or if it cannot be read: the profile must never keep close() from releasing
    what it holds."""
    if profile is None:
        return {}
    try:
        return {wid: (pid, cpu_seconds(pid)) for wid, pid in pids.items()}
    except Exception:
        return {}


_TICKS_PER_SECOND = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100


def machine_cpu_seconds(cpus: set[int]) -> float | None:
    """CPU seconds all processes together have spent on ``cpus`` since boot, from
    ``/proc/stat``: user, nice, system, irq, softirq and steal (time a hypervisor gave the
    CPU to another machine: it was not ours either). None where it cannot be read."""
    try:
        with open("/proc/stat") as f:
            lines = f.read().splitlines()
    except OSError:
        return None
    ticks = 0
    for line in lines:
        name, _, rest = line.partition(" ")
        if name[:3] == "cpu" and name[3:].isdigit() and int(name[3:]) in cpus:
            v = [int(x) for x in rest.split()] + [0] * 8
            ticks += v[0] + v[1] + v[2] + v[5] + v[6] + v[7]
    return ticks / _TICKS_PER_SECOND


def _memory(pid: int) -> tuple[int | None, int | None, int | None]:
    try:
        info = psutil.Process(pid).memory_full_info()
    except (psutil.Error, OSError):
        return None, None, None
    if not info.rss:  # a process that has exited but is not yet reaped (a zombie) has no memory to read
        return None, None, None
    return info.rss, getattr(info, "pss", None), info.uss


def _recent(rows: np.ndarray, count: int, capacity: int) -> np.ndarray:
    """The rows of a ring of ``capacity`` holding ``count`` records so far, oldest first."""
    if count <= capacity:
        return np.array(rows[:count])
    start = count % capacity
    return np.concatenate([rows[start:], rows[:start]])


class Profile:
    def __init__(self) -> None:
        self.consumer = ConsumerClock()
        self.inline_board = np.zeros((1, counters.row_words()))  # num_workers=0 loads here
        self.inline = counters.Recorder(self.inline_board, 0)
        self._sessions: weakref.WeakSet = weakref.WeakSet()
        self._retired_totals: dict[int, np.ndarray] = {}  # worker id -> counters of closed sessions
        self._retired_events: dict[int, list[np.ndarray]] = {}
        self.memory = MemoryHistory(lambda pid: _memory(pid)[2])  # the workers' USS over time (memory.py)
        self.reset()

    def reset(self) -> None:
        """Start a new window now."""
        self.started = _clock()
        self._cpu_main = time.process_time()
        self._cpu_machine = machine_cpu_seconds(usable_cpus())
        self._base_totals = self._totals()
        self._base_consumer = self.consumer.figures()
        self._base_cpu = {pid: cpu for pid, cpu in self._live_cpu().items()}
        self._retired_cpu: dict[int, float] = {}  # worker id -> CPU seconds of closed sessions, this window

    # ------------------------------------------------------------ sessions
    def attach(self, session: ProfiledSession) -> None:
        self._sessions.add(session)

    def retire(self, session: ProfiledSession, cpu: dict[int, tuple[int, float | None]]) -> None:
        """A session is closing: keep its workers' counters, events and CPU seconds
        (``cpu``: worker id -> (pid, seconds), read before the workers stopped)."""
        if session not in self._sessions:
            return
        self._sessions.discard(session)
        board = session.board
        tot = counters.totals(board)
        for wid in range(len(tot)):
            self._retired_totals[wid] = self._retired_totals.get(wid, 0) + tot[wid]
            ev, _ = counters.events(board, wid)
            kept = self._retired_events.setdefault(wid, [])
            kept.append(ev)
            while sum(len(e) for e in kept) > 2 * counters.EVENTS:
                kept.pop(0)
        for wid, (pid, seconds) in cpu.items():
            if seconds is not None:
                self._retired_cpu[wid] = self._retired_cpu.get(wid, 0.0) + seconds - self._base_cpu.get(pid, 0.0)

    def worker_stopped(self, wid: int, pid: int) -> None:
        """Worker ``wid`` (process ``pid``) is about to exit while its session runs on
        (num_workers="auto"): keep its CPU seconds, which cannot be read once it is gone."""
        seconds = cpu_seconds(pid)
        if seconds is not None:
            self._retired_cpu[wid] = self._retired_cpu.get(wid, 0.0) + seconds - self._base_cpu.get(pid, 0.0)

    def sample_memory(self, session: ProfiledSession) -> None:
        """Read a worker's USS if one is due (``memory.py``). Called on ``next()`` within the
        ring sampling's throttle: one clock reading and a comparison when nothing is due."""
        now = _clock()
        if now >= self.memory.next_read:
            try:
                self.memory.sample(now, session.worker_pids())
            except Exception:  # (a figure of the profile is never worth a batch: next() goes on)
                self.memory.next_read = now + MEMORY_INTERVAL

    def _live(self) -> list[ProfiledSession]:
        return [s for s in list(self._sessions) if not s.closed]

    def _live_cpu(self) -> dict[int, float]:
        out = {}
        for session in self._live():
            for pid in session.worker_pids().values():
                cpu = cpu_seconds(pid)
                if cpu is not None:
                    out[pid] = cpu
        return out

    def _totals(self) -> dict[int, np.ndarray]:
        """Cumulative counters per worker id (INLINE for in-process loading)."""
        out: dict[int, np.ndarray] = {wid: np.array(t) for wid, t in self._retired_totals.items()}
        for session in self._live():
            tot = counters.totals(session.board)
            for wid in range(len(tot)):
                out[wid] = out.get(wid, 0) + tot[wid]
        inline = counters.totals(self.inline_board)[0]
        if inline[0]:
            out[INLINE] = inline
        return out

    # ------------------------------------------------------------ the snapshot
    def snapshot(self, num_workers: int, prefetch: int, memory: bool = True, dataset: Any = None,
                 shm_backend: str | None = None, counts: list[tuple[float, int]] | None = None,
                 max_workers: int | None = None) -> LoaderStats:
        """The window so far. ``num_workers`` and ``prefetch`` are the loader's settings,
        used when no session is live (a live one reports its own); ``dataset``, if given,
        is described in the snapshot so that its diagnosis names stages it really has.
        ``memory=False`` skips reading each process's memory now; the workers' USS over
        time, sampled all along (``memory.py``), is reported either way. ``counts``:
        num_workers="auto"'s (clock, count) at each change, up to ``max_workers``."""
        now = _clock()
        duration = now - self.started
        cpus = usable_cpus()
        machine, cpu_main = self._cpu_window(cpus, duration)
        totals, base = self._totals(), self._base_totals
        pids: dict[int, int] = {}
        ring = None  # (slots, bytes per slot) of the newest live session
        for session in self._live():
            pids.update(session.worker_pids())
            num_workers, prefetch, slots, slot_bytes = session.profile_settings()
            ring = (slots, slot_bytes)
        live_cpu = self._live_cpu()
        history = self.memory.window(self.started)
        trends = {wid: memory_trend(pid, rows) for wid, (pid, rows) in history.items()}
        workers = []
        for wid in sorted(totals):
            t = totals[wid] - base.get(wid, 0)
            if not t[0] and wid not in pids:
                continue
            pid = os.getpid() if wid == INLINE else pids.get(wid)
            cpu = self._retired_cpu.get(wid)
            if pid is not None and pid in live_cpu and wid != INLINE:
                cpu = (cpu or 0.0) + live_cpu[pid] - self._base_cpu.get(pid, 0.0)
            rss = pss = uss = None
            if memory and pid is not None and wid != INLINE:
                rss, pss, uss = _memory(pid)
            f = dict(zip(counters.FIELDS, t))
            workers.append(WorkerStats(wid, pid, int(f["batches"]), int(f["samples"]), int(f["bytes"]), f["wait"],
                                       f["fetch"], f["collate"], f["other"], cpu, rss, pss, uss, trends.get(wid)))
        c, b = self.consumer.figures(), self._base_consumer
        mrss, mpss, muss = _memory(os.getpid()) if memory else (None, None, None)
        main = MainStats(os.getpid(), c[0] - b[0], c[1] - b[1], c[2] - b[2], c[3] - b[3],
                         cpu_main, mrss, mpss, muss)
        ring_stats = self._ring_stats(ring)
        timeline = self._timeline(pids, history)
        window = in_window(counts, self.started) if counts is not None else None
        timeline["worker_counts"] = [(self.started + t, n) for t, n in window or ()]
        return LoaderStats(duration, num_workers, len(cpus), prefetch, main, tuple(workers), ring_stats,
                           timeline, self.reset, machine_cpu=machine,
                           dataset=describe_dataset(dataset) if dataset is not None else None,
                           shm_backend=shm_backend if num_workers else None, core=native.CORE,
                           worker_counts=window, max_workers=max_workers)

    def _cpu_window(self, cpus: set[int], duration: float) -> tuple[float | None, float]:
        """The machine's CPU seconds on ``cpus`` and the main process's in the window, read
        together (and before the memory maps, which cost the main process CPU). The kernel
        counts in ticks (10 ms), so a short window may show more than it can hold: capped."""
        machine, main = machine_cpu_seconds(cpus), time.process_time() - self._cpu_main
        if machine is None or self._cpu_machine is None:
            return None, main
        return min(machine - self._cpu_machine, len(cpus) * duration), main

    def _ring_stats(self, ring: tuple[int, int] | None) -> RingStats | None:
        if ring is None:
            return None
        occ = self._window(_recent(self.consumer.occupancy, self.consumer.occupancy_count, OCCUPANCY), 0)
        means = occ[:, 1:].mean(axis=0) if len(occ) else np.zeros(4)
        return RingStats(ring[0], ring[1], len(occ), *map(float, means))

    def _window(self, rows: np.ndarray, time_column: int) -> np.ndarray:
        return rows[rows[:, time_column] >= self.started] if len(rows) else rows

    def _timeline(self, pids: dict[int, int], history: dict[int, tuple[int, np.ndarray]]) -> dict[str, Any]:
        """The window's raw events: per worker id, its batches (``counters.EVENT_FIELDS``);
        the consumer's next() calls (entered, left, bytes, stepped before); ring occupancy samples
        (time, free, filling, ready, held); per worker id, its USS samples (time, bytes)."""
        events: dict[int, list[np.ndarray]] = {wid: list(evs) for wid, evs in self._retired_events.items()}
        for session in self._live():
            for wid in range(len(session.board)):
                events.setdefault(wid, []).append(counters.events(session.board, wid)[0])
        inline, _ = counters.events(self.inline_board, 0)
        if len(inline):
            events[INLINE] = [inline]
        done = counters.EVENT_FIELDS.index("done")
        workers = {wid: self._window(np.concatenate(evs), done) for wid, evs in events.items() if evs}
        c = self.consumer
        return {
            "origin": self.started,
            "workers": {wid: ev for wid, ev in workers.items() if len(ev)},
            "pids": dict(pids),
            "main_pid": os.getpid(),
            "calls": self._window(_recent(c.calls, c.count, CALLS), 0),
            "occupancy": self._window(_recent(c.occupancy, c.occupancy_count, OCCUPANCY), 0),
            "memory": {wid: rows for wid, (_, rows) in history.items()},
        }
