"""Loading one batch: seed, fetch, plan. The one path for ``num_workers=0`` and for workers.

Both the in-process epoch (``epoch.SingleProcessEpoch``) and each worker
(``worker._WorkerLoop``) call :func:`load_batch`, so a batch is seeded, fetched and
planned the same way wherever it is loaded: that is what makes batches bit-identical
for any ``num_workers`` (torch shares its fetcher between its two iterators for the same
reason). Where the plan is then written differs: fresh arrays in the calling process,
a ring slot in a worker, which may also write large samples row by row as they are
fetched (``rowwise.py``) when it passes ``rowwise``.

A :class:`BatchTimer` owns the profiler's figures of the batch (``profiler/counters.py``):
seconds in the dataset (*fetch*), in collate (planning and writing), the samples and
the bytes. Time is split by moving a mark: every reading goes to the stage that just
ended, so stages interleaved within one batch (row-wise writing fetches between rows)
are counted without subtracting one from another.
"""

from __future__ import annotations

import functools
import time
from typing import Any, Callable, NamedTuple, Sequence

from .._batching import parts as _parts
from .._batching.collate import StackPlans, make_plan
from .._ordering import seeding
from .._ordering.shuffle import StreamShuffle
from .._ordering.stream import Stream, StreamPlace
from .._transport.messages import Draw, Indices
from .fetch import fetch

_clock = time.perf_counter

ENDED = object()  # load_batch(): the worker's stream has ended, no batch at this position


class BatchSource(NamedTuple):
    """What a process loads batches from: the user's dataset and collate_fn, how they
    are batched and seeded, and for an iterable source this process's stream of it
    (``worker`` of ``workers`` streams; one stream, 0 of 1, with ``num_workers=0``)."""

    dataset: Any
    collate_fn: Callable | None  # None: the default collate
    auto_batch: bool  # False with batch_size=None: each load is one index (or one sample)
    seed: int
    rank: int
    stream: Stream | None = None
    worker: int = 0
    workers: int = 1
    plans: StackPlans | None = None  # the default collate's cached plans (NOTE [ The cached plan ], collate.py)
    shuffle: StreamShuffle | None = None  # an iterable source's shuffling (shuffle.py)


class BatchTimer:
    """One batch's figures for the profiler. :meth:`begin` starts a batch; each of
    :meth:`to_fetch`, :meth:`to_collate` and :meth:`to_other` gives the time since the
    last reading to that stage; :meth:`record` stores the batch in a
    ``counters.Recorder`` (what a stage did not get is "other" there)."""

    __slots__ = ("seq", "waited_from", "started", "fetch", "collate", "samples", "nbytes", "_mark")

    def __init__(self) -> None:
        self.begin(-1, 0.0)

    def begin(self, seq: int, waited_from: float | None) -> None:
        """Batch ``seq`` begins now; its worker had waited for it since ``waited_from``
        (None: no wait, as in the calling process)."""
        self.started = self._mark = _clock()
        self.seq, self.waited_from = seq, self.started if waited_from is None else waited_from
        self.fetch = self.collate = 0.0
        self.samples = self.nbytes = 0

    def to_fetch(self) -> None:
        now = _clock()
        self.fetch += now - self._mark
        self._mark = now

    def to_collate(self) -> None:
        now = _clock()
        self.collate += now - self._mark
        self._mark = now

    def to_other(self) -> None:
        self._mark = _clock()

    def record(self, recorder: Any) -> None:
        recorder.batch(self.seq, self.waited_from, self.started, self.fetch, self.collate, _clock(), self.samples,
                       self.nbytes)


def load_batch(src: BatchSource, epoch: int, seq: int, load: Any, epoch_key: Any, timer: BatchTimer,
               rowwise: Callable[..., Any] | None = None, parts: int = 1, span: _parts.Span | None = None,
               bound: int | None = None, position: int | None = None) -> Any:
    """Batch ``seq`` of ``epoch``: its :class:`Plan`, or :data:`ENDED` if ``load`` is a
    :class:`Draw` past the end of this process's stream. ``load`` is the task's (dataset
    indices, one index, or a Draw); ``epoch_key`` changes with every epoch of the stream.

    A map-style batch is seeded by its position (``seeding.seed_globals``), each of its
    ``parts`` for itself (NOTE [ Parts of a batch ], parts.py); ``span``: ``load`` is only
    those parts' rows. A draw is seeded by its position in its stream, which the stream
    also uses for the draws it skips. A worker passes ``rowwise`` for a map-style batch
    that may be written row by row (``rowwise.applies``): the batch is then handed to it,
    seeded, instead of being fetched whole; it returns a Plan, or None if the batch was
    given up. ``bound``: a number every index is below, if known (``fetch.check_indices``).
    ``position``: an elastic epoch's batch (NOTE [ The global sequence ], elastic.py) whose
    first sample is at this global position: each sample is seeded by its own position
    instead, whatever its batch, part or span (an Indices load carries it in this process)."""
    if type(load) is Draw:
        return _load_draw(src, epoch, load, epoch_key, timer)
    if type(load) is Indices:  # (in this process: a worker gets the list from wire.py)
        position = load.position
        load = load.tolist()
    cuts: Sequence[tuple[int, int]] = ()
    reseed: Callable[[int], None] | None = None
    if position is not None:  # (cuts name the sample itself: reseed(i) seeds the load's i-th sample)
        reseed = functools.partial(seeding.seed_sample, src.seed, epoch, position + (span.start if span else 0))
        reseed(0)
        cuts = [(i, i) for i in range(1, len(load))]
    else:
        seeding.seed_globals(src.seed, epoch, seq, src.rank, span.first if span is not None else 0)
        if parts > 1:
            cuts = _parts.cuts_within(span.rows if span is not None else len(load), parts, span)
            reseed = functools.partial(seeding.seed_globals, src.seed, epoch, seq, src.rank)
    timer.to_other()
    timer.samples = len(load) if src.auto_batch else 1
    if rowwise is not None:
        return rowwise(load, timer, cuts, reseed, bound)
    samples = fetch(src.dataset, load, src.auto_batch, cuts, reseed, bound)
    timer.to_fetch()
    plan = make_plan(samples, load, src.collate_fn, src.auto_batch, src.plans)
    timer.to_collate()
    return plan


def _load_draw(src: BatchSource, epoch: int, draw: Draw, epoch_key: Any, timer: BatchTimer) -> Any:
    def seed(number: int) -> None:
        seeding.seed_globals(src.seed, epoch, seeding.stream_position(number, src.worker, src.workers), src.rank)

    assert src.stream is not None, "a Draw, but the source is not iterable"
    place = StreamPlace(epoch, src.seed, src.rank, src.worker, src.workers, src.shuffle)
    samples = src.stream.draw(epoch_key, draw, seed, place)
    if samples is None:
        return ENDED
    timer.to_fetch()
    timer.samples = len(samples) if src.auto_batch else 1
    plan = make_plan(samples, None, src.collate_fn, src.auto_batch, src.plans)
    timer.to_collate()
    return plan

