"""One loader on one workload, in a process of its own: ``python -m benchmarks.measure``.

The orchestrator (``benchmarks.run``) starts one of these per (workload, loader), so
loaders never share a process, its memory or its imports, and it samples the memory of
this process and its workers from outside. This side times:

* time to first batch: from constructing the loader (its imports already done) to the
  first batch in hand, worker start-up included; the rest of that epoch is the warm-up;
* ``--epochs`` timed epochs: wall time, the consumer thread's CPU (``thread_time``, the
  CPU the loader takes from the training loop's own thread), the whole main process's CPU
  (``process_time``, its threads included) and the workers' (psutil, 10 ms ticks, so CPU
  figures are totals over all timed epochs divided by the batches);
* checks on every epoch, made after its clocks stop: batches, labels seen (duplicates and
  missing ones counted), and for deterministic workloads a checksum of the first value
  of every sample.

For the ``consumer`` workload it also times the consumer's steps alone on one premade
batch, in this same process just before the loader starts.
"""

from __future__ import annotations

import argparse
import gc
import json
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np
import psutil

from . import peers
from .host import children_cpu_seconds
from .workloads import WORKLOADS, Step, getitem_ms, load_batch


def first_values(images: Any) -> np.ndarray:
    a = np.asarray(images)
    return a.reshape(a.shape[0], -1)[:, 0].astype(np.float64)


class Tally:
    """What the consumer saw in one epoch."""

    def __init__(self) -> None:
        self.batches = 0
        self.labels: list[np.ndarray] = []
        self.checksum = 0.0

    def add(self, images: Any, labels: Any) -> None:
        self.batches += 1
        self.labels.append(np.array(np.asarray(labels), dtype=np.int64))  # a copy: holds no loader memory
        self.checksum += float(first_values(images).sum())

    def summary(self, expected_samples: int, labels_are_indices: bool) -> dict[str, Any]:
        seen = np.concatenate(self.labels) if self.labels else np.zeros(0, np.int64)
        if labels_are_indices:  # each sample's label is its index: count repeats and gaps exactly
            unique = np.unique(seen).size
            duplicates, missing = seen.size - unique, expected_samples - unique
        else:  # class labels: only the count of samples can be checked
            duplicates, missing = max(0, seen.size - expected_samples), max(0, expected_samples - seen.size)
        return {"batches": self.batches, "samples": int(seen.size), "duplicates": int(duplicates),
                "missing": int(missing), "checksum": self.checksum}


def run_epoch(iterable: Any, step: Step | None, first: Any = None) -> Tally:
    """One epoch as a training loop runs it: each batch read (the tally touches its
    labels and a value of every sample) and dropped before the next is asked for."""
    tally = Tally()
    if first is not None:
        tally.add(*first[:2])
        if step is not None:
            step(first[0])
    for batch in iterable:
        images, labels = batch[0], batch[1]
        tally.add(images, labels)
        if step is not None:
            step(images)
        del batch, images, labels  # drop the batch before asking for the next, as a training loop does
    return tally


def timed_epoch(harness: peers.Harness, step: Step | None, expected: tuple[int, bool]) -> dict[str, Any]:
    cpu0, thread0, child0 = time.process_time(), time.thread_time(), children_cpu_seconds()
    t0 = time.perf_counter()
    tally = run_epoch(harness.epoch(), step)
    seconds = time.perf_counter() - t0
    clocks = {"seconds": seconds, "consumer_thread_cpu": time.thread_time() - thread0,
              "main_cpu": time.process_time() - cpu0, "workers_cpu": children_cpu_seconds() - child0}
    # The epoch's checks run after the clocks stop: they are the benchmark's, not the
    # loader's or a training loop's (np.unique over 153,600 labels takes ~45 ms, which
    # inside the clocks was a third of a tiny epoch and pulled every ratio towards 1).
    return tally.summary(*expected) | clocks


def own_pss() -> int:
    return psutil.Process().memory_full_info().pss


def expected_checksum(dataset: Any, batches: list[list[int]]) -> float:
    return sum(float(first_values(load_batch(dataset, b)[0]).sum()) for b in batches)


def measure(workload_name: str, loader: str, quick: bool, workers: int, start_method: str,
            epochs: int) -> dict[str, Any]:
    workload = WORKLOADS[workload_name]
    nbatches = workload.epoch_batches(quick)
    dataset = workload.make_dataset(workload.batch_size * nbatches)
    batches = [list(range(s, s + workload.batch_size)) for s in range(0, len(dataset), workload.batch_size)]
    sample_images, _ = load_batch(dataset, batches[0])
    result: dict[str, Any] = {"workload": workload_name, "loader": loader, "batches_per_epoch": len(batches),
                              "batch_size": workload.batch_size, "samples_per_epoch": len(dataset),
                              "batch_bytes": int(sample_images.nbytes + 8 * workload.batch_size)}
    reason = peers.unavailable(loader)
    if reason is not None:
        return result | {"skipped": reason}
    checksum = expected_checksum(dataset, batches) if workload.deterministic else None
    result["getitem_ms"] = getitem_ms(dataset, batches)
    expected = (len(dataset), workload.deterministic)  # deterministic workloads label samples by index

    step = None
    if workload.step_ms:
        step = Step(workload.step_ms)
        t0 = time.perf_counter()
        for _ in batches:
            step(sample_images)
        result["steps_alone_seconds"] = time.perf_counter() - t0
        result["step_ms"] = 1e3 * result["steps_alone_seconds"] / len(batches)

    options = peers.Options(workers=workers, start_method=start_method)
    gc.collect()
    result["baseline_pss"] = own_pss()
    t0 = time.perf_counter()
    harness = peers.make(loader, dataset, batches, options)
    try:
        iterator = iter(harness.epoch())
        first = next(iterator)
        result["time_to_first_batch"] = time.perf_counter() - t0
        warm = run_epoch(iterator, step, first=first)
        del first
        result["warmup"] = warm.summary(*expected)
        result["epochs"] = [timed_epoch(harness, step, expected) for _ in range(epochs)]
    finally:
        harness.close()
    result.update(description=harness.description, ordered=harness.ordered, exact=harness.exact,
                  expected_checksum=checksum)
    return result


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description="Time one loader on one workload (run by benchmarks.run).")
    p.add_argument("--workload", required=True, choices=sorted(WORKLOADS))
    p.add_argument("--loader", required=True, choices=sorted(peers.PEERS))
    p.add_argument("--quick", action="store_true")
    p.add_argument("--workers", type=int, default=2)
    p.add_argument("--start-method", default="fork")
    p.add_argument("--epochs", type=int, default=3)
    p.add_argument("--out", type=Path, required=True)
    args = p.parse_args(argv)
    result = measure(args.workload, args.loader, args.quick, args.workers, args.start_method, args.epochs)
    args.out.write_text(json.dumps(result))
    sys.stdout.flush()


if __name__ == "__main__":
    main()
