"""Stats: a frozen snapshot of a loader's profile, its table and its diagnosis (pure).

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
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Callable

from .errors import format_bytes

DATA_BOUND_STALL = 0.10  # the consumer waits for data this share of its time or more
BUSY_WORKERS = 0.80  # workers busy this share of their time or more: they are the limit


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
        return diagnose(self)

    def table(self) -> str:
        return format_table(self)

    def __str__(self) -> str:
        return self.table() + "\n\n" + self.diagnosis()


# ---------------------------------------------------------------- the table
def _ms(seconds: float, batches: int) -> str:
    return f"{1000 * seconds / batches:.2f}" if batches else "-"


def _mem(value: int | None) -> str:
    return format_bytes(value) if value is not None else "-"


def _cpu(cpu: float | None, duration: float) -> str:
    return f"{100 * cpu / duration:.0f}%" if cpu is not None and duration > 0 else "-"


def format_table(s: LoaderStats) -> str:
    m = s.main
    lines = [
        f"shmload profile: {m.batches} batches in {s.duration:.2f} s ({s.batches_per_second:.1f} batches/s, "
        f"{format_bytes(s.bytes_per_second)}/s), num_workers={s.num_workers}, {s.cores} usable cores",
        f"consumer: waiting in next() {m.stall:.2f} s ({100 * m.stall_fraction:.1f}% of its time: the data stall), "
        f"own work between next() calls {m.step:.2f} s"
        + (f" ({_ms(m.step, m.batches)} ms a batch)" if m.batches else ""),
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
        lines.append(f"total PSS (shared memory counted once): {format_bytes(sum(pss))}")
    if s.ring is not None and s.ring.samples:
        r = s.ring
        lines.append(f"ring: {r.slots} slots x {format_bytes(r.slot_bytes)}; mean occupancy free {r.free:.1f}, "
                     f"filling {r.filling:.1f}, ready {r.ready:.1f}, held by the consumer {r.held:.1f} "
                     f"({r.samples} samples)")
    return "\n".join(lines)


# ---------------------------------------------------------------- the diagnosis
_STAGE_ADVICE = {
    "fetch": "the dataset's __getitem__ (decode less: reduced-size JPEG decoding, smaller source images; "
             "cache decoded data; serve whole batches with __getitems__)",
    "collate": "collate and the copy into the slot (return fixed-shape, contiguous numpy arrays; avoid a "
               "collate_fn that builds Python objects or copies twice)",
    "other": "the loader's own per-batch work (seeding, waiting for a larger ring slot, reporting): pass "
             "slot_bytes so the ring is sized once, or use larger batches",
}


def diagnose(s: LoaderStats) -> str:
    m = s.main
    if m.batches == 0:
        return "diagnosis: no batch delivered in this window yet."
    stages = s.stage_seconds()
    busy = sum(stages.values())
    if not s.workers or busy <= 0:
        return "diagnosis: no worker time recorded in this window yet."
    top = max(stages, key=stages.get)
    share = stages[top] / busy
    worker_ms, step_ms = 1000 * (s.worker_cost() or 0.0), 1000 * (s.step_cost() or 0.0)
    util = sum(w.busy for w in s.workers) / max(1e-12, sum(w.busy + w.wait for w in s.workers))
    needed = s.workers_needed()
    stage_line = (f"The workers spend {100 * share:.0f}% of their busy time in {top} "
                  f"({1000 * stages[top] / max(1, sum(w.batches for w in s.workers)):.2f} ms a batch).")
    inline = s.num_workers == 0
    parts = []
    if s.data_bound:
        parts.append(f"diagnosis: DATA-BOUND. The consumer waits for data {100 * s.stall_fraction:.0f}% of its time "
                     f"({1000 * m.stall / m.batches:.2f} ms a batch inside next(), against {step_ms:.2f} ms of its "
                     "own work).")
        parts.append(stage_line)
        if inline:
            want = min(needed or 1, s.cores)
            parts.append(f"Recommendation: load in worker processes: num_workers={want}. A batch costs "
                         f"{worker_ms:.2f} ms to load and the step {step_ms:.2f} ms, so keeping up takes about "
                         f"{needed} workers; {s.cores} cores are usable.")
            if needed is not None and needed > s.cores:
                parts.append(f"That is fewer than needed: also speed up {_STAGE_ADVICE[top]}.")
        elif util >= BUSY_WORKERS:
            room = s.cores - s.num_workers
            if needed is not None and needed > s.num_workers and room > 0:
                want = min(needed, s.cores)
                parts.append(f"Recommendation: num_workers={want}. The workers are busy {100 * util:.0f}% of the "
                             f"time; a batch costs a worker {worker_ms:.2f} ms and the consumer {step_ms:.2f} ms, so "
                             f"keeping up takes about {needed} workers, and {s.cores} cores are usable.")
                if needed > s.cores:
                    parts.append(f"That is fewer than the {needed} needed: also speed up {_STAGE_ADVICE[top]}.")
            else:
                why = (f"{s.num_workers} workers already use the {s.cores} usable cores" if room <= 0 else
                       f"more workers would not help much (about {needed} needed)")
                parts.append(f"Recommendation: speed up {_STAGE_ADVICE[top]}. The workers are busy "
                             f"{100 * util:.0f}% of the time and {why}.")
        else:
            parts.append(f"Recommendation: a deeper queue: prefetch_factor={2 * s.prefetch} (now {s.prefetch} tasks "
                         f"a worker). The workers are busy only {100 * util:.0f}% of the time while the consumer "
                         "waits, so batches are not handed out fast enough; if that does not help, the main "
                         "process itself is the limit (larger batches cost it less per sample).")
    else:
        parts.append(f"diagnosis: CONSUMER-BOUND. Loading is hidden behind the consumer's own work: it waits for "
                     f"data only {100 * s.stall_fraction:.0f}% of its time.")
        parts.append(stage_line)
        if not inline and needed is not None and needed < s.num_workers:
            parts.append(f"Recommendation: num_workers={needed} would keep up and free "
                         f"{s.num_workers - needed} core(s): a batch costs a worker {worker_ms:.2f} ms and the "
                         f"consumer {step_ms:.2f} ms.")
        else:
            parts.append("Recommendation: nothing to change in the loader; speed up the training step itself.")
    return "\n".join(parts)
