"""Control messages between the main process and its workers.

Every message is a small typed record; array data never travels in one. Each worker has
one Unix socket pair to the main process, which carries these messages in both
directions and, right after an :class:`Attach`, the segment's file descriptor
(``SCM_RIGHTS``); see ``channel.py`` for why the main process's end never blocks. Why a socket and not a POSIX message queue: queues are
capped at 10 messages and 8 KB by default, ``/dev/mqueue`` is often not mounted in
containers, and they cannot carry file descriptors.

Main -> worker: :class:`Attach` (+ fd), :class:`Detach`, :class:`AttachBoard` (+ fd),
:class:`Task`, :class:`Reassign`, :class:`Shutdown`.
Worker -> main: :class:`Ready`, :class:`StartupFailed`, :class:`Done`,
:class:`NeedSpace`, :class:`Failed`, :class:`Exhausted`.

A task loads either a batch of dataset indices (map-style) or a :class:`Draw`: the next
batch of the worker's own stream (an iterable source, see ``iterable.py``).

``iteration`` numbers each ``iter()`` of a session, so results of an abandoned epoch
(``break`` with persistent workers) are recognised and dropped.
"""

from __future__ import annotations

from typing import Any, NamedTuple

from .errors import RemoteError


class SlotRef(NamedTuple):
    """Where a batch is to be written: ``capacity`` bytes at ``offset`` of a segment."""

    segment: int
    offset: int
    capacity: int


# ---------------------------------------------------------------- main -> worker
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
    layout: bytes  # the pickled Layout, loaded by the session where a failure can be reported
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
