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
  are stacked to ``[B, ...]``; Python bool/int/float become a 1-D array of length B;
  other leaves become a list of length B (a tuple inside a tuple or list sample).
  Containers are rebuilt as torch's ``default_collate`` builds them (NOTE [ Batch
  containers ]) and numeric types that differ between samples are promoted as torch
  promotes them (NOTE [ Mixed numeric types ]).
* ``convert`` (one sample with ``batch_size=None``, or a user ``collate_fn`` result):
  arrays are placed as they are; every other leaf is passed through unchanged.

NOTE [ Batch containers ]
    torch's ``default_collate`` is the reference (``torch/utils/data/_utils/collate.py``).
    A tuple sample (not a namedtuple) becomes a *list* of batched fields; a namedtuple
    stays that namedtuple; a list stays a list. A list subclass, and a mapping type
    other than ``dict`` that is mutable (``defaultdict``, ``OrderedDict``, your own), is
    ``copy.copy`` of sample 0's container with the batched values set in, so its type,
    ``default_factory`` and attributes are kept; an immutable mapping type is called with
    a dict; when that raises TypeError the batch holds a plain list or dict, as in torch.
    The copy is made in the worker from sample 0 with its values set to None (a
    :class:`_Template`, pickled with the layout) and copied again for every batch built.
    Non-array leaves come as torch hands them down: a list of the samples' values,
    or a tuple of them when their parent is a tuple, list or namedtuple (torch transposes
    those with ``zip``). Other sequence types (``UserList``, ``deque``, ``range``) are
    leaves here, where torch recurses into them.

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
    agree never see any of this: only the reference path promotes, after the fast path
    declined (see _transpose). The streaming path (stream.py) writes rows into the slot
    as samples arrive, so it cannot change a dtype afterwards: there a type differing
    from sample 0's raises :class:`StreamedTypeMismatch`.
"""

from __future__ import annotations

import copy
import math
import sys
from collections.abc import Mapping, MutableMapping
from operator import attrgetter, countOf, itemgetter
from typing import Any, Callable, NamedTuple, Sequence

import numpy as np

from .deferred import DeferredArray
from .errors import CollateError, format_indices

ALIGN = 64


# ---------------------------------------------------------------- structure nodes
class Leaf(NamedTuple):
    id: int


class Seq(NamedTuple):
    kind: str  # the batch's container: "list" | "tuple" | "namedtuple" | "copy" (of template)
    cls: type  # what later samples must be: the namedtuple class, else tuple or list
    children: tuple
    template: Any = None  # "copy": a _Template (NOTE [ Batch containers ])


class Map(NamedTuple):
    cls: type | None  # a Mapping type other than dict, else None
    keys: tuple
    children: tuple
    template: Any = None  # a mutable mapping type: a _Template (NOTE [ Batch containers ])


class _Template:
    """Sample 0's container (a list subclass, a mapping type other than dict), copied and
    with its values set to None: each batch is a ``copy.copy`` of it with the batched values
    set in, as torch's ``default_collate`` copies sample 0's container. It equals only
    itself, so the worker never reuses another batch's pickled layout for it (its type's
    ``==`` may ignore its attributes)."""

    __slots__ = ("value",)

    def __init__(self, value: Any):
        self.value = value

    def __reduce__(self):
        return _Template, (self.value,)

    def __repr__(self) -> str:
        return f"_Template({self.value!r})"


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


class StreamedTypeMismatch(CollateError):
    """A sample's numeric type differs from sample 0's in a batch that is written into its
    slot as it is loaded (stream.py), which cannot promote (NOTE [ Mixed numeric types ])."""


# ---------------------------------------------------------------- type promotion
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


class _Cast(list):
    """A column whose values differ in numeric type: written value by value, each cast to
    the promoted dtype (only batches that needed promotion pay for the loop)."""


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

    def __init__(self, stack: bool, indices: Sequence[int] | None, promote: bool = False,
                 tuple_as_list: bool = False):
        self.stack = stack
        self.indices = indices
        # May numeric types differ between samples (NOTE [ Mixed numeric types ])? Not
        # where rows are written as samples arrive (stream.py).
        self.promote = promote
        self.tuple_as_list = stack or tuple_as_list  # NOTE [ Batch containers ]
        # per leaf: ("array", shape, dtype) | ("scalar", type) | ("object", in_sequence)
        self.kinds: list = []
        self.columns: list[list] = []
        self.paths: list[str] = []
        self.mixed: dict[int, int] = {}  # leaf id -> first position whose numeric type differs
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

    def first(self, value: Any, path: str, in_sequence: bool = False) -> Any:
        if value is None and path == "sample" and self.stack:
            raise self.no_sample(0)
        if isinstance(value, tuple) and hasattr(type(value), "_fields"):
            kids = tuple(self.first(v, _child_path(path, "namedtuple", i, type(value)), True)
                         for i, v in enumerate(value))
            return Seq("namedtuple", type(value), kids)
        if isinstance(value, (tuple, list)):
            kids = tuple(self.first(v, f"{path}[{i}]", True) for i, v in enumerate(value))
            return self.sequence(value, kids)
        if isinstance(value, Mapping):
            keys = tuple(value.keys())
            kids = tuple(self.first(value[k], f"{path}[{k!r}]") for k in keys)
            return self.mapping(value, keys, kids)
        return self.new_leaf(value, path, in_sequence)

    def sequence(self, value: tuple | list, kids: tuple) -> Seq:
        """The node of a tuple or list (not a namedtuple): NOTE [ Batch containers ]."""
        if isinstance(value, tuple):
            return Seq("list" if self.tuple_as_list else "tuple", tuple, kids)
        if type(value) is not list:
            try:  # torch: copy.copy(elem), then clone[i] = ...; a plain list on TypeError
                clone = copy.copy(value)
                for i in range(len(clone)):
                    clone[i] = None
                return Seq("copy", list, kids, _Template(clone))
            except TypeError:
                pass
        return Seq("list", list, kids)

    def mapping(self, value: Mapping, keys: tuple, kids: tuple) -> Map:
        """The node of a mapping: NOTE [ Batch containers ]."""
        if type(value) is dict:
            return Map(None, keys, kids)
        if not isinstance(value, MutableMapping):
            return Map(type(value), keys, kids)  # built as type(value)(dict), as torch does
        try:  # torch: copy.copy(elem), then clone.update(...); a plain dict on TypeError
            clone = copy.copy(value)
            clone.update(dict.fromkeys(keys))
        except TypeError:
            return Map(None, keys, kids)
        return Map(type(value), keys, kids, _Template(clone))

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

    def new_leaf(self, value: Any, path: str, in_sequence: bool = False) -> Leaf:
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
            kind = ("object", in_sequence)
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
            if not isinstance(value, node.cls) or len(value) != len(node.children):
                want = f"a {node.cls.__name__} of length {len(node.children)}"
                raise self.fail(path, pos, _describe_value(value), want)
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
                if not self.mixes(leaf_id, value if arr is None else arr, path, pos):
                    raise self.fail(path, pos, _describe_value(value), f"an array of shape {tuple(kind[1])} and "
                                    f"dtype {kind[2]}", "Arrays are stacked, so every sample needs the same shape "
                                    "and a numeric dtype torch can promote: resize or cast in the dataset, or pass "
                                    "a collate_fn that pads.")
            if arr is not None:
                value = arr
        elif kind[0] == "scalar" and type(value) is not kind[1]:
            arr = None if type(value) in _SCALAR_DTYPES else self.array_of(value, path, pos)
            if not self.mixes(leaf_id, value if arr is None else arr, path, pos):
                raise self.fail(path, pos, _describe_value(value), f"a Python {kind[1].__name__}",
                                "Python scalars are batched into one array, so every sample needs a number here.")
            if arr is not None:
                value = arr
        self.columns[leaf_id].append(value)

    def mixes(self, leaf_id: int, value: Any, path: str, pos: int) -> bool:
        """Does ``value`` (an array if it is array data) differ from the leaf's first value
        in numeric type alone? Then the column is promoted when planned (NOTE [ Mixed
        numeric types ]); False for a real mismatch."""
        kind = self.kinds[leaf_id]  # from the kind: stream.py lets go of each value once written
        if kind[0] == "scalar":
            shape, first = (), f"a Python {kind[1].__name__}"
        elif kind[0] == "array" and _promotable(kind[2]):
            shape, first = kind[1], f"an array of shape {tuple(kind[1])} and dtype {kind[2]}"
        else:
            return False
        if _numeric_shape(value) != shape:
            return False
        if not self.promote:
            raise StreamedTypeMismatch(
                f"cannot batch field {path}: {self.where(pos)} has {_describe_value(value)}, where "
                f"{self.where(0)} has {first}. torch's DataLoader would promote them to a common dtype, "
                "but samples this large are written into shared memory one by one as they are loaded, so "
                "sample 0 fixes each field's dtype: give every sample the same dtype in the dataset.")
        if isinstance(self.columns[leaf_id][0], DeferredArray):
            return False  # written in its own dtype (NOTE [ Mixed numeric types ])
        self.mixed.setdefault(leaf_id, pos)
        return True

    def promote_column(self, leaf_id: int) -> None:
        """Give a mixed column torch's dtype for it (NOTE [ Mixed numeric types ])."""
        column, path = self.columns[leaf_id], self.paths[leaf_id]
        if type(column[0]) is float:  # collate_float_fn: torch.tensor(values, dtype=torch.float64)
            dtype = np.dtype(np.float64)
            for pos, value in enumerate(column):
                if _value_dtype(value).kind == "c":
                    raise self.fail(path, pos, _describe_value(value), "a real number",
                                    f"A Python float in {self.where(0)} makes the batch float64, as in torch.")
        else:  # torch.tensor, torch.as_tensor, torch.stack: torch.promote_types over the values
            dtype = _value_dtype(column[0])
            for pos, value in enumerate(column):
                promoted = promote_types(dtype, _value_dtype(value))
                if promoted is None:
                    raise self.fail(path, pos, _describe_value(value), f"a value of a type that promotes with "
                                    f"{dtype}", f"torch.promote_types has no common type for {dtype} and "
                                    f"{_value_dtype(value)}: cast in the dataset.")
                dtype = promoted
            if dtype.kind in "iu":
                self.check_int64(path, column)
        self.kinds[leaf_id] = ("array", () if type(column[0]) in _SCALAR_DTYPES else column[0].shape, dtype)
        self.columns[leaf_id] = _Cast(column)

    @staticmethod
    def check_int64(path: str, column: list) -> None:
        """Python ints go into int64: a CollateError naming the first one that does not fit."""
        bad = next((v for v in column if type(v) is int and not _INT64_MIN <= v <= _INT64_MAX), None)
        if bad is not None:
            raise CollateError(f"cannot batch field {path}: the Python int {bad} does not fit in int64, "
                               "which Python ints are batched as; return it as a str or a float instead.")

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
        for leaf_id in self.mixed:
            self.promote_column(leaf_id)
        self.mixed = {}
        batch = len(self.columns[0]) if self.columns else 0
        specs, nbytes = self.specs(batch)
        leaves, sources = [], []
        for kind, column, path, spec in zip(self.kinds, self.columns, self.paths, specs):
            if check_ints and kind == ("scalar", int) and not (_INT64_MIN <= min(column) and max(column) <= _INT64_MAX):
                self.check_int64(path, column)
            if spec is None:
                value = column[0] if not self.stack else tuple(column) if kind[1] else column
                leaves.append(ObjectValue(value))  # a tuple under a sequence: NOTE [ Batch containers ]
                sources.append(None)
            else:
                leaves.append(spec)
                sources.append(column if self.stack else column[0])
        return Plan(Layout(structure, tuple(leaves), nbytes), tuple(sources))


def plan_stack(samples: Sequence[Any], indices: Sequence[int] | None = None) -> Plan:
    """Plan the default collate of ``samples`` (validating that they can be stacked)."""
    if len(samples) == 0:
        raise CollateError("cannot collate an empty batch")
    batcher = _Batcher(True, indices, promote=True)
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
    batcher = _Batcher(True, indices, promote=True)
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
# np.concatenate(..., casting="no") rejects any other difference of shape; an int
# column's int64 range is checked by the conversion itself (OverflowError). On such a
# failure the write calls the plan's ``recheck`` (the slow path), which raises the
# CollateError naming the sample. (The dtype cannot be left to the write: a promoted
# dtype changes the slot's size, which is chosen before the write.) Each pass over 256
# arrays costs 8-12 us with countOf (identity first, then ==), 6-22 us with set() for the
# shape; leaving the shape to the write cuts about 20 us from a batch of 256 small samples.
_shape, _dtype = attrgetter("shape"), attrgetter("dtype")


def _transpose(node: Any, values: list, batcher: _Batcher) -> bool:
    """Fill ``batcher.columns`` for ``node`` from ``values`` (one per sample); False if any
    check fails (the caller then takes the slow path)."""
    if type(node) is Leaf:
        kind = batcher.kinds[node.id]
        if kind[0] == "array":
            n = len(values)
            ok = countOf(map(type, values), np.ndarray) == n
            if kind[1] and math.prod(kind[1]):  # the rest of the shape is checked by the write's concatenate
                ok = ok and countOf(map(len, values), kind[1][0]) == n and countOf(map(_dtype, values), kind[2]) == n
            else:  # 0-d or empty arrays: concatenate cannot check them
                ok = ok and set(map(_shape, values)) == {kind[1]} and set(map(_dtype, values)) == {kind[2]}
        elif kind[0] == "scalar":
            ok = set(map(type, values)) == {kind[1]}
        else:
            ok = True
        batcher.columns[node.id] = values
        return ok
    if type(node) is Seq:
        if set(map(type, values)) != {node.cls} or set(map(len, values)) != {len(node.children)}:
            return False
        return all(_transpose(child, list(column), batcher) for child, column in zip(node.children, zip(*values)))
    if set(map(type, values)) != {node.cls or dict}:
        return False
    keys = set(node.keys)
    if not all(v.keys() == keys for v in values):
        return False
    return all(_transpose(child, list(map(itemgetter(k), values)), batcher)
               for k, child in zip(node.keys, node.children))


def plan_convert(batch: Any, indices: Sequence[int] | None = None, tuple_as_list: bool = False) -> Plan:
    """Plan placing an already-batched structure (arrays as they are, other leaves unchanged).
    ``tuple_as_list``: tuples (not namedtuples) become lists, as torch's ``default_convert``
    makes them for ``batch_size=None`` without a ``collate_fn``."""
    batcher = _Batcher(False, indices, tuple_as_list=tuple_as_list)
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
    """The batch's container for ``node`` (NOTE [ Batch containers ])."""
    if type(node) is Leaf:
        return values[node.id]
    if type(node) is Seq:
        items = [_assemble(child, values) for child in node.children]
        if node.kind == "list":
            return items
        if node.kind == "namedtuple":
            return node.cls(*items)
        if node.kind == "tuple":
            return tuple(items)
        try:  # "copy"
            clone = copy.copy(node.template.value)
            for i, item in enumerate(items):
                clone[i] = item
            return clone
        except TypeError:
            return items
    mapping = {k: _assemble(child, values) for k, child in zip(node.keys, node.children)}
    if node.cls is None:
        return mapping
    try:
        if node.template is None:
            return node.cls(mapping)
        clone = copy.copy(node.template.value)
        clone.update(mapping)
        return clone
    except TypeError:  # torch's fallback too
        return mapping
