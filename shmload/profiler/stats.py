"""Stats: a frozen snapshot of a loader's profile and its table (pure); its diagnosis is
``diagnosis.py``.

``loader.stats()`` builds a :class:`LoaderStats` from the counters (``counters.py``,
``profile.py``); everything here works on those numbers alone, so the diagnosis is
tested without processes. Times are seconds, sizes bytes.

The diagnosis answers three questions, each from numbers the table shows:

* Is training waiting for data? The *stall* is the share of the consumer's time spent
  inside ``next()``; at :data:`DATA_BOUND_STALL` or more the run is data-bound.
* Which stage costs what? Each worker's busy time splits into fetch (the dataset),
  collate (collate_fn, planning and the copy into the slot) and other (seeding, waiting
  for a larger slot, reporting); the rest of its time it waited for a task.
* How many workers? A batch costs a worker ``busy / batches`` seconds and the consumer
  ``step / batches``; keeping up takes ``ceil(worker cost / step cost)`` workers, at
  most the usable cores. (In a data-bound run the measured step is the consumer's own
  work, which is what it would do with data always ready.)

A fourth question is only raised when the answer is yes: does a worker's private memory
grow? Each worker's USS is sampled over the window (``memory.py``, where the rule is);
growth that is not a one-time allocation is most likely copy-on-read of the dataset's
Python objects.

Two things qualify the answers. What the dataset is (:class:`DatasetInfo`, when the
snapshot was told) decides which advice the diagnosis gives for a slow fetch: image
decoding advice only for datasets that decode images. And the cores may have been busy
with other programs (:meth:`LoaderStats.contention`): then the figures, and a
recommendation of fewer workers, may be too low.

Every figure is printed in decimal units: kB, MB and GB (10**3, 10**6, 10**9 bytes) and
MB/s, GB/s, as in docs/performance.md.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Callable

from .._core._units import decimal_rate, decimal_size
from .dataset import DatasetInfo
from .memory import MemoryTrend

DATA_BOUND_STALL = 0.10  # the consumer waits for data this share of its time or more
# Other programs' CPU that counts as contention: at least this many cores on average, and
# at least MIN_OTHER_SECONDS in all (the kernel counts CPU time in 10 ms ticks, so a short
# window could show a fraction of a core that nobody used).
OTHER_CORES = 0.2
MIN_OTHER_SECONDS = 0.1


@dataclass(frozen=True)
class WorkerStats:
    """One worker (or, with ``num_workers=0``, the main process loading in-line)."""

    id: int
    pid: int | None
    batches: int
    samples: int
    bytes: int
    wait: float  # waiting for a task
    fetch: float  # in the dataset's __getitem__ / __getitems__
    collate: float  # collate_fn, planning, writing the slot
    other: float  # seeding, waiting for a larger slot, reporting
    cpu: float | None = None  # CPU seconds in the window (psutil), None if unknown
    rss: int | None = None
    pss: int | None = None
    uss: int | None = None
    memory: MemoryTrend | None = None  # its USS over the window (memory.py); None: fewer than two samples

    @property
    def busy(self) -> float:
        return self.fetch + self.collate + self.other

    @property
    def utilization(self) -> float:
        """Busy share of the time it was measured (busy + waiting for a task)."""
        total = self.busy + self.wait
        return self.busy / total if total > 0 else 0.0


@dataclass(frozen=True)
class MainStats:
    pid: int
    batches: int  # delivered by next()
    bytes: int  # array bytes delivered
    stall: float  # seconds inside next() (waiting for data, plus the loader's own work)
    step: float  # seconds between next() calls: the consumer's own work
    cpu: float | None = None
    rss: int | None = None
    pss: int | None = None
    uss: int | None = None

    @property
    def stall_fraction(self) -> float:
        total = self.stall + self.step
        return self.stall / total if total > 0 else 0.0


@dataclass(frozen=True)
class RingStats:
    slots: int
    slot_bytes: int
    samples: int  # occupancy samples taken
    free: float  # mean number of slots in each state over the samples
    filling: float
    ready: float
    held: float


@dataclass(frozen=True)
class LoaderStats:
    """A frozen snapshot of one window (since the loader started or since ``reset()``).

    ``print(stats)`` shows the table and the diagnosis; :meth:`trace` writes a Chrome
    trace (Perfetto, chrome://tracing), :meth:`plot` a picture (needs matplotlib).
    """

    duration: float  # seconds of the window
    num_workers: int
    cores: int  # usable by this process (its CPU affinity)
    prefetch: int  # tasks each worker may hold
    main: MainStats
    workers: tuple[WorkerStats, ...]
    ring: RingStats | None
    # Raw timelines for trace() and plot(): see profile.py for their columns.
    timeline: Any = field(default=None, repr=False, compare=False)
    _reset: Callable[[], None] | None = field(default=None, repr=False, compare=False)
    # CPU seconds all processes together spent on the usable cores in the window
    # (/proc/stat); None if unknown.
    machine_cpu: float | None = None
    dataset: DatasetInfo | None = None  # None: not known to the snapshot
    shm_backend: str | None = None  # the ring's segments: "memfd" | "posix"; None without workers
    core: str = "python"  # the default collate's per-sample work: "compiled" (_native.c) | "python"
    # num_workers="auto": (seconds into the window, workers run from then on), the first
    # at 0 if the window began after the workers started (else when they started; empty
    # before any epoch); None with a fixed count. ``num_workers`` is then the count run last.
    worker_counts: tuple[tuple[float, int], ...] | None = None
    max_workers: int | None = None  # "auto"'s cap

    # ------------------------------------------------------------ derived figures
    @property
    def batches_per_second(self) -> float:
        return self.main.batches / self.duration if self.duration > 0 else 0.0

    @property
    def bytes_per_second(self) -> float:
        return self.main.bytes / self.duration if self.duration > 0 else 0.0

    @property
    def stall_fraction(self) -> float:
        return self.main.stall_fraction

    @property
    def data_bound(self) -> bool:
        return self.main.batches > 0 and self.stall_fraction >= DATA_BOUND_STALL

    def stage_seconds(self) -> dict[str, float]:
        """Busy seconds per stage, summed over the workers."""
        return {s: sum(getattr(w, s) for w in self.workers) for s in ("fetch", "collate", "other")}

    def worker_cost(self) -> float | None:
        """Busy worker-seconds per batch."""
        batches = sum(w.batches for w in self.workers)
        return sum(w.busy for w in self.workers) / batches if batches else None

    def step_cost(self) -> float | None:
        """The consumer's own seconds per batch."""
        return self.main.step / self.main.batches if self.main.batches else None

    def own_cpu(self) -> float | None:
        """CPU seconds of this loader's processes (main and workers) in the window."""
        cpus = [self.main.cpu] + [w.cpu for w in self.workers if w.id >= 0]  # in-process loading is main's
        known = [c for c in cpus if c is not None]
        return sum(known) if len(known) == len(cpus) else None

    def other_cores(self) -> float | None:
        """Cores used on average by other programs in the window: the machine's CPU on the
        usable cores minus this loader's; None if either is unknown."""
        own = self.own_cpu()
        if self.machine_cpu is None or own is None or self.duration <= 0:
            return None
        return max(0.0, self.machine_cpu - own) / self.duration

    def contention(self) -> str | None:
        """A warning when other programs took cores this loader could have used: they used
        at least :data:`OTHER_CORES` cores on average (and :data:`MIN_OTHER_SECONDS` in all),
        and what they left is less than the main process and the workers could use."""
        others = self.other_cores()
        if others is None or others < OTHER_CORES or others * self.duration < MIN_OTHER_SECONDS:
            return None
        if self.cores - others >= min(self.num_workers + 1, self.cores):
            return None
        return f"other programs used {others:.2f} of the {self.cores} usable cores"

    def workers_needed(self) -> int | None:
        """Workers that keep up with the consumer: ceil(worker cost / step cost)."""
        worker, step = self.worker_cost(), self.step_cost()
        if worker is None or not step:
            return None
        return max(1, math.ceil(worker / step))

    # ------------------------------------------------------------ actions
    def reset(self) -> None:
        """Start a fresh window on the loader this snapshot came from."""
        if self._reset is None:
            raise RuntimeError("this snapshot is not attached to a loader")
        self._reset()

    def trace(self, path: str) -> None:
        """Write the window's timeline as Chrome trace events (JSON)."""
        from .trace import write_trace

        write_trace(self, path)

    def plot(self, path: str) -> None:
        """Draw worker utilization over time and the stage breakdown (needs matplotlib)."""
        from .plot import plot_stats

        plot_stats(self, path)

    # ------------------------------------------------------------ text
    def diagnosis(self) -> str:
        from .diagnosis import diagnose  # (it reads these classes, for their types only)

        return diagnose(self)

    def table(self) -> str:
        return format_table(self)

    def __str__(self) -> str:
        return self.table() + "\n\n" + self.diagnosis()


# ---------------------------------------------------------------- the table
def _ms(seconds: float, batches: int) -> str:
    return f"{1000 * seconds / batches:.2f}" if batches else "-"


def _mem(value: int | None) -> str:
    return decimal_size(value) if value is not None else "-"


def _signed_rate(bytes_per_second: float) -> str:
    return ("-" if bytes_per_second < 0 else "+") + decimal_rate(abs(bytes_per_second))


def memory_line(trends: list[MemoryTrend]) -> str:
    """The workers' USS over the window, summed: first and last samples, the longest
    span, the summed slopes, and how many grew (NOTE [ When a worker's memory grows ])."""
    line = (f"workers' private memory (USS): {decimal_size(sum(m.first for m in trends))} -> "
            f"{decimal_size(sum(m.last for m in trends))} over {max(m.seconds for m in trends):.1f} s "
            f"({_signed_rate(sum(m.rate for m in trends))})")
    steady, levelled = sum(m.steady for m in trends), sum(m.growing and not m.steady for m in trends)
    if steady:
        line += f"; growing steadily in {steady} of {len(trends)} workers"
    if levelled:
        line += f"; grew and levelled off in {levelled} of {len(trends)} workers"
    return line


def auto_line(counts: tuple[tuple[float, int], ...], cap: int | None) -> str:
    """num_workers="auto"'s counts over the window: the changes, the last few if many."""
    steps = [f"{n} at {t:.2f} s" for t, n in counts] or ["no worker started yet"]
    if len(steps) > 8:
        steps = steps[:2] + [f"... ({len(steps) - 6} more)"] + steps[-4:]
    return f"num_workers='auto' (at most {cap}): {', '.join(steps)}"


def _cpu(cpu: float | None, duration: float) -> str:
    return f"{100 * cpu / duration:.0f}%" if cpu is not None and duration > 0 else "-"


def format_table(s: LoaderStats) -> str:
    m = s.main
    lines = [
        f"shmload profile: {m.batches} batches in {s.duration:.2f} s ({s.batches_per_second:.1f} batches/s, "
        f"{decimal_rate(s.bytes_per_second)}), num_workers={s.num_workers}, {s.cores} usable cores"
        + (f", {s.shm_backend} segments" if s.shm_backend else "") + f", {s.core} core",
        f"consumer: waiting in next() {m.stall:.2f} s ({100 * m.stall_fraction:.1f}% of its time: the data stall), "
        f"own work between next() calls {m.step:.2f} s"
        + (f" ({_ms(m.step, m.batches)} ms a batch)" if m.batches else ""),
    ]
    if s.worker_counts is not None:
        lines.append(auto_line(s.worker_counts, s.max_workers))
    others, own = s.other_cores(), s.own_cpu()
    if others is not None and own is not None and s.machine_cpu is not None:  # (others is None without both)
        lines.append(f"cores: the {s.cores} usable cores were {100 * s.machine_cpu / s.duration / s.cores:.0f}% busy: "
                     f"this loader {own / s.duration:.2f} cores, other programs {others:.2f}")
    lines += [
        "",
        f"{'':<18}{'batches':>8}{'busy':>7}{'ms/batch: wait':>16}{'fetch':>8}{'collate':>9}{'other':>8}"
        f"{'CPU':>7}{'RSS':>11}{'PSS':>11}{'USS':>11}",
    ]
    for w in s.workers:
        name = f"worker {w.id}" + (f" ({w.pid})" if w.pid is not None else "") if w.id >= 0 else "in-process"
        lines.append(
            f"{name:<18}{w.batches:>8}{100 * w.utilization:>6.0f}%{_ms(w.wait, w.batches):>16}"
            f"{_ms(w.fetch, w.batches):>8}{_ms(w.collate, w.batches):>9}{_ms(w.other, w.batches):>8}"
            f"{_cpu(w.cpu, s.duration):>7}{_mem(w.rss):>11}{_mem(w.pss):>11}{_mem(w.uss):>11}")
    lines.append(f"{'main (' + str(m.pid) + ')':<18}{m.batches:>8}{'':>7}{'':>16}{'':>8}{'':>9}{'':>8}"
                 f"{_cpu(m.cpu, s.duration):>7}{_mem(m.rss):>11}{_mem(m.pss):>11}{_mem(m.uss):>11}")
    pss = [p for p in [m.pss] + [w.pss for w in s.workers] if p is not None]
    if pss:
        lines.append(f"total PSS (shared memory counted once): {decimal_size(sum(pss))}")
    trends = [w.memory for w in s.workers if w.memory is not None]
    if trends:
        lines.append(memory_line(trends))
    if s.ring is not None and s.ring.samples:
        r = s.ring
        lines.append(f"ring: {r.slots} slots x {decimal_size(r.slot_bytes)}; mean occupancy free {r.free:.1f}, "
                     f"filling {r.filling:.1f}, ready {r.ready:.1f}, held by the consumer {r.held:.1f} "
                     f"({r.samples} samples)")
    return "\n".join(lines)
