"""Worker memory over time: each worker's private memory (USS) sampled while batches flow,
and the rule that tells growth worth a diagnosis from a one-time allocation (pure, but
for the sampler's reads).

Why it matters: a forked worker inherits the main process's pages, shared until written.
A dataset holding Python objects (a list of a million file names, of dicts) is read by
the workers, and reading an object writes its reference count, so every page a worker
reads from becomes its own copy: *copy-on-read* (PyTorch issue 13246). It shows as each
worker's USS, the pages only it holds, growing as the epoch goes on: steadily when the
order walks the list, or quickly and then level when it is shuffled (each page holds
dozens of objects, so a shuffled order has copied most pages a few percent into the
epoch). Either way each worker ends with its own copy of the objects. numpy arrays (or
``shmload.datasets.StringArray``) hold the same data in a few large buffers that reads
do not write.

Sampling. USS comes from ``/proc/<pid>/smaps_rollup`` (psutil), a walk of the worker's
page tables: on the development machine 0.5 ms for a worker whose memory is large arrays
(10 MB to 1 GB), 6 to 10 ms for one holding 100 MB of Python objects in 4 kB pages. So
it is read rarely, on the main process's ``next()`` (no thread; ``Profile.sample_memory``,
inside the ring sampling's 5 ms throttle: a read pauses its next() for as long as it
takes, 8 to 25 ms for a worker holding 400 MB of Python objects; no thread, which would
be alive while the loader forks its workers), one
worker per read, round-robin:

* each worker at most every :data:`MEMORY_INTERVAL` (so one read every
  ``MEMORY_INTERVAL / num_workers`` seconds at most), and
* the reads take at most :data:`MEMORY_BUDGET` of the main process's time: after a read
  of ``r`` seconds the next waits at least ``r / MEMORY_BUDGET``.

Each worker process keeps at most :data:`SAMPLES` samples; when they are full every other
one is dropped and that process's interval doubles, so a long run keeps its whole course
at a coarser grain, in a fixed 1 kB a process. Samples are kept per process: a worker
replaced (an epoch's new workers, a restart) starts a new series, and the last
:data:`KEPT` series of each worker id are kept, so a profile read after the epoch still
has the workers that have exited.

Always measured, as the rest of the profile: the history must exist before anyone asks
for it. ``loader.stats(memory=False)`` skips only the reads at the snapshot itself; the
history is reported either way.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Callable

import numpy as np

MEMORY_INTERVAL = 1.0  # seconds between two reads of one worker's USS, at least
MEMORY_BUDGET = 0.01  # share of the main process's time the reads may take, at most
SAMPLES = 64  # samples kept per worker process: 64 x (time, USS) x 8 bytes = 1 kB
KEPT = 2  # series kept per worker id: the live process's and the one before

# NOTE [ When a worker's memory grows ]
# A worker's samples (time, USS) in the window show growth when all of these hold:
#
# 1. enough to judge: MIN_SAMPLES samples or more, over MIN_SECONDS or more;
# 2. large: the last sample exceeds the first by GROWTH_FLOOR and by GROWTH_SHARE of the
#    first, so the allocator's drift and a big worker's noise are not growth;
# 3. held: the peak is at most a quarter of the growth above the last sample (memory
#    that rose and fell back is a passing need, not what the dataset keeps);
# 4. gradual: between reaching 10% and 90% of the growth, RISE_STEPS samples or more
#    were taken. A one-time allocation (a decoder's buffers at the first batch, a cache
#    filled once) is a jump between two samples, which this refuses; copy-on-read
#    spreads over the epoch, or at least its first few percent.
#
# Growth is *steady* when it also goes on through the second half of the samples' time:
# the least-squares fit over that half rises by STEADY_SHARE of the growth or more.
# Otherwise it rose and levelled off: the shape of copy-on-read in a shuffled order.
MIN_SAMPLES = 6
MIN_SECONDS = 3.0
GROWTH_FLOOR = 32e6  # bytes (decimal, as the profile prints them)
GROWTH_SHARE = 0.10
RISE_STEPS = 4
STEADY_SHARE = 0.25

_clock = time.perf_counter  # the profile's clock


@dataclass(frozen=True)
class MemoryTrend:
    """One worker process's private memory (USS) over the window, from its samples."""

    pid: int
    samples: int
    seconds: float  # from the first sample to the last
    first: int  # bytes
    last: int
    peak: int
    rate: float  # bytes a second: the least-squares slope over all samples
    growing: bool  # NOTE [ When a worker's memory grows ] (memory.py)
    steady: bool  # growing, and still in the second half of the samples' time

    @property
    def growth(self) -> int:
        return self.last - self.first


def _slope(t: np.ndarray, u: np.ndarray) -> float:
    dt = t - t.mean()
    denominator = float((dt * dt).sum())
    return float((dt * (u - u.mean())).sum()) / denominator if denominator > 0 else 0.0


def grows(t: np.ndarray, u: np.ndarray) -> bool:
    """Rules 1 to 4 of NOTE [ When a worker's memory grows ], on times ``t`` (seconds) and
    USS ``u`` (bytes), oldest first."""
    if len(u) < MIN_SAMPLES or t[-1] - t[0] < MIN_SECONDS:
        return False
    rise = u[-1] - u[0]
    if rise < max(GROWTH_FLOOR, GROWTH_SHARE * u[0]) or u.max() - u[-1] > rise / 4:
        return False
    tenth, ninetieth = np.argmax(u >= u[0] + 0.1 * rise), np.argmax(u >= u[0] + 0.9 * rise)
    return bool(ninetieth - tenth >= RISE_STEPS)


def still_rising(t: np.ndarray, u: np.ndarray) -> bool:
    """Does the growth go on through the second half of the samples' time?"""
    half = t >= (t[0] + t[-1]) / 2
    return bool(_slope(t[half], u[half]) * (t[-1] - t[half][0]) >= STEADY_SHARE * (u[-1] - u[0]))


def memory_trend(pid: int, rows: np.ndarray) -> MemoryTrend | None:
    """The trend of one process's samples (rows of time, USS; oldest first); None with
    fewer than two."""
    if len(rows) < 2:
        return None
    t, u = rows[:, 0], rows[:, 1]
    growing = grows(t, u)
    return MemoryTrend(pid, len(rows), float(t[-1] - t[0]), int(u[0]), int(u[-1]), int(u.max()), _slope(t, u),
                       growing, growing and still_rising(t, u))


class Series:
    """One worker process's samples: rows of (time, USS), oldest first."""

    def __init__(self, pid: int):
        self.pid = pid
        self.rows = np.zeros((SAMPLES, 2))
        self.count = 0
        self.interval = MEMORY_INTERVAL

    def due(self, now: float) -> bool:
        return self.count == 0 or now - self.rows[self.count - 1, 0] >= self.interval

    def add(self, now: float, uss: int) -> None:
        if self.count == SAMPLES:  # full: keep every other sample, and take them half as often
            kept = self.rows[::2].copy()
            self.rows[:len(kept)] = kept
            self.count = len(kept)
            self.interval *= 2
        self.rows[self.count] = (now, uss)
        self.count += 1

    def since(self, start: float) -> np.ndarray:
        rows = self.rows[:self.count]
        return rows[rows[:, 0] >= start]


class MemoryHistory:
    """The workers' USS over time, read by ``read(pid)`` (bytes, or None if it cannot be
    read) on the schedule of this module's docstring."""

    def __init__(self, read: Callable[[int], int | None]):
        self._read = read
        self._series: dict[int, list[Series]] = {}  # worker id -> its processes' series, oldest first
        self._last = -1  # the worker id read last
        self.next_read = 0.0  # when a read is next due

    def sample(self, now: float, pids: dict[int, int]) -> None:
        """Read the USS of the next worker due after the one read last (``pids``: worker
        id -> pid of the live workers), and set when the next read is due."""
        gap = MEMORY_INTERVAL / max(1, len(pids))
        due = [wid for wid, pid in sorted(pids.items()) if self._series_of(wid, pid).due(now)]
        if due:
            wid = next((w for w in due if w > self._last), due[0])
            began = _clock()
            uss = self._read(pids[wid])
            took = _clock() - began
            if uss is not None:
                self._series[wid][-1].add(now, uss)  # (now, not began: due() compares with now)
            self._last = wid
            gap = max(gap, took / MEMORY_BUDGET)
        self.next_read = now + gap

    def _series_of(self, wid: int, pid: int) -> Series:
        kept = self._series.setdefault(wid, [])
        if not kept or kept[-1].pid != pid:
            kept.append(Series(pid))
            del kept[:-KEPT]
        return kept[-1]

    def window(self, start: float) -> dict[int, tuple[int, np.ndarray]]:
        """Per worker id, the pid and samples since ``start`` of the process with the most
        of them there (the newest, of equals)."""
        out = {}
        for wid, kept in self._series.items():
            best = max(reversed(kept), key=lambda s: len(s.since(start)))
            rows = best.since(start)
            if len(rows):
                out[wid] = (best.pid, rows)
        return out
