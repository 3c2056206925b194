"""Batch layout: where each array of a batch lives inside a slot, and the structure around it.

This module is pure (no processes, no shared memory). A worker *plans* a batch from its
samples, which validates them and decides the byte layout; it then *writes* the plan into
whatever buffer it is given (a ring slot, or fresh arrays for :func:`default_collate`).
The main process *builds* the user's batch from the small :class:`Layout` that travels in
the completion message, as views into the slot.

Slot format (one batch)::

    offset 0                                                     capacity
    | leaf 0 bytes | pad to 64 | leaf 1 bytes | pad to 64 | ... | unused |

Only array leaves occupy the slot. Every array starts at a multiple of :data:`ALIGN`
bytes, so any dtype is aligned and SIMD loads do not straddle cache lines. Non-array
leaves (str, bytes, None, other objects) travel pickled inside the message; they are
expected to be small.

Two planning modes:

* ``stack`` (default collate over samples): arrays and numpy scalars of the same shape
  and dtype are stacked to ``[B, ...]``; Python bool/int/float become a 1-D array of
  length B; other leaves become a list of length B. Containers (tuple, list, dict,
  namedtuple) are mirrored.
* ``convert`` (one sample with ``batch_size=None``, or a user ``collate_fn`` result):
  arrays are placed as they are; every other leaf is passed through unchanged.
"""

from __future__ import annotations

import math
import sys
from collections.abc import Mapping
from operator import attrgetter, itemgetter
from typing import Any, Callable, NamedTuple, Sequence

import numpy as np

from .deferred import DeferredArray
from .errors import CollateError, format_indices

ALIGN = 64


# ---------------------------------------------------------------- structure nodes
class Leaf(NamedTuple):
    id: int


class Seq(NamedTuple):
    kind: str  # "tuple" | "list" | "namedtuple"
    cls: type | None  # the namedtuple class, else None
    children: tuple


class Map(NamedTuple):
    cls: type | None  # a Mapping type other than dict, else None
    keys: tuple
    children: tuple


class ArraySpec(NamedTuple):
    """One array leaf in the slot: ``nbytes`` bytes at ``offset``."""

    offset: int
    shape: tuple
    dtype: np.dtype

    @property
    def nbytes(self) -> int:
        return math.prod(self.shape) * self.dtype.itemsize


class ObjectValue(NamedTuple):
    """A non-array leaf, carried in the message itself."""

    value: Any


class Layout(NamedTuple):
    """What the main process needs to rebuild a batch from a slot."""

    structure: Any
    leaves: tuple  # ArraySpec | ObjectValue, indexed by Leaf.id
    nbytes: int


class Plan(NamedTuple):
    """A layout plus what to write into each array leaf (worker side only)."""

    layout: Layout
    sources: tuple  # per leaf: list of arrays / scalars to stack, one array, or None
    # Set by the fast path, which leaves some checks to the write (see _transpose): if
    # the write fails, this raises the reference path's CollateError naming the mismatch.
    recheck: Callable[[], Any] | None = None


_INT64_MIN, _INT64_MAX = -(2**63), 2**63 - 1
_SCALAR_DTYPES = {bool: np.dtype(np.bool_), int: np.dtype(np.int64), float: np.dtype(np.float64)}


def _torch_tensor_type():
    torch = sys.modules.get("torch")
    return getattr(torch, "Tensor", None)


def _as_array(value: Any, tensor_type) -> np.ndarray | None:
    """``value`` as a numpy array if it is array-like data, else None."""
    if isinstance(value, np.ndarray):
        return value
    if tensor_type is not None and isinstance(value, tensor_type):
        return value.detach().cpu().numpy()
    if isinstance(value, np.generic) and not isinstance(value, (np.str_, np.bytes_, np.object_)):
        return np.asarray(value)
    return None


def _describe_value(value: Any) -> str:
    if isinstance(value, DeferredArray):
        return f"a deferred array of shape {tuple(value.shape)} and dtype {np.dtype(value.dtype)}"
    try:
        arr = _as_array(value, _torch_tensor_type())
    except TypeError:  # a tensor numpy cannot represent
        return f"a {type(value).__name__} of dtype {getattr(value, 'dtype', '?')}"
    if arr is not None:
        return f"an array of shape {tuple(arr.shape)} and dtype {arr.dtype}"
    if isinstance(value, (tuple, list)):
        return f"a {type(value).__name__} of length {len(value)}"
    if isinstance(value, Mapping):
        return f"a {type(value).__name__} with keys {list(value.keys())}"
    return f"a {type(value).__name__}"


def _child_path(path: str, node_kind: str, key: Any, cls: type | None = None) -> str:
    if node_kind == "namedtuple" and cls is not None:
        return f"{path}.{cls._fields[key]}"
    return f"{path}[{key!r}]"


class _Batcher:
    """Walks the samples of one batch against the first sample's structure."""

    def __init__(self, stack: bool, indices: Sequence[int] | None):
        self.stack = stack
        self.indices = indices
        self.kinds: list = []  # per leaf: ("array", shape, dtype) | ("scalar", type) | ("object",)
        self.columns: list[list] = []
        self.paths: list[str] = []
        self.tensor_type = _torch_tensor_type()

    def where(self, pos: int) -> str:
        if not self.stack:
            return "the batch" if self.indices is None else f"the batch of dataset indices {format_indices(self.indices)}"
        if self.indices is not None and pos < len(self.indices):
            return f"dataset index {self.indices[pos]} (position {pos} in the batch)"
        return f"position {pos} in the batch"

    def fail(self, path: str, pos: int, got: str, expected: str, hint: str = "") -> CollateError:
        first = "" if pos == 0 else f" like {self.where(0)}"
        msg = f"cannot batch field {path}: {self.where(pos)} has {got}, expected {expected}{first}."
        return CollateError(msg + (" " + hint if hint else ""))

    # Position 0 defines the structure; later positions must match it.
    def no_sample(self, pos: int) -> CollateError:
        return CollateError(f"cannot batch {self.where(pos)}: the dataset returned None for it (a missing "
                            "return in __getitem__?); a sample is an array, a number, or a tuple, list or "
                            "dict of them.")

    def first(self, value: Any, path: str) -> Any:
        if value is None and path == "sample" and self.stack:
            raise self.no_sample(0)
        if isinstance(value, tuple) and hasattr(type(value), "_fields"):
            kids = tuple(self.first(v, _child_path(path, "namedtuple", i, type(value))) for i, v in enumerate(value))
            return Seq("namedtuple", type(value), kids)
        if isinstance(value, (tuple, list)):
            kind = "tuple" if isinstance(value, tuple) else "list"
            return Seq(kind, None, tuple(self.first(v, f"{path}[{i}]") for i, v in enumerate(value)))
        if isinstance(value, Mapping):
            keys = tuple(value.keys())
            kids = tuple(self.first(value[k], f"{path}[{k!r}]") for k in keys)
            return Map(None if type(value) is dict else type(value), keys, kids)
        return self.new_leaf(value, path)

    def array_of(self, value: Any, path: str, pos: int) -> np.ndarray | None:
        try:
            return _as_array(value, self.tensor_type)
        except TypeError as exc:  # e.g. a bfloat16 tensor
            raise self.fail(path, pos, _describe_value(value), "an array numpy can represent",
                            f"({exc}) Convert it in the dataset, e.g. tensor.float().") from None

    def deferred_kind(self, value: DeferredArray, path: str, pos: int) -> tuple:
        try:
            shape, dtype = tuple(int(n) for n in value.shape), np.dtype(value.dtype)
        except (AttributeError, TypeError, ValueError) as exc:
            raise self.fail(path, pos, f"a {type(value).__name__} without a valid shape and dtype",
                            "a DeferredArray with a tuple of ints as shape and a numpy dtype",
                            f"({exc})") from None
        if dtype.hasobject or any(n < 0 for n in shape):
            raise self.fail(path, pos, _describe_value(value), "a non-negative shape and a plain (non-object) dtype")
        return ("array", shape, dtype)

    def new_leaf(self, value: Any, path: str) -> Leaf:
        arr = None
        if isinstance(value, DeferredArray):
            kind = self.deferred_kind(value, path, 0)
        elif (arr := self.array_of(value, path, 0)) is not None:
            if arr.dtype.hasobject:
                raise self.fail(path, 0, f"an array of dtype {arr.dtype}", "an array of a plain (non-object) dtype",
                                "Object arrays cannot be placed in shared memory; convert to a numeric dtype.")
            kind = ("array", arr.shape, arr.dtype)
            value = arr
        elif self.stack and type(value) in _SCALAR_DTYPES:
            kind = ("scalar", type(value))
        else:
            kind = ("object",)
        self.kinds.append(kind)
        self.columns.append([value])
        self.paths.append(path)
        return Leaf(len(self.kinds) - 1)

    def match(self, node: Any, value: Any, path: str, pos: int) -> None:
        if value is None and path == "sample":
            raise self.no_sample(pos)
        if type(node) is Leaf:
            self.match_leaf(node.id, value, path, pos)
        elif type(node) is Seq:
            ok = (isinstance(value, node.cls) if node.kind == "namedtuple"
                  else isinstance(value, tuple if node.kind == "tuple" else list))
            if not ok or len(value) != len(node.children):
                want = node.cls.__name__ if node.cls is not None else node.kind
                raise self.fail(path, pos, _describe_value(value), f"a {want} of length {len(node.children)}")
            for i, (child, v) in enumerate(zip(node.children, value)):
                self.match(child, v, _child_path(path, node.kind, i, node.cls), pos)
        else:  # Map
            if not isinstance(value, Mapping) or set(value.keys()) != set(node.keys):
                raise self.fail(path, pos, _describe_value(value), f"a mapping with keys {list(node.keys)}")
            for k, child in zip(node.keys, node.children):
                self.match(child, value[k], f"{path}[{k!r}]", pos)

    def match_leaf(self, leaf_id: int, value: Any, path: str, pos: int) -> None:
        kind = self.kinds[leaf_id]
        if kind[0] == "array" and isinstance(value, DeferredArray):
            if self.deferred_kind(value, path, pos) != kind:
                raise self.fail(path, pos, _describe_value(value), f"an array of shape {tuple(kind[1])} and dtype {kind[2]}",
                                "Arrays are stacked, so every sample needs the same shape and dtype.")
        elif kind[0] == "array":
            arr = self.array_of(value, path, pos)
            if arr is None or arr.shape != kind[1] or arr.dtype != kind[2]:
                got = _describe_value(value)
                raise self.fail(path, pos, got, f"an array of shape {tuple(kind[1])} and dtype {kind[2]}",
                                "Arrays are stacked, so every sample needs the same shape and dtype: "
                                "resize or cast in the dataset, or pass a collate_fn that pads.")
            value = arr
        elif kind[0] == "scalar" and type(value) is not kind[1]:
            raise self.fail(path, pos, _describe_value(value), f"a Python {kind[1].__name__}",
                            "Python scalars are batched into one array, so their type must not change.")
        self.columns[leaf_id].append(value)

    def specs(self, batch: int) -> tuple[list, int]:
        """Each leaf's ArraySpec (None for an object leaf) for ``batch`` samples, and the
        bytes they span: decided by the leaves' kinds alone, before any value is seen."""
        specs, offset = [], 0
        for kind in self.kinds:
            if kind[0] == "object":
                specs.append(None)
                continue
            if kind[0] == "scalar":
                shape, dtype = (batch,), _SCALAR_DTYPES[kind[1]]
            else:
                shape, dtype = ((batch,) + tuple(kind[1]) if self.stack else tuple(kind[1])), kind[2]
            offset = -(-offset // ALIGN) * ALIGN
            specs.append(ArraySpec(offset, shape, dtype))
            offset += specs[-1].nbytes
        return specs, offset

    def plan(self, structure: Any, check_ints: bool = True) -> Plan:
        """The plan of the columns read so far. ``check_ints=False`` (the fast path) leaves
        the int64 range of int columns to the write, where numpy raises OverflowError."""
        batch = len(self.columns[0]) if self.columns else 0
        specs, nbytes = self.specs(batch)
        leaves, sources = [], []
        for kind, column, path, spec in zip(self.kinds, self.columns, self.paths, specs):
            if check_ints and kind == ("scalar", int) and not (_INT64_MIN <= min(column) and max(column) <= _INT64_MAX):
                bad = next(v for v in column if not _INT64_MIN <= v <= _INT64_MAX)
                raise CollateError(f"cannot batch field {path}: the Python int {bad} does not fit in int64, "
                                   "which Python ints are batched as; return it as a str or a float instead.")
            if spec is None:
                leaves.append(ObjectValue(column if self.stack else column[0]))
                sources.append(None)
            else:
                leaves.append(spec)
                sources.append(column if self.stack else column[0])
        return Plan(Layout(structure, tuple(leaves), nbytes), tuple(sources))


def plan_stack(samples: Sequence[Any], indices: Sequence[int] | None = None) -> Plan:
    """Plan the default collate of ``samples`` (validating that they can be stacked)."""
    if len(samples) == 0:
        raise CollateError("cannot collate an empty batch")
    batcher = _Batcher(True, indices)
    return _plan_stack_after_first(batcher, batcher.first(samples[0], "sample"), samples, indices)


def _plan_stack_after_first(batcher: _Batcher, structure: Any, samples: Sequence[Any],
                            indices: Sequence[int] | None) -> Plan:
    """``plan_stack`` once ``batcher.first`` has read sample 0 (stream.py reuses it)."""
    if len(samples) > 1 and _transpose(structure, list(samples), batcher):
        return batcher.plan(structure, check_ints=False)._replace(
            recheck=lambda: _plan_stack_slowly(samples, indices))
    return _plan_stack_slowly(samples, indices)


def _plan_stack_slowly(samples: Sequence[Any], indices: Sequence[int] | None) -> Plan:
    """Sample by sample, naming the first mismatch: the reference for the fast path."""
    batcher = _Batcher(True, indices)
    structure = batcher.first(samples[0], "sample")
    for pos in range(1, len(samples)):
        batcher.match(structure, samples[pos], "sample", pos)
    return batcher.plan(structure)


# The fast path. Validating sample by sample in Python costs microseconds per sample,
# more than loading a small sample. Instead the samples are transposed into one column
# per leaf with C-level builtins (map, zip, set), and each column is checked whole:
# exact container types and lengths, exact ndarray type, one shape, one dtype. It is
# deliberately stricter than the slow path (subclasses, tensors, numpy scalars are left
# to it), so whenever it accepts a batch the slow path would have accepted it too, with
# the same plan; when it declines, the slow path runs and names the first mismatch.
#
# Two checks are left to the write, where numpy makes them for free: an array column of
# ndim >= 1 is checked here for type and first dimension only, and the write's
# np.concatenate(..., casting="no") rejects any other difference of shape or dtype; an
# int column's int64 range is checked by the conversion itself (OverflowError). On such
# a failure the write calls the plan's ``recheck`` (the slow path), which raises the
# CollateError naming the sample. Each set(map(...)) over 256 arrays costs 6-22 us, and
# these two cut about 40 us from a batch of 256 small samples.
_shape, _dtype = attrgetter("shape"), attrgetter("dtype")


def _transpose(node: Any, values: list, batcher: _Batcher) -> bool:
    """Fill ``batcher.columns`` for ``node`` from ``values`` (one per sample); False if any
    check fails (the caller then takes the slow path)."""
    if type(node) is Leaf:
        kind = batcher.kinds[node.id]
        if kind[0] == "array":
            ok = set(map(type, values)) == {np.ndarray}
            if kind[1] and math.prod(kind[1]):  # the rest is checked by the write's concatenate
                ok = ok and set(map(len, values)) == {kind[1][0]}
            else:  # 0-d or empty arrays: concatenate cannot check them
                ok = ok and set(map(_shape, values)) == {kind[1]} and set(map(_dtype, values)) == {kind[2]}
        elif kind[0] == "scalar":
            ok = set(map(type, values)) == {kind[1]}
        else:
            ok = True
        batcher.columns[node.id] = values
        return ok
    if type(node) is Seq:
        want = node.cls if node.kind == "namedtuple" else (tuple if node.kind == "tuple" else list)
        if set(map(type, values)) != {want} or set(map(len, values)) != {len(node.children)}:
            return False
        return all(_transpose(child, list(column), batcher) for child, column in zip(node.children, zip(*values)))
    if set(map(type, values)) != {node.cls or dict}:
        return False
    keys = set(node.keys)
    if not all(v.keys() == keys for v in values):
        return False
    return all(_transpose(child, list(map(itemgetter(k), values)), batcher)
               for k, child in zip(node.keys, node.children))


def plan_convert(batch: Any, indices: Sequence[int] | None = None) -> Plan:
    """Plan placing an already-batched structure (arrays as they are, other leaves unchanged)."""
    batcher = _Batcher(False, indices)
    return batcher.plan(batcher.first(batch, "batch"))


def _fill(out: np.ndarray, source: Any) -> None:
    """Write one leaf. A column of equal-length arrays is concatenated along its first
    axis into ``out`` seen as ``[B * n0, ...]``: the same bytes as ``np.stack``, without
    its per-array Python work (3x faster for 256 small arrays). ``casting="no"`` and the
    concatenation's own shape rule complete the fast path's checks (see _transpose)."""
    if isinstance(source, list) and source and isinstance(source[0], np.ndarray):
        if out.size == 0:
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
    else:
        out[...] = source


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
    A leaf whose source is None was written already (see stream.py)."""
    try:
        for spec, source in zip(plan.layout.leaves, plan.sources):
            if type(spec) is ArraySpec and source is not None:
                _fill(destination(spec), source)
    except (TypeError, ValueError, OverflowError) as exc:
        raise _rechecked(plan, exc) from None


def slot_destination(slot: np.ndarray) -> Callable[[ArraySpec], np.ndarray]:
    """A destination writing into ``slot`` (a uint8 array) at each leaf's offset."""

    def view(spec: ArraySpec) -> np.ndarray:
        return slot[spec.offset:spec.offset + spec.nbytes].view(spec.dtype).reshape(spec.shape)

    return view


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


def build(layout: Layout, arrays: Callable[[ArraySpec], Any]) -> Any:
    """Rebuild the batch described by ``layout``; ``arrays(spec)`` supplies each array leaf."""
    values = [arrays(leaf) if type(leaf) is ArraySpec else leaf.value for leaf in layout.leaves]
    return _assemble(layout.structure, values)


def _assemble(node: Any, values: list) -> Any:
    if type(node) is Leaf:
        return values[node.id]
    if type(node) is Seq:
        items = [_assemble(child, values) for child in node.children]
        if node.kind == "namedtuple":
            return node.cls(*items)
        return tuple(items) if node.kind == "tuple" else items
    mapping = {k: _assemble(child, values) for k, child in zip(node.keys, node.children)}
    if node.cls is not None:
        try:
            return node.cls(mapping)
        except Exception:  # e.g. defaultdict, whose first argument is a factory
            return mapping
    return mapping
