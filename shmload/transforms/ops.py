"""The transforms, one step each, with torchvision's semantics for their random
parameters (see ``params.py``), on PIL images and ``[H, W, C]`` numpy arrays.

Geometric steps (crops, resizes) take and return PIL images, as torchvision's do, and
decode a pending JPEG at a reduced size when the output allows (``decode.py``); flips
and crops also work on arrays. ``Normalize`` and ``ToCHW`` produce arrays.
"""

from __future__ import annotations

import random
from typing import Any, Callable, Sequence

import numpy as np

from . import params
from .decode import pending_jpeg, prepare

# torchvision's ImageNet statistics (0-1 units) times 255: inputs stay uint8 0-255, as in
# OneFlow's CropMirrorNormalize.
MEAN = (123.68, 116.779, 103.939)
STD = (58.393, 57.12, 57.375)

_INTERPOLATIONS = {"nearest": 0, "box": 4, "bilinear": 2, "hamming": 5, "bicubic": 3, "lanczos": 1}


def resample_filter(value: Any) -> int:
    """A Pillow resampling filter from a name ("bilinear") or a Pillow constant."""
    if isinstance(value, str):
        try:
            return _INTERPOLATIONS[value.lower()]
        except KeyError:
            raise ValueError(f"interpolation must be one of {sorted(_INTERPOLATIONS)}, got {value!r}") from None
    return int(value)


def as_pil(img: Any, who: str) -> Any:
    from PIL import Image

    if isinstance(img, Image.Image):
        return img
    if isinstance(img, np.ndarray) and img.dtype == np.uint8 and img.ndim in (2, 3):
        return Image.fromarray(img)
    raise TypeError(f"{who} expects a PIL image or a uint8 [H, W, C] array, got {_describe(img)}")


def as_array(img: Any, who: str) -> np.ndarray:
    from PIL import Image

    if isinstance(img, Image.Image):
        return np.asarray(img if img.mode in ("RGB", "L", "RGBA") else img.convert("RGB"))
    if isinstance(img, np.ndarray):
        return img
    raise TypeError(f"{who} expects a PIL image or a numpy array, got {_describe(img)}")


def _describe(img: Any) -> str:
    if isinstance(img, np.ndarray):
        return f"an array of shape {img.shape} and dtype {img.dtype}"
    return f"a {type(img).__name__}"


class Compose:
    """Apply ``transforms`` in order."""

    def __init__(self, transforms: Sequence[Callable]):
        self.transforms = list(transforms)

    def __call__(self, img: Any) -> Any:
        for t in self.transforms:
            img = t(img)
        return img

    @property
    def reduced_decode(self) -> bool | None:
        """The first decoding step's ``reduced_decode`` (None if none says): what the
        profiler reads to name the decode stage (profiler/stats.py)."""
        says = (getattr(t, "reduced_decode", None) for t in self.transforms)
        return next((reduced for reduced in says if isinstance(reduced, bool)), None)

    def __repr__(self) -> str:
        return "Compose([" + ", ".join(map(repr, self.transforms)) + "])"


class RandomResizedCrop:
    """A crop of random area (``scale`` of the image's) and aspect ratio (``ratio``,
    log-uniform), resized to ``size``; torchvision's parameters and fallback.

    ``reduced_decode``: a JPEG not yet decoded is decoded at 1/2, 1/4 or 1/8 scale when
    the crop still holds at least ``size`` pixels at that scale. ``fast_decode``: libjpeg's
    fastest settings (see ``decode.py``)."""

    def __init__(self, size: int | Sequence[int], scale: Sequence[float] = (0.08, 1.0),
                 ratio: Sequence[float] = (3 / 4, 4 / 3), interpolation: Any = "bilinear",
                 reduced_decode: bool = True, fast_decode: bool = False):
        self.size = params.pair(size)
        if not (0 < scale[0] <= scale[1]) or not (0 < ratio[0] <= ratio[1]):
            raise ValueError(f"RandomResizedCrop: scale and ratio must be (low, high) with 0 < low <= high, "
                             f"got scale={tuple(scale)}, ratio={tuple(ratio)}")
        self.scale, self.ratio = tuple(scale), tuple(ratio)
        self.interpolation = resample_filter(interpolation)
        self.reduced_decode, self.fast_decode = reduced_decode, fast_decode

    def __call__(self, img: Any) -> Any:
        img = as_pil(img, "RandomResizedCrop")
        width, height = img.size
        left, top, w, h = params.resized_crop_box(width, height, self.scale, self.ratio)
        return crop_resize(img, (left, top, left + w, top + h), self.size, self.interpolation,
                           self.reduced_decode, self.fast_decode)

    def __repr__(self) -> str:
        return f"RandomResizedCrop(size={self.size}, scale={self.scale}, ratio={self.ratio})"


def crop_resize(img: Any, box: tuple[int, int, int, int], size: tuple[int, int], resample: int,
                reduced: bool = True, fast: bool = False) -> Any:
    """``box`` of ``img`` resized to ``size`` (height, width) in one Pillow call (no
    intermediate crop), decoding a pending JPEG no larger than needed."""
    out_h, out_w = size
    img, scaled = prepare(img, box, out_w, out_h, reduced, fast)
    if img.mode not in ("RGB", "L"):
        img = img.convert("RGB")  # palette and other modes resize badly (Pillow falls back to nearest)
    return img.resize((out_w, out_h), resample, box=scaled)


class Resize:
    """torchvision's ``Resize``: an int matches the shorter side keeping the aspect
    ratio, a (height, width) pair is the exact size. A pending JPEG decodes at the
    largest reduction that keeps at least the output size."""

    def __init__(self, size: int | Sequence[int], interpolation: Any = "bilinear", reduced_decode: bool = True):
        if not isinstance(size, int):
            params.pair(size)
        elif size <= 0:
            raise ValueError(f"Resize: size must be positive, got {size}")
        self.size = size
        self.interpolation = resample_filter(interpolation)
        self.reduced_decode = reduced_decode

    def __call__(self, img: Any) -> Any:
        img = as_pil(img, "Resize")
        width, height = img.size
        out_w, out_h = params.resize_size(width, height, self.size)
        if (out_w, out_h) == (width, height) and not pending_jpeg(img):
            return img
        return crop_resize(img, (0, 0, width, height), (out_h, out_w), self.interpolation, self.reduced_decode)

    def __repr__(self) -> str:
        return f"Resize(size={self.size})"


class CenterCrop:
    """The central ``size`` (int or (height, width)) region; zero-padded where the image
    is smaller, as torchvision pads. PIL images and ``[H, W, ...]`` arrays."""

    def __init__(self, size: int | Sequence[int]):
        self.size = params.pair(size)

    def __call__(self, img: Any) -> Any:
        crop_h, crop_w = self.size
        if isinstance(img, np.ndarray):
            height, width = img.shape[:2]
            left, top, right, bottom = params.center_crop_box(width, height, crop_h, crop_w)
            if left >= 0 and top >= 0:
                return img[top:bottom, left:right]
            out = np.zeros((crop_h, crop_w) + img.shape[2:], img.dtype)
            src = img[max(top, 0):bottom, max(left, 0):right]
            out[max(-top, 0):max(-top, 0) + src.shape[0], max(-left, 0):max(-left, 0) + src.shape[1]] = src
            return out
        img = as_pil(img, "CenterCrop")
        width, height = img.size
        return img.crop(params.center_crop_box(width, height, crop_h, crop_w))

    def __repr__(self) -> str:
        return f"CenterCrop(size={self.size})"


class RandomHorizontalFlip:
    """Mirror left-right with probability ``p`` (``random.random() < p``, as torchvision)."""

    def __init__(self, p: float = 0.5):
        if not 0.0 <= p <= 1.0:
            raise ValueError(f"RandomHorizontalFlip: p must be in [0, 1], got {p}")
        self.p = p

    def __call__(self, img: Any) -> Any:
        if random.random() >= self.p:
            return img
        if isinstance(img, np.ndarray):
            return img[:, ::-1]
        from PIL import Image

        return as_pil(img, "RandomHorizontalFlip").transpose(Image.Transpose.FLIP_LEFT_RIGHT)

    def __repr__(self) -> str:
        return f"RandomHorizontalFlip(p={self.p})"


class Normalize:
    """``(x - mean) / std`` per channel, to float32, from 0-255 input (a uint8 array or PIL
    image; mean and std in 0-255 units, as OneFlow's CropMirrorNormalize). The defaults
    are torchvision's ImageNet statistics times 255. Layout is kept: ``[H, W, C]`` in,
    ``[H, W, C]`` out (``ToCHW`` after it for channels first)."""

    def __init__(self, mean: Sequence[float] = MEAN, std: Sequence[float] = STD):
        self.mean = np.asarray(mean, dtype=np.float32)
        std_arr = np.asarray(std, dtype=np.float64)
        if self.mean.shape != std_arr.shape or self.mean.ndim != 1:
            raise ValueError(f"Normalize: mean and std must be sequences of the same length, got {mean!r}, {std!r}")
        if np.any(std_arr == 0):
            raise ValueError(f"Normalize: std must not contain 0, got {std!r}")
        self.inv_std = (1.0 / std_arr).astype(np.float32)

    def __call__(self, img: Any) -> np.ndarray:
        a = as_array(img, "Normalize")
        channels = a.shape[-1] if a.ndim == 3 else 1
        if channels != len(self.mean):
            raise ValueError(f"Normalize: the image has {channels} channels (shape {a.shape}), "
                             f"but mean/std have {len(self.mean)} values")
        mean, inv = (self.mean, self.inv_std) if a.ndim == 3 else (self.mean[0], self.inv_std[0])
        out = np.subtract(a, mean, dtype=np.float32)
        out *= inv
        return out

    def __repr__(self) -> str:
        return f"Normalize(mean={self.mean.tolist()}, std={(1 / self.inv_std).tolist()})"


class ToCHW:
    """``[H, W, C]`` (or a PIL image) to a contiguous ``[C, H, W]`` array; ``[H, W]`` to
    ``[1, H, W]``. The dtype is kept (torchvision's ToTensor also scales to 0-1; here
    scaling is ``Normalize``'s job)."""

    def __call__(self, img: Any) -> np.ndarray:
        a = as_array(img, "ToCHW")
        if a.ndim == 2:
            return np.ascontiguousarray(a[None])
        if a.ndim != 3:
            raise ValueError(f"ToCHW expects an [H, W, C] or [H, W] image, got shape {a.shape}")
        return np.ascontiguousarray(a.transpose(2, 0, 1))

    def __repr__(self) -> str:
        return "ToCHW()"
