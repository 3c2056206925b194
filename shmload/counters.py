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

    | batches | samples | bytes | wait | fetch | collate | other | events |  EVENTS x event  |

``wait`` (seconds waiting for a task), ``fetch`` (in the dataset's ``__getitem__`` /
``__getitems__``), ``collate`` (``collate_fn``, planning and writing the slot), ``other``
(the rest of a batch: seeding, waiting for a larger slot, reporting). ``events`` counts
the batches recorded; event ``k`` lives at ``k % EVENTS`` (the last ``EVENTS`` batches):
its fields are :data:`EVENT_FIELDS`, times from ``time.perf_counter()``, which on Linux is
``CLOCK_MONOTONIC``, the same clock in every process, so the main process can lay the
workers' events on its own timeline.
"""

from __future__ import annotations

import struct

import numpy as np

FIELDS = ("batches", "samples", "bytes", "wait", "fetch", "collate", "other", "events")
STAGES = ("wait", "fetch", "collate", "other")
# seq; when the worker began waiting for the task, when it had it; seconds in fetch and
# in collate; when the batch was reported; its samples and bytes.
EVENT_FIELDS = ("seq", "waited_from", "started", "fetch", "collate", "done", "samples", "bytes")
EVENTS = 4096  # batches of history per worker: 4096 x 64 bytes = 256 KiB a worker

_F = {name: i for i, name in enumerate(FIELDS)}


def row_words(events: int = EVENTS) -> int:
    return len(FIELDS) + events * len(EVENT_FIELDS)


def board_bytes(rows: int, events: int = EVENTS) -> int:
    return rows * row_words(events) * 8


def board(buffer, rows: int, events: int = EVENTS) -> np.ndarray:
    """The board in ``buffer`` as a ``[rows, row_words]`` float64 array."""
    return np.frombuffer(buffer, dtype=np.float64, count=rows * row_words(events)).reshape(rows, row_words(events))


class Recorder:
    """Worker side: adds one batch at a time into row ``row`` of a board.

    The running totals are kept in Python and stored whole after each batch, with one
    ``struct.pack_into`` for the event and one for the totals (about 0.5 us a batch, a
    third of item-by-item stores). They start from what the row holds, so a replacement
    worker carries on the counts of the one it replaces."""

    _EVENT = struct.Struct(f"{len(EVENT_FIELDS)}d")
    _TOTALS = struct.Struct(f"{len(FIELDS)}d")

    def __init__(self, board_array: np.ndarray, row: int, events: int = EVENTS):
        self._row = board_array[row]
        self._buffer = memoryview(self._row).cast("B")
        self._totals = [float(v) for v in self._row[:len(FIELDS)]]
        self._events = events

    def batch(self, seq: int, waited_from: float, started: float, fetch: float, collate: float, done: float,
              samples: int, nbytes: int) -> None:
        t = self._totals
        t[0] += 1.0
        t[1] += samples
        t[2] += nbytes
        t[3] += started - waited_from
        t[4] += fetch
        t[5] += collate
        t[6] += max(0.0, done - started - fetch - collate)
        k = int(t[7])
        self._EVENT.pack_into(self._buffer, 8 * (len(FIELDS) + (k % self._events) * len(EVENT_FIELDS)),
                              seq, waited_from, started, fetch, collate, done, samples, nbytes)
        t[7] = k + 1.0
        # after the event: a reader never sees an event counted before it is written
        self._TOTALS.pack_into(self._buffer, 0, *t)

    def close(self) -> None:
        self._buffer.release()
        self._row = None  # the last reference into the board: its mapping can now be closed


def totals(board_array: np.ndarray) -> np.ndarray:
    """A copy of every row's counters, ``[rows, len(FIELDS)]``."""
    return np.array(board_array[:, :len(FIELDS)])


def events(board_array: np.ndarray, row: int, since: int = 0, events: int = EVENTS) -> tuple[np.ndarray, int]:
    """Row ``row``'s events numbered ``since`` and later that are still kept (the last
    ``events``), as a ``[n, len(EVENT_FIELDS)]`` copy in order, and the count to pass as
    ``since`` next time."""
    line = board_array[row]
    count = int(line[_F["events"]])
    first = max(since, count - events)
    ring = line[len(FIELDS):].reshape(events, len(EVENT_FIELDS))
    picked = np.arange(first, count) % events
    return np.array(ring[picked]), count
