"""A split batch in the main process: its spans in flight, and the batch they make
(pure: no processes, no messages; spans.py carries out what it says).

The spans of one batch (NOTE [ Parts of a batch ], parts.py) share the batch's one slot,
each worker writing its own rows. The rule that keeps that safe, enforced here: the slot
goes back to the ring only once *every* span has reported (done, failed, or told to drop
its rows), since until then some worker may still write into it. A span that reports
early never releases it on its own.

When the spans do not make one batch, the batch is loaded again, whole, by one worker
(:attr:`SplitBatch.redo`): its spans disagree (a dtype promoted in one span only, shapes
that differ between spans, a container copied from each span's first sample), a span
found the samples do not collate (the whole batch then gives the exact error a batch
never split gives, naming the sample), or a span needed a larger slot than the batch
was given. The seeds are the parts' own, so the batch loaded again is the same batch.
"""

from __future__ import annotations

from typing import Any

from .layout import ArraySpec, Layout, ObjectValue, Template
from .parts import Span

# Failures in a span that loading the whole batch again turns into the error an unsplit
# batch gives (with the sample's position in the batch, not in the span): CollateError
# and its subclass for batches written row by row, where whether rows are written one by
# one is decided from the span's first sample, not the batch's (rowwise.py).
_REDO_ERRORS = frozenset({"CollateError", "RowwiseTypeMismatch"})


class SplitBatch:
    """One split batch: which workers still hold a span of it, and what came back."""

    def __init__(self, epoch: int, seq: int, load: list, parts: int, spans: dict[int, Span], slot: Any,
                 position: int | None = None):
        self.epoch, self.seq, self.load, self.parts = epoch, seq, load, parts
        self.position = position  # elastic: the batch's first global position (elastic.py)
        self.spans = spans  # worker -> its span
        self.pending = set(spans)
        self.slot = slot  # shared by every span (None until the ring is sized)
        self.layouts: dict[int, Layout] = {}  # first part -> the layout its span reported
        self.error: tuple[int, Any] | None = None  # (worker, RemoteError): the earliest span's failure
        self.redo_from: int | None = None  # the first part of the earliest span that calls for a redo

    @property
    def redo(self) -> bool:
        """Is the batch loaded again, whole? When a span called for it and no span before
        it failed: a batch loaded whole stops at its first bad sample, so an error after a
        redo's span is not the batch's (the redo gives the batch's own)."""
        if self.redo_from is None:
            return False
        return self.error is None or self.redo_from < self.spans[self.error[0]].first

    def done(self, wid: int, layout: Layout) -> None:
        self.pending.discard(wid)
        self.layouts[self.spans[wid].first] = layout

    def failed(self, wid: int, error: Any) -> None:
        self.pending.discard(wid)
        if error.type_name in _REDO_ERRORS:
            self._redo(wid)
        elif self.error is None or self.spans[wid].first < self.spans[self.error[0]].first:
            self.error = (wid, error)

    def broken(self, wid: int, exc: Exception) -> None:
        """The span's layout did not unpickle in the main process."""
        self.pending.discard(wid)
        if self.error is None or self.spans[wid].first < self.spans[self.error[0]].first:
            self.error = (wid, exc)

    def dropped(self, wid: int) -> None:
        """The span was told to drop its rows (no slot large enough): the batch is loaded again."""
        self.pending.discard(wid)
        self._redo(wid)

    def _redo(self, wid: int) -> None:
        first = self.spans[wid].first
        if self.redo_from is None or first < self.redo_from:
            self.redo_from = first

    @property
    def finished(self) -> bool:
        return not self.pending

    def layout(self) -> Layout | None:
        """The whole batch's layout, once every span is done; None if they do not agree
        (then the batch is loaded again)."""
        return merged([self.layouts[first] for first in sorted(self.layouts)])


def merged(layouts: list[Layout]) -> Layout | None:
    """The layout of a batch from its spans' layouts, in order (each already widened to
    the whole batch: ``layout.widened``): the same structure and array leaves, object
    leaves joined in order. None where they differ."""
    first = layouts[0]
    for other in layouts[1:]:
        if other.nbytes != first.nbytes or not _alike(other.structure, first.structure):
            return None
        for a, b in zip(first.leaves, other.leaves):
            if type(a) is not type(b) or (type(a) is ArraySpec and a != b):
                return None
            if type(a) is ObjectValue and type(a.value) is not type(b.value):
                return None
    if not any(type(leaf) is ObjectValue for leaf in first.leaves):
        return first
    leaves = []
    for i, leaf in enumerate(first.leaves):
        if type(leaf) is ObjectValue:
            joined = [v for layout in layouts for v in layout.leaves[i].value]
            leaf = ObjectValue(type(leaf.value)(joined))
        leaves.append(leaf)
    return Layout(first.structure, tuple(leaves), first.nbytes)


def _alike(a: Any, b: Any) -> bool:
    """Do two spans' structures describe one batch? Equal, except that a copied container
    (``layout.Template``, equal only to itself) is taken from each span's first sample:
    of the same type, the batch keeps the first span's, which is the batch's sample 0's,
    as a batch loaded whole does."""
    if a == b:
        return True
    if type(a) is Template and type(b) is Template:
        return type(a.value) is type(b.value)
    if type(a) is not type(b) or not isinstance(a, tuple) or len(a) != len(b):
        return False
    return all(_alike(x, y) for x, y in zip(a, b))
