"""Row-wise collate: fetch a batch of large samples one at a time, each written straight into
its row of the slot.

The default path fetches every sample of a batch, then copies them into the slot. With
large samples (images of hundreds of KB) that keeps a whole batch alive in the worker's
heap, and malloc hands blocks that large back to the kernel when they are freed, so the
next batch's samples land on fresh pages: the worker pays a page fault per 4 KiB and its
copies run at fresh-memory speed (measured, docs/performance.md: 16.6 ms to fetch 32 samples of 786 KB,
6,100 faults, against 3.6 ms fetching and writing them one at a time).

Here sample 0 fixes the layout (structure, shapes and dtypes, and the batch size, which
is the number of indices); every later sample is checked against it as it arrives, with
the reference checks and messages of ``layout``, and its arrays are written to their row
of the slot at once and dropped. The worker's heap then holds about one sample, warm in
the cache, and the batch in the slot is byte for byte what the default path writes.

Used only when it cannot change the outcome: the default collate, automatic batching,
no ``__getitems__``, and sample 0's arrays of at least :data:`MIN_SAMPLE_BYTES`. Since
sample 0 tells the batch's size, a worker without a large enough slot asks for one
before fetching the rest (:func:`load_rowwise`), so even the batches that size the ring
are written row by row.
"""

from __future__ import annotations

from typing import Any, Callable, Iterable, Sequence

import numpy as np

from .._batching.batcher import Batcher, Plan
from .._batching.collate import plan_stack_after_first, write_one
from .._batching.layout import ArraySpec, slot_destination
from .._batching.parts import Span
from .fetch import check_indices

# Below this, fetching the whole batch first costs nothing worth avoiding, and the
# column-at-a-time fast path of ``collate.plan_stack`` is quicker than going sample by sample.
MIN_SAMPLE_BYTES = 64 * 1024


def applies(dataset: Any, collate_fn: Any, auto_batch: bool, indices: Any, plans: Any = None) -> bool:
    """May this batch be written row by row? Only where that cannot change the outcome:
    the default collate of a batch of indices, by ``__getitem__``. Not where ``plans``
    (``collate.StackPlans``) has a plan for batches of this size whose samples are small:
    then the default path takes the batch, and its cached plan. (Otherwise the sample
    size is checked by :func:`load_rowwise`, from the batch's first sample.)"""
    if not (auto_batch and collate_fn is None and len(indices) > 0 and not hasattr(dataset, "__getitems__")):
        return False
    per_sample = plans.sample_bytes(len(indices)) if plans is not None else None
    return per_sample is None or per_sample >= MIN_SAMPLE_BYTES


def load_rowwise(dataset: Any, indices: Sequence[Any], timer: Any,
                 space: Callable[[int], np.ndarray | None], plans: Any = None,
                 cuts: Sequence[tuple[int, int]] = (), reseed: Callable[[int], None] | None = None,
                 span: Span | None = None, bound: int | None = None) -> Plan | None:
    """Load the batch at ``indices``: its plan, with its arrays written already into
    ``space(nbytes)`` (the slot, as a uint8 array; None if the batch was given up while
    waiting for one: then so is this call, None). If its samples are small, they are
    fetched whole and planned the default way instead (reusing what sample 0 told), and
    nothing is written yet, by ``plans`` (``collate.StackPlans``) if given, so that the
    next batch of this size finds its plan cached and skips this path (``worker.py``).
    ``timer`` is the batch's ``loading.BatchTimer``; ``reseed(part)`` is called before the
    sample at each ``(position, part)`` of ``cuts`` (NOTE [ Parts of a batch ], parts.py).
    With a ``span`` (``parts.Span``), ``indices`` are its rows of a larger batch: the space
    asked for is the whole batch's, and the samples go to their rows of it. ``bound``: a
    number every index is below, if known (``fetch.check_indices``).

    The first sample tells the batch's size, so a batch without a (large enough) slot
    asks for one right then, before fetching the rest: even the batches that size the
    ring never sit whole in the worker's heap."""
    check_indices(dataset, indices, bound)
    first = dataset[indices[0]]
    timer.to_fetch()
    batch = RowwiseBatch(first, indices, span)
    if batch.sample_bytes < MIN_SAMPLE_BYTES:
        timer.to_collate()
        rest = list(_fetched(dataset, indices, cuts, reseed, None))
        timer.to_fetch()
        plan = plans.plan([first] + rest, indices) if plans is not None else batch.plan([first] + rest)
        timer.to_collate()
        return plan
    del first
    timer.to_collate()
    target = space(batch.nbytes)
    if target is None:
        return None
    timer.to_other()  # the wait for a slot
    plan = batch.write(slot_destination(target), _fetched(dataset, indices, cuts, reseed, timer))
    timer.to_collate()
    return plan


def _fetched(dataset: Any, indices: Sequence[Any], cuts: Sequence[tuple[int, int]],
             reseed: Callable[[int], None] | None, timer: Any) -> Iterable[Any]:
    """The samples at ``indices[1:]`` (sample 0 is read already), one at a time, each part seeded as it begins;
    with a ``timer``, their fetches are timed as fetch, the writing between them as collate."""
    parts = dict(cuts)
    for pos in range(1, len(indices)):
        if timer is not None:
            timer.to_collate()
        if pos in parts:
            assert reseed is not None, "cuts without a reseed"  # (load_batch makes them together)
            reseed(parts[pos])
        sample = dataset[indices[pos]]
        if timer is not None:
            timer.to_fetch()
        yield sample
        del sample


class RowwiseBatch:
    """The layout a batch will have, known from its first sample."""

    def __init__(self, first: Any, indices: Sequence[int], span: Span | None = None):
        self._batcher = Batcher(True, indices)
        self._structure = self._batcher.first(first, "sample")
        rows, self._start = (len(indices), 0) if span is None else (span.rows, span.start)
        specs, self.nbytes = self._batcher.specs(rows)  # (a span: the whole batch's, as layout.widened)
        # the array leaves' specs by leaf (an array leaf has one: only an object leaf's is None)
        self._arrays = {i: spec for i, (kind, spec) in enumerate(zip(self._batcher.kinds, specs))
                        if kind[0] == "array" and spec is not None}
        self.sample_bytes = sum(spec.nbytes for spec in self._arrays.values()) // max(1, rows)
        self._count = len(indices)

    def write(self, destination: Callable[[ArraySpec], np.ndarray], rest: Iterable[Any]) -> Plan:
        """Write sample 0 and then each of ``rest`` (the other samples, in order) into
        ``destination``; the returned plan's array leaves are written already."""
        b = self._batcher
        start = self._start
        views = {i: destination(spec)[start:start + self._count] for i, spec in self._arrays.items()}
        self._take(views, 0)
        pos = 0
        for pos, sample in enumerate(rest, 1):
            b.match(self._structure, sample, "sample", pos)
            del sample
            self._take(views, pos)
        if pos + 1 != self._count:
            raise RuntimeError(f"expected {self._count} samples, got {pos + 1}")
        plan = b.plan(self._structure)
        return plan._replace(sources=tuple(None if i in views else src for i, src in enumerate(plan.sources)))

    def plan(self, samples: list) -> Plan:
        """The default path's plan for ``samples`` (sample 0 first), reusing what sample 0
        told: for batches whose samples are too small to write row by row."""
        return plan_stack_after_first(self._batcher, self._structure, samples, self._batcher.indices)

    def _take(self, views: dict[int, np.ndarray], pos: int) -> None:
        """Write sample ``pos``'s arrays (the last entry of each array column) and let go of them."""
        for i, view in views.items():
            column = self._batcher.columns[i]
            write_one(view[pos, ...], column[-1])  # [pos, ...]: a view even when a row is 0-d
            column[-1] = None
