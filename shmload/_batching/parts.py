"""Parts of a batch: the fixed pieces a batch may be split into, and which worker loads
which piece (pure: no processes, no messages).

NOTE [ Parts of a batch ]
A batch of ``rows`` samples is cut into ``min(rows, parts)`` contiguous parts of nearly
equal size (:func:`bounds`), ``parts`` being the loader's ``batch_parts`` for the first
and last :data:`EDGE` batches of an epoch and 1 in between (:func:`parts_of`; every batch
with ``split_batches=True``, none with ``False``). The cut depends on nothing but the
batch's position and length and those settings: not on ``num_workers``, nor on whether
the batch is in fact split. Each part is
seeded for itself, from (seed, epoch, batch, part) (``seeding.seed_globals``), wherever it
is loaded: a worker loading the whole batch seeds again at each part's first sample. So a
batch is bit-identical whether one worker loads it, several load its parts, or the main
process loads it (``num_workers=0``). Part 0's seed is the batch's seed of a loader
without parts, so a batch of one part is what it always was.

A worker loads a *span*: one or more consecutive parts (:class:`Span`), never two spans of
one batch, so a task is still named by (iteration, batch) on each worker. Splitting pays
when workers would otherwise idle: :func:`plan_spans` cuts a batch into the spans that
finish it soonest given the rows each worker still holds, and keeps it whole when that is
as soon (``dispatch.py`` holds the rows; ``epoch.py`` asks only when a worker is idle or
the epoch nears its end, so steady state costs nothing).

What is never split: a batch with a ``collate_fn`` or from a ``__getitems__`` (their
result is made for the whole batch), ``batch_size=None``, and an iterable source's draws.
"""

from __future__ import annotations

from typing import NamedTuple, Sequence

DEFAULT_PARTS = 2  # the default batch_parts: see docs/api.md for the trade-off
MAX_PARTS = 255  # (a task's header carries the count in one byte: wire.py)
EDGE = 16  # batches at each end of an epoch that have parts, unless split_batches=True


def parts_of(seq: int, length: int | None, parts: int, everywhere: bool) -> int:
    """The parts of batch ``seq`` of an epoch of ``length`` batches (None: unknown), for a
    loader whose batches may have ``parts`` (``LoaderConfig.parts``). Only the first and
    last :data:`EDGE` batches have them, where the policy splits (the epoch's start and
    end, short epochs), unless ``everywhere`` (``split_batches=True``): each part after the
    first costs a reseed (~8 µs), in every batch that has it, split or not, and batches in
    steady state are not split. A function of the batch's position and the settings
    alone, the same in every process and for any ``num_workers``."""
    if parts == 1 or everywhere or seq < EDGE or (length is not None and length - seq <= EDGE):
        return parts
    return 1


def bounds(rows: int, parts: int) -> list[int]:
    """The first row of each part of a batch of ``rows``, and ``rows``: ``[0, ..., rows]``
    with ``min(rows, parts)`` parts whose sizes differ by at most one, larger ones first."""
    k = max(1, min(rows, parts))
    size, extra = divmod(rows, k)
    out, row = [0], 0
    for j in range(k):
        row += size + (j < extra)
        out.append(row)
    return out


class Span(NamedTuple):
    """Parts ``first`` to ``end - 1`` of a batch of ``rows`` rows: its rows ``start`` to
    ``stop - 1``."""

    first: int
    end: int
    start: int
    stop: int
    rows: int


def span(rows: int, parts: int, first: int, end: int) -> Span:
    cuts = bounds(rows, parts)
    return Span(first, end, cuts[first], cuts[end], rows)


def cuts_within(rows: int, parts: int, sp: Span | None) -> list[tuple[int, int]]:
    """Where, in the indices a task loads (the whole batch, or span ``sp``'s rows), a new
    part begins: ``(position, part)`` pairs after the first part's start. The loader
    seeds again there (NOTE [ Parts of a batch ])."""
    cuts = bounds(rows, parts)
    first, end, start = (0, len(cuts) - 1, 0) if sp is None else (sp.first, sp.end, sp.start)
    return [(cuts[j] - start, j) for j in range(first + 1, end)]


def plan_spans(rows: int, parts: int, loads: Sequence[int], room: Sequence[bool],
               force: bool = False) -> list[tuple[int, Span]]:
    """How to load a batch of ``rows`` given the rows each worker still holds (``loads``)
    and whether it may take another task (``room``): ``(worker, span)`` pairs, one per
    worker used, spans in order. A single pair (the whole batch) unless cutting it
    finishes it sooner: for each number ``m`` of spans, the parts are shared out in ``m``
    runs as even as the parts allow, the biggest to the least loaded worker, and the
    ``m`` with the earliest finish wins (fewest spans on a tie: each span is a message
    and a merge). An empty list if no worker has room."""
    free = sorted((load, wid) for wid, (load, ok) in enumerate(zip(loads, room)) if ok)
    if not free:
        return []
    cuts = bounds(rows, parts)
    k = len(cuts) - 1
    best: list[tuple[int, Span]] = []
    best_finish = None
    for m in range(1, min(k, len(free)) + 1):
        runs = _runs(k, m)  # parts per span, largest first
        spans, first = [], 0
        for n in runs:
            spans.append(Span(first, first + n, cuts[first], cuts[first + n], rows))
            first += n
        by_size = sorted(spans, key=lambda s: s.start - s.stop)  # largest span first
        finish = max(load + (s.stop - s.start) for (load, _), s in zip(free, by_size))
        if best_finish is None or finish < best_finish or force:
            best_finish = finish
            best = sorted(((wid, s) for (_, wid), s in zip(free, by_size)), key=lambda p: p[1].first)
    return best


def _runs(k: int, m: int) -> list[int]:
    """``k`` parts in ``m`` runs whose sizes differ by at most one, larger first."""
    size, extra = divmod(k, m)
    return [size + (j < extra) for j in range(m)]


def tail_wait(idle: Sequence[bool], loads: Sequence[int], busy_since: Sequence[float | None], now: float,
              per_row: float | None, parts: int) -> float:
    """At an epoch's end, how long to hold a batch back for workers about to be idle
    (0: send it now, to the idle workers). A batch given to the one worker that went idle
    first ends the epoch on that worker alone while the others, done a moment later,
    wait. So when fewer workers are idle than the batch has parts, and a busy worker's
    queue should end soon (it began at ``busy_since``, when its previous task ended, and
    ``per_row`` seconds a row is the workers' measured pace), wait for the first of them:
    until its expected end, and at least a tenth of its expected time while it is late,
    up to a quarter of that time past its expected end. Without a measure yet (None),
    do not wait."""
    if per_row is None or sum(idle) >= min(parts, len(idle)):
        return 0.0
    soonest = None
    for free, load, since in zip(idle, loads, busy_since):
        if free or since is None or not load:
            continue
        expected = load * per_row
        elapsed = now - since
        if expected / 2 <= elapsed < expected * 1.25:  # past half way, and not (much) slower than its peers
            wait = max(expected - elapsed, expected / 10)
            soonest = wait if soonest is None else min(soonest, wait)
    return 0.0 if soonest is None else soonest
