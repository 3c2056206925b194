"""Synthetic datasets for trying the loader and its profiler without data:
``shmload profile shmload.tools.synthetic:images``.
"""

from __future__ import annotations

import os
import random
import sys
from typing import Any, Iterator

import numpy as np


class SyntheticImages:
    """``n`` samples ``{"image": uint8 [3, size, size], "label": int}``: a cached random
    image, cropped at a random offset and flipped at random (seeded per batch by the
    loader), about what a decoded-JPEG pipeline hands its collate."""

    def __init__(self, n: int = 4096, size: int = 224, classes: int = 1000):
        self.n, self.size, self.classes = n, size, classes
        self.source = np.random.default_rng(0).integers(0, 256, (3, size + 32, size + 32), dtype=np.uint8)

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> dict:
        if not 0 <= i < self.n:
            raise IndexError(f"index {i} out of range for {self.n} samples")
        top, left = random.randrange(33), random.randrange(33)
        image = self.source[:, top:top + self.size, left:left + self.size]
        if random.random() < 0.5:
            image = image[:, :, ::-1]
        return {"image": np.ascontiguousarray(image), "label": i % self.classes}


def images(n: int = 4096, size: int = 224) -> SyntheticImages:
    """The factory ``shmload profile`` imports: ``shmload.tools.synthetic:images``."""
    return SyntheticImages(n, size)


# ---------------------------------------------------------------- a folder of JPEGs
class SyntheticRegression:
    """``n`` samples ``{"x": float32 [features], "y": float32, "id": int}`` for a linear
    model to fit: ``x`` from a generator seeded by the index, plus a little noise from
    numpy's global generator (an "augmentation": the loader seeds it per batch, so the
    noise is the same for any ``num_workers`` and after a resume), ``y`` a fixed linear
    function of ``x``, and the index itself, so a test can tell which samples it saw.
    The trainer examples (``examples/*_train.py``) use it."""

    def __init__(self, n: int = 96, features: int = 8):
        self.n = n
        self.w = np.linspace(-1, 1, features, dtype=np.float32)

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> dict:
        if not 0 <= i < self.n:
            raise IndexError(f"index {i} out of range for {self.n} samples")
        x = np.random.default_rng(i).standard_normal(len(self.w)).astype(np.float32)
        x += np.random.normal(0, 0.01, len(self.w)).astype(np.float32)
        return {"x": x, "y": np.float32(x @ self.w), "id": i}


def photo(rng: np.random.Generator, width: int, height: int) -> np.ndarray:
    """A photo-like ``[height, width, 3]`` uint8 image: a smooth random colour field (a
    coarse random grid upsampled bicubically), a few soft-edged shapes, and sensor-like
    noise, so it compresses and decodes like a photograph, not like flat colour or
    white noise."""
    from PIL import Image, ImageDraw, ImageFilter

    coarse = rng.integers(0, 256, (max(2, height // 48), max(2, width // 48), 3), dtype=np.uint8)
    # (Pillow sets Image.BICUBIC in a loop, unseen by type checkers; Image.Resampling needs Pillow 9.1)
    img = Image.fromarray(coarse).resize((width, height), Image.BICUBIC)  # type: ignore[attr-defined]
    draw = ImageDraw.Draw(img)
    for _ in range(int(rng.integers(3, 8))):
        x0, y0 = int(rng.integers(0, width)), int(rng.integers(0, height))
        r = int(rng.integers(min(width, height) // 12, min(width, height) // 3))
        colour = tuple(int(c) for c in rng.integers(0, 256, 3))
        box = (x0 - r, y0 - r, x0 + r, y0 + r)
        (draw.ellipse if rng.random() < 0.5 else draw.rectangle)(box, fill=colour)
    img = img.filter(ImageFilter.GaussianBlur(1.5))
    pixels = np.asarray(img, dtype=np.int16) + rng.normal(0, 8, (height, width, 3)).astype(np.int16)
    return np.clip(pixels, 0, 255).astype(np.uint8)


def _write_photos(job: tuple[str, int, int, int, int, int]) -> None:
    from PIL import Image

    root, start, stop, width, height, classes = job
    for k in range(start, stop):
        rng = np.random.default_rng(k)
        w = int(width * rng.uniform(0.9, 1.1)) if width > 64 else width  # a little size variety, as in ImageNet
        h = int(height * rng.uniform(0.9, 1.1)) if height > 64 else height
        path = os.path.join(root, f"class{k % classes:03d}", f"img{k:06d}.jpg")
        Image.fromarray(photo(rng, w, h)).save(path, quality=90)


def image_folder(root: str | os.PathLike, count: int = 2000, size: tuple[int, int] = (500, 375),
                 classes: int = 10, processes: int | None = None, progress: bool = False) -> str:
    """Write ``count`` synthetic photo-like JPEGs of about ``size`` (width, height) into
    ``root/class000 .. root/class{classes-1}`` once (a marker file records a finished
    folder; a partial one is rewritten), and return ``root``. Deterministic: image ``k``
    comes from seed ``k``. Written by ``processes`` worker processes (default: the
    usable cores). Use one folder per ``count``: a larger count adds images next to
    those of a smaller one."""
    import multiprocessing

    root = os.fspath(root)
    marker = os.path.join(root, f".complete-{count}-{size[0]}x{size[1]}-{classes}")
    if os.path.exists(marker):
        return root
    for c in range(classes):
        os.makedirs(os.path.join(root, f"class{c:03d}"), exist_ok=True)
    step = 50
    jobs = [(root, s, min(s + step, count), size[0], size[1], classes) for s in range(0, count, step)]
    procs = processes or len(os.sched_getaffinity(0))
    done = 0
    live = progress and sys.stderr.isatty()
    if progress and not live:
        print(f"writing {count} synthetic JPEGs to {root} (once)", file=sys.stderr, flush=True)
    finished: Iterator[None]
    if procs == 1:
        finished = map(_write_photos, jobs)
    else:
        pool = multiprocessing.get_context("fork").Pool(procs)
        finished = pool.imap_unordered(_write_photos, jobs)
    try:
        for _ in finished:
            done += 1
            if live:
                print(f"\rwriting {count} synthetic JPEGs to {root} (once): {min(done * step, count)}/{count}",
                      end="", file=sys.stderr, flush=True)
    except BaseException:
        if procs != 1:
            pool.terminate()
        raise
    finally:
        if procs != 1:
            pool.close()
            pool.join()
    if live:
        print(file=sys.stderr)
    with open(marker, "w"):
        pass
    return root


def cache_dir() -> str:
    """Where generated data is kept: ``$SHMLOAD_CACHE``, else ``~/.cache/shmload``."""
    return os.environ.get("SHMLOAD_CACHE") or os.path.join(os.path.expanduser("~"), ".cache", "shmload")


DEMO_IMAGES = 2000
DEMO_SIZE = (500, 375)


def demo_folder(count: int = DEMO_IMAGES, progress: bool = False) -> str:
    """The demo's folder of ``count`` ~500x375 JPEGs in 10 classes, in :func:`cache_dir`."""
    root = os.path.join(cache_dir(), f"demo-images-{count}-{DEMO_SIZE[0]}x{DEMO_SIZE[1]}")
    return image_folder(root, count, DEMO_SIZE, progress=progress)


def imagefolder(count: int = DEMO_IMAGES, size: int = 224, output: str = "uint8-hwc") -> Any:
    """The image example as a factory for ``shmload profile shmload.tools.synthetic:imagefolder``:
    ``ImageFolder`` over the demo's folder with the fused ``train_pipeline``."""
    from ..datasets import ImageFolder
    from ..transforms import train_pipeline

    return ImageFolder(demo_folder(count, progress=True), transform=train_pipeline(size, output))
