"""The session's pace: how deep each worker's queue is, retuned as the workers' pace is
measured, how large the ring's target is, and when a round of tasks is worth sending.

The depth rule itself is ``dispatch.prefetch_depth`` (pure); this module applies it
to a live session's ring and its workers' counters.
"""

from __future__ import annotations

from typing import Any, Callable, NamedTuple

from ..profiler import counters
from .config import LoaderConfig
from .dispatch import DEFAULT_PREFETCH, Dispatcher, prefetch_depth


class WorkersBusy(NamedTuple):
    """The workers' loading so far, from the profiler's counters (:func:`busy`)."""

    seconds: float  # loading, not waiting
    batches: int
    samples: int


def busy(board: Any) -> WorkersBusy | None:
    """The workers' loading so far; None without the profiler's counters (``board``)."""
    if board is None:
        return None
    t = counters.totals(board)
    f = {name: i for i, name in enumerate(counters.FIELDS)}
    seconds = t[:, f["fetch"]].sum() + t[:, f["collate"]].sum() + t[:, f["other"]].sum()
    return WorkersBusy(float(seconds), int(t[:, f["batches"]].sum()), int(t[:, f["samples"]].sum()))


class Pacing:
    """The depth and the ring's target for one session; ``max_bytes`` reads the ring's
    bound, which is known only once the loader's own segments exist."""

    def __init__(self, cfg: LoaderConfig, max_bytes: Callable[[], int], workers: Callable[[], int]):
        """``workers()``: the workers being run (fewer than ``num_workers`` with "auto": scaling.py)."""
        self._cfg, self._max_bytes, self._workers = cfg, max_bytes, workers
        self._retune_at = 4 * cfg.num_workers  # completions after which the depth is retuned

    def target_slots(self, slot_bytes: int) -> int:
        """The ring's target: the batches in flight, plus two the consumer may hold (ring.py)."""
        return self._workers() * self.depth(slot_bytes) + 2

    def depth(self, slot_bytes: int, batch_seconds: float | None = None) -> int:
        """The depth for slots of ``slot_bytes`` (and a measured ``batch_seconds``). By bytes
        alone, it is what the ring is sized for: an upper bound, so that a depth retuned by
        pace never needs a larger ring."""
        cfg = self._cfg
        return prefetch_depth(cfg.prefetch_factor, slot_bytes, cfg.num_workers, self._max_bytes(), batch_seconds)

    def due(self, completed: int) -> bool:
        """Whether ``completed`` batches call for a retune (:meth:`retune`)."""
        return completed >= self._retune_at

    def retune(self, dispatcher: Dispatcher, slot_bytes: int, board: Any) -> None:
        """The automatic depth again, with the workers' pace so far (:func:`busy` over the
        profiler's ``board``; ``dispatch.DEPTH_SECONDS``): torch's 2 until a batch has been measured, so that
        small batches slow to load never queue deep. At the ring's sizing, at every
        iteration, and after 4, 16, 64... times ``num_workers`` batches have come back."""
        while self._retune_at <= dispatcher.completed:
            self._retune_at *= 4
        if self._cfg.prefetch_factor is not None or not slot_bytes:
            return
        measured = busy(board)  # (read only when the depth is the automatic one)
        if measured is None or not measured.batches:
            dispatcher.per_worker = DEFAULT_PREFETCH
        else:
            dispatcher.per_worker = self.depth(slot_bytes, measured.seconds / measured.batches)

    def worth_dispatching(self, dispatcher: Dispatcher, room: int) -> bool:
        """Whether to send tasks now, with ``room`` more batches allowed outstanding.

        With deep queues (small batches, ``prefetch_factor=None``) tasks go out in bursts:
        once a quarter of every worker's depth is free, or as soon as a worker holds
        nothing. Each task sent to a sleeping worker costs a wake-up (a system call and a
        context switch, tens of microseconds here: docs/performance.md), so sending four
        at once wakes a worker once per four batches; a worker that still holds three
        quarters of its depth has plenty to do meanwhile. Depths under 4 (large batches,
        where a wake-up is nothing beside the batch) send every task at once."""
        burst = dispatcher.per_worker // 4
        return room >= max(1, burst * dispatcher.active) or (room > 0 and dispatcher.idle())
