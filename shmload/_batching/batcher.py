"""The batcher: reads a batch's samples against sample 0's structure, naming the first
mismatch, and decides the batch's :class:`Plan` (its layout, and what to write into
each array leaf).

Position 0 defines the structure (containers as NOTE [ Batch containers ] in layout.py
says, and each leaf's kind: an array of a shape and dtype, a Python scalar, or an
object); later positions must match it, or differ only in numeric type, which is
promoted (NOTE [ Mixed numeric types ] in promotion.py). This is the reference path of
``collate.py``: its fast path declines to it, and the row-wise path (rowwise.py) feeds
it one sample at a time.
"""

from __future__ import annotations

import copy
from collections.abc import Mapping, MutableMapping
from typing import Any, Callable, NamedTuple, Sequence

import numpy as np

from .._core._torch import loaded_torch
from ..errors import CollateError, format_indices
from .deferred import DeferredArray
from .layout import ALIGN, ArraySpec, Layout, Leaf, Map, ObjectValue, Seq, Template
from .promotion import _INT64_MAX, _INT64_MIN, _SCALAR_DTYPES, _numeric_shape, _promotable, _value_dtype, promote_types


class Plan(NamedTuple):
    """A layout plus what to write into each array leaf (worker side only)."""

    layout: Layout
    sources: tuple  # per leaf: list of arrays / scalars to stack, one array, or None
    # Set by the fast path, which leaves some checks to the write (see _transpose): if
    # the write fails, this raises the reference path's CollateError naming the mismatch.
    recheck: Callable[[], Any] | None = None




class RowwiseTypeMismatch(CollateError):
    """A sample's numeric type differs from sample 0's in a batch that is written into its
    slot as it is loaded (rowwise.py), which cannot promote (NOTE [ Mixed numeric types ])."""



class _Cast(list):
    """A column whose values differ in numeric type: written value by value, each cast to
    the promoted dtype (only batches that needed promotion pay for the loop)."""


def _torch_tensor_type():
    torch = loaded_torch()
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
        fields: tuple[str, ...] = getattr(cls, "_fields")  # a namedtuple class's (no type says so)
        return f"{path}.{fields[key]}"
    return f"{path}[{key!r}]"


class Batcher:
    """Walks the samples of one batch against the first sample's structure."""

    def __init__(self, stack: bool, indices: Sequence[int] | None, promote: bool = False,
                 tuple_as_list: bool = False):
        self.stack = stack
        self.indices = indices
        # May numeric types differ between samples (NOTE [ Mixed numeric types ])? Not
        # where rows are written as samples arrive (rowwise.py).
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
            if self.indices is None:
                return "the batch"
            return f"the batch of dataset indices {format_indices(self.indices)}"
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
                return Seq("copy", list, kids, Template(clone))
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
        return Map(type(value), keys, kids, Template(clone))

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
                raise self.fail(path, pos, _describe_value(value),
                                f"an array of shape {tuple(kind[1])} and dtype {kind[2]}",
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
        kind = self.kinds[leaf_id]  # from the kind: rowwise.py lets go of each value once written
        if kind[0] == "scalar":
            shape, first = (), f"a Python {kind[1].__name__}"
        elif kind[0] == "array" and _promotable(kind[2]):
            shape, first = kind[1], f"an array of shape {tuple(kind[1])} and dtype {kind[2]}"
        else:
            return False
        if _numeric_shape(value) != shape:
            return False
        if not self.promote:
            raise RowwiseTypeMismatch(
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

    def specs(self, batch: int) -> tuple[list[ArraySpec | None], int]:
        """Each leaf's ArraySpec (None for an object leaf) for ``batch`` samples, and the
        bytes they span: decided by the leaves' kinds alone, before any value is seen."""
        specs: list[ArraySpec | None] = []
        offset = 0
        for kind in self.kinds:
            if kind[0] == "object":
                specs.append(None)
                continue
            if kind[0] == "scalar":
                shape, dtype = (batch,), _SCALAR_DTYPES[kind[1]]
            else:
                shape, dtype = ((batch,) + tuple(kind[1]) if self.stack else tuple(kind[1])), kind[2]
            offset = -(-offset // ALIGN) * ALIGN
            spec = ArraySpec(offset, shape, dtype)
            specs.append(spec)
            offset += spec.nbytes
        return specs, offset

    def plan(self, structure: Any, check_ints: bool = True) -> Plan:
        """The plan of the columns read so far. ``check_ints=False`` (the fast path) leaves
        the int64 range of int columns to the write, where numpy raises OverflowError."""
        for leaf_id in self.mixed:
            self.promote_column(leaf_id)
        self.mixed = {}
        batch = len(self.columns[0]) if self.columns else 0
        specs, nbytes = self.specs(batch)
        leaves: list[ArraySpec | ObjectValue] = []
        sources: list[Any] = []
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

