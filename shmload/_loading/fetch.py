"""Fetch: read the samples of one batch from a map-style dataset."""

from __future__ import annotations

from typing import Any, Callable, Sequence

from .._batching.deferred import Batched
from ..errors import ShmloadError, format_indices


def fetch(dataset: Any, indices: Any, auto_batch: bool, cuts: Sequence[tuple[int, int]] = (),
          reseed: Callable[[int], None] | None = None, bound: int | None = None) -> Any:
    """The samples at ``indices`` (a list), or the one sample at ``indices`` (an int)
    when ``auto_batch`` is False (``batch_size=None``). ``reseed(part)`` is called before
    the sample at each ``(position, part)`` of ``cuts`` (NOTE [ Parts of a batch ], parts.py).

    A dataset with ``__getitems__`` (as torch 2.x datasets may have) serves the whole
    batch in one call.
    """
    check_indices(dataset, [indices] if not auto_batch else indices, bound)
    if not auto_batch:
        return dataset[indices]
    getitems = getattr(dataset, "__getitems__", None)
    if getitems is None:
        if not cuts:
            return [dataset[i] for i in indices]
        assert reseed is not None, "cuts without a reseed"  # (load_batch makes them together)
        samples, start = [], 0
        for position, part in cuts:
            samples += [dataset[i] for i in indices[start:position]]
            reseed(part)
            start = position
        samples += [dataset[i] for i in indices[start:]]
        return samples
    samples = getitems(list(indices))
    _check_getitems(dataset, indices, samples)
    return samples


def check_indices(dataset: Any, indices: Sequence[Any], bound: int | None = None) -> None:
    """Integer indices must lie in ``range(len(dataset))``. Why check, when the dataset
    may raise IndexError itself: a list- or array-backed dataset silently wraps a negative
    index around to the end, and a dataset whose ``__len__`` is too large fails with an
    error that does not say the sampler is at fault. Indices that are not integers (keys
    of a dict-like dataset) are the dataset's business. About 10 us for 256 indices (docs/performance.md);
    one comparison given ``bound``, a number every index is known to be below, when it is
    within ``len(dataset)`` (NOTE [ The bound of a task's indices ], wire.py)."""
    try:
        n = len(dataset)
    except Exception:  # no usable len(): nothing to check against
        return
    if bound is not None and bound <= n:
        return
    try:
        lo, hi = min(indices), max(indices)
        if not (lo < 0 or hi >= n):
            return
    except (TypeError, ValueError):  # no indices, or indices that are not numbers
        return
    pos, bad = next((p, i) for p, i in enumerate(indices) if not 0 <= i < n)
    where = f"position {pos} of the batch {format_indices(indices)}" if len(indices) > 1 else "a batch"
    raise IndexError(f"the sampler gave dataset index {bad} (at {where}), but len(dataset) is {n}: "
                     f"expected 0 <= index < {n}. Check the sampler, or the dataset's __len__.")


def _check_getitems(dataset: Any, indices: Sequence[int], samples: Any) -> None:
    """One sample per index, and for a :class:`Batched`, one row per index in each array:
    the loader places a Batched's arrays as they are, so an extra row would be delivered
    as a batch of the wrong length."""
    try:
        n = len(samples)
    except TypeError:
        n = None
    if n != len(indices):
        got = f"{n} samples" if n is not None else f"a {type(samples).__name__} without a length"
        raise _getitems_error(dataset, indices, got, f"a sequence of {len(indices)} samples")
    if type(samples) is Batched:
        for field, shape in samples.array_shapes():
            if not shape or shape[0] != n:
                rows = f"{shape[0]} rows" if shape else "no rows"
                raise _getitems_error(dataset, indices, f"a Batched of {n} samples whose {field} has {rows} "
                                      f"(shape {shape})", f"{len(indices)} rows")


def _getitems_error(dataset: Any, indices: Sequence[int], got: str, expected: str) -> ShmloadError:
    return ShmloadError(f"{type(dataset).__name__}.__getitems__({format_indices(list(indices))}) returned {got}, "
                        f"expected {expected} (one per index)")
