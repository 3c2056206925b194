"""A session's split batches: sending a batch's spans, taking their results, and what
they make: the batch, its error, or the batch sent again whole.

The bookkeeping of one split batch is ``splitting.SplitBatch`` (pure, with the rule that
keeps the shared slot safe); this module carries it out through what the session shows
it (:class:`SpanHost`). Which batches are split is decided at dispatch time
(``split_policy.SplitPolicy``, by ``parts.plan_spans``).
"""

from __future__ import annotations

from typing import Any, Protocol

from .._batching.splitting import SplitBatch
from .._transport.messages import Done, Indices, NeedSpace, Reassign, Task, position_of
from .._transport.ring import SlotState
from .allocation import SlotAllocator
from .dispatch import Dispatcher, InFlight
from .results import Loaded, LoadFailed, failed_where, unpicklable


class SpanHost(Protocol):
    """What split batches use of their session (``session.Session``), and nothing more."""

    iteration: int
    dispatcher: Dispatcher
    allocator: SlotAllocator

    def send(self, wid: int, msg: Any, defer: bool = False) -> None:
        """Send worker ``wid`` a message (``defer``: with the next flush)."""

    def worker_ids(self) -> list[int]:
        """The live workers' ids; every worker's while none is known to be alive."""

    def load_layout(self, wid: int, layout_id: int, layout: Any) -> Any:
        """The layout worker ``wid`` sent (``LayoutCache.load``)."""

    def give_back(self, slot: Any) -> None:
        """Return ``slot`` (None: no slot) to the ring."""


class SplitBatches:
    """The split batches of a session in flight, by (iteration, batch)."""

    def __init__(self, session: SpanHost):
        self._s = session
        self._batches: dict[tuple[int, int], SplitBatch] = {}

    def __contains__(self, key: tuple[int, int]) -> bool:
        return key in self._batches

    def send(self, epoch: int, seq: int, load: Any, parts: int, spans: list, slot: Any) -> None:
        """Send each ``(worker, parts.Span)`` of batch ``seq`` its rows, all into ``slot``
        (None before the ring is sized: the first span's NeedSpace chooses it)."""
        s = self._s
        indices = load.tolist() if type(load) is Indices else list(load)
        position = position_of(load)
        self._batches[(s.iteration, seq)] = SplitBatch(epoch, seq, indices, parts, dict(spans), slot, position)
        for wid, span in spans:
            task = Task(s.iteration, epoch, seq, indices[span.start:span.stop], slot.ref if slot is not None else None,
                        parts, span, position=position)
            s.dispatcher.assign(wid, (s.iteration, seq), InFlight(task, slot))
            s.send(wid, task, defer=True)

    def result(self, wid: int, kind: type, msg: Any, key: tuple[int, int], stale: bool) -> Loaded | LoadFailed | None:
        """A span's message (Done, Failed or NeedSpace): the batch once every span has reported."""
        s, split = self._s, self._batches[key]
        if kind is NeedSpace:
            if not stale and self._slot(wid, key, split, msg.nbytes):
                return None
            s.send(wid, Reassign(msg.iteration, msg.seq, None))
            s.dispatcher.complete(wid, key)
            split.dropped(wid)
        else:
            s.dispatcher.complete(wid, key)
            if kind is Done:
                try:
                    split.done(wid, s.load_layout(wid, msg.layout_id, msg.layout))
                except Exception as exc:
                    split.broken(wid, exc)
            else:
                split.failed(wid, msg.error)
        return self._finished(key, stale) if split.finished else None

    def dropped(self, wid: int, key: tuple[int, int]) -> None:
        """Worker ``wid`` died holding a span of an abandoned epoch's batch, which is not
        sent again."""
        split = self._batches[key]
        split.dropped(wid)
        if split.finished:
            self._finished(key, True)

    def _slot(self, wid: int, key: tuple[int, int], split: SplitBatch, nbytes: int) -> bool:
        """Give a span that asked for space the batch's slot, taken now if the batch was
        sent before the ring was sized. False if that slot cannot hold ``nbytes`` (the
        span then drops its rows, and the batch is loaded again whole)."""
        s = self._s
        if split.slot is None:
            split.slot = s.allocator.slot_for_split(nbytes)
        if split.slot is None or split.slot.capacity < nbytes:
            return False
        s.dispatcher.assign(wid, key, s.dispatcher.task(wid, key)._replace(slot=split.slot, fits=True))
        s.send(wid, Reassign(key[0], key[1], split.slot.ref))
        return True

    def _finished(self, key: tuple[int, int], stale: bool) -> Loaded | LoadFailed | None:
        """Every span of a split batch has reported: the batch, its error, or (None) it is
        sent again whole. Only now does its slot go back (splitting.py's docstring says why)."""
        s, split = self._s, self._batches.pop(key)
        redo = split.redo
        layout = split.layout() if not (stale or split.error or redo) else None
        if layout is None:
            s.give_back(split.slot)
        if stale:
            return None
        if split.error is not None and not redo:
            wid, error = split.error
            span = split.spans[wid]
            # the words of a batch loaded whole (scripts match them); the part in a note
            if isinstance(error, Exception):  # the span's layout did not unpickle here
                exc = unpicklable(wid, split.seq, error)
            else:
                exc = error.rebuild(failed_where(wid, split.seq, split.load))
            _add_note(exc, f"Worker {wid} was loading rows {span.start} to {span.stop - 1} of the batch's "
                           f"{span.rows}: a part of it (split_batches, docs/api.md).")
            return LoadFailed(split.seq, exc)
        if layout is None:
            self._send_whole(split)
            return None
        if split.slot is not None:
            split.slot.state = SlotState.READY
        return Loaded(split.seq, split.slot, layout)

    def _send_whole(self, split: SplitBatch) -> None:
        """Load a split batch again, whole (splitting.py says when); it asks for a slot as
        the ring's first batches do. A worker loads its tasks in order, and the allocator
        serves slots earliest batch first: behind a later batch that waits for a larger
        slot, this one would wait for ever. So it goes to a live worker holding no later
        batch (the fewest tasks among them), and only if there is none to the one with
        the fewest tasks: the allocator then serves the batch it waits behind first
        (NOTE [ Earliest as the workers see it ], allocation.py)."""
        s = self._s
        ids = s.worker_ids()

        def later_and_held(w: int) -> tuple[bool, int]:
            held = s.dispatcher.held_by(w)
            return any(entry.task.seq > split.seq for entry in held), len(held)

        wid = min(ids, key=later_and_held)
        task = Task(s.iteration, split.epoch, split.seq, split.load, None, split.parts, position=split.position)
        s.dispatcher.assign(wid, (s.iteration, split.seq), InFlight(task, None))
        s.send(wid, task)


def _add_note(exc: BaseException, note: str) -> None:
    """``exc.add_note(note)``, also on Python 3.10, which has no ``add_note`` (tracebacks
    print ``__notes__`` from 3.11 on; on 3.10 the note is kept, not printed)."""
    if hasattr(exc, "add_note"):
        exc.add_note(note)
    else:
        exc.__notes__ = [*getattr(exc, "__notes__", ()), note]
