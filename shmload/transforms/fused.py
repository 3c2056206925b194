"""The fused train transform: decode, random-resized-crop, flip and (optionally)
normalize, writing the final pixels straight into the batch's slot.

A torchvision-style pipeline makes, per image: the full decoded image, a cropped copy,
the resized image, a flipped copy, an array of it, a float copy, a normalized copy, and
finally the collate's copy into the batch. Here, per image:

1. ``__call__`` (in the dataset's ``__getitem__``, timed as *fetch*): pick the crop box
   (torchvision's parameters), decode the JPEG at the largest reduction that keeps the
   crop's resolution (``decode.py``), and crop + resize in one Pillow call
   (``resize(box=...)``), giving the small ``size`` x ``size`` image. The flip is drawn
   here too, so the random draws happen in a fixed order.
2. ``write_into`` (in the collate, *collate*): one pass from that image into the slot
   row: a copy (mirrored if flipped) for ``uint8-hwc``, or subtract-and-scale into
   float32 ``[3, H, W]`` for ``float32-chw``.

Step 2 is the :class:`~shmload._batching.deferred.DeferredArray` protocol: the dataset returns a
small object that knows its output shape and dtype, and the loader hands it the slot row.
"""

from __future__ import annotations

import random
from typing import Any, Sequence

import numpy as np

from .._batching.deferred import DeferredArray
from . import params
from .ops import MEAN, STD, as_pil, crop_resize, resample_filter

OUTPUTS = ("uint8-hwc", "float32-chw")


class TrainPipeline:
    """See :func:`train_pipeline`."""

    def __init__(self, size: int | Sequence[int] = 224, output: str = "uint8-hwc",
                 scale: Sequence[float] = (0.08, 1.0), ratio: Sequence[float] = (3 / 4, 4 / 3),
                 flip_p: float = 0.5, mean: Sequence[float] = MEAN, std: Sequence[float] = STD,
                 interpolation: Any = "bilinear", reduced_decode: bool = True, fast_decode: bool = False):
        if output not in OUTPUTS:
            raise ValueError(f"train_pipeline: output must be one of {OUTPUTS}, got {output!r}")
        if not 0.0 <= flip_p <= 1.0:
            raise ValueError(f"train_pipeline: flip_p must be in [0, 1], got {flip_p}")
        self.size = params.pair(size)
        self.output, self.scale, self.ratio, self.flip_p = output, tuple(scale), tuple(ratio), flip_p
        self.resample = resample_filter(interpolation)
        self.reduced_decode, self.fast_decode = reduced_decode, fast_decode
        mean_arr, std_arr = np.asarray(mean, np.float64), np.asarray(std, np.float64)
        if mean_arr.shape != (3,) or std_arr.shape != (3,) or np.any(std_arr == 0):
            raise ValueError(f"train_pipeline: mean and std need 3 values each, std without 0; got {mean!r}, {std!r}")
        self.mean = mean_arr.astype(np.float32).reshape(3, 1, 1)
        self.inv_std = (1.0 / std_arr).astype(np.float32).reshape(3, 1, 1)
        h, w = self.size
        self.shape: tuple[int, int, int]
        self.dtype: np.dtype
        self.shape, self.dtype = ((h, w, 3), np.dtype(np.uint8)) if output == "uint8-hwc" else \
            ((3, h, w), np.dtype(np.float32))

    def __call__(self, img: Any) -> PendingImage:
        img = as_pil(img, "train_pipeline")
        width, height = img.size
        left, top, w, h = params.resized_crop_box(width, height, self.scale, self.ratio)
        small = crop_resize(img, (left, top, left + w, top + h), self.size, self.resample,
                            self.reduced_decode, self.fast_decode)
        if small.mode != "RGB":
            small = small.convert("RGB")
        return PendingImage(self, small, random.random() < self.flip_p)

    def __repr__(self) -> str:
        return (f"train_pipeline(size={self.size}, output={self.output!r}, scale={self.scale}, ratio={self.ratio}, "
                f"flip_p={self.flip_p})")


class PendingImage(DeferredArray):
    """A cropped and resized image, to be flipped and converted into its slot row."""

    __slots__ = ("pipeline", "image", "flip", "shape", "dtype")

    def __init__(self, pipeline: TrainPipeline, image: Any, flip: bool):
        self.pipeline, self.image, self.flip = pipeline, image, flip
        self.shape, self.dtype = pipeline.shape, pipeline.dtype

    def write_into(self, out: np.ndarray) -> None:
        image = self.image
        if self.flip:
            # Pillow mirrors a 224x224 image in 0.06 ms; numpy's negative-stride copy of
            # 3-byte pixels (a[:, ::-1]) took 0.35 ms, 7% of a 500x375 image's budget.
            from PIL import Image

            image = image.transpose(Image.Transpose.FLIP_LEFT_RIGHT)
        a = np.asarray(image)  # [H, W, 3] uint8
        p = self.pipeline
        if p.output == "uint8-hwc":
            out[...] = a
        else:
            np.subtract(a.transpose(2, 0, 1), p.mean, out=out, dtype=np.float32)
            out *= p.inv_std


def train_pipeline(size: int | Sequence[int] = 224, output: str = "uint8-hwc", **options: Any) -> TrainPipeline:
    """The fused training transform for :class:`shmload.datasets.ImageFolder`: decode,
    ``RandomResizedCrop(size, scale, ratio)``, ``RandomHorizontalFlip(flip_p)`` and, for
    ``output="float32-chw"``, ``Normalize(mean, std)`` + ``ToCHW``, with each image
    written straight into the batch's slot.

    ``output="uint8-hwc"``: ``[size, size, 3]`` uint8, 4x fewer bytes than float32
    (normalize later, on the accelerator). ``"float32-chw"``: ``[3, size, size]`` float32,
    ``(x - mean) / std`` with mean and std in 0-255 units.

    Options: ``scale=(0.08, 1.0)``, ``ratio=(3/4, 4/3)``, ``flip_p=0.5``, ``mean``,
    ``std`` (torchvision's ImageNet values times 255), ``interpolation="bilinear"``,
    ``reduced_decode=True``, ``fast_decode=False`` (True: libjpeg's fast DCT and plain
    chroma upsampling, about 5% less decode time with libjpeg-turbo for about 1 level in
    255 of pixel difference; off by default so that results match an exact decode)."""
    return TrainPipeline(size, output, **options)
