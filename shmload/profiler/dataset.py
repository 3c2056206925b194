"""What the profile knows of the dataset, to name stages it really has: what the dataset
and its transform say of themselves (``decodes_images``, ``reduced_decode``)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class DatasetInfo:
    """What the diagnosis knows of the dataset, to name stages it really has."""

    name: str  # its class (or function) name
    images: bool = False  # it decodes images: its ``decodes_images`` says so (ImageFolder, RecordDataset(image=True))
    # its transform's ``reduced_decode``: True, False (a shmload transform told not to), None (not known)
    reduced_decode: bool | None = None
    batched: bool = False  # it has __getitems__
    stream: bool = False  # read with __iter__, not __getitem__


def describe_dataset(dataset: Any) -> DatasetInfo:
    """The :class:`DatasetInfo` of a dataset object, from what it says of itself: its
    ``decodes_images`` and its transform's ``reduced_decode`` (the datasets and the
    transforms of shmload have them, and any other may). Only its type and attributes
    are read; an object whose attributes raise is described by its class name alone."""
    kind = type(dataset)
    stream = not hasattr(kind, "__getitem__")
    name = getattr(dataset, "__name__", None) if stream and callable(dataset) else None  # a generator function
    try:
        images = getattr(dataset, "decodes_images", False) is True
        reduced = getattr(getattr(dataset, "transform", None), "reduced_decode", None)
    except Exception:
        return DatasetInfo(kind.__name__, stream=stream)
    return DatasetInfo(name or kind.__name__, images, reduced if images and isinstance(reduced, bool) else None,
                       hasattr(kind, "__getitems__"), stream)
