"""Control messages between the main process and its workers.

Every message is a small typed record; array data never travels in one. They travel
through each worker's two queues in shared memory (``control.py``, encoded by
``wire.py``); its Unix socket pair to the main process carries what is rare: the
control segment (:class:`AttachControl`, first), the file descriptor that follows an
:class:`Attach` or :class:`AttachBoard` (``SCM_RIGHTS``), and a message too large for
its queue. See ``channel.py`` for why the main process's end of the socket never blocks.
Why not a POSIX message queue: queues are capped at 10 messages and 8 KB by default,
``/dev/mqueue`` is often not mounted in containers, they cannot carry file descriptors,
and every message is a system call.

Main -> worker: :class:`AttachControl` (+ fd, by the socket), :class:`Attach` (+ fd),
:class:`Detach`, :class:`AttachBoard` (+ fd), :class:`Task`, :class:`Reassign`,
:class:`Shutdown`.
Worker -> main: :class:`Ready`, :class:`StartupFailed`, :class:`Done`,
:class:`NeedSpace`, :class:`Failed`, :class:`Exhausted`.

A task loads either a batch of dataset indices (map-style) or a :class:`Draw`: the next
batch of the worker's own stream (an iterable source, see ``stream.py``).

``iteration`` numbers each ``iter()`` of a session, so results of an abandoned epoch
(``break`` with persistent workers) are recognised and dropped.
"""

from __future__ import annotations

from typing import Any, NamedTuple

import numpy as np

from ..errors import RemoteError


class SlotRef(NamedTuple):
    """Where a batch is to be written: ``capacity`` bytes at ``offset`` of a segment."""

    segment: int
    offset: int
    capacity: int


class Indices:
    """The dataset indices of one batch from shmload's own batch sampler, kept as the int64
    array they were sliced from (``sampler.BatchSampler``): the dataset gets them as a
    list of Python ints, as from torch's samplers, but the main process neither builds
    that list nor pickles it (``wire.py``: the array's bytes go to the worker as they are)."""

    __slots__ = ("array", "position")

    def __init__(self, array: np.ndarray, position: int | None = None):
        self.array = array
        self.position = position  # elastic: the global position of the first index (elastic.py)

    def tolist(self) -> list[int]:
        return self.array.tolist()

    def __len__(self) -> int:
        return len(self.array)

    def __iter__(self):
        return iter(self.tolist())

    def __getitem__(self, key: Any) -> Any:
        return self.tolist()[key]

    def __eq__(self, other: Any) -> bool:
        return self.tolist() == (other.tolist() if type(other) is Indices else other)

    __hash__ = None  # type: ignore[assignment]

    def __repr__(self) -> str:
        return repr(self.tolist())


def position_of(load: Any) -> int | None:
    """The global position of a batch's first sample, which an elastic loader's batches
    carry (NOTE [ The global sequence ], elastic.py); None for any other load."""
    return load.position if type(load) is Indices else None


# ---------------------------------------------------------------- main -> worker
class AttachControl(NamedTuple):
    """Map the control segment (``control.py``) and use ``area``'s queues; its file
    descriptor follows on the socket. The first message a worker gets, by the socket."""

    size: int
    area: Any  # control.Area


class Attach(NamedTuple):
    """Map a new segment; its file descriptor follows on the socket."""

    segment: int
    size: int


class AttachBoard(NamedTuple):
    """Map the profiler's board (see ``counters.py``) and record into row ``row``; its file
    descriptor follows on the socket. Sent before any task."""

    size: int
    rows: int
    row: int


class Detach(NamedTuple):
    """Unmap a segment that the ring has retired."""

    segment: int


class StreamPoint(NamedTuple):
    """A position in a worker's stream (an iterable source): after ``draws`` draws this
    epoch, with the source's ``state_dict()`` then (None if it has none). Workers report
    it after each draw; the main process sends it back in a :class:`Draw` where a stream
    must start from it (exact resume, a restarted worker), and with ``state`` None the
    worker re-iterates from the start and skips ``draws`` draws."""

    draws: int
    state: Any


class Draw(NamedTuple):
    """Draw number ``number`` (counted from 0 each epoch) of this worker's stream: up to
    ``size`` samples (None: one sample, unbatched); a short last batch is dropped if
    ``drop_last``. ``restore`` is set on the first draw a worker gets of an epoch that
    does not start at the stream's beginning (exact resume, a restarted worker)."""

    worker: int
    number: int
    size: int | None
    drop_last: bool
    restore: StreamPoint | None = None

    def describe(self) -> str:
        return f"draw {self.number} of worker {self.worker}'s stream"


class Task(NamedTuple):
    """Load one batch and write it into ``slot`` (None while the slot size is unknown)."""

    iteration: int
    epoch: int
    seq: int
    load: Any  # what to load: a list of dataset indices, one index (batch_size=None), or a Draw
    slot: SlotRef | None
    parts: int = 1  # the batch's parts, each seeded for itself (NOTE [ Parts of a batch ], parts.py)
    span: Any = None  # a parts.Span: ``load`` is these rows of the batch only, written into their rows of the slot
    bound: int | None = None  # set by the worker's decoding only (wire.py): every index of ``load`` is below it
    position: int | None = None  # elastic: the global position of the batch's first sample (elastic.py)


class Reassign(NamedTuple):
    """Write the batch held after :class:`NeedSpace` into ``slot``; None means drop it."""

    iteration: int
    seq: int
    slot: SlotRef | None


class Shutdown(NamedTuple):
    """Exit cleanly."""


# ---------------------------------------------------------------- worker -> main
class Ready(NamedTuple):
    worker_id: int
    pid: int


class StartupFailed(NamedTuple):
    worker_id: int
    error: RemoteError


class Done(NamedTuple):
    """The batch is in its slot (or, if it holds no arrays, needs none)."""

    iteration: int
    seq: int
    layout_id: int  # the worker's number for its layout (wire.LayoutIds); -1: not kept
    layout: bytes | None  # the pickled Layout the first time (or always, for -1), loaded by the session
    stream: StreamPoint | None = None  # for a Draw


class NeedSpace(NamedTuple):
    """The batch needs ``nbytes``, more than its slot holds; the worker keeps it until
    a :class:`Reassign` arrives."""

    iteration: int
    seq: int
    nbytes: int


class Failed(NamedTuple):
    iteration: int
    seq: int
    error: RemoteError
    stream: StreamPoint | None = None  # for a Draw


class Exhausted(NamedTuple):
    """The worker's stream ended before this :class:`Draw` (or left only a short batch,
    dropped by ``drop_last``): no batch, and none will follow this epoch."""

    iteration: int
    seq: int
