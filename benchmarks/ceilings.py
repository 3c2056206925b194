"""Physical ceilings measured in the same run, on one core of this machine.

* copy bandwidth into already-touched memory: the one copy shmload's workers make per
  byte (sample -> slot), and what a loader that reuses its buffers can reach;
* copy bandwidth into fresh pages (a new anonymous mmap each time): what a loader pays
  when every batch lands in new memory (torch's new segment per batch, an ``np.stack``
  whose output malloc takes from the kernel);
* the ``jpeg`` pipeline's rate on one core, in this process (decode + crop + flip; no
  stacking), which times the cores used is the most any loader can reach; and the rate
  of that many independent processes running it at once, with no loader at all, which
  shows how much of the gap to that ideal the machine itself takes.
"""

from __future__ import annotations

import mmap
import multiprocessing
import os
import resource
import statistics
import time
from typing import Any, Callable

import numpy as np

from .workloads import WORKLOADS


def _timed_copies(make_dst: Callable[[], tuple[np.ndarray, Callable[[], None]]], src: np.ndarray,
                  repeats: int) -> tuple[float, float]:
    """Median seconds per copy of ``src`` (allocation included) and minor page faults per copy."""
    times, faults = [], 0
    for _ in range(repeats):
        f0 = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
        t0 = time.perf_counter()
        dst, cleanup = make_dst()
        np.copyto(dst, src)
        times.append(time.perf_counter() - t0)
        faults += resource.getrusage(resource.RUSAGE_SELF).ru_minflt - f0
        del dst
        cleanup()
    return statistics.median(times), faults / repeats


def _fresh_mmap(nbytes: int) -> tuple[np.ndarray, Callable[[], None]]:
    m = mmap.mmap(-1, nbytes)
    return np.frombuffer(m, dtype=np.uint8), m.close


def copy_bandwidth(nbytes: int, repeats: int) -> dict[str, Any]:
    src = np.random.default_rng(1).integers(0, 256, size=nbytes, dtype=np.uint8)
    touched = np.ones_like(src)
    out: dict[str, Any] = {"bytes": nbytes, "repeats": repeats}
    for label, make_dst in (("touched", lambda: (touched, lambda: None)),
                            ("fresh", lambda: _fresh_mmap(nbytes))):
        _timed_copies(make_dst, src, 3)  # warm-up
        seconds, faults = _timed_copies(make_dst, src, repeats)
        out[label] = {"gb_per_s": nbytes / seconds / 1e9, "ms_per_copy": 1e3 * seconds,
                      "minor_faults_per_copy": faults}
    return out


def _pipeline_rate(images: int, part: int = 0, parts: int = 1) -> float:
    """Images/s of the jpeg pipeline over this process's share of the folder."""
    dataset = WORKLOADS["jpeg"].make_dataset(images)
    mine = range(part, len(dataset), parts)
    for i in list(mine)[:4]:  # warm the page cache and the decoder
        dataset[i]
    t0 = time.perf_counter()
    for i in mine:
        dataset[i]
    return len(mine) / (time.perf_counter() - t0)


def jpeg_rate(images: int, workers: int) -> dict[str, Any]:
    """One core alone, and ``workers`` independent processes at once (no loader at all:
    what the cores reach together when they share caches, memory and the host)."""
    one = _pipeline_rate(images)
    ctx = multiprocessing.get_context("fork")
    with ctx.Pool(workers) as pool:
        together = pool.starmap(_pipeline_rate, [(images, k, workers) for k in range(workers)])
    return {"images": images, "images_per_s": one, "processes": workers,
            "independent_processes_images_per_s": sum(together)}


def measure(quick: bool, workers: int) -> dict[str, Any]:
    repeats = 10 if quick else 30
    big = WORKLOADS["transport-big"]
    return {
        "copy": {"transport": copy_bandwidth(64 * 3 * 224 * 224, repeats),
                 "transport-big": copy_bandwidth(big.batch_size * 3 * 512 * 512, repeats)},
        "jpeg_one_core": jpeg_rate(WORKLOADS["jpeg"].batch_size * WORKLOADS["jpeg"].epoch_batches(quick), workers),
        "cpu_count": os.cpu_count(),
    }
