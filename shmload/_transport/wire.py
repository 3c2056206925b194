"""Wire: the control messages (``messages.py``) as records in the shared-memory queues
(``control.py``), and back.

The two messages of every batch have fixed binary headers, so neither side pickles
anything in steady state:

* a :class:`Task` whose load is a list of Python ints (or shmload's own
  :class:`~shmload._transport.messages.Indices`) carries them as raw int64 after its header; the
  worker gets a list of Python ints back, as torch's fetcher hands them to the dataset.
  Any other load (numpy indices from a custom batch sampler, keys that are not ints, a
  :class:`Draw`) is pickled after the header, so the dataset gets exactly what the
  sampler gave.
* a :class:`Done` names its layout by a number the worker gave it (:class:`LayoutIds`);
  only the first completion with a new layout carries its pickle. A layout with object
  leaves (strings, ...) holds this batch's values and is always pickled.

Every other message is pickled whole (start-up, errors, a larger slot: all rare), and a
record too large for its queue travels by the socket, announced by :data:`NOTICE`.
"""

from __future__ import annotations

import array
import pickle
import struct
from multiprocessing import reduction
from operator import countOf
from typing import Any

import numpy as np

from .._batching.layout import LAYOUTS_KEPT, Layout, ObjectValue
from .._core.native import native
from .messages import Done, Indices, SlotRef, Task

# kinds: the first byte of a record
TASK, DONE, PICKLED, NOTICE_KIND, BUNDLE = 1, 2, 3, 4, 5
NOTICE = bytes([NOTICE_KIND])  # "the next message is a frame on the socket"

_LOAD_INTS, _LOAD_PICKLE = 0, 1
# kind, load kind, parts, iteration, epoch, seq, segment (-1: no slot), offset, capacity,
# position (elastic: the batch's first global position; -1: none)
_TASK = struct.Struct("<BBB5xqqqqqqq")
_DONE = struct.Struct("<BB2xiqqI")  # kind, has stream, layout id (-1: pickled here), iteration, seq, layout bytes
_NO_SLOT = (-1, 0, 0)


def _pickled(msg: Any) -> bytes:
    return bytes([PICKLED]) + pickle.dumps(msg, pickle.HIGHEST_PROTOCOL)  # plain data: no reducers needed


# ---------------------------------------------------------------- main -> worker
def encode_task(task: Task) -> tuple[bytes, Any]:
    """The record of ``task``: its header, and the load's bytes (a buffer, not copied)."""
    load = task.load
    ints: memoryview | None = None  # the load's int64s, if it is sent as such
    if type(load) is Indices:
        ints = np.ascontiguousarray(load.array).data  # (a strided shard's slice: copied)
    elif type(load) is list and load and countOf(map(type, load), int) == len(load):
        try:
            ints = memoryview(array.array("q", load))
        except OverflowError:  # beyond int64: pickled
            pass
    payload: bytes | memoryview
    if ints is None:
        kind, payload = _LOAD_PICKLE, pickle.dumps(load, pickle.HIGHEST_PROTOCOL)
    else:
        kind, payload = _LOAD_INTS, ints.cast("B")
    slot = task.slot if task.slot is not None else _NO_SLOT
    position = -1 if task.position is None else task.position
    return _TASK.pack(TASK, kind, task.parts, task.iteration, task.epoch, task.seq, *slot, position), payload


def encode_to_worker(msg: Any) -> tuple[bytes, Any]:
    """Header and body of ``msg``'s record (the body may be empty)."""
    if type(msg) is Task and msg.span is None:  # (a span, rare, is pickled whole)
        return encode_task(msg)
    return _pickled(msg), b""


_PART = struct.Struct("<I")


def bundles(messages: list[tuple[bytes, Any]], limit: int) -> list[list[Any]]:
    """Encoded messages as the parts of as few records as hold them, each at most ``limit``
    bytes (:func:`unbundle` splits one): the tasks of one round of dispatching leave
    together, so a sleeping worker is woken once for all of them (NOTE [ A doorbell rung
    only for a sleeper ], control.py)."""
    if len(messages) == 1:
        return [list(messages[0])]
    out: list[list[Any]] = []
    parts: list[Any] = []
    size = 0
    for head, body in messages:
        n = len(head) + len(body)
        if parts and size + _PART.size + n > limit:
            out.append(parts)
            parts = []
        if not parts:
            parts, size = [bytes([BUNDLE])], 1
        parts += (_PART.pack(n), head, body)
        size += _PART.size + n
    out.append(parts)
    return out


def unbundle(record: bytes) -> list[memoryview | bytes]:
    """The messages of a record (one, unless it is a bundle)."""
    if record[0] != BUNDLE:
        return [record]
    view, pos = memoryview(record), 1
    out: list[memoryview | bytes] = []
    while pos < len(record):
        (n,) = _PART.unpack_from(record, pos)
        out.append(view[pos + _PART.size:pos + _PART.size + n])
        pos += _PART.size + n
    return out


# NOTE [ The bound of a task's indices ]
# The worker checks every batch's indices against len(dataset) (fetch.check_indices), and
# min() plus max() over 256 Python ints cost ~7 us, a twentieth of the worker's own cost
# per small batch. Indices that came as raw int64 are bounded here instead, by one numpy
# reduction over the same array read as uint64 (~1.5 us): a negative index reads as a
# number of at least 2**63, and len() is at most sys.maxsize (2**63 - 1; a larger
# __len__ raises OverflowError), so ``bound <= len(dataset)`` proves every index in range.
# Any other outcome falls back to the full check, which names the first index out of range.
_max = np.maximum.reduce


# (looked up, not assumed: a compiled core built before it had this function, as an
# editable install not rebuilt since, then declines instead of failing every task)
_int64_indices_c = getattr(native, "int64_indices", None)


def _int64_indices(raw: memoryview) -> tuple[list[int], int | None]:
    """A task's raw int64 indices as the list of Python ints the dataset gets, and their
    bound (NOTE [ The bound of a task's indices ]; None for none). ``native.int64_indices``
    does the same in C, or declines."""
    indices = np.frombuffer(raw, np.int64)
    load = indices.tolist()
    return load, int(_max(indices.view(np.uint64))) + 1 if load else None


def decode_to_worker(record: bytes | memoryview) -> Any:
    """The message of one record (or one part of a bundle) from the task queue;
    :data:`NOTICE` as it is."""
    kind = record[0]
    if kind == TASK:
        _, load_kind, parts, iteration, epoch, seq, segment, offset, capacity, position = _TASK.unpack_from(record)
        raw, bound = memoryview(record)[_TASK.size:], None
        if load_kind == _LOAD_INTS:
            decoded = _int64_indices_c(raw) if _int64_indices_c is not None else None
            load, bound = decoded if decoded is not None else _int64_indices(raw)
        else:
            load = pickle.loads(raw)
        slot = SlotRef(segment, offset, capacity) if segment >= 0 else None
        return Task(iteration, epoch, seq, load, slot, parts, None, bound, None if position < 0 else position)
    return _other(record, kind, "a worker's task queue")


def _other(record: bytes | memoryview, kind: int, where: str) -> Any:
    """A record of a kind both directions share."""
    if kind == PICKLED:
        return pickle.loads(memoryview(record)[1:])
    if kind == NOTICE_KIND:
        return NOTICE
    raise ValueError(f"unknown record kind {kind} in {where}")


# ---------------------------------------------------------------- worker -> main
class LayoutIds:
    """The worker's numbering of the layouts it sent. The main process keeps the last
    :data:`KEPT` of each worker's, in the same order (``layout.LayoutCache``): both sides
    forget the oldest when a new one arrives, so a number always means the same layout."""

    KEPT = LAYOUTS_KEPT

    def __init__(self) -> None:
        self._ids: dict[Layout, int] = {}
        self._next = 0
        self._last: tuple[Any, int] = (None, -1)

    def ref(self, layout: Layout) -> tuple[int, bytes | None]:
        """The layout's number, and its pickle if the main process has not had it yet."""
        if layout is self._last[0]:  # a cached collate plan's own layout (collate.StackPlans)
            return self._last[1], None
        if any(type(leaf) is ObjectValue for leaf in layout.leaves):
            # the batch's own values: pickled with multiprocessing's reducers (torch's, ...)
            return -1, bytes(reduction.ForkingPickler.dumps(layout))
        number = self._ids.get(layout)
        data = None
        if number is None:
            data = pickle.dumps(layout, pickle.HIGHEST_PROTOCOL)
            number, self._next = self._next, self._next + 1
            if len(self._ids) >= self.KEPT:
                del self._ids[next(iter(self._ids))]
            self._ids[layout] = number
        self._last = (layout, number)
        return number, data


def encode_done(msg: Done) -> tuple[bytes, bytes]:
    layout = msg.layout or b""
    stream = pickle.dumps(msg.stream, pickle.HIGHEST_PROTOCOL) if msg.stream is not None else b""
    head = _DONE.pack(DONE, msg.stream is not None, msg.layout_id, msg.iteration, msg.seq, len(layout))
    return head, layout + stream if stream else layout


def encode_to_main(msg: Any) -> tuple[bytes, bytes]:
    if type(msg) is Done:
        return encode_done(msg)
    return _pickled(msg), b""


def decode_to_main(record: bytes) -> Any:
    """The message of a record from a completion queue (or a socket frame made a record
    by :func:`frame_record`); :data:`NOTICE` as it is."""
    kind = record[0]
    if kind == DONE:
        _, has_stream, layout_id, iteration, seq, nlayout = _DONE.unpack_from(record)
        start = _DONE.size
        layout = record[start:start + nlayout] if nlayout else None
        stream = pickle.loads(memoryview(record)[start + nlayout:]) if has_stream else None
        return Done(iteration, seq, layout_id, layout, stream)
    return _other(record, kind, "a worker's completion queue")


def frame_record(frame: bytes) -> bytes:
    """A pickled message that came by the socket, as a record."""
    return bytes([PICKLED]) + frame
