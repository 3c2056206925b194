"""Deferred arrays: samples that write themselves into the batch.

The default collate copies every sample's arrays into the batch's slot. A sample that
is produced by a computation (an image decoded, cropped, resized, flipped, normalized)
can skip that copy and its own intermediate array: it returns, in place of the array, a
:class:`DeferredArray` that knows the array's ``shape`` and ``dtype`` and writes it into
a buffer it is given. The collate plans the batch from ``shape`` and ``dtype`` (checked
like any array leaf, so a mismatch is a ``CollateError`` naming the field and index),
then calls ``write_into(out)`` with ``out`` the sample's row of the slot: a writable,
C-contiguous numpy view of exactly that shape and dtype. With ``num_workers=0``, or in
``default_collate``, ``out`` is the row of an ordinary array: the same code runs.

The contract for ``write_into``:

* write every element of ``out`` (the slot is reused: what you do not write holds a
  previous batch's bytes);
* do not keep ``out`` or a view of it after returning (the slot belongs to the consumer
  once the batch is delivered);
* do the expensive, failure-prone work (opening and decoding a file) before returning
  the DeferredArray, in ``__getitem__``, so the dataset's errors are raised, and timed,
  where they belong; ``write_into`` is for the final conversion into the row.

:class:`Batched` is the batch-level counterpart, for a dataset's ``__getitems__`` that
can gather a whole batch at once (``ArrayDataset`` fills its rows with one ``np.take``).
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import Any

import numpy as np


class DeferredArray:
    """An array leaf that writes itself: subclass and set ``shape`` and ``dtype``.

    ``np.asarray(d)`` materializes it (a fresh array), so code that does not know the
    protocol, such as a custom ``collate_fn``, still gets an array."""

    shape: tuple[int, ...]
    dtype: np.dtype

    def write_into(self, out: np.ndarray) -> None:
        raise NotImplementedError

    def __array__(self, dtype: Any = None, copy: Any = None) -> np.ndarray:
        out = np.empty(self.shape, self.dtype)
        self.write_into(out)
        return out if dtype is None else out.astype(dtype, copy=False)

    def __repr__(self) -> str:
        return f"{type(self).__name__}(shape={tuple(self.shape)}, dtype={np.dtype(self.dtype)})"


class Batched:
    """What a ``__getitems__`` may return instead of a list of samples: the batch,
    already in collated form. ``batch`` mirrors what the default collate would build (a
    tuple, list or dict of arrays of ``[B, ...]``, or :class:`DeferredArray` of that
    shape); ``size`` is B. The loader writes it into the slot as it is. A loader with a
    ``collate_fn`` receives the per-sample list instead (:meth:`samples`)."""

    def __init__(self, batch: Any, size: int):
        self.batch = batch
        self.size = size

    def __len__(self) -> int:
        return self.size

    def array_shapes(self) -> Iterator[tuple[str, tuple]]:
        """``(field, shape)`` of each array leaf of ``batch`` (numpy arrays and scalars,
        tensors, :class:`DeferredArray`: what has a ``shape``), the field named as in a
        ``CollateError`` (``batch['image']``, ``batch[0]``). Each must have ``size`` rows,
        which the loader checks (``fetch.py``) before placing the batch."""
        return _shapes(self.batch, "batch")

    def samples(self) -> list:
        """The batch as a list of ``size`` samples (arrays materialized)."""
        full = _map(self.batch, np.asarray)
        return [_map(full, lambda a: a[i]) for i in range(self.size)]


def _shapes(node: Any, path: str) -> Iterator[tuple[str, tuple]]:
    cls = type(node)
    if isinstance(node, tuple) and hasattr(cls, "_fields"):
        for field, value in zip(cls._fields, node):
            yield from _shapes(value, f"{path}.{field}")
    elif isinstance(node, (tuple, list)):
        for i, value in enumerate(node):
            yield from _shapes(value, f"{path}[{i}]")
    elif isinstance(node, Mapping):
        for key, value in node.items():
            yield from _shapes(value, f"{path}[{key!r}]")
    elif not isinstance(node, (str, bytes)):  # numpy's str_ and bytes_ have a shape, but are objects
        try:
            shape = tuple(int(n) for n in node.shape)
        except (AttributeError, TypeError, ValueError):  # no shape: an object leaf, placed as it is
            return
        yield path, shape


def _map(node: Any, fn: Any) -> Any:
    if isinstance(node, tuple):
        return tuple(_map(v, fn) for v in node)
    if isinstance(node, list):
        return [_map(v, fn) for v in node]
    if isinstance(node, dict):
        return {k: _map(v, fn) for k, v in node.items()}
    return fn(node)
