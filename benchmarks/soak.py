"""Soak: run a loader for a while, check every batch, watch memory.

    python -m benchmarks.soak [--minutes 3] [--workers 2] [--kill-every 20] [--out soak.json]

A loader with workers and persistent epochs runs in lockstep with the same loader at
``num_workers=0`` (same seed), and every batch is compared bit for bit: the data is
augmented with numpy's global RNG and samples vary in size, so a batch in the wrong
slot, a stale slot, a reused-too-early slot or a wrongly seeded re-dispatch shows up as
a mismatch. With ``--kill-every S`` a random worker is SIGKILLed every S seconds
(``max_worker_restarts`` is unbounded enough for the run), so restarts are soaked too.

Every ``--sample-every`` seconds it records the RSS and USS of the main process and of
each worker, and at the end prints batches, mismatches (must be 0) and the slope of each
memory series over the second half of the run (a leak shows as a steady positive slope;
the first half is warm-up: the ring and allocator caches fill).
"""

from __future__ import annotations

import argparse
import json
import os
import random
import signal
import sys
import time
import warnings
from pathlib import Path

import numpy as np
import psutil

import shmload


class SoakDataset:
    """A ~150 KB uint8 image whose height varies with the index, augmented with numpy's
    global RNG (a random crop offset and noise), plus the label."""

    def __init__(self, n: int):
        self.n = n
        self.base = np.random.default_rng(0).integers(0, 255, (256, 256, 3), dtype=np.uint8)

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int):
        height = 160 + (i * 37) % 48
        top = np.random.randint(0, 256 - height)
        image = self.base[top:top + height, :200] ^ np.uint8(i % 251)
        image = image + np.random.randint(0, 3, image.shape, dtype=np.uint8)
        return image, i


class SameHeightBatches:
    """Batches of indices with equal sample heights (the default collate stacks them), in a
    shuffled order that depends on the epoch."""

    def __init__(self, n: int, batch_size: int):
        self.n, self.batch_size, self.epoch = n, batch_size, 0

    def set_epoch(self, epoch: int) -> None:
        self.epoch = epoch

    def __iter__(self):
        rng = random.Random(self.epoch)
        groups: dict[int, list[int]] = {}
        for i in range(self.n):
            groups.setdefault((i * 37) % 48, []).append(i)
        batches = [g[k:k + self.batch_size] for g in groups.values() for k in range(0, len(g), self.batch_size)]
        rng.shuffle(batches)
        return iter(batches)

    def __len__(self) -> int:
        return sum(1 for _ in iter(self))


def memory(proc: psutil.Process) -> tuple[float, float]:
    info = proc.memory_full_info()
    return info.rss / 2**20, info.uss / 2**20


def slope(times: list[float], values: list[float]) -> float:
    """Least-squares slope in MiB per hour over the second half of the samples."""
    half = len(times) // 2
    t, v = np.array(times[half:]), np.array(values[half:])
    if len(t) < 2 or np.ptp(t) == 0:
        return 0.0
    return float(np.polyfit(t, v, 1)[0] * 3600)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--minutes", type=float, default=3.0)
    p.add_argument("--workers", type=int, default=2)
    p.add_argument("--batch-size", type=int, default=16)
    p.add_argument("--samples", type=int, default=2400)
    p.add_argument("--kill-every", type=float, default=0.0, help="SIGKILL a random worker every S seconds (0: never)")
    p.add_argument("--sample-every", type=float, default=5.0)
    p.add_argument("--out", type=Path, default=None)
    args = p.parse_args(argv)

    ds = SoakDataset(args.samples)
    seed = 1234
    loader = shmload.DataLoader(ds, batch_sampler=SameHeightBatches(args.samples, args.batch_size),
                                num_workers=args.workers, persistent_workers=True, seed=seed, timeout=60,
                                max_worker_restarts=10**6)
    reference = shmload.DataLoader(ds, batch_sampler=SameHeightBatches(args.samples, args.batch_size), seed=seed)
    me = psutil.Process()
    series: dict[str, list[float]] = {"t": [], "main_rss": [], "main_uss": [], "workers_rss": [], "workers_uss": []}
    batches = mismatches = kills = epochs = 0
    start = time.monotonic()
    end = start + 60 * args.minutes
    next_sample = start
    next_kill = start + args.kill_every if args.kill_every else float("inf")
    warnings.simplefilter("ignore", shmload.ShmloadWarning)  # restarts are expected here
    with loader:
        while time.monotonic() < end:
            loader.set_epoch(epochs)
            reference.set_epoch(epochs)
            for (image, label), (want_image, want_label) in zip(loader, reference):
                batches += 1
                if not (np.array_equal(image, want_image) and np.array_equal(label, want_label)):
                    mismatches += 1
                    print(f"MISMATCH in epoch {epochs}, batch of labels {label.tolist()}", file=sys.stderr)
                del image, label, want_image, want_label
                now = time.monotonic()
                if now >= next_kill:
                    victim = random.choice(loader._sessions.persistent.supervisor.pids)
                    os.kill(victim, signal.SIGKILL)
                    kills += 1
                    next_kill = now + args.kill_every
                if now >= next_sample:
                    try:
                        pids = loader._sessions.persistent.supervisor.pids
                        per_worker = [memory(psutil.Process(pid)) for pid in pids]
                    except psutil.NoSuchProcess:  # killed a moment ago, not yet replaced: sample next time
                        continue
                    rss, uss = memory(me)
                    series["t"].append(now - start)
                    series["main_rss"].append(rss)
                    series["main_uss"].append(uss)
                    series["workers_rss"].append(sum(m[0] for m in per_worker))
                    series["workers_uss"].append(sum(m[1] for m in per_worker))
                    next_sample = now + args.sample_every
                if now >= end:
                    break
            epochs += 1
    elapsed = time.monotonic() - start
    result = {
        "minutes": elapsed / 60, "workers": args.workers, "batches": batches, "epochs": epochs,
        "batches_per_second": batches / elapsed, "mismatches": mismatches, "worker_kills": kills,
        "memory_mib_first_last": {k: (round(v[0], 1), round(v[-1], 1)) for k, v in series.items() if k != "t" and v},
        "slope_mib_per_hour": {k: round(slope(series["t"], v), 2) for k, v in series.items() if k != "t"},
        "machine": f"{os.cpu_count()} CPUs, python {sys.version.split()[0]}, numpy {np.__version__}",
    }
    print(json.dumps(result, indent=2))
    if args.out:
        args.out.write_text(json.dumps(dict(result, series=series)))
    return 0 if mismatches == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
