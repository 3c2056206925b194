"""The workloads: the same dataset objects and batch function for every loader.

Each workload is a map-style dataset (``__getitem__``/``__len__``) whose samples are
``(array, int label)``, a batch size, and how many batches make an epoch. Every loader
turns a list of indices into ``(stacked arrays, int64 labels)``: ``load_batch`` below is
exactly what the single-process baseline, the pickling pool, tensorpack and SPDL run,
and what shmload's and torch's default collate produce.

* ``transport`` / ``transport-big``: a fresh copy of a cached random uint8 image
  (3x224x224, batch 64, ~9.6 MB; 3x512x512, batch 32, ~25 MB). Almost pure data
  movement: the cost of getting a batch from a worker to the consumer.
* ``jpeg``: a synthetic folder of ~500x375 JPEGs (ImageNet's typical size), decoded with
  Pillow, RandomResizedCrop to 224 with torchvision's parameter rules, random flip.
* ``tiny``: 32 float32 values + a label, batch 256: the per-batch control overhead.
* ``rows``: 1 KiB rows (256 float32) of an in-memory numpy table + a label, batch 1,024:
  the "dataset already in memory" case, where a loader's cost per sample decides.
* ``consumer``: ``transport`` with a consumer that does a fixed amount of compute per
  batch (``Step``), a stand-in for a training step.
"""

from __future__ import annotations

import os
import random
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

import numpy as np

from shmload.transforms.params import resized_crop_box  # torchvision's rules, on Python's random

CACHE_DIR = Path(__file__).resolve().parent / ".cache"


# ---------------------------------------------------------------- datasets
class CachedImages:
    """Sample ``i`` is a fresh copy of cached image ``i % cached``, and the label ``i``."""

    def __init__(self, length: int, shape: tuple[int, ...], cached: int = 4, seed: int = 0):
        rng = np.random.default_rng(seed)
        self.images = [rng.integers(0, 256, size=shape, dtype=np.uint8) for _ in range(cached)]
        self.length = length

    def __len__(self) -> int:
        return self.length

    def __getitem__(self, i: int) -> tuple[np.ndarray, int]:
        return self.images[i % len(self.images)].copy(), i


class TinyRows:
    """Sample ``i`` is row ``i`` of a float32 table (32 values) and the label ``i``."""

    def __init__(self, length: int, width: int = 32, seed: int = 0):
        self.rows = np.random.default_rng(seed).random((length, width), dtype=np.float32)

    def __len__(self) -> int:
        return len(self.rows)

    def __getitem__(self, i: int) -> tuple[np.ndarray, int]:
        return self.rows[i], i


class InMemoryRows(TinyRows):
    """Sample ``i`` is row ``i`` of an in-memory float32 table of 1 KiB rows, and the label ``i``."""

    def __init__(self, length: int, width: int = 256, seed: int = 0):
        super().__init__(length, width, seed)


class JpegFolder:
    """Decode + RandomResizedCrop(224) + random horizontal flip, HWC uint8; label = class."""

    def __init__(self, root: Path, size: int = 224):
        self.paths = sorted(str(p) for p in Path(root).glob("*/*.jpg"))
        if not self.paths:
            raise FileNotFoundError(f"no JPEGs under {root}")
        self.labels = [int(Path(p).parent.name[1:]) for p in self.paths]
        self.size = size

    def __len__(self) -> int:
        return len(self.paths)

    def __getitem__(self, i: int) -> tuple[np.ndarray, int]:
        from PIL import Image
        with Image.open(self.paths[i]) as img:
            img = img.convert("RGB")
            left, top, w, h = resized_crop_box(*img.size)
            img = img.resize((self.size, self.size), Image.BILINEAR, box=(left, top, left + w, top + h))
            if random.random() < 0.5:
                img = img.transpose(Image.FLIP_LEFT_RIGHT)
            return np.asarray(img), self.labels[i]


def make_jpeg_folder(count: int, classes: int = 8, size=(500, 375), seed: int = 0) -> Path:
    """Write ``count`` synthetic photo-like JPEGs (smooth gradients plus noise, quality 90)
    under benchmarks/.cache once; later runs reuse them."""
    from PIL import Image
    root = CACHE_DIR / f"jpeg-{count}-{size[0]}x{size[1]}"
    done = root / ".complete"
    if done.exists():
        return root
    rng = np.random.default_rng(seed)
    w, h = size
    yy, xx = np.mgrid[0:h, 0:w].astype(np.float32)
    for k in range(count):
        c = k % classes
        folder = root / f"c{c:03d}"
        folder.mkdir(parents=True, exist_ok=True)
        fx, fy, phase = rng.uniform(0.005, 0.05, size=3)
        base = np.stack([np.sin(xx * fx + phase * ch) * np.cos(yy * fy + ch) for ch in range(3)], axis=-1)
        noise = rng.normal(0, 12, size=(h, w, 3))
        pixels = np.clip(127 + 100 * base + noise, 0, 255).astype(np.uint8)
        Image.fromarray(pixels).save(folder / f"{k:06d}.jpg", quality=90)
    done.touch()
    return root


def load_batch(dataset: Any, indices: list[int]) -> tuple[np.ndarray, np.ndarray]:
    """The batch every loader produces: stacked arrays and int64 labels."""
    samples = [dataset[i] for i in indices]
    return np.stack([s[0] for s in samples]), np.array([s[1] for s in samples], dtype=np.int64)


def getitem_ms(dataset: Any, batches: list[list[int]], count: int = 50) -> float:
    """CPU milliseconds of the dataset's ``__getitem__`` alone per batch (a list of the
    samples, as a fetcher builds it), the median of up to ``count`` batches: what a
    loader's workers must spend in any case, so that ``workers CPU - this`` is the
    loader's own cost per batch."""
    times = []
    for b in batches[:count]:
        t0 = time.thread_time()
        samples = [dataset[i] for i in b]
        times.append(time.thread_time() - t0)
        del samples
    return 1e3 * sorted(times)[len(times) // 2]


# ---------------------------------------------------------------- the consumer's step
class Step:
    """A fixed amount of single-threaded compute per batch, plus reading a slice of it.

    Calibrated once per process to about ``target_ms`` on an idle core: a training step
    that needs its core, so whatever CPU the loader takes from it shows in the epoch time.
    """

    def __init__(self, target_ms: float, n: int = 160):
        rng = np.random.default_rng(3)
        self.a = rng.random((n, n), dtype=np.float32)
        self.b = rng.random((n, n), dtype=np.float32)
        self.repeats = 1
        one = min(self._timed(1) for _ in range(5))
        self.repeats = max(1, round(target_ms / 1e3 / one))

    def _timed(self, repeats: int) -> float:
        t0 = time.perf_counter()
        for _ in range(repeats):
            self.a @ self.b
        return time.perf_counter() - t0

    def __call__(self, images: np.ndarray) -> float:
        acc = float(np.asarray(images)[:, 0, ::4, ::4].sum(dtype=np.int64))  # read part of the batch
        for _ in range(self.repeats):
            self.a @ self.b
        return acc


# ---------------------------------------------------------------- the workload table
@dataclass(frozen=True)
class Workload:
    name: str
    batch_size: int
    batches: int            # per epoch, full mode
    quick_batches: int      # per epoch, --quick
    make_dataset: Callable[[int], Any]  # (number of samples) -> dataset
    unit: str               # what the second throughput column counts: "MB" or "images"
    step_ms: float = 0.0    # the consumer's step per batch (0: the consumer only reads labels)
    note: str = ""
    deterministic: bool = True  # same batch for the same indices, labels = indices (jpeg: random crops, classes)

    def epoch_batches(self, quick: bool) -> int:
        return self.quick_batches if quick else self.batches


def _jpeg_dataset(samples: int) -> JpegFolder:
    return JpegFolder(make_jpeg_folder(samples))


WORKLOADS = {w.name: w for w in (
    Workload("transport", 64, 48, 16, lambda n: CachedImages(n, (3, 224, 224)), "MB",
             note="uint8 3x224x224 fresh copy + label, batch 64"),
    Workload("transport-big", 32, 24, 8, lambda n: CachedImages(n, (3, 512, 512)), "MB",
             note="uint8 3x512x512 fresh copy + label, batch 32"),
    Workload("jpeg", 64, 24, 4, _jpeg_dataset, "images",
             note="~500x375 JPEG decode + RandomResizedCrop 224 + flip, batch 64", deterministic=False),
    # tiny and rows: epochs of ~0.3 s. At 600 and 120 batches an epoch lasted ~60 ms: runs
    # varied by +-15%, and the end of each epoch, when an exact-epoch loader's workers have
    # nothing left to load while the consumer takes the batches they prefetched (~3 ms for
    # shmload, docs/performance.md), weighed ~5% of it (tensorpack's runner keeps no epochs).
    # The datasets are 5x larger with them: the memory columns of these two workloads are
    # not comparable with tables dated before 2026-11-26.
    Workload("tiny", 256, 3000, 200, lambda n: TinyRows(n), "MB",
             note="32 float32 + label, batch 256"),
    Workload("rows", 1024, 600, 40, lambda n: InMemoryRows(n), "MB",
             note="1 KiB rows (256 float32) of an in-memory table + label, batch 1024"),
    Workload("consumer", 64, 40, 16, lambda n: CachedImages(n, (3, 224, 224)), "MB", step_ms=19.0,
             note="transport with a 19 ms single-threaded compute step per batch"),
)}


def thread_env() -> dict[str, str]:
    """One BLAS/OpenMP thread everywhere, so the step and the loaders do not oversubscribe."""
    return {k: "1" for k in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS")} | {
        "PYTHONHASHSEED": os.environ.get("PYTHONHASHSEED", "0")}
