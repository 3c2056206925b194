"""Batch layout: the format of a batch in its slot, and how the main process rebuilds it.

This module is pure (no processes, no shared memory). A worker plans a batch
(``collate.py``) and writes its arrays into the slot; the small :class:`Layout` travels in
the completion message, and the main process *builds* the user's batch from it
(:func:`build`), as views into the slot.

Slot format (one batch)::

    offset 0                                                     capacity
    | leaf 0 bytes | pad to 64 | leaf 1 bytes | pad to 64 | ... | unused |

Only array leaves occupy the slot. Every array starts at a multiple of :data:`ALIGN`
bytes, so any dtype is aligned and SIMD loads do not straddle cache lines. Non-array
leaves (str, bytes, None, other objects) travel pickled inside the message; they are
expected to be small.

NOTE [ Batch containers ]
    torch's ``default_collate`` is the reference (``torch/utils/data/_utils/collate.py``).
    A tuple sample (not a namedtuple) becomes a *list* of batched fields; a namedtuple
    stays that namedtuple; a list stays a list. A list subclass, and a mapping type
    other than ``dict`` that is mutable (``defaultdict``, ``OrderedDict``, your own), is
    ``copy.copy`` of sample 0's container with the batched values set in, so its type,
    ``default_factory`` and attributes are kept; an immutable mapping type is called with
    a dict; when that raises TypeError the batch holds a plain list or dict, as in torch.
    The copy is made in the worker from sample 0 with its values set to None (a
    :class:`Template`, pickled with the layout) and copied again for every batch built.
    Non-array leaves come as torch hands them down: a list of the samples' values,
    or a tuple of them when their parent is a tuple, list or namedtuple (torch transposes
    those with ``zip``). Other sequence types (``UserList``, ``deque``, ``range``) are
    leaves here, where torch recurses into them.

"""

from __future__ import annotations

import copy
import functools
import math
import pickle
from typing import Any, Callable, NamedTuple

import numpy as np

from .._core.native import native

ALIGN = 64
LAYOUTS_KEPT = 16  # layouts each side remembers per worker (wire.LayoutIds, LayoutCache)


# ---------------------------------------------------------------- structure nodes
class Leaf(NamedTuple):
    id: int


class Seq(NamedTuple):
    kind: str  # the batch's container: "list" | "tuple" | "namedtuple" | "copy" (of template)
    cls: type[tuple | list]  # what later samples must be: the namedtuple class, else tuple or list
    children: tuple
    template: Any = None  # "copy": a Template (NOTE [ Batch containers ])


class Map(NamedTuple):
    cls: type | None  # a Mapping type other than dict, else None
    keys: tuple
    children: tuple
    template: Any = None  # a mutable mapping type: a Template (NOTE [ Batch containers ])


class Template:
    """Sample 0's container (a list subclass, a mapping type other than dict), copied and
    with its values set to None: each batch is a ``copy.copy`` of it with the batched values
    set in, as torch's ``default_collate`` copies sample 0's container. It equals only
    itself, so the worker never reuses another batch's pickled layout for it (its type's
    ``==`` may ignore its attributes)."""

    __slots__ = ("value",)

    def __init__(self, value: Any):
        self.value = value

    def __reduce__(self):
        return Template, (self.value,)

    def __repr__(self) -> str:
        return f"Template({self.value!r})"


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



class LayoutCache:
    """The layouts of completion messages in the main process, by the number their worker
    gave them (``wire.LayoutIds``): a worker pickles a layout once, and later completions
    name it. Each worker's last :data:`LAYOUTS_KEPT` are kept, forgotten oldest
    first exactly as the worker forgets them; a layout numbered -1 (object leaves: this
    batch's values) is never kept. A layout that failed to unpickle is kept as its
    error, raised again for every batch that names it."""

    def __init__(self, kept: int = LAYOUTS_KEPT):
        self._kept: dict[int, dict[int, Any]] = {}
        self._size = kept

    def load(self, worker: int, number: int, data: bytes | None) -> Layout:
        if data is None:
            layout = self._kept[worker][number]
            if isinstance(layout, Exception):
                raise layout
            return layout
        try:
            layout = pickle.loads(data)
        except Exception as exc:
            layout = exc
        if number >= 0:
            kept = self._kept.setdefault(worker, {})
            if len(kept) >= self._size:
                del kept[next(iter(kept))]
            kept[number] = layout
        if isinstance(layout, Exception):
            raise layout
        return layout

    def forget(self, worker: int) -> None:
        """A restarted worker numbers its layouts afresh."""
        self._kept.pop(worker, None)


def slot_destination(slot: np.ndarray) -> Callable[[ArraySpec], np.ndarray]:
    """A destination writing into ``slot`` (a uint8 array) at each leaf's offset."""

    def view(spec: ArraySpec) -> np.ndarray:
        return slot[spec.offset:spec.offset + spec.nbytes].view(spec.dtype).reshape(spec.shape)

    return view


class SlotViews:
    """A worker's views into its slots, kept for layouts that recur.

    Making a leaf's view (slice, dtype view, reshape) costs about 2 us of numpy calls per
    leaf, and in steady state a worker writes batches of one layout into the same ring
    slots again and again. So the views of a (slot, layout) pair are made once and
    reused. Only layouts the caller says ``recur`` are kept (the cached plans' own
    objects, NOTE [ The cached plan ] in collate.py: shared by every batch of their
    structure, and holding no batch's values); any other layout gets fresh views. At most
    one layout is kept per slot, and at most :attr:`SLOTS` slots (a view is ~250 bytes: a
    ring of many workers at depth 64, with batches of many fields, would otherwise keep
    megabytes per worker; past it, slots get fresh views as before). The views export
    the segment's mapping, which then cannot be closed: :meth:`forget` a segment before
    unmapping it."""

    SLOTS = 256

    def __init__(self) -> None:
        self._kept: dict[tuple[int, int], tuple[Layout, dict[int, np.ndarray]]] = {}

    def destination(self, slot: Any, mapping: np.ndarray, layout: Layout,
                    recur: bool) -> Callable[[ArraySpec], np.ndarray]:
        """Where each array leaf of ``layout`` goes in ``slot`` (a ``messages.SlotRef``:
        segment, offset, capacity) of the segment mapped as ``mapping`` (uint8)."""
        key = (slot.segment, slot.offset)
        entry = self._kept.get(key)
        if entry is None or entry[0] is not layout:
            view = slot_destination(mapping[slot.offset:slot.offset + slot.capacity])
            if not recur or (entry is None and len(self._kept) >= self.SLOTS):
                return view
            entry = self._kept[key] = (layout, {id(spec): view(spec) for spec in layout.leaves
                                               if type(spec) is ArraySpec})
        views = entry[1]  # keyed by id: the specs are the kept layout's own objects
        return lambda spec: views[id(spec)]

    def forget(self, segment: int | None = None) -> None:
        """Drop the views into ``segment`` (every segment if None)."""
        if segment is None:
            self._kept.clear()
        else:
            for key in [k for k in self._kept if k[0] == segment]:
                del self._kept[key]


def widened(layout: Layout, rows: int) -> Layout:
    """The layout of a whole batch of ``rows`` rows, from the layout of a span of its rows
    (NOTE [ Parts of a batch ], parts.py): every array leaf of the default collate is
    stacked, ``[n, ...]``, so the whole batch's is ``[rows, ...]``, laid out as
    ``Batcher.specs`` lays out a batch. Object leaves stay the span's values."""
    leaves, offset = [], 0
    for leaf in layout.leaves:
        if type(leaf) is ArraySpec:
            offset = -(-offset // ALIGN) * ALIGN
            leaf = ArraySpec(offset, (rows,) + tuple(leaf.shape[1:]), leaf.dtype)
            offset += leaf.nbytes
        leaves.append(leaf)
    return Layout(layout.structure, tuple(leaves), offset)


def span_destination(slot: np.ndarray, part: Layout, whole: Layout, start: int,
                     stop: int) -> Callable[[ArraySpec], np.ndarray]:
    """A destination writing a span's leaves (``part``'s specs) into rows ``start`` to
    ``stop - 1`` of each leaf of the whole batch (``whole``, see :func:`widened`)."""
    # keyed by the whole spec, not its offset: an empty leaf shares its offset with the next
    into = {p: w for p, w in zip(part.leaves, whole.leaves) if type(p) is ArraySpec}

    def view(spec: ArraySpec) -> np.ndarray:
        w = into[spec]
        row = w.nbytes // w.shape[0]
        data = slot[w.offset + start * row:w.offset + stop * row]
        return data.view(w.dtype).reshape((stop - start,) + tuple(w.shape[1:]))

    return view


# NOTE [ A recurring layout's batch, built from a recipe ]
# The main process builds every batch it yields from its layout, and in steady state
# the layout is the same object batch after batch (LayoutCache keeps it). So what the
# layout asks for is worked out once, as a recipe: each leaf's (shape, dtype, offset)
# or value, and how the container is put together, with the common flat ones (a tuple
# sample's list, a dict of arrays) made in one call instead of a walk of the structure.
# A leaf's view is one ``np.ndarray(shape, dtype, owner, offset)``: the same array as
# slicing, viewing and reshaping the owner (C order, the owner as its ``.base``, which
# lifetime.py relies on), at a third of the cost. Zero-byte leaves keep the slice, whose
# offset may lie at or past the slot's end. Recipes are kept by the layout's id, with
# the layout itself (an id is reused only once its object is gone), at most RECIPES_KEPT.
RECIPES_KEPT = 64
_recipes: dict[int, tuple[Layout, tuple, Callable[[list], Any]]] = {}


_compiled_views = getattr(native, "views", None)  # (None: pure Python, or a core built before views())


def views_in(layout: Layout, owner: np.ndarray, wrap: Callable[[np.ndarray], Any] | None = None) -> Any:
    """The batch of ``layout`` as views of ``owner`` (a uint8 array over its slot), each
    array passed through ``wrap`` if given: what ``build(layout, slot_destination(owner))``
    returns, from the layout's recipe."""
    entry = _recipes.get(id(layout))
    if entry is None or entry[0] is not layout:
        entry = _recipe(layout)
    values = _compiled_views(entry[1], owner) if _compiled_views is not None else None
    if values is None:  # pure Python, or the compiled core declined (_core/_views.c)
        new = np.ndarray
        values = [value if shape is None else new(shape, value, owner, offset) if offset >= 0
                  else owner[:0].view(value).reshape(shape) for shape, value, offset in entry[1]]
    if wrap is not None:
        values = [v if leaf[0] is None else wrap(v) for leaf, v in zip(entry[1], values)]
    return entry[2](values)


def _recipe(layout: Layout) -> tuple[Layout, tuple, Callable[[list], Any]]:
    leaves = tuple((None, leaf.value, 0) if type(leaf) is not ArraySpec
                   else (leaf.shape, leaf.dtype, leaf.offset if leaf.nbytes else -1) for leaf in layout.leaves)
    node = layout.structure
    flat = type(node) in (Seq, Map) and len(node.children) == len(leaves) and \
        all(type(c) is Leaf and c.id == i for i, c in enumerate(node.children))
    assemble: Callable[[list], Any]
    if flat and type(node) is Seq and node.kind in ("list", "tuple"):
        assemble = list if node.kind == "list" else tuple
    elif flat and type(node) is Map and node.cls is None:
        keys = node.keys
        assemble = lambda values: dict(zip(keys, values))  # noqa: E731
    else:
        assemble = functools.partial(_assemble, node)
    if len(_recipes) >= RECIPES_KEPT:
        _recipes.clear()
    entry = _recipes[id(layout)] = (layout, leaves, assemble)
    return entry


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
