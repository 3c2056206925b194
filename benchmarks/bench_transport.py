"""Transport benchmark: how fast do batches get from worker processes to the main process?

The workload is almost pure data movement. Each sample is a fresh copy of one of a few
cached random uint8 images (3x224x224, or 3x512x512 with ``--big``) plus its integer
label, so loading a batch costs little more than the copies any loader must make
(sample -> batch) and whatever it takes to hand the batch to the main process.

Loaders compared, in one run, over the same dataset object:

* ``single``   -- the main process loads and collates itself (``ds[i]`` per index, then
  ``np.stack`` / ``np.array``). Every ratio is given against this baseline.
* ``shmload``  -- ``shmload.DataLoader``: workers collate straight into shared memory,
  the main process yields views of it.
* ``torch``    -- ``torch.utils.data.DataLoader`` with its default collate (skipped when
  torch is not installed).
* ``mp-queue`` -- a hand-written ``multiprocessing.Pool.imap(load_batch, ...)``
  (chunksize=1) whose workers return the stacked numpy batch, pickled through the
  pool's pipes. Note that ``imap`` queues every task of the epoch at once, so its
  prefetch is unbounded where the others keep ``workers * prefetch_factor`` in flight.

The multiprocess loaders all use ``--workers`` workers, the same start method (fork
where available), persistent workers (the pool is created once) and prefetch_factor 2.
Each loader runs one untimed warm-up epoch, whose wall time including worker start-up
is reported as "time to first epoch", then ``--epochs`` timed epochs. The consumer
touches every batch lightly (``images[:, 0, 0, 0].sum()`` and the label sum, which is
also checked) and drops it at the next iteration, as a plain ``for`` loop does.

Reported per loader: median / min / max epoch time, batches/s and MB/s (MB = 1e6
bytes of batch data), the ratio of its median throughput to ``single``'s, the main
process's CPU time per batch (``time.process_time``, i.e. the main process and its
threads only) and its minor page faults per batch (fresh memory is expensive to touch),
and, for information, the CPU time per batch of its child processes (psutil; 10 ms
clock ticks, so CPU figures are averaged over all timed epochs).

Ceilings, measured in the same run on one core with numpy: bandwidth of copying one
batch's worth of bytes into an already-touched buffer, and into freshly allocated
memory (``np.empty`` each time; and an anonymous ``mmap`` each time, which is
guaranteed to be new pages -- ``np.empty`` may get recycled ones from malloc), with the
page faults each copy took.

Each loader's workers are stopped before the next loader starts, so they never compete
for cores. A table goes to stdout; all figures and the machine description go to a
JSON file (``--out``; by default ``benchmarks/results/transport.json``, or
``transport_big.json`` with ``--big``).

Run::

    python benchmarks/bench_transport.py [--big] [--workers N] [--epochs N]
"""

from __future__ import annotations

import argparse
import datetime
import gc
import json
import mmap
import multiprocessing
import os
import platform
import resource
import statistics
import sys
import time
from pathlib import Path
from typing import Any, Callable, Iterable, NamedTuple

import numpy as np
import psutil

import shmload

try:
    import torch
    import torch.utils.data
except ImportError:  # the torch loader is skipped
    torch = None

RESULTS_DIR = Path(__file__).resolve().parent / "results"
LOADERS = ("single", "shmload", "torch", "mp-queue")
VARIANTS = {  # name: (image shape, batch size)
    "default": ((3, 224, 224), 64),
    "big": ((3, 512, 512), 32),
}


# ---------------------------------------------------------------- the workload
class CachedImages:
    """Map-style dataset: sample ``i`` is a fresh copy of cached image ``i % k``, and ``i``."""

    def __init__(self, length: int, shape: tuple[int, ...], cached: int = 4, seed: int = 0):
        rng = np.random.default_rng(seed)
        self.images = [rng.integers(0, 256, size=shape, dtype=np.uint8) for _ in range(cached)]
        self.length = length

    def __len__(self) -> int:
        return self.length

    def __getitem__(self, i: int) -> tuple[np.ndarray, int]:
        return self.images[i % len(self.images)].copy(), i


def load_batch(dataset: CachedImages, indices: list[int]) -> tuple[np.ndarray, np.ndarray]:
    samples = [dataset[i] for i in indices]
    images = np.stack([s[0] for s in samples])
    labels = np.array([s[1] for s in samples], dtype=np.int64)
    return images, labels


def batch_indices(length: int, batch_size: int) -> list[list[int]]:
    return [list(range(start, min(start + batch_size, length))) for start in range(0, length, batch_size)]


# ---------------------------------------------------------------- the loaders
class Harness(NamedTuple):
    epoch: Callable[[], Iterable]  # a fresh iterable of (images, labels) batches
    close: Callable[[], None]
    describe: Callable[[], str]


def make_single(ds: CachedImages, batches: list[list[int]], args: argparse.Namespace) -> Harness:
    def epoch():
        for indices in batches:
            yield load_batch(ds, indices)
    return Harness(epoch, lambda: None, lambda: "main process only")


def make_shmload(ds: CachedImages, batches: list[list[int]], args: argparse.Namespace) -> Harness:
    loader = shmload.DataLoader(ds, batch_size=len(batches[0]), num_workers=args.workers,
                                persistent_workers=True, prefetch_factor=2, seed=0,
                                multiprocessing_context=args.start_method)
    return Harness(lambda: iter(loader), loader.close, lambda: repr(loader))


def make_torch(ds: CachedImages, batches: list[list[int]], args: argparse.Namespace) -> Harness:
    loader = torch.utils.data.DataLoader(ds, batch_size=len(batches[0]), num_workers=args.workers,
                                         persistent_workers=True, prefetch_factor=2,
                                         multiprocessing_context=args.start_method)

    def close():
        iterator = getattr(loader, "_iterator", None)  # persistent workers live here
        if iterator is not None and hasattr(iterator, "_shutdown_workers"):
            iterator._shutdown_workers()
        loader._iterator = None

    def describe():
        return (f"torch {torch.__version__}, sharing strategy "
                f"{torch.multiprocessing.get_sharing_strategy()!r}, default collate")
    return Harness(lambda: iter(loader), close, describe)


_pool_dataset: CachedImages | None = None


def _pool_init(ds: CachedImages) -> None:
    global _pool_dataset
    _pool_dataset = ds


def _pool_load(indices: list[int]) -> tuple[np.ndarray, np.ndarray]:
    return load_batch(_pool_dataset, indices)


def make_mp_queue(ds: CachedImages, batches: list[list[int]], args: argparse.Namespace) -> Harness:
    context = multiprocessing.get_context(args.start_method)
    pool = context.Pool(args.workers, initializer=_pool_init, initargs=(ds,))

    def close():
        pool.close()
        pool.join()
    return Harness(lambda: pool.imap(_pool_load, batches, chunksize=1), close,
                   lambda: f"multiprocessing.Pool({args.workers}).imap, chunksize=1, pickled batches")


FACTORIES = {"single": make_single, "shmload": make_shmload, "torch": make_torch, "mp-queue": make_mp_queue}


# ---------------------------------------------------------------- measuring
def children_cpu_seconds() -> float:
    total = 0.0
    for child in psutil.Process().children(recursive=True):
        try:
            t = child.cpu_times()
        except psutil.Error:
            continue
        total += t.user + t.system
    return total


def consume(batches: Iterable) -> tuple[int, int, int]:
    """Touch every batch lightly: returns (batches, label sum, pixel checksum)."""
    count = label_sum = checksum = 0
    for images, labels in batches:
        checksum += int(images[:, 0, 0, 0].sum())
        label_sum += int(labels.sum())
        count += 1
    return count, label_sum, checksum


def timed_epoch(harness: Harness) -> dict[str, Any]:
    faults0 = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    cpu0, child0, t0 = time.process_time(), children_cpu_seconds(), time.perf_counter()
    count, label_sum, checksum = consume(harness.epoch())
    wall = time.perf_counter() - t0
    cpu, child = time.process_time() - cpu0, children_cpu_seconds() - child0
    faults = resource.getrusage(resource.RUSAGE_SELF).ru_minflt - faults0
    return {"seconds": wall, "main_cpu_seconds": cpu, "children_cpu_seconds": child, "main_minor_faults": faults,
            "batches": count, "label_sum": label_sum, "checksum": checksum}


def summarize(epochs: list[dict[str, Any]], batch_bytes: int, expected: dict[str, int]) -> dict[str, Any]:
    times = [e["seconds"] for e in epochs]
    nb = expected["batches"]
    med, lo, hi = statistics.median(times), min(times), max(times)
    return {
        "epoch_seconds": {"median": med, "min": lo, "max": hi, "all": times},
        "batches_per_s": {"median": nb / med, "min": nb / hi, "max": nb / lo},
        "mb_per_s": {"median": nb * batch_bytes / med / 1e6, "min": nb * batch_bytes / hi / 1e6,
                     "max": nb * batch_bytes / lo / 1e6},
        # CPU: totals over all timed epochs (psutil's child times tick at 10 ms, too coarse per epoch)
        "main_cpu_ms_per_batch": 1e3 * sum(e["main_cpu_seconds"] for e in epochs) / (nb * len(epochs)),
        "children_cpu_ms_per_batch": 1e3 * sum(e["children_cpu_seconds"] for e in epochs) / (nb * len(epochs)),
        "main_minor_faults_per_batch": sum(e["main_minor_faults"] for e in epochs) / (nb * len(epochs)),
        "checks_ok": all(e["batches"] == nb and e["label_sum"] == expected["label_sum"]
                         and e["checksum"] == expected["checksum"] for e in epochs),
    }


def bench_loader(name: str, ds: CachedImages, batches: list[list[int]], args: argparse.Namespace,
                 batch_bytes: int, expected: dict[str, int]) -> dict[str, Any]:
    gc.collect()
    t0 = time.perf_counter()
    harness = FACTORIES[name](ds, batches, args)
    try:
        warm = consume(harness.epoch())
        first_epoch = time.perf_counter() - t0
        description = harness.describe()
        epochs = [timed_epoch(harness) for _ in range(args.epochs)]
    finally:
        harness.close()
    result = {"time_to_first_epoch_s": first_epoch, "description": description,
              "warmup_batches": warm[0], **summarize(epochs, batch_bytes, expected)}
    result["epochs"] = epochs
    return result


# ---------------------------------------------------------------- ceilings
def _median_copy(make_dst: Callable[[], Any], src: np.ndarray, repeats: int) -> tuple[float, float]:
    """Median seconds of one copy of ``src`` into ``make_dst()``, and minor faults per copy.
    ``make_dst`` returns (array, cleanup); allocation is timed along with the copy."""
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


def measure_ceilings(nbytes: int, repeats: int) -> dict[str, Any]:
    src = np.random.default_rng(1).integers(0, 256, size=nbytes, dtype=np.uint8)
    touched = np.empty_like(src)
    touched.fill(0)
    cases = {
        "touched (np.copyto into a pre-touched buffer)": lambda: (touched, lambda: None),
        "fresh (np.empty each time)": lambda: (np.empty(nbytes, dtype=np.uint8), lambda: None),
        "fresh (anonymous mmap each time)": lambda: _fresh_mmap(nbytes),
    }
    out = {"bytes": nbytes, "repeats": repeats, "cases": {}}
    for label, make_dst in cases.items():
        _median_copy(make_dst, src, 3)  # warm-up
        seconds, faults = _median_copy(make_dst, src, repeats)
        out["cases"][label] = {"median_seconds": seconds, "gb_per_s": nbytes / seconds / 1e9,
                               "minor_faults_per_copy": faults}
    return out


# ---------------------------------------------------------------- machine and report
def _cpu_model() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def _read_text(path: str) -> str | None:
    try:
        return Path(path).read_text().strip()
    except OSError:
        return None


def machine_info() -> dict[str, Any]:
    return {
        "platform": platform.platform(),
        "cpu_count": os.cpu_count(),
        "cpu_model": _cpu_model(),
        "ram_bytes": psutil.virtual_memory().total,
        "transparent_hugepage": _read_text("/sys/kernel/mm/transparent_hugepage/enabled"),
        "python": sys.version.split()[0],
        "numpy": np.__version__,
        "torch": torch.__version__ if torch is not None else None,
        "shmload": shmload.__version__,
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
    }


def print_ceilings(ceilings: dict[str, Any]) -> None:
    print(f"\nCeilings: one core copying {ceilings['bytes'] / 1e6:.1f} MB (median of {ceilings['repeats']})")
    print(f"  {'destination':<48} {'GB/s':>7} {'ms/copy':>8} {'faults/copy':>12}")
    for label, c in ceilings["cases"].items():
        print(f"  {label:<48} {c['gb_per_s']:>7.2f} {1e3 * c['median_seconds']:>8.2f} "
              f"{c['minor_faults_per_copy']:>12.0f}")


def print_loaders(results: dict[str, Any], epochs: int) -> None:
    print(f"\nLoaders: {epochs} timed epochs each (median [min..max]); ratio = median throughput / single's")
    head = (f"  {'loader':<9} {'1st epoch s':>11} {'epoch s':>22} {'batch/s':>24} {'MB/s':>24} "
            f"{'vs single':>9} {'main CPU ms/b':>13} {'faults/b':>10} {'child CPU ms/b':>14}")
    print(head)
    base = results.get("single", {}).get("mb_per_s", {}).get("median")
    for name, r in results.items():
        if "skipped" in r:
            print(f"  {name:<9} skipped: {r['skipped']}")
            continue
        e, b, m = r["epoch_seconds"], r["batches_per_s"], r["mb_per_s"]
        ratio = f"{m['median'] / base:.2f}x" if base else "n/a"
        flag = "" if r["checks_ok"] else "  (CHECKSUM MISMATCH)"
        print(f"  {name:<9} {r['time_to_first_epoch_s']:>11.2f} "
              f"{e['median']:>7.3f} [{e['min']:.3f}..{e['max']:.3f}] "
              f"{b['median']:>7.1f} [{b['min']:>6.1f}..{b['max']:>6.1f}] "
              f"{m['median']:>7.0f} [{m['min']:>6.0f}..{m['max']:>6.0f}] "
              f"{ratio:>9} {r['main_cpu_ms_per_batch']:>13.2f} {r['main_minor_faults_per_batch']:>10.0f} "
              f"{r['children_cpu_ms_per_batch']:>14.2f}{flag}")
    for name, r in results.items():
        if "description" in r:
            print(f"  {name}: {r['description']}")


def leftover_children() -> list[str]:
    """Child processes still alive after every loader was closed, as "pid: command line".
    (Under spawn/forkserver, multiprocessing's resource tracker stays until interpreter exit.)"""
    _, alive = psutil.wait_procs(psutil.Process().children(recursive=True), timeout=3)
    out = []
    for p in alive:
        try:
            out.append(f"{p.pid}: {' '.join(p.cmdline())[:120]}")
        except psutil.Error:
            continue  # exited meanwhile
    return out


# ---------------------------------------------------------------- main
def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--big", action="store_true", help="3x512x512 images, batch 32 (~25 MB/batch)")
    p.add_argument("--workers", type=int, default=2, help="worker processes per loader (default 2)")
    p.add_argument("--epochs", type=int, default=5, help="timed epochs per loader (default 5)")
    p.add_argument("--batches", type=int, default=40, help="batches per epoch (default 40)")
    p.add_argument("--loaders", nargs="+", choices=LOADERS, default=list(LOADERS),
                   help="which loaders to run (default: all)")
    p.add_argument("--start-method", default=None, choices=multiprocessing.get_all_start_methods(),
                   help="for every multiprocess loader (default: fork where available)")
    p.add_argument("--ceiling-repeats", type=int, default=30, help="copies per ceiling (default 30)")
    p.add_argument("--out", type=Path, default=None,
                   help="JSON output (default benchmarks/results/transport.json, transport_big.json with --big)")
    args = p.parse_args(argv)
    if args.workers < 1 or args.epochs < 1 or args.batches < 1:
        p.error("--workers, --epochs and --batches must be at least 1")
    if args.start_method is None:
        args.start_method = "fork" if "fork" in multiprocessing.get_all_start_methods() else "spawn"
    if args.out is None:
        args.out = RESULTS_DIR / ("transport_big.json" if args.big else "transport.json")
    if "single" not in args.loaders:
        args.loaders.insert(0, "single")  # the baseline every ratio is given against
    return args


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    variant = "big" if args.big else "default"
    shape, batch_size = VARIANTS[variant]
    ds = CachedImages(batch_size * args.batches, shape)
    batches = batch_indices(len(ds), batch_size)
    batch_bytes = batch_size * (int(np.prod(shape)) + np.dtype(np.int64).itemsize)
    expected = dict(zip(("batches", "label_sum", "checksum"), consume(load_batch(ds, b) for b in batches)))
    print(f"transport benchmark ({variant}): {len(ds)} samples of uint8 {'x'.join(map(str, shape))} + int label, "
          f"batch {batch_size} ({batch_bytes / 1e6:.2f} MB/batch), {len(batches)} batches/epoch, "
          f"{args.workers} workers, start method {args.start_method!r}")
    info = machine_info()
    print(f"machine: {info['cpu_model']}, {info['cpu_count']} CPUs, {info['ram_bytes'] / 2**30:.1f} GiB RAM, "
          f"{info['platform']}; python {info['python']}, numpy {info['numpy']}, torch {info['torch']}")

    ceilings = measure_ceilings(batch_size * int(np.prod(shape)), args.ceiling_repeats)
    print_ceilings(ceilings)

    results: dict[str, Any] = {}
    for name in args.loaders:
        if name == "torch" and torch is None:
            results[name] = {"skipped": "torch not installed"}
            continue
        results[name] = bench_loader(name, ds, batches, args, batch_bytes, expected)
    base = results["single"]["mb_per_s"]["median"]
    for r in results.values():
        if "mb_per_s" in r:
            r["ratio_vs_single"] = r["mb_per_s"]["median"] / base
    print_loaders(results, args.epochs)

    leftovers = leftover_children()
    print(f"\nchild processes left running: {leftovers if leftovers else 'none'}")
    report = {
        "benchmark": "transport", "variant": variant,
        "config": {"image_shape": shape, "batch_size": batch_size, "batches_per_epoch": len(batches),
                   "dataset_length": len(ds), "batch_bytes": batch_bytes, "workers": args.workers,
                   "epochs": args.epochs, "prefetch_factor": 2, "persistent_workers": True,
                   "start_method": args.start_method},
        "machine": info, "ceilings": ceilings, "loaders": results, "leftover_children": leftovers,
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(report, indent=2) + "\n")
    print(f"results written to {args.out}")


if __name__ == "__main__":
    main()
