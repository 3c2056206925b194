"""Split batches on short JPEG epochs (issue 35 item 4): ``python -m benchmarks.split
--kinds jpeg``. The workload of benchmarks/images.py, folder (a): ImageFolder over
~500x375 synthetic JPEGs (its cache, benchmarks/.cache) with
``train_pipeline(224, "uint8-hwc")`` (decode, random resized crop, flip), batch 64,
shuffled, fork; epochs of ``--epoch-batches`` batches (10 and 30), each the first
batches x 64 samples of the folder, wrapping round it when the folder is smaller.

Loaders: shmload's default (``split_batches=None``: the first batch split over idle
workers, the epoch's last batches held back and shared), ``split_batches=False``, and
torch's DataLoader over the same dataset (its images materialized with ``np.asarray``,
since torch's collate does not know shmload's deferred arrays), if torch imports. With
torch imported, shmload's workers seed torch too, as in a training script. Per run and
loader:

* fresh: ``--epochs`` epochs, each with a new loader (its workers started and stopped,
  as each epoch with non-persistent workers): images/s from the loader's construction to
  the epoch's end, and seconds to the first batch (from the construction);
* persistent: one loader with ``persistent_workers=True``, a first epoch (not counted),
  then ``--epochs`` epochs: images/s, and seconds to the first batch from ``iter()``.

Runs alternate the loaders' order (ABC, CBA, ...); figures are medians of ``--runs``,
ratios of the default's median to ``split_batches=False``'s (medians over the rounds of
one invocation; the JSON keeps every round's figure, for the rounds' own ratios).
"""

from __future__ import annotations

import statistics
import time
from typing import Any, Callable

import numpy as np

from .images import BATCH_SIZE, FOLDERS, SIZE, warm_page_cache

FOLDER = FOLDERS[0]  # (a) ~500x375, ImageNet's typical size
FIGURES = ("fresh", "fresh_first", "persistent", "persistent_first")
UNSPLIT = "shmload (split_batches=False)"


class Epoch:
    """``n`` samples: sample i is ``dataset[i % len(dataset)]``, its image materialized
    (``np.asarray``) with ``materialize`` (for torch's collate)."""

    def __init__(self, dataset: Any, n: int, materialize: bool = False):
        self.dataset, self.n, self.materialize = dataset, n, materialize

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> tuple[Any, int]:
        if not 0 <= i < self.n:
            raise IndexError(f"index {i} out of range for {self.n} samples")
        image, label = self.dataset[i % len(self.dataset)]
        return (np.asarray(image) if self.materialize else image), label


Make = Callable[[int, bool], tuple[Any, Callable[[], None]]]  # (samples, persistent) -> (loader, close)


def loaders(root: str, workers: int) -> dict[str, Make]:
    import shmload
    from shmload.datasets import ImageFolder
    from shmload.transforms import train_pipeline

    folder = ImageFolder(root, transform=train_pipeline(SIZE, "uint8-hwc"))

    def shm(split: bool | None) -> Make:
        def make(n: int, persistent: bool) -> tuple[Any, Callable[[], None]]:
            loader = shmload.DataLoader(Epoch(folder, n), batch_size=BATCH_SIZE, shuffle=True, num_workers=workers,
                                        persistent_workers=persistent, multiprocessing_context="fork", seed=0,
                                        timeout=120, split_batches=split)
            return loader, loader.close
        return make

    out = {"shmload (split)": shm(None), UNSPLIT: shm(False)}
    try:
        import torch
        import torch.utils.data
    except ImportError:
        return out

    def make_torch(n: int, persistent: bool) -> tuple[Any, Callable[[], None]]:
        loader = torch.utils.data.DataLoader(Epoch(folder, n, materialize=True), batch_size=BATCH_SIZE, shuffle=True,
                                             num_workers=workers, persistent_workers=persistent,
                                             multiprocessing_context="fork", timeout=120,
                                             generator=torch.Generator().manual_seed(0))

        def close() -> None:
            iterator = getattr(loader, "_iterator", None)  # persistent workers live here
            if iterator is not None:
                iterator._shutdown_workers()
            loader._iterator = None
        return loader, close
    out[f"torch {torch.__version__}"] = make_torch
    return out


def run_epoch(loader: Any, t0: float, n: int) -> tuple[float, float]:
    """Seconds from ``t0`` to the first batch and to the epoch's end (the loop's exit)."""
    first, images = 0.0, 0
    for batch_images, labels in loader:
        if images == 0:
            first = time.perf_counter() - t0
            if tuple(batch_images.shape[1:]) != (SIZE, SIZE, 3) or "uint8" not in str(batch_images.dtype):
                raise AssertionError(f"unexpected batch: {tuple(batch_images.shape)} {batch_images.dtype}")
        images += len(labels)
    seconds = time.perf_counter() - t0
    if images != n:
        raise AssertionError(f"an epoch of {images} images, expected {n}")
    return first, seconds


def fresh(make: Make, n: int, epochs: int) -> tuple[float, float]:
    """Images/s and the median seconds to the first batch over ``epochs`` fresh loaders."""
    firsts, total = [], 0.0
    for _ in range(epochs):
        t0 = time.perf_counter()
        loader, close = make(n, False)
        try:
            first, seconds = run_epoch(loader, t0, n)
        finally:
            close()
        firsts.append(first)
        total += seconds
    return n * epochs / total, statistics.median(firsts)


def persistent(make: Make, n: int, epochs: int) -> tuple[float, float]:
    """Images/s and the median seconds to the first batch over ``epochs`` epochs of one
    loader with persistent workers, after its first epoch."""
    loader, close = make(n, True)
    try:
        run_epoch(loader, time.perf_counter(), n)
        timed = [run_epoch(loader, time.perf_counter(), n) for _ in range(epochs)]
    finally:
        close()
    return n * epochs / sum(s for _, s in timed), statistics.median(f for f, _ in timed)


def prepare(quick: bool) -> str:
    """The cached folder (written once, as images.py writes it), read once so the page
    cache is warm."""
    from shmload.tools.synthetic import image_folder

    root = FOLDER.root(quick)
    image_folder(root, FOLDER.images(quick), FOLDER.size, classes=10, progress=True)
    warm_page_cache(root)
    return str(root)


def measure(root: str, workers: int, runs: int, epochs: int,
            epoch_batches: list[int]) -> dict[int, dict[str, dict[str, list[float]]]]:
    """{batches: {loader: {figure: [one value a run]}}}, figures as in :data:`FIGURES`."""
    makers = loaders(root, workers)
    names = list(makers)
    results: dict[int, dict[str, dict[str, list[float]]]] = {b: {name: {f: [] for f in FIGURES} for name in names}
                                                             for b in epoch_batches}
    for r in range(runs):
        for batches in epoch_batches:
            n = batches * BATCH_SIZE
            for name in (names if r % 2 == 0 else names[::-1]):
                row = results[batches][name]
                rate, first = fresh(makers[name], n, epochs)
                row["fresh"].append(rate)
                row["fresh_first"].append(first)
                rate, first = persistent(makers[name], n, epochs)
                row["persistent"].append(rate)
                row["persistent_first"].append(first)
    return results


def report(title: str, workers: int, results: dict[int, dict[str, dict[str, list[float]]]]) -> dict[str, Any]:
    """Prints a table per epoch length; returns the medians and the ratios to
    ``split_batches=False``, by epoch length and loader."""
    summary: dict[str, Any] = {}
    for batches, by_loader in results.items():
        med = {name: {f: statistics.median(v) for f, v in row.items()} for name, row in by_loader.items()}
        base = med[UNSPLIT]
        ratios = {name: {f: m[f] / base[f] for f in FIGURES} for name, m in med.items()}
        unsplit = by_loader[UNSPLIT]
        per_round = {name: {f: statistics.median(a / b for a, b in zip(row[f], unsplit[f])) for f in FIGURES}
                     for name, row in by_loader.items()}  # (drift between rounds hits both sides of each ratio)
        summary[str(batches)] = {"medians": med, "x_unsplit": ratios, "x_unsplit_per_round": per_round}
        print(f"\njpeg, {title}: {batches}-batch epochs of {BATCH_SIZE} images (~{FOLDER.size[0]}x{FOLDER.size[1]}), "
              f"{workers} workers (medians; x: over split_batches=False):")
        print(f"  {'loader':32s} {'fresh img/s':>11s} {'x':>5s} {'1st batch s':>11s} {'x':>5s} "
              f"{'persistent img/s':>16s} {'x':>5s} {'1st batch s':>11s} {'x':>5s}")
        for name, m in med.items():
            x = ratios[name]
            print(f"  {name:32s} {m['fresh']:11.0f} {x['fresh']:5.2f} {m['fresh_first']:11.3f} {x['fresh_first']:5.2f} "
                  f"{m['persistent']:16.0f} {x['persistent']:5.2f} {m['persistent_first']:11.3f} "
                  f"{x['persistent_first']:5.2f}")
        print("  the medians of the rounds' own ratios over split_batches=False (fresh, persistent img/s): "
              + "; ".join(f"{name} {r['fresh']:.2f}, {r['persistent']:.2f}" for name, r in per_round.items()
                          if name != UNSPLIT))
    return summary
