"""What elastic loading costs (issue 36): each sample seeded for itself instead of each batch.

    python -m benchmarks.elastic [--rounds 5] [--quick] [--json FILE]

Two measures, on one machine, nothing else running:

* **seeding alone**: one batch's seeding (``seeding.seed_globals``: Python's ``random``,
  numpy's global RNG, and torch's CPU generator when torch is imported) against one
  sample's (``seeding.seed_sample``), in µs per call, best of 5 timeit runs, without
  and with torch imported (it is imported after the first pair, as a training script
  has it);
* **loaders**: ``DataLoader(elastic=False)`` against ``elastic=True`` (a world of one:
  its own sampler, no process group), 2 workers, persistent, fork, shuffled, interleaved
  in each round (AB, BA, ...), over two workloads of benchmarks/workloads.py:
  ``tiny`` (256 samples of 32 float32 and a label a batch: where per-sample seeding
  shows most) and ``jpeg`` (the images benchmark's folder (a), ~500x375 JPEGs, with
  ``train_pipeline(224, "uint8-hwc")``, batch 64). Samples/s per epoch (after one
  warm-up epoch), the medians over ``--rounds``, the ratio of medians (elastic / not),
  and each round's own ratio with their median.

Speed is never asserted. ``--quick`` is a smoke test whose figures mean nothing.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
import timeit
from pathlib import Path
from typing import Any, Callable

import shmload
from shmload._ordering import seeding

from .per_batch import whence
from .workloads import TinyRows


def seeding_alone(number: int) -> dict[str, float]:
    """µs per call of a batch's seeding and of a sample's, best of 5."""
    def best(fn: Callable[[], None]) -> float:
        return min(timeit.repeat(fn, number=number, repeat=5)) / number * 1e6

    out = {"batch": best(lambda: seeding.seed_globals(1, 2, 3)),
           "sample": best(lambda: seeding.seed_sample(1, 2, 3, 4))}
    try:
        import torch  # noqa: F401  (imported: the seeding then seeds its generator too)
    except ImportError:
        return out
    out["batch, torch imported"] = best(lambda: seeding.seed_globals(1, 2, 3))
    out["sample, torch imported"] = best(lambda: seeding.seed_sample(1, 2, 3, 4))
    return out


class Workload:
    def __init__(self, name: str, dataset: Any, batch_size: int, samples: int):
        self.name, self.dataset, self.batch_size, self.samples = name, dataset, batch_size, samples


class _Head:
    """The first ``n`` samples of ``dataset``, wrapping round it (an epoch of ``n``)."""

    def __init__(self, dataset: Any, n: int):
        self.dataset, self.n = dataset, n

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> Any:
        return self.dataset[i % len(self.dataset)]


def workloads(quick: bool) -> list[Workload]:
    from shmload.datasets import ImageFolder
    from shmload.tools.synthetic import image_folder
    from shmload.transforms import train_pipeline

    from .images import FOLDERS, warm_page_cache
    folder = FOLDERS[0]
    root = folder.root(quick)
    image_folder(root, count=folder.images(quick), size=folder.size)
    warm_page_cache(Path(root))
    jpeg = ImageFolder(str(root), transform=train_pipeline(224, "uint8-hwc"))
    tiny_batches = 40 if quick else 1000
    jpeg_batches = 3 if quick else 30
    return [Workload("tiny", TinyRows(256 * tiny_batches), 256, 256 * tiny_batches),
            Workload("jpeg", _Head(jpeg, 64 * jpeg_batches), 64, 64 * jpeg_batches)]


def epoch_rate(loader: Any, samples: int) -> float:
    t0 = time.perf_counter()
    seen = sum(len(batch[1]) for batch in loader)
    seconds = time.perf_counter() - t0
    if seen != samples:
        raise AssertionError(f"an epoch of {seen} samples, expected {samples}")
    return samples / seconds


def measure(work: Workload, elastic: bool, epochs: int) -> float:
    """Samples/s over ``epochs`` epochs of one persistent loader, after a warm-up epoch."""
    loader = shmload.DataLoader(work.dataset, batch_size=work.batch_size, shuffle=True, num_workers=2,
                                persistent_workers=True, multiprocessing_context="fork", seed=0, timeout=120,
                                elastic=elastic)
    try:
        epoch_rate(loader, work.samples)
        rates = [epoch_rate(loader, work.samples) for _ in range(epochs)]
    finally:
        loader.close()
    return statistics.median(rates)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--epochs", type=int, default=2, help="timed epochs per loader and round")
    parser.add_argument("--quick", action="store_true", help="a smoke test: the figures mean nothing")
    parser.add_argument("--json", type=Path, help="write every figure here")
    args = parser.parse_args(argv)
    rounds = 1 if args.quick else args.rounds
    print(f"{whence()}; {os.cpu_count()} CPUs; load average {os.getloadavg()[0]:.2f} at start")
    alone = seeding_alone(200 if args.quick else 20000)
    print("seeding alone, µs per call (best of 5):")
    for name, us in alone.items():
        print(f"  {name:<28}{us:8.2f}")
    data: dict[str, Any] = {"seeding_us": alone, "loaders": {}}
    for work in workloads(args.quick):
        figures: dict[bool, list[float]] = {False: [], True: []}
        for r in range(rounds):
            for elastic in ((False, True) if r % 2 == 0 else (True, False)):
                figures[elastic].append(measure(work, elastic, 1 if args.quick else args.epochs))
        plain, flexible = statistics.median(figures[False]), statistics.median(figures[True])
        own = [b / a for a, b in zip(figures[False], figures[True])]
        print(f"{work.name}: samples/s, median of {rounds} round(s): elastic=False {plain:,.0f}, "
              f"elastic=True {flexible:,.0f}; ratio of medians {flexible / plain:.3f}, the rounds' own ratios "
              f"{', '.join(f'{x:.3f}' for x in own)} (median {statistics.median(own):.3f})")
        data["loaders"][work.name] = {"plain": figures[False], "elastic": figures[True],
                                      "ratio_of_medians": flexible / plain, "round_ratios": own}
    print(f"load average {os.getloadavg()[0]:.2f} at end")
    if args.json:
        args.json.write_text(json.dumps(data, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
