"""Decode less: JPEG reduced-size and fast decoding, chosen per image before it is decoded.

An image from ``Image.open`` is not decoded until its pixels are needed. A JPEG decoder
can then produce the image at 1/2, 1/4 or 1/8 of its size straight from the DCT
coefficients (libjpeg's ``scale_denom``, Pillow's ``Image.draft``), at a fraction of the
cost of a full decode. :func:`prepare` picks, for the region that will be resized to the
output, the largest reduction that still leaves at least the output's resolution in it
(``params.reduction``), so the resize that follows sees no fewer pixels than it outputs
and the result is close to a full decode followed by the same resize (measured in
``tests/test_transforms.py``, figures in docs/performance.md).

``fast=True`` also asks libjpeg for its fastest settings: the integer fast DCT and plain
(not "fancy", interpolating) chroma upsampling. That is Pillow's draft mode, set through
its ``decoderconfig = (scale, draft)`` (a decoder setting Pillow reads when it decodes;
on a Pillow that drops it, images simply decode exactly). With libjpeg-turbo's SIMD code
it saves little: a 500x375 decode went from 1.03 to 0.97 ms on the benchmark machine,
for about 1.1 levels in 255 of pixel difference after the resize. Off by default
everywhere; an option for those who want the last few percent.
"""

from __future__ import annotations

from typing import Any

from .params import reduction


def pending_jpeg(img: Any) -> bool:
    """Is ``img`` a JPEG opened but not yet decoded (so its decoded size can still change)?"""
    return getattr(img, "format", None) == "JPEG" and bool(getattr(img, "tile", None)) and \
        not getattr(img, "decoderconfig", ())


def prepare(img: Any, box: tuple[float, float, float, float], out_w: int, out_h: int, reduced: bool = True,
            fast: bool = False) -> tuple[Any, tuple[float, float, float, float]]:
    """Set up ``img`` to decode no more than needed for resizing ``box`` (left, top, right,
    bottom, in the image's coordinates) to ``out_w`` x ``out_h``; returns the image and the
    box in the coordinates of the image as it will decode. A no-op for anything but a
    JPEG that is not decoded yet."""
    if not pending_jpeg(img):
        return img, box
    left, top, right, bottom = box
    s = reduction(right - left, bottom - top, out_w, out_h) if reduced else 1
    if s > 1:
        width, height = img.size
        img.draft(None, (width // s, height // s))  # Pillow picks the largest power of 2 <= size ratio: s
        s = img.decoderconfig[0] if img.decoderconfig else 1
    if fast:
        img.decoderconfig = (img.decoderconfig[0] if img.decoderconfig else 1, 1)
    return img, (left / s, top / s, right / s, bottom / s)
