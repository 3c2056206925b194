"""StringArray: a sequence of strings held in two numpy arrays, for datasets of names.

Why (PyTorch issue 13246, "copy-on-read"). A forked worker shares its parent's memory
copy-on-write, and CPython writes to every object it merely reads: taking ``names[i]``
increments and decrements the reference count in the string's header. A worker that
reads a Python list of a million file names therefore copies, page by page, every page
holding one of them, and each worker ends up with its own copy of the list. A
StringArray is three objects (itself and two arrays) however many items it holds:
reading an item touches only their reference counts, and the pages with the text stay
shared. It is also smaller: a byte a character (ASCII) plus 8 for the offset, against
57 bytes of object header and list pointer per Python string besides its characters.

Layout::

    data     uint8[total]   every item's bytes, back to back: b"cat.jpgdog.png..."
    offsets  int64[n + 1]   item i is data[offsets[i]:offsets[i + 1]]; offsets[0] == 0

Both arrays are read-only, and slices are copies (as a list's are), so ``offsets[0]``
is always 0 and ``data`` holds exactly the items. All items are of one kind, ``str``
or ``bytes``. ``str`` items are stored UTF-8 encoded with ``surrogateescape``, the
file-system encoding of POSIX systems: a name from ``os.listdir``/``os.fsdecode``
that is not valid UTF-8 (its bad bytes decoded to lone surrogates U+DC80..U+DCFF) is
stored as the bytes on disk and comes back equal. Other lone surrogates cannot be
stored (a ValueError names the item), and a run of escaped bytes that happens to be valid
UTF-8 (``"\udce2\udc82\udcac"``) comes back decoded (``"€"``): ``os.fsdecode`` never
makes one. A numpy ``S`` array loses its items' trailing NUL bytes, as numpy's own
indexing does.
"""

from __future__ import annotations

import operator
import os
from collections.abc import Iterable, Iterator, Sequence
from itertools import islice
from typing import Any

import numpy as np

CHUNK = 1 << 16  # items encoded (and Python objects alive) at a time while building
REPR_ITEMS = 3
GATHER_BYTES = 1 << 22  # bytes a stepped slice gathers with one index (of 8 bytes a byte)
ENCODING, ERRORS = "utf-8", "surrogateescape"
_Kind = type[str] | type[bytes]  # what the items are, all of them


class StringArray(Sequence):
    """An immutable sequence of ``str`` (or of ``bytes``) in two numpy arrays.

    ``StringArray(items)`` takes any iterable (a list, a generator, a 1-d numpy array
    of strings, another StringArray), reading it a chunk at a time, so a generator of a
    million names never has all of them alive as Python objects at once. Items are all
    ``str`` or all ``bytes``, decided by the first; ``os.PathLike`` items (``pathlib``
    paths) are taken as ``os.fspath(item)``. An empty input gives an empty ``str`` array.

    Indexing by an int (negative too, numpy ints too) is O(1); a slice (any step) is a
    new StringArray. Pickling carries the two arrays (the offsets as narrow item
    lengths), not a list of strings, and numpy's pickle protocol 5 buffers. ``data``
    and ``offsets`` are the read-only arrays themselves (see the module doc).
    """

    __slots__ = ("_data", "_offsets", "_kind", "_text", "_at")
    __hash__ = None  # type: ignore[assignment]  # equal to lists, which are unhashable

    def __init__(self, items: Iterable[Any] = ()):
        if isinstance(items, StringArray):
            self._set(items._data, items._offsets, items._kind)
            return
        if isinstance(items, (str, bytes)):
            raise TypeError(f"StringArray expects an iterable of str or bytes, got a {type(items).__name__} "
                            "itself; wrap it in a list")
        if isinstance(items, np.ndarray):
            items = _numpy_items(items)
        self._set(*_encode_all(items))

    def _set(self, data: np.ndarray, offsets: np.ndarray, kind: _Kind) -> None:
        # The bytes live in one immutable ``bytes`` object that ``data`` is a view of (so
        # no one can make it writeable again), and item i is one slice of it between two
        # Python ints read through a memoryview of the offsets: 3x faster than numpy's
        # scalar indexing and slicing, which cost a microsecond an item.
        text = data.base if type(data.base) is bytes and data.nbytes == len(data.base) else data.tobytes()
        if type(offsets.base) is not bytes:  # (the same for the offsets: 8 bytes an item, copied once)
            offsets = np.frombuffer(np.ascontiguousarray(offsets, dtype=np.int64).tobytes(), dtype=np.int64)
        self._text, self._at = text, offsets.data
        self._data, self._offsets, self._kind = np.frombuffer(text, dtype=np.uint8), offsets, kind

    @classmethod
    def _from_arrays(cls, data: np.ndarray, offsets: np.ndarray, kind: _Kind) -> "StringArray":
        out = cls.__new__(cls)
        out._set(data, offsets, kind)
        return out

    # ------------------------------------------------------------ the arrays
    @property
    def data(self) -> np.ndarray:
        """Every item's bytes back to back (``uint8``, read-only)."""
        return self._data

    @property
    def offsets(self) -> np.ndarray:
        """``int64[len + 1]``: item ``i`` is ``data[offsets[i]:offsets[i + 1]]`` (read-only)."""
        return self._offsets

    @property
    def kind(self) -> type:
        """``str`` or ``bytes``: what the items are."""
        return self._kind

    @property
    def nbytes(self) -> int:
        """Bytes held by the two arrays."""
        return self._data.nbytes + self._offsets.nbytes

    # ------------------------------------------------------------ the sequence
    def __len__(self) -> int:
        return len(self._offsets) - 1

    def __getitem__(self, index: Any) -> Any:
        at = self._at
        if type(index) is int and 0 <= index < len(at) - 1:  # the dataset's case, first
            item = self._text[at[index]:at[index + 1]]
            return item.decode(ENCODING, ERRORS) if self._kind is str else item
        if isinstance(index, slice):
            return self._slice(*index.indices(len(self)))
        try:
            i = operator.index(index)
        except TypeError:
            raise TypeError(f"StringArray indices must be integers or slices, not {type(index).__name__}") from None
        n = len(self)
        if not -n <= i < n:
            raise IndexError(f"StringArray index {i} is out of range for {n} items")
        if i < 0:
            i += n
        return self[i]

    def __iter__(self) -> Iterator[str | bytes]:
        decode = self._kind is str
        for start in range(0, len(self), CHUNK):  # one bytes object a chunk, then cut
            offs = self._offsets[start:start + CHUNK + 1].tolist()
            base = offs[0]
            blob = self._data[base:offs[-1]].tobytes()
            for a, b in zip(offs, offs[1:]):
                raw = blob[a - base:b - base]
                yield raw.decode(ENCODING, ERRORS) if decode else raw

    def _slice(self, start: int, stop: int, step: int) -> "StringArray":
        if step != 1:
            return self._take(np.arange(start, stop, step, dtype=np.int64))
        stop = max(start, stop)  # one run of items: copied once, by _set
        o = self._offsets
        return StringArray._from_arrays(self._data[o[start]:o[stop]], o[start:stop + 1] - o[start], self._kind)

    def _take(self, idx: np.ndarray) -> "StringArray":
        """The items at ``idx`` (valid, non-negative indices) as a new StringArray."""
        starts, ends = self._offsets[idx], self._offsets[idx + 1]
        lengths = ends - starts
        offsets = np.zeros(len(idx) + 1, dtype=np.int64)
        np.cumsum(lengths, out=offsets[1:])
        data = np.empty(int(offsets[-1]), dtype=np.uint8)
        shift = starts - offsets[:-1]  # item j's bytes move from starts[j] to offsets[j]
        for a in range(0, len(idx), CHUNK):  # a chunk at a time: the gather index is 8 bytes a byte
            b = min(a + CHUNK, len(idx))
            lo, hi = offsets[a], offsets[b]
            if hi - lo <= GATHER_BYTES:
                data[lo:hi] = self._data[np.repeat(shift[a:b], lengths[a:b]) + np.arange(lo, hi)]
            else:  # long items: one copy each, so the index never outgrows GATHER_BYTES x 8
                for j in range(a, b):
                    data[offsets[j]:offsets[j + 1]] = self._data[starts[j]:ends[j]]
        return StringArray._from_arrays(data, offsets, self._kind)

    def __eq__(self, other: object) -> bool:
        if isinstance(other, StringArray):
            if len(self) != len(other):
                return False
            return len(self) == 0 or (self._kind is other._kind and np.array_equal(self._offsets, other._offsets)
                                      and np.array_equal(self._data, other._data))
        if isinstance(other, list):
            return len(self) == len(other) and all(a == b for a, b in zip(self, other))
        return NotImplemented

    def __repr__(self) -> str:
        n = len(self)
        head = list(self[:REPR_ITEMS])
        more = ", ..." if n > REPR_ITEMS else ""
        return f"StringArray({repr(head)[:-1]}{more}], len={n})"

    def __reduce__(self) -> tuple:
        # The item lengths in the narrowest unsigned type that holds them (one byte an
        # item for names under 256 bytes) instead of the int64 offsets: the pickle is
        # about the text itself. Rebuilt with one cumsum.
        lengths = np.diff(self._offsets)
        top = int(lengths.max()) if len(lengths) else 0
        return (_rebuild, (self._data, lengths.astype(np.min_scalar_type(top)), self._kind))


def _rebuild(data: np.ndarray, lengths: np.ndarray, kind: _Kind) -> StringArray:
    offsets = np.zeros(len(lengths) + 1, dtype=np.int64)
    np.cumsum(lengths, dtype=np.int64, out=offsets[1:])
    return StringArray._from_arrays(np.asarray(data, dtype=np.uint8), offsets, kind)


# ---------------------------------------------------------------- building
def _numpy_items(array: np.ndarray) -> Iterator[Any]:
    """A 1-d array's items as Python objects, a chunk at a time (``np.str_`` would do,
    but converting a chunk with ``tolist`` is several times faster)."""
    if array.ndim != 1:
        raise ValueError(f"StringArray expects a 1-d array of strings, got shape {array.shape}")
    for start in range(0, len(array), CHUNK):
        yield from array[start:start + CHUNK].tolist()


def _encode_all(items: Iterable[Any]) -> tuple[np.ndarray, np.ndarray, _Kind]:
    """(data, offsets, kind) of ``items``, encoded ``CHUNK`` items at a time."""
    it = iter(items)
    kind: _Kind = str
    # The bytes grow in one bytearray: a large one is reallocated in place (mremap), so
    # growing costs the result and one chunk; the copy into immutable bytes at the end
    # holds the text twice for a moment (a million names: 30 MB more, once).
    buffer = bytearray()
    lengths: list[np.ndarray] = []
    count = 0
    while True:
        chunk = list(islice(it, CHUNK))
        if not chunk:
            break
        if count == 0:
            kind = _kind_of(chunk[0])
        encoded = _encode_chunk(chunk, count, kind)
        del chunk
        buffer += b"".join(encoded)
        lengths.append(np.fromiter(map(len, encoded), dtype=np.int64, count=len(encoded)))
        count += len(encoded)
        del encoded
    offsets = np.zeros(count + 1, dtype=np.int64)
    i = 0
    for part in lengths:
        np.cumsum(part, out=offsets[i + 1:i + 1 + len(part)])
        offsets[i + 1:i + 1 + len(part)] += offsets[i]
        i += len(part)
    text = bytes(buffer)  # (the one copy: _set keeps the bytes immutable)
    del buffer
    return np.frombuffer(text, dtype=np.uint8), offsets, kind


def _kind_of(first: Any) -> _Kind:
    """``bytes`` if the first item is, else ``str`` (an item of neither kind fails in ``_coerce``)."""
    value = os.fspath(first) if isinstance(first, os.PathLike) else first
    return bytes if isinstance(value, bytes) else str


def _encode_chunk(chunk: list[Any], start: int, kind: _Kind) -> list[bytes]:
    """The chunk's items (item ``start`` first) as bytes; ``chunk`` is converted in place."""
    for j, item in enumerate(chunk):
        if type(item) is not kind:
            chunk[j] = _coerce(item, start + j, kind)
    if kind is bytes:
        return chunk
    try:
        return [s.encode(ENCODING, ERRORS) for s in chunk]
    except UnicodeEncodeError as exc:
        j = next(j for j, s in enumerate(chunk) if not _encodable(s))
        raise ValueError(f"StringArray: item {start + j} ({chunk[j]!r:.60}) cannot be stored: {exc.reason} "
                         f"(only the lone surrogates U+DC80..U+DCFF of os.fsdecode are kept)") from exc


def _coerce(item: Any, index: int, kind: _Kind) -> str | bytes:
    value = os.fspath(item) if isinstance(item, os.PathLike) else item
    if isinstance(value, kind):
        return value
    if isinstance(value, (str, bytes)):
        raise TypeError(f"StringArray: item {index} is {type(item).__name__}, expected {kind.__name__} like item 0 "
                        "(the items must be all str or all bytes)")
    raise TypeError(f"StringArray: item {index} is {type(item).__name__} ({item!r:.60}), expected str or bytes")


def _encodable(s: str) -> bool:
    try:
        s.encode(ENCODING, ERRORS)
    except UnicodeEncodeError:
        return False
    return True
