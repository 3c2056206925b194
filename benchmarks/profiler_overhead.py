"""What the always-on profiler costs, measured two ways.

    python -m benchmarks.profiler_overhead [--runs 7] [--epochs 3]

1. Direct: the code the profiler adds to a batch, timed in-process (``timeit``, best of
   several repeats): a worker's clock readings and its ``Recorder.batch`` call, and the
   main process's clock readings and ``ConsumerClock.leave``; divided by the CPU time a
   batch costs the whole loader (workers and main process, from ``loader.stats()`` of a
   real run). On a machine whose cores are all busy, as here, throughput falls by that
   fraction.
2. End to end: the same loader with its recording stubbed out, in the same run,
   alternating. "off" replaces ``counters.Recorder.batch`` in the workers (which fork and
   inherit the patch) and ``ConsumerClock.leave`` and the ring sampling in the main
   process with no-ops; the clock readings stay. Runs alternate on/off in ABBA order, so
   drift of a shared machine hits both alike; the figure is the ratio of the medians, with
   the spread of single runs, which on a shared 2-core machine is wider than the effect.

``tiny`` (batches of 256 small rows, ~0.25 ms of work a batch) is where a fixed per-batch
cost shows most; ``transport`` (9.6 MB batches) is the other end.
"""

from __future__ import annotations

import argparse
import statistics
import time
import timeit
from contextlib import contextmanager
from types import SimpleNamespace

import shmload
from shmload._loading.loading import BatchTimer
from shmload._loading.worker import _WorkerLoop
from shmload.profiler import counters
from shmload.profiler.profile import ConsumerClock

from .workloads import CachedImages, TinyRows

WORKER_CLOCKS = 7  # perf_counter() readings a worker takes per batch outside BatchTimer.record (worker.py, loading.py)
MAIN_CLOCKS = 2  # in _Epoch.__next__: entering, and the ring sampling check


@contextmanager
def recording_off():
    saved = (counters.Recorder.batch, ConsumerClock.leave, ConsumerClock.sample_ring)
    counters.Recorder.batch = lambda self, *args: None
    ConsumerClock.leave = lambda self, entered, nbytes: None
    ConsumerClock.sample_ring = lambda self, ring: setattr(self, "next_sample", float("inf"))
    try:
        yield
    finally:
        counters.Recorder.batch, ConsumerClock.leave, ConsumerClock.sample_ring = saved


def _best(fn, number: int = 200_000, repeat: int = 7) -> float:
    return min(timeit.repeat(fn, number=number, repeat=repeat)) / number


def added_per_batch() -> tuple[float, float]:
    """Seconds the profiler adds to a batch: in a worker, in the main process."""
    board = counters.board(bytearray(counters.board_bytes(1)), 1)
    timer = BatchTimer()
    timer.begin(1, 1.0)
    timer.fetch, timer.collate, timer.samples, timer.nbytes = 1e-4, 1e-4, 256, 32768
    stand_in = SimpleNamespace(recorder=counters.Recorder(board, 0), timer=timer, recording=False)

    def worker_side():
        stand_in.recording = True
        _WorkerLoop.record(stand_in)

    clock = _best(time.perf_counter)
    consumer = ConsumerClock()
    worker = _best(worker_side) + WORKER_CLOCKS * clock
    main = _best(lambda: consumer.leave(1.0, 32768)) + MAIN_CLOCKS * clock
    stand_in.recorder.close()
    return worker, main


def cpu_per_batch(dataset, batch_size: int, epochs: int) -> float:
    """CPU seconds (workers and main process) per batch of a real run."""
    with shmload.DataLoader(dataset, batch_size=batch_size, shuffle=True, num_workers=2, persistent_workers=True,
                            multiprocessing_context="fork", seed=0) as loader:
        for _ in loader:
            pass
        loader.reset_stats()
        for _ in range(epochs):
            for _ in loader:
                pass
        stats = loader.stats(memory=False)
    cpu = stats.main.cpu + sum(w.cpu or 0.0 for w in stats.workers)
    return cpu / stats.main.batches


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

    worker, main_side = added_per_batch()
    print(f"added per batch: {worker * 1e6:.2f} us in a worker, {main_side * 1e6:.2f} us in the main process")
    print(f"{'workload':<10}{'CPU/batch':>12}{'added':>10}")
    for name, (dataset, batch_size) in workloads.items():
        cpu = statistics.median(cpu_per_batch(dataset, batch_size, args.epochs) for _ in range(3))
        print(f"{name:<10}{cpu * 1e6:>10.1f}us{(worker + main_side) / cpu:>10.2%}")

    print(f"\n{'workload':<10}{'profiler on':>14}{'off':>12}{'on / off':>10}   batches/s, median of {args.runs} runs")
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
