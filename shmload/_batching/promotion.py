"""Promotion: the dtype torch gives a batch whose samples differ in numeric type.

NOTE [ Mixed numeric types ]
    When a numeric field's type differs between the samples of one batch, torch does not
    refuse the batch: ``default_collate`` calls ``torch.tensor`` (Python numbers),
    ``torch.as_tensor`` (numpy scalars) or ``torch.stack`` (arrays, tensors), which
    promote. The batch's dtype here is what torch gives: if sample 0 holds a Python
    float, float64 (``collate_float_fn``); otherwise :func:`promote_types` over the
    values' dtypes, where a Python bool is bool, an int int64 and a float float32
    (torch's default dtype: ``[0, 0.5]`` is float32 but ``[0.5, 0]`` float64). Shapes
    must still agree, and types torch cannot promote (uint64 with int64, a complex
    number after a Python float, strings, byte-swapped dtypes, a ``DeferredArray``, whose
    contract is to be written in its own dtype) are a CollateError. Batches whose samples
    The row-wise path (rowwise.py) writes rows into the slot as samples arrive, so it
    cannot change a dtype afterwards: there a type differing from sample 0's raises
    :class:`~shmload._batching.batcher.RowwiseTypeMismatch`.
"""

from __future__ import annotations

from typing import Any

import numpy as np

_INT64_MIN, _INT64_MAX = -(2**63), 2**63 - 1
_SCALAR_DTYPES = {bool: np.dtype(np.bool_), int: np.dtype(np.int64), float: np.dtype(np.float64)}

# torch.tensor's dtype for a Python number: a float gets torch's default dtype, float32.
_TORCH_SCALAR_DTYPES = {bool: np.dtype(np.bool_), int: np.dtype(np.int64), float: np.dtype(np.float32)}
# The dtypes numpy and torch share, as (kind, itemsize); ranked bool < ints < floats < complex.
_SHARED = {("b", 1), ("u", 1), ("u", 2), ("u", 4), ("u", 8), ("i", 1), ("i", 2), ("i", 4), ("i", 8),
           ("f", 2), ("f", 4), ("f", 8), ("c", 8), ("c", 16)}
_RANK = {"b": 0, "u": 1, "i": 1, "f": 2, "c": 3}


def _promotable(dtype: np.dtype) -> bool:
    return dtype.isnative and (dtype.kind, dtype.itemsize) in _SHARED


def promote_types(a: np.dtype, b: np.dtype) -> np.dtype | None:
    """``torch.promote_types(a, b)`` for the dtypes numpy and torch share, without torch
    (checked pair by pair against torch in the tests); None where torch has no common
    type, or for a dtype torch does not have."""
    if a == b:
        return a
    if not (_promotable(a) and _promotable(b)):
        return None
    for wide, other in ((a, b), (b, a)):  # torch promotes uint16/32/64 only with floats
        if wide.kind == "u" and wide.itemsize > 1 and other.kind != "f":
            return None
    if {a.kind, b.kind} == {"u", "i"}:  # uint8 with a signed int: a signed int holding both
        signed = a if a.kind == "i" else b
        return signed if signed.itemsize > 1 else np.dtype(np.int16)
    lo, hi = sorted((a, b), key=lambda d: (_RANK[d.kind], d.itemsize))
    if lo.kind == "f" and hi.kind == "c" and hi.itemsize < 2 * lo.itemsize:
        return np.dtype(f"c{2 * lo.itemsize}")  # complex64 with float64: complex128
    return hi


def _numeric_shape(value: Any) -> tuple | None:
    """The shape of a value that may join a promoted column: a Python bool/int/float (a
    numpy scalar or tensor arrives here as an array), None for anything else."""
    if type(value) in _SCALAR_DTYPES:
        return ()
    if type(value) is np.ndarray and _promotable(value.dtype):
        return value.shape
    return None


def _value_dtype(value: Any) -> np.dtype:
    return _TORCH_SCALAR_DTYPES.get(type(value)) or value.dtype


