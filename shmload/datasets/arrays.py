"""ArrayDataset: numpy arrays in memory as a dataset, gathered a batch at a time."""

from __future__ import annotations

from typing import Any, Sequence

import numpy as np

from .._batching.deferred import Batched, DeferredArray


class ArrayDataset:
    """Samples are rows of equally long arrays: ``dataset[i] == (a[i], b[i], ...)``.

    The counterpart of ``torch.utils.data.TensorDataset`` and of OneFlow's "numpy as
    data input". ``__getitems__`` serves a whole batch: each array's rows are gathered
    with one ``np.take(..., out=...)`` straight into the batch's slot, with no per-sample
    Python work and no intermediate copy. With ``fork``, workers share the arrays with
    the main process (copy-on-write pages that are only read); with ``spawn`` or
    ``forkserver`` each worker gets a pickled copy, so prefer ``fork`` or a memory-mapped
    array (``np.load(path, mmap_mode="r")``) for large data.
    """

    def __init__(self, *arrays: Any):
        if not arrays:
            raise ValueError("ArrayDataset needs at least one array")
        arrs = tuple(np.asarray(a) for a in arrays)
        for k, a in enumerate(arrs):
            if a.ndim == 0:
                raise ValueError(f"ArrayDataset: array {k} is 0-d; expected arrays with a first dimension of samples")
            if a.dtype.hasobject:
                raise ValueError(f"ArrayDataset: array {k} has dtype {a.dtype}; expected a plain numeric dtype")
            if len(a) != len(arrs[0]):
                raise ValueError(f"ArrayDataset: array {k} has {len(a)} rows, expected {len(arrs[0])} "
                                 "like array 0 (every array needs one row per sample)")
        self.arrays = arrs

    def __len__(self) -> int:
        return len(self.arrays[0])

    def __getitem__(self, index: int) -> tuple:
        return tuple(a[index] for a in self.arrays)

    def __getitems__(self, indices: Sequence[int]) -> Batched:
        idx = np.asarray(indices, dtype=np.intp)
        n = len(self)
        if len(idx) and (idx.min() < 0 or idx.max() >= n):
            bad = int(idx[(idx < 0) | (idx >= n)][0])
            raise IndexError(f"ArrayDataset index {bad} is out of range: expected 0 <= index < {n}")
        return Batched(tuple(_Rows(a, idx) for a in self.arrays), len(idx))


class _Rows(DeferredArray):
    """Rows ``idx`` of ``array``, gathered into ``out`` by one ``np.take``."""

    __slots__ = ("array", "idx", "shape", "dtype")

    def __init__(self, array: np.ndarray, idx: np.ndarray):
        self.array, self.idx = array, idx
        self.shape = (len(idx),) + array.shape[1:]
        self.dtype = array.dtype

    def write_into(self, out: np.ndarray) -> None:
        # mode="clip": with the default mode="raise" numpy gathers into a temporary and
        # copies it to ``out``. __getitems__ has checked every index, so clipping never
        # changes one.
        np.take(self.array, self.idx, axis=0, out=out, mode="clip")
