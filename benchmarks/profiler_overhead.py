"""What the always-on profiler costs: the same loader with its recording stubbed out, in
the same run, alternating.

    python -m benchmarks.profiler_overhead [--runs 7] [--epochs 3]

"off" replaces the recording calls (``counters.Recorder.batch`` in the workers, which
fork and inherit the patch, and ``ConsumerClock.enter/leave/ring_sample_due`` in the main
process) with no-ops; everything else is identical. Runs alternate on/off, in ABBA order,
so drift of a shared machine hits both alike; the figure is the ratio of the medians. ``tiny`` (batches
of 256 small rows, ~250 us of work a batch) is where a fixed per-batch cost shows most.
"""

from __future__ import annotations

import argparse
import statistics
import time
from contextlib import contextmanager

import shmload
from shmload import counters
from shmload.profile import ConsumerClock

from .workloads import CachedImages, TinyRows


@contextmanager
def recording_off():
    saved = (counters.Recorder.batch, ConsumerClock.enter, ConsumerClock.leave, ConsumerClock.ring_sample_due)
    counters.Recorder.batch = lambda self, *args: None
    ConsumerClock.enter = lambda self: 0.0
    ConsumerClock.leave = lambda self, entered, nbytes: None
    ConsumerClock.ring_sample_due = lambda self: False
    try:
        yield
    finally:
        counters.Recorder.batch, ConsumerClock.enter, ConsumerClock.leave, ConsumerClock.ring_sample_due = saved


def batches_per_second(dataset, batch_size: int, epochs: int) -> float:
    with shmload.DataLoader(dataset, batch_size=batch_size, shuffle=True, num_workers=2, persistent_workers=True,
                            multiprocessing_context="fork", seed=0) as loader:
        for _ in loader:  # warm-up: workers up, ring sized
            pass
        rates = []
        for _ in range(epochs):
            start, n = time.perf_counter(), 0
            for _ in loader:
                n += 1
            rates.append(n / (time.perf_counter() - start))
    return statistics.median(rates)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--runs", type=int, default=7, help="runs per mode (alternating)")
    parser.add_argument("--epochs", type=int, default=3)
    args = parser.parse_args()
    workloads = {"tiny": (TinyRows(256 * 400), 256), "transport": (CachedImages(64 * 60, (3, 224, 224)), 64)}
    print(f"{'workload':<10}{'profiler on':>14}{'off':>12}{'on / off':>10}   batches/s, median of {args.runs} runs")
    for name, (dataset, batch_size) in workloads.items():
        on, off = [], []
        for run in range(args.runs):
            for mode in (("on", "off") if run % 2 == 0 else ("off", "on")):  # ABBA: no order bias
                if mode == "on":
                    on.append(batches_per_second(dataset, batch_size, args.epochs))
                else:
                    with recording_off():
                        off.append(batches_per_second(dataset, batch_size, args.epochs))
        m_on, m_off = statistics.median(on), statistics.median(off)
        print(f"{name:<10}{m_on:>14.1f}{m_off:>12.1f}{m_on / m_off:>10.3f}   "
              f"(on {min(on):.0f}..{max(on):.0f}, off {min(off):.0f}..{max(off):.0f})")


if __name__ == "__main__":
    main()
