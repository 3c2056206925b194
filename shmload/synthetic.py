"""Synthetic datasets for trying the loader and its profiler without data:
``shmload profile shmload.synthetic:images``.
"""

from __future__ import annotations

import random

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
    """The factory ``shmload profile`` imports: ``shmload.synthetic:images``."""
    return SyntheticImages(n, size)
