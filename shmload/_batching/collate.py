"""Collate: turn the samples of one batch into a :class:`~shmload._batching.batcher.Plan`, and write
a plan anywhere: into a ring slot (in a worker) or into fresh arrays (``num_workers=0``
and :func:`default_collate`, the public in-memory version for custom collate functions
to build on). The default path copies each byte once.

Two planning modes:

* ``stack`` (default collate over samples): arrays and numpy scalars of the same shape
  are stacked to ``[B, ...]``; Python bool/int/float become a 1-D array of length B;
  other leaves become a list of length B (a tuple inside a tuple or list sample).
  Containers are rebuilt as torch's ``default_collate`` builds them (NOTE [ Batch
  containers ], layout.py) and numeric types that differ between samples are promoted
  as torch promotes them (NOTE [ Mixed numeric types ], promotion.py).
* ``convert`` (one sample with ``batch_size=None``, or a user ``collate_fn`` result):
  arrays are placed as they are; every other leaf is passed through unchanged.
"""

from __future__ import annotations

import math
from operator import attrgetter, countOf, itemgetter
from typing import Any, Callable, NamedTuple, Sequence

import numpy as np

from .._core.native import native
from ..errors import CollateError
from .batcher import Batcher, Plan, _as_array, _Cast, _torch_tensor_type
from .deferred import Batched, DeferredArray
from .layout import ArraySpec, Layout, Leaf, Map, ObjectValue, Seq, build
from .promotion import _SCALAR_DTYPES


def default_collate(batch: Sequence[Any]) -> Any:
    """Collate a list of samples into a batch of numpy arrays.

    The batch has torch's ``default_collate`` structure (NOTE [ Batch containers ],
    layout.py): a tuple sample gives a list, a namedtuple, list or mapping its own kind.
    Arrays, numpy scalars and torch tensors of equal shape are stacked to ``[B, ...]``,
    numbers of different types promoted as torch promotes them (NOTE [ Mixed numeric
    types ]); Python bool/int/float become a 1-D array of length B; any other leaf (str,
    bytes, None, objects) becomes a sequence of length B.

    Raises :class:`shmload.CollateError` naming the field and the position when samples
    do not match.
    """
    return build_local(plan_stack(batch))


def make_plan(samples: Any, indices: Any, collate_fn: Callable | None, auto_batch: bool,
              plans: StackPlans | None = None) -> Plan:
    """The plan for one batch, however it was asked to be collated; the default collate
    through ``plans`` (its cache) when given.

    ``auto_batch`` is False when ``batch_size=None``: ``samples`` is then one sample.
    """
    if type(samples) is Batched:  # from a __getitems__: collated already (see deferred.py)
        if collate_fn is None:  # (tuples as lists: the batch a __getitem__ path would give)
            return plan_convert(samples.batch, indices, tuple_as_list=True)
        samples = samples.samples()
    if collate_fn is not None:
        return plan_convert(collate_fn(samples), indices if auto_batch else [indices])
    if auto_batch:
        return plans.plan(samples, indices) if plans is not None else plan_stack(samples, indices)
    return plan_convert(samples, [indices], tuple_as_list=True)  # torch's default_convert


def plan_stack(samples: Sequence[Any], indices: Sequence[int] | None = None) -> Plan:
    """Plan the default collate of ``samples`` (validating that they can be stacked)."""
    return _planned(samples, indices)[0]


def _planned(samples: Sequence[Any], indices: Sequence[int] | None) -> tuple[Plan, Any]:
    """``plan_stack``'s plan, and the ``(batcher, structure)`` it was made from when the
    fast path made it (None after the reference path): what StackPlans caches."""
    if len(samples) == 0:
        raise CollateError("cannot collate an empty batch")
    batcher = Batcher(True, indices, promote=True)
    structure = batcher.first(samples[0], "sample")
    plan = _fast_plan(batcher, structure, samples, indices)
    if plan is None:
        return _plan_stack_slowly(samples, indices), None
    return plan, (batcher, structure)


def plan_stack_after_first(batcher: Batcher, structure: Any, samples: Sequence[Any],
                            indices: Sequence[int] | None) -> Plan:
    """``plan_stack`` once ``batcher.first`` has read sample 0 (rowwise.py reuses it)."""
    plan = _fast_plan(batcher, structure, samples, indices)
    return plan if plan is not None else _plan_stack_slowly(samples, indices)


def _fast_plan(batcher: Batcher, structure: Any, samples: Sequence[Any], indices: Sequence[int] | None) -> Plan | None:
    """The fast path's plan (see _transpose), or None where it declines."""
    if len(samples) > 1 and _transpose(structure, list(samples), batcher):
        return batcher.plan(structure, check_ints=False)._replace(
            recheck=lambda: _plan_stack_slowly(samples, indices))
    return None


# NOTE [ The cached plan ]
# Batches of one dataset almost always have one structure: the same containers, and per
# leaf the same kind, shape and dtype. Planning a batch from scratch (reading sample 0,
# building its layout) costs more than checking a batch against a known plan, so the
# default collate keeps, per batch size, the plan of the last batch the fast path
# accepted (StackPlans). A later batch of that size is transposed against the cached
# structure and kinds with the fast path's own checks (_transpose): the same checks,
# hence the same batches accepted, the same layout (it depends on nothing else), and on
# a mismatch the same CollateError from the reference path, since anything _transpose
# declines is planned from scratch. The layout is then the cached object itself, which
# the worker recognises without comparing it (wire.LayoutIds). Not cached: structures
# with a copied container (NOTE [ Batch containers ]: copied from each batch's own
# sample 0), and batches that needed promotion.
# The kinds are the cached batch's sample 0's, and a batch is planned from its own
# sample 0: so a batch is taken against the cache only if its sample 0 has the cached
# kinds (_transpose checks it: an array's whole shape, an object leaf that is still no
# array or number). The checks on the other samples compare them with the kinds, which
# is comparing them with sample 0. Without that, a batch whose samples agree with each
# other but not with the cached batch (shapes that change from batch to batch, a field
# that was None and is now an array) would fail the write and pass the recheck, or
# become a list where a fresh plan stacks it.
class _Columns:
    """What _transpose fills: the columns of a batch against known kinds."""

    __slots__ = ("kinds", "columns")

    def __init__(self, kinds: list):
        self.kinds = kinds
        self.columns: list[list | None] = [None] * len(kinds)


class _Cached(NamedTuple):
    structure: Any
    kinds: list
    leaves: tuple  # the layout's leaves, None at object leaves
    layout: Layout | None  # the layout itself when it has no object leaves (then it never changes)
    in_sequence: tuple  # per leaf: an object leaf under a sequence is a tuple (NOTE [ Batch containers ])
    nbytes: int


class StackPlans:
    """The default collate's plans, cached per batch size (NOTE [ The cached plan ])."""

    KEPT = 4

    def __init__(self) -> None:
        self._cached: dict[int, _Cached] = {}

    def plan(self, samples: Sequence[Any], indices: Sequence[int] | None) -> Plan:
        n = len(samples)
        cached = self._cached.get(n)
        if cached is not None:
            sink = _Columns(cached.kinds)
            if _transpose(cached.structure, samples if type(samples) is list else list(samples), sink):
                return self._from_cache(cached, sink.columns, samples, indices)
        plan, made = _planned(samples, indices)
        if made is not None and _cacheable(made[1]):
            batcher, structure = made
            if len(self._cached) >= self.KEPT:
                self._cached.clear()
            leaves = tuple(None if type(leaf) is ObjectValue else leaf for leaf in plan.layout.leaves)
            whole = plan.layout if None not in leaves else None
            in_seq = tuple(kind[0] == "object" and kind[1] for kind in batcher.kinds)
            self._cached[n] = _Cached(structure, list(batcher.kinds), leaves, whole, in_seq, plan.layout.nbytes)
        return plan

    def sample_bytes(self, n: int) -> int | None:
        """Array bytes per sample of the cached plan for batches of ``n``; None if there is
        none (the worker asks, to skip row-wise writing for small samples: rowwise.py)."""
        cached = self._cached.get(n)
        return None if cached is None else cached.nbytes // max(1, n)

    def holds(self, layout: Layout) -> bool:
        """Is ``layout`` a cached plan's own (whole) layout? Then later batches of that
        structure have this very object as their layout (the worker keeps its slot
        views for it: worker.SlotViews). By identity, over at most :attr:`KEPT` plans."""
        return any(cached.layout is layout for cached in self._cached.values())

    @staticmethod
    def _from_cache(cached: _Cached, columns: list, samples: Sequence[Any], indices: Any) -> Plan:
        layout = cached.layout
        if layout is None:
            leaves = tuple(ObjectValue(tuple(col) if in_seq else list(col)) if spec is None else spec
                           for spec, col, in_seq in zip(cached.leaves, columns, cached.in_sequence))
            layout = Layout(cached.structure, leaves, cached.nbytes)
        sources = tuple(None if spec is None else col for spec, col in zip(cached.leaves, columns))
        return Plan(layout, sources, lambda: _plan_stack_slowly(samples, indices))


def _cacheable(node: Any) -> bool:
    if type(node) is Leaf:
        return True
    return node.template is None and all(map(_cacheable, node.children))


def _plan_stack_slowly(samples: Sequence[Any], indices: Sequence[int] | None) -> Plan:
    """Sample by sample, naming the first mismatch: the reference for the fast path."""
    batcher = Batcher(True, indices, promote=True)
    structure = batcher.first(samples[0], "sample")
    for pos in range(1, len(samples)):
        batcher.match(structure, samples[pos], "sample", pos)
    return batcher.plan(structure)


# The fast path. Validating sample by sample in Python costs microseconds per sample,
# more than loading a small sample. Instead the samples are transposed into one column
# per leaf with C-level builtins (map, zip, set, countOf), and each column is checked whole:
# exact container types and lengths, exact ndarray type, one shape, one dtype. It is
# deliberately stricter than the slow path (subclasses, tensors, numpy scalars, types
# that differ and are promoted are left to it), so whenever it accepts a batch the slow
# path would have accepted it too, with the same plan; when it declines, the slow path
# runs and names the first mismatch, or promotes (NOTE [ Mixed numeric types ]).
#
# Two checks are left to the write, where numpy makes them for free: an array column of
# ndim >= 1 is checked here for type, first dimension and dtype only, and the write's
# np.concatenate(..., casting="no") rejects any other difference of shape (small 1-D
# rows, written by _joined instead, have their ndim checked there); an int
# column's int64 range is checked by the conversion itself (OverflowError). On such a
# failure the write calls the plan's ``recheck`` (the slow path), which raises the
# CollateError naming the sample. (The dtype cannot be left to the write: a promoted
# dtype changes the slot's size, which is chosen before the write.) Each pass over 256
# arrays costs 8-12 us with countOf (identity first, then ==), 6-22 us with set() for the
# shape; leaving the shape to the write cuts about 20 us from a batch of 256 small samples (docs/performance.md).
_shape, _dtype = attrgetter("shape"), attrgetter("dtype")


def _transpose(node: Any, values: list, batcher: Batcher | _Columns) -> bool:
    """Fill ``batcher.columns`` for ``node`` from ``values`` (one per sample); False if any
    check fails (the caller then takes the slow path). The compiled core does it first
    where it can; where it declines, this does (native.py)."""
    if native is not None and native.transpose(node, values, batcher.kinds, batcher.columns):
        return True
    return _transpose_here(node, values, batcher)


def _transpose_here(node: Any, values: list, batcher: Batcher | _Columns) -> bool:
    if type(node) is Leaf:
        kind = batcher.kinds[node.id]
        if kind[0] == "array":
            n = len(values)
            ok = countOf(map(type, values), np.ndarray) == n
            if kind[1] and math.prod(kind[1]):  # the rest of the shape is checked by the write's concatenate
                ok = (ok and values[0].shape == kind[1] and countOf(map(len, values), kind[1][0]) == n
                      and countOf(map(_dtype, values), kind[2]) == n)
            else:  # 0-d or empty arrays: concatenate cannot check them
                ok = ok and set(map(_shape, values)) == {kind[1]} and set(map(_dtype, values)) == {kind[2]}
        elif kind[0] == "scalar":
            ok = countOf(map(type, values), kind[1]) == len(values)
        else:  # (what follows sample 0 in an object leaf is never checked: it is kept as it is)
            ok = _an_object(values[0])
        batcher.columns[node.id] = values
        return ok
    if type(node) is Seq:
        if countOf(map(type, values), node.cls) != len(values):
            return False
        try:  # strict: samples of different lengths raise instead of being cut to the shortest
            columns = list(zip(*values, strict=True))
        except ValueError:
            return False
        if len(columns) != len(node.children):  # (every sample has len(columns) fields)
            return False
        for child, column in zip(node.children, columns):
            if not _transpose_here(child, list(column), batcher):
                return False
        return True
    if set(map(type, values)) != {node.cls or dict}:
        return False
    keys = set(node.keys)
    if not all(v.keys() == keys for v in values):
        return False
    return all(_transpose_here(child, list(map(itemgetter(k), values)), batcher)
               for k, child in zip(node.keys, node.children))


def _an_object(value: Any) -> bool:
    """Is ``value``, as a sample 0, an object leaf (``Batcher.new_leaf``)? Not if it is an
    array, a tensor, a numpy number or a Python number (NOTE [ The cached plan ])."""
    if type(value) in _SCALAR_DTYPES or isinstance(value, DeferredArray):
        return False
    try:
        return _as_array(value, _torch_tensor_type()) is None
    except TypeError:  # a tensor numpy cannot represent: planned afresh, which names it
        return False


def plan_convert(batch: Any, indices: Sequence[int] | None = None, tuple_as_list: bool = False) -> Plan:
    """Plan placing an already-batched structure (arrays as they are, other leaves unchanged).
    ``tuple_as_list``: tuples (not namedtuples) become lists, as torch's ``default_convert``
    makes them for ``batch_size=None`` without a ``collate_fn``."""
    batcher = Batcher(False, indices, tuple_as_list=tuple_as_list)
    return batcher.plan(batcher.first(batch, "batch"))


def _fill(out: np.ndarray, source: Any) -> None:
    """Write one leaf. A column of equal-length arrays is concatenated along its first
    axis into ``out`` seen as ``[B * n0, ...]``: the same bytes as ``np.stack``, without
    its per-array Python work (3x faster for 256 small arrays). ``casting="no"`` and the
    concatenation's own shape rule complete the fast path's checks (see _transpose)."""
    if type(source) is _Cast:
        for i, value in enumerate(source):
            out[i, ...] = value  # numpy's assignment casts (the dtype is torch's, see promote_column)
    elif isinstance(source, list) and source and isinstance(source[0], np.ndarray):
        if out.size == 0 or (native is not None and native.copy_rows(out, source)):
            return
        if source[0].ndim == 1 and out.nbytes <= _JOIN_BYTES * len(source) and _joined(out, source):
            return
        if source[0].ndim:
            np.concatenate(source, out=out.reshape((-1,) + out.shape[2:]), casting="no")
        else:
            np.stack(source, out=out)
    elif isinstance(source, list) and source and isinstance(source[0], DeferredArray):
        for i, value in enumerate(source):
            write_one(out[i, ...], value)  # [i, ...]: a view even when a row is 0-d
    elif isinstance(source, DeferredArray):
        source.write_into(out)
    elif not (native is not None and type(source) is list and native.fill_numbers(out, source)):
        out[...] = source


# Small 1-D rows (features, token ids, a table's rows): np.concatenate spends ~110 ns of
# Python-level work per array, four times what bytes.join spends on the same copy (30 us
# against 8 us for 256 rows of 32 float32: docs/performance.md). join needs what
# concatenate would check: every row a C-contiguous 1-D array (the fast path has checked
# type, length and dtype; the ndim is checked here), else concatenate runs and checks.
# The joined bytes are one more copy, so only rows of at most _JOIN_BYTES take this way.
_JOIN_BYTES = 4096
_ndim = attrgetter("ndim")


def _joined(out: np.ndarray, rows: list) -> bool:
    if countOf(map(_ndim, rows), 1) != len(rows):
        return False
    try:
        data = b"".join(rows)
    except (BufferError, TypeError):  # a row that is not C-contiguous
        return False
    flat = out.reshape(-1).view(np.uint8)
    if len(data) != flat.nbytes:
        return False
    flat[:] = np.frombuffer(data, np.uint8)
    return True


def write_one(out: np.ndarray, value: Any) -> None:
    """Write one sample's array leaf (an array, or a DeferredArray) into its row."""
    if isinstance(value, DeferredArray):
        value.write_into(out)
    else:
        out[...] = value


def _rechecked(plan: Plan, error: Exception) -> Exception:
    """The error to raise for a failed write: the reference path's CollateError if the
    plan came from the fast path (it names the sample and field), else ``error``."""
    if plan.recheck is not None:
        try:
            plan.recheck()
        except CollateError as exc:
            return exc
    return error


def write(plan: Plan, destination: Callable[[ArraySpec], np.ndarray]) -> None:
    """Copy every array leaf of ``plan`` into ``destination(spec)``: one copy per byte.
    A leaf whose source is None was written already (see rowwise.py)."""
    try:
        for spec, source in zip(plan.layout.leaves, plan.sources):
            if type(spec) is ArraySpec and source is not None:
                _fill(destination(spec), source)
    except (TypeError, ValueError, OverflowError) as exc:
        raise _rechecked(plan, exc) from None



def build_local(plan: Plan, wrap: Callable[[np.ndarray], Any] | None = None) -> Any:
    """Build the batch of ``plan`` in ordinary memory: stacked leaves into fresh arrays,
    already-batched arrays as they are (used by ``default_collate`` and ``num_workers=0``)."""
    arrays = []
    for spec, source in zip(plan.layout.leaves, plan.sources):
        if type(spec) is ArraySpec:
            if isinstance(source, (list, DeferredArray)):
                out = np.empty(spec.shape, spec.dtype)
                try:
                    _fill(out, source)
                except (TypeError, ValueError, OverflowError) as exc:
                    raise _rechecked(plan, exc) from None
                source = out
            arrays.append(source if wrap is None else wrap(source))
    filled = iter(arrays)  # build() visits the array leaves in the same order
    return build(plan.layout, lambda spec: next(filled))


if native is not None:
    native.setup(Leaf, Seq, Map, _an_object)  # the classes and the check transpose() reads
