"""Checks for code written against shmload's contracts: use them in your own tests.

:func:`assert_resumes_exactly` checks the exact-resume contract of a loader you build:
an uninterrupted run of ``epochs`` epochs is the reference; then, for each save point
and each pair of worker counts (saved with, resumed with), a run is stopped there, its
``state_dict()`` goes through JSON, a new loader (with a different seed, which the state
must override) loads it, and what that loader yields must equal the rest of the
reference bit for bit (dtype, shape and bytes of every array). With ``in_order=False``
the promise is weaker: each remaining batch of the epoch exactly once, in any order.

:func:`check_deferred_array` checks one :class:`shmload.DeferredArray` your dataset
returns: a valid ``shape`` and ``dtype``, a ``write_into(out)`` that writes every
element of ``out`` and keeps neither ``out`` nor a view of it.

:func:`script_workers` makes a ``num_workers="auto"`` loader change its worker count at
the batches you name instead of measuring, so a test can start and stop workers at known
points (and check that the batches do not change).

Both checks raise :class:`AssertionError` with a message saying what is wrong (also under
``python -O``), and return nothing when the check passes. :func:`run` and
:func:`flatten` are the pieces :func:`assert_resumes_exactly` is built of, for checks
of your own.
"""

from __future__ import annotations

import gc
import itertools
import json
import operator
import sys
import weakref
from typing import Any, Callable

import numpy as np

from ._batching.deferred import DeferredArray

__all__ = ["assert_resumes_exactly", "check_deferred_array", "flatten", "run", "script_workers"]

# The byte patterns check_deferred_array fills ``out`` with, one per call of write_into.
# An element is unwritten only if it holds the first after the first call and the second
# after the second: a value written there cannot equal both.
SENTINELS = (0xA5, 0x5A)


def flatten(batch: Any) -> list:
    """A batch as a list of (dtype, shape, bytes) / plain values: comparable with ==, and
    holding nothing of the ring."""
    if isinstance(batch, dict):
        return [(k, flatten(v)) for k, v in sorted(batch.items())]
    if isinstance(batch, (list, tuple)):
        return [flatten(v) for v in batch]
    if hasattr(batch, "numpy") and not isinstance(batch, np.ndarray):
        batch = batch.numpy()
    if isinstance(batch, np.ndarray):
        return [str(batch.dtype), batch.shape, batch.tobytes()]
    return [batch]


def run(loader: Any, epochs: int, stop_after: int | None = None) -> tuple[list, Any]:
    """The batches of ``epochs`` epochs, flattened; stopped after ``stop_after`` batches
    (then also returns ``state_dict()`` at that point, through JSON, and closes the
    loader)."""
    out = []
    for _ in range(epochs):
        for batch in loader:
            out.append(flatten(batch))
            del batch
            if stop_after is not None and len(out) == stop_after:
                state = json.loads(json.dumps(loader.state_dict()))
                loader.close()
                return out, state
    return out, None


def assert_resumes_exactly(make_loader: Callable[..., Any], stops: list[int], epochs: int = 2,
                           workers: tuple[int, ...] = (0, 1, 2), pairs: list[tuple[int, int]] | None = None,
                           in_order: bool = True, reference_workers: int = 0) -> None:
    """Check that a loader resumed from ``state_dict()`` yields exactly what an
    uninterrupted run does (the module docstring describes the runs).

    ``make_loader(num_workers=..., seed=...)`` builds a fresh loader (with a fresh
    sampler) each time it is called. ``stops``: after how many batches (counted over all
    epochs) to save; each must lie inside the run. ``pairs``: the (saved with, resumed
    with) worker counts, by default every pair from ``workers``. The reference runs with
    ``reference_workers`` (an iterable source's batches depend on how many workers read
    it). ``in_order=False`` (for a loader with ``in_order=False``) checks one epoch
    (``epochs=1``): every batch not delivered before the save, once each, in any order.
    Every loader built is closed before this returns."""
    if not in_order and epochs != 1:
        raise AssertionError(f"in_order=False checks one epoch: epochs must be 1, not {epochs}")
    reference = _run_closed(make_loader(num_workers=reference_workers, seed=11), epochs)
    if not len(reference) > max(stops):
        raise AssertionError("the save points must lie inside the run")
    pairs = pairs if pairs is not None else list(itertools.product(workers, workers))
    for stop in stops:
        for saved_with, resumed_with in pairs:
            saved = make_loader(num_workers=saved_with, seed=11)
            try:
                head, state = run(saved, epochs, stop)
            finally:
                saved.close()
            if head != reference[:stop] and in_order:
                raise AssertionError(f"the first {stop} batches differ (num_workers={saved_with})")
            loader = make_loader(num_workers=resumed_with, seed=12345)  # the state's seed must win
            try:
                loader.load_state_dict(state)
                epochs_left = epochs - state["epoch"]
                tail, _ = run(loader, epochs_left)
            finally:
                loader.close()
            expected = reference[stop:]
            where = f"resumed after {stop} batches, saved with num_workers={saved_with}, resumed with {resumed_with}"
            if in_order:
                if len(tail) != len(expected):
                    raise AssertionError(f"{where}: {len(tail)} batches, expected {len(expected)}")
                for k, (got, want) in enumerate(zip(tail, expected)):
                    if got != want:
                        raise AssertionError(f"{where}: batch {stop + k} differs")
            elif sorted(map(repr, head + tail)) != sorted(map(repr, reference)):
                # one epoch: what came before and after the save is the epoch, each batch once
                raise AssertionError(f"{where}: the remaining batches are not each delivered exactly once")


def _run_closed(loader: Any, epochs: int) -> list:
    try:
        return run(loader, epochs)[0]
    finally:
        loader.close()


def check_deferred_array(value: Any, name: str | None = None) -> None:
    """Check ``value``, a :class:`shmload.DeferredArray`, against the protocol's contract
    (``shmload/deferred.py``); ``name`` names it in messages (default: its class name).

    * ``value`` is a ``DeferredArray`` (the loader writes only those into the batch);
    * ``shape`` is a tuple (or list) of non-negative ints, ``dtype`` a numpy dtype (or
      what ``np.dtype()`` accepts) with a size and without Python objects;
    * ``write_into(out)`` writes every element of ``out``: ``out`` (a writable,
      C-contiguous view of the declared shape and dtype, as the loader passes) is filled
      with a byte pattern first, and an element that still holds it afterwards is
      unwritten. This is done twice, with two patterns, and an element counts as
      unwritten only if it held the pattern both times, so a value that happens to equal
      one pattern is no false alarm (``write_into`` must write the same values each
      time: ``np.asarray(value)`` calls it again);
    * ``write_into`` leaves ``out``'s shape, dtype and memory as they were, and keeps no
      reference to ``out`` or to a view of it once it returns.

    Raises AssertionError naming the first problem found (for unwritten elements: how
    many, and the index of the first). An exception raised by ``write_into`` itself
    propagates as it is."""
    what = name if name is not None else type(value).__name__
    if not isinstance(value, DeferredArray):
        raise AssertionError(f"{what} is not a shmload.DeferredArray: the loader writes only DeferredArray "
                             "instances into the batch (subclass shmload.DeferredArray)")
    shape = _checked_shape(value, what)
    dtype = _checked_dtype(value, what)
    first, second = (_write_once(value, shape, dtype, sentinel, what) for sentinel in SENTINELS)
    if not first.size:
        return
    unwritten = (first == SENTINELS[0]).all(axis=1) & (second == SENTINELS[1]).all(axis=1)
    count = int(np.count_nonzero(unwritten))
    if count:
        index = tuple(int(i) for i in np.unravel_index(int(np.argmax(unwritten)), shape))
        raise AssertionError(f"{what}.write_into left {count} of {len(unwritten)} elements of out unwritten "
                             f"(the first at index {index}): write every element (the loader reuses the slot, "
                             "so an unwritten element holds a previous batch's bytes)")


def _checked_shape(value: Any, what: str) -> tuple[int, ...]:
    try:
        shape = value.shape
    except AttributeError:
        raise AssertionError(f"{what} has no shape: set shape, a tuple of non-negative ints") from None
    if not isinstance(shape, (tuple, list)):
        raise AssertionError(f"{what}.shape is {shape!r}: expected a tuple of non-negative ints")
    try:
        dims = tuple(operator.index(n) for n in shape)
    except TypeError:
        raise AssertionError(f"{what}.shape is {shape!r}: expected a tuple of non-negative ints") from None
    if any(n < 0 for n in dims):
        raise AssertionError(f"{what}.shape is {shape!r}: expected a tuple of non-negative ints "
                             "(a negative dimension)")
    return dims


def _checked_dtype(value: Any, what: str) -> np.dtype:
    try:
        declared = value.dtype
    except AttributeError:
        raise AssertionError(f"{what} has no dtype: set dtype, a numpy dtype such as np.dtype(np.float32)") from None
    if declared is None:  # np.dtype(None) is float64: surely not what was meant
        raise AssertionError(f"{what}.dtype is None: expected a numpy dtype such as np.dtype(np.float32)")
    try:
        dtype = np.dtype(declared)
    except TypeError:
        raise AssertionError(f"{what}.dtype is {declared!r}: expected a numpy dtype such as "
                             "np.dtype(np.float32)") from None
    if dtype.hasobject:
        raise AssertionError(f"{what}.dtype is {dtype}: expected a plain (non-object) dtype; "
                             "Python objects cannot be placed in shared memory")
    if dtype.itemsize == 0:
        raise AssertionError(f"{what}.dtype is {dtype}, which has no size: give a flexible dtype its "
                             "length (such as 'S8' or 'U8')")
    return dtype


def _write_once(value: DeferredArray, shape: tuple[int, ...], dtype: np.dtype, sentinel: int,
                what: str) -> np.ndarray:
    """Call ``value.write_into(out)`` once, ``out`` filled with ``sentinel`` bytes; check
    that ``out`` is neither changed nor kept. The bytes ``out`` held afterwards, as a
    [elements, itemsize] uint8 array."""
    size = 1
    for n in shape:
        size *= n
    memory = np.full(size * dtype.itemsize, sentinel, np.uint8)  # out's memory, which only out refers to
    refs = sys.getrefcount(memory)
    out = memory.view(dtype).reshape(shape)
    address = out.__array_interface__["data"][0]
    alive = weakref.ref(out)
    value.write_into(out)
    changed = []
    if out.shape != shape:
        changed.append(f"its shape from {shape} to {out.shape}")
    if out.dtype != dtype:
        changed.append(f"its dtype from {dtype} to {out.dtype}")
    if out.__array_interface__["data"][0] != address or out.base is not memory:
        changed.append("the memory it views")
    del out
    gc.collect()
    if changed:
        raise AssertionError(f"{what}.write_into changed out ({', '.join(changed)}): write into out as given, "
                             "with out[...] = ... or out=, and do not reshape, resize or replace it")
    if alive() is not None:
        raise AssertionError(f"{what}.write_into kept out after returning (out is still referenced): the "
                             "batch's slot belongs to the consumer once the batch is delivered")
    if sys.getrefcount(memory) != refs:
        raise AssertionError(f"{what}.write_into kept a view of out after returning (out's memory is still "
                             "referenced): the batch's slot belongs to the consumer once the batch is delivered")
    return memory.reshape(size, dtype.itemsize)


def script_workers(loader: Any, script: dict[int, int]) -> None:
    """Have ``loader`` (``num_workers="auto"``) run ``script[seq]`` workers from the moment
    batch ``seq`` of an epoch is delivered, in every epoch from its next ``iter()``, instead
    of choosing the count from measurements. Counts are clamped to 1..``max_workers``."""
    if getattr(loader, "num_workers", None) != "auto":
        raise ValueError(f"script_workers needs a loader with num_workers='auto', not "
                         f"num_workers={getattr(loader, 'num_workers', None)!r}")
    for seq, count in script.items():
        if not isinstance(seq, int) or not isinstance(count, int) or seq < 0 or count < 1:
            raise ValueError(f"script_workers: expected {{batch: workers}} with batch >= 0 and workers >= 1, "
                             f"but got {seq!r}: {count!r}")
    pool = loader._sessions
    pool.script = dict(script)
    pool.tuner = None  # made again, with the script, at the next iter()
