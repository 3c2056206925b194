"""The pure arithmetic of the image transforms: random crop boxes, output sizes and the
JPEG reduction to decode at. No images here, so every rule is unit-tested on numbers.

Random draws use Python's ``random`` module: the loader seeds it for every batch from
``(seed, epoch, batch)`` (``seeding.py``), so augmentations are the same for any
``num_workers`` and across runs with the same seed.
"""

from __future__ import annotations

import math
import random
from typing import Sequence

REDUCTIONS = (8, 4, 2, 1)  # the DCT scalings a JPEG decoder offers (libjpeg's scale_denom)


def pair(size: int | Sequence[int], name: str = "size") -> tuple[int, int]:
    """``size`` as (height, width): an int is a square."""
    if isinstance(size, int):
        h = w = size
    else:
        if len(size) != 2:
            raise ValueError(f"{name} must be an int or a (height, width) pair, got {size!r}")
        h, w = (int(v) for v in size)
    if h <= 0 or w <= 0:
        raise ValueError(f"{name} must be positive, got {size!r}")
    return h, w


def resized_crop_box(width: int, height: int, scale: Sequence[float] = (0.08, 1.0),
                     ratio: Sequence[float] = (3 / 4, 4 / 3)) -> tuple[int, int, int, int]:
    """torchvision's ``RandomResizedCrop.get_params``, drawing from ``random``:
    (left, top, crop width, crop height). Ten tries at a random area fraction in ``scale``
    and a log-uniform aspect ratio in ``ratio``; then the central crop with the aspect
    ratio clamped into ``ratio``."""
    area = width * height
    log_ratio = (math.log(ratio[0]), math.log(ratio[1]))
    for _ in range(10):
        target_area = area * random.uniform(scale[0], scale[1])
        aspect = math.exp(random.uniform(*log_ratio))
        w = int(round(math.sqrt(target_area * aspect)))
        h = int(round(math.sqrt(target_area / aspect)))
        if 0 < w <= width and 0 < h <= height:
            top = random.randint(0, height - h)
            left = random.randint(0, width - w)
            return left, top, w, h
    in_ratio = width / height
    if in_ratio < min(ratio):
        w, h = width, int(round(width / min(ratio)))
    elif in_ratio > max(ratio):
        w, h = int(round(height * max(ratio))), height
    else:
        w, h = width, height
    return (width - w) // 2, (height - h) // 2, w, h


def resize_size(width: int, height: int, size: int | Sequence[int]) -> tuple[int, int]:
    """torchvision's ``Resize`` output (width, height): an int matches the shorter side
    keeping the aspect ratio (the longer side rounded down), a pair is (height, width)."""
    if isinstance(size, int):
        if size <= 0:
            raise ValueError(f"size must be positive, got {size}")
        short, long = (width, height) if width <= height else (height, width)
        new_short, new_long = size, int(size * long / short)
        return (new_short, new_long) if width <= height else (new_long, new_short)
    h, w = pair(size)
    return w, h


def center_crop_box(width: int, height: int, crop_h: int, crop_w: int) -> tuple[int, int, int, int]:
    """torchvision's ``CenterCrop`` box (left, top, right, bottom); parts outside the image
    (a crop larger than the image) are zero padding, placed as torchvision pads."""
    left = -((crop_w - width) // 2) if crop_w > width else int(round((width - crop_w) / 2.0))
    top = -((crop_h - height) // 2) if crop_h > height else int(round((height - crop_h) / 2.0))
    return left, top, left + crop_w, top + crop_h


def reduction(region_w: float, region_h: float, out_w: int, out_h: int) -> int:
    """The largest JPEG reduction (8, 4, 2 or 1) that still leaves at least the output's
    resolution in the region to be resized: decoding at 1/s costs about 1/s² of a full
    decode, and the resize that follows sees no fewer pixels than it outputs."""
    for s in REDUCTIONS:
        if region_w >= s * out_w and region_h >= s * out_h:
            return s
    return 1
