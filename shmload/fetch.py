"""Fetch: read the samples of one batch from a map-style dataset."""

from __future__ import annotations

from typing import Any, Sequence

from .errors import ShmloadError


def fetch(dataset: Any, indices: Any, auto_batch: bool) -> Any:
    """The samples at ``indices`` (a list), or the one sample at ``indices`` (an int)
    when ``auto_batch`` is False (``batch_size=None``).

    A dataset with ``__getitems__`` (as torch 2.x datasets may have) serves the whole
    batch in one call.
    """
    if not auto_batch:
        return dataset[indices]
    getitems = getattr(dataset, "__getitems__", None)
    if getitems is None:
        return [dataset[i] for i in indices]
    samples = getitems(list(indices))
    _check_getitems(dataset, indices, samples)
    return samples


def _check_getitems(dataset: Any, indices: Sequence[int], samples: Any) -> None:
    try:
        n = len(samples)
    except TypeError:
        n = None
    if n != len(indices):
        got = f"{n} samples" if n is not None else f"a {type(samples).__name__} without a length"
        raise ShmloadError(
            f"{type(dataset).__name__}.__getitems__({list(indices)!r}) returned {got}, "
            f"expected a sequence of {len(indices)} samples (one per index)"
        )
