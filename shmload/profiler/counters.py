"""Counters: what each worker measures about its own batches, kept in shared memory.

Always on, so it must cost next to nothing: a worker takes a few ``perf_counter()``
readings per batch and adds them into its own record, a row of float64 words in one
small shared-memory segment (the *board*) that the main process maps too. No message
carries them and nothing is pickled; the main process reads the board only when someone
asks (``loader.stats()``, a trace) and when a session closes.

One writer per row: worker ``i`` writes row ``i`` only, and a replacement worker (see
``max_worker_restarts``) continues the row of the one it replaces. The main process reads
without a lock. Each word is an aligned 8-byte store (``pack_into`` copies whole
doubles), which x86-64 and AArch64 never tear, so a read sees every counter either before
or after a batch's update; counters of one row may be one batch apart from each other,
which a profile does not notice.

Row layout (float64 words)::

    | count | batches | samples | bytes | wait | fetch | collate | other | covered |  EVENTS x event  |

Per batch a worker writes one *event* (:data:`EVENT_FIELDS`) and bumps ``count``: one
``struct.pack_into`` and one word store, about 0.6 us (docs/performance.md). Event ``k`` lives at
``k % EVENTS`` (the last ``EVENTS`` batches are kept for the trace). Its times come from
``time.perf_counter()``, which on Linux is ``CLOCK_MONOTONIC``, the same clock in every
process, so the main process can lay the workers' events on its own timeline.

The running totals (``wait``: seconds waiting for a task; ``fetch``: in the dataset's
``__getitem__`` / ``__getitems__``; ``collate``: ``collate_fn``, planning and writing the
slot; ``other``: the rest of a batch, such as seeding, waiting for a larger slot and
reporting) are not stored per batch: every :data:`FLUSH` batches the worker sums its
events since the last flush with numpy and stores the totals with ``covered``, the count
they include. A reader adds the events from ``covered`` to ``count`` with the same
function (:func:`_sum`), so totals are exact at any moment, and ``FLUSH`` < ``EVENTS``
keeps those events in the ring. This keeps the per-batch cost to a third of storing
totals every batch, which is what the "under 1% of a tiny batch" goal needed.

Ordering: the worker writes the event, then ``count``, then (on a flush) the totals; a
reader reads the totals, ``count``, and the totals again, and retries if a flush came in
between. On x86-64 stores and loads keep program order (TSO), so this is exact. On weakly
ordered CPUs (AArch64) a reader may, rarely, see a ``count`` before its event: one
batch's figures in a profile read a moment too early, never anything on the data path.
"""

from __future__ import annotations

import struct

import numpy as np

FIELDS = ("batches", "samples", "bytes", "wait", "fetch", "collate", "other", "events")  # what totals() gives
# seq; when the worker began waiting for the task, when it had it; seconds in fetch and
# in collate; when the batch was reported; its samples and bytes.
EVENT_FIELDS = ("seq", "waited_from", "started", "fetch", "collate", "done", "samples", "bytes")
EVENTS = 4096  # batches of history per worker: 4096 x 64 bytes = 256 KiB a worker
FLUSH = 512  # batches between stored totals; must stay below EVENTS

_COUNT = 0  # word 0: events written
_STORED = slice(1, 9)  # batches .. other, covered
_HEADER = 9
_E = {name: i for i, name in enumerate(EVENT_FIELDS)}


def row_words(events: int = EVENTS) -> int:
    return _HEADER + events * len(EVENT_FIELDS)


def board_bytes(rows: int, events: int = EVENTS) -> int:
    return rows * row_words(events) * 8


def board(buffer, rows: int, events: int = EVENTS) -> np.ndarray:
    """The board in ``buffer`` as a ``[rows, row_words]`` float64 array."""
    return np.frombuffer(buffer, dtype=np.float64, count=rows * row_words(events)).reshape(rows, row_words(events))


def _ring(line: np.ndarray) -> np.ndarray:
    """A row's events, ``[EVENTS, len(EVENT_FIELDS)]`` (the row's width gives EVENTS)."""
    return line[_HEADER:].reshape(-1, len(EVENT_FIELDS))


def _since(line: np.ndarray, first: int, count: int) -> np.ndarray:
    """Events ``first`` .. ``count - 1`` of a row, in order (a copy)."""
    ring = _ring(line)
    return ring[np.arange(first, count) % len(ring)]


def _sum(ev: np.ndarray) -> np.ndarray:
    """batches, samples, bytes, wait, fetch, collate, other of the events ``ev``."""
    e = _E
    if not len(ev):
        return np.zeros(7)
    other = ev[:, e["done"]] - ev[:, e["started"]] - ev[:, e["fetch"]] - ev[:, e["collate"]]
    return np.array([len(ev), ev[:, e["samples"]].sum(), ev[:, e["bytes"]].sum(),
                     (ev[:, e["started"]] - ev[:, e["waited_from"]]).sum(), ev[:, e["fetch"]].sum(),
                     ev[:, e["collate"]].sum(), np.maximum(other, 0.0).sum()])


def _row_totals(line: np.ndarray) -> np.ndarray:
    """One row's totals (:data:`FIELDS`): the stored ones plus the events since."""
    while True:
        stored = np.array(line[_STORED])
        count = int(line[_COUNT])
        if np.array_equal(stored, line[_STORED]):
            break  # no flush came in between
    return np.append(stored[:-1] + _sum(_since(line, int(stored[-1]), count)), count)


class Recorder:
    """Worker side: records one batch at a time into row ``row`` of a board.

    A replacement worker carries on the counts of the one it replaces: it starts from
    what the row holds."""

    _EVENT = struct.Struct(f"{len(EVENT_FIELDS)}d")

    def __init__(self, board_array: np.ndarray, row: int):
        self._row = board_array[row]
        self._buffer = memoryview(self._row).cast("B")
        self._words = self._buffer.cast("d")
        self._events = len(_ring(self._row))
        self._flush_every = min(FLUSH, self._events // 2)
        self._count = int(self._row[_COUNT])
        self._store(_row_totals(self._row))

    def batch(self, seq: int, waited_from: float, started: float, fetch: float, collate: float, done: float,
              samples: int, nbytes: int) -> None:
        k = self._count
        self._EVENT.pack_into(self._buffer, 8 * (_HEADER + (k % self._events) * len(EVENT_FIELDS)),
                              seq, waited_from, started, fetch, collate, done, samples, nbytes)
        k += 1
        self._count = k
        self._words[_COUNT] = k  # after the event: a reader never counts an event before it is written
        if k - self._covered >= self._flush_every:
            self._store(_row_totals(self._row))

    def _store(self, totals: np.ndarray) -> None:
        self._covered = int(totals[-1])
        self._row[_STORED] = totals  # batches .. other, then covered = the count they include

    def close(self) -> None:
        self._words.release()
        self._buffer.release()
        self._row = None  # the last reference into the board: its mapping can now be closed


def totals(board_array: np.ndarray) -> np.ndarray:
    """Every row's counters (:data:`FIELDS`), ``[rows, len(FIELDS)]``."""
    if not len(board_array):
        return np.zeros((0, len(FIELDS)))
    return np.stack([_row_totals(line) for line in board_array])


def events(board_array: np.ndarray, row: int, since: int = 0) -> tuple[np.ndarray, int]:
    """Row ``row``'s events numbered ``since`` and later that are still kept (the last
    ``EVENTS``), as a ``[n, len(EVENT_FIELDS)]`` copy in order, and the count to pass as
    ``since`` next time."""
    line = board_array[row]
    count = int(line[_COUNT])
    return _since(line, max(since, count - len(_ring(line))), count), count
