"""Which batches are split over workers, and when one waits to be (``split_batches``).

The rules are ``parts.plan_spans`` and ``parts.tail_wait`` (pure); this module applies
them to a live session at dispatch time, for the epoch (``worker_epoch.py``), from the
workers' queues and their measured pace. ``spans.py`` then sends what it decides.
"""

from __future__ import annotations

import enum
import time
from typing import Any, Literal

from .._batching.parts import Span, plan_spans, tail_wait
from .._loading.fetch import check_indices
from .._ordering.schedule import Planned
from .config import LoaderConfig


class Later(enum.Enum):
    LATER = "dispatch this batch later"


LATER = Later.LATER  # SplitPolicy.spans: dispatch this batch later
HOLD_BACK_MIN = 0.005  # seconds: a batch loaded faster is never held back at an epoch's end (_fast)


class SplitPolicy:
    """One epoch's decisions: the spans of each batch, and until when one is held back."""

    def __init__(self, cfg: LoaderConfig, length: int | None, session: Any):
        self._cfg, self._length, self._session = cfg, length, session
        self.deadline: float | None = None  # until when a batch is held back (parts.tail_wait)
        self._pace: float | None = None  # the workers' seconds per sample, read at the epoch's end

    def spans(self, planned: Planned, parts: int,
              on_their_way: int) -> list[tuple[int, Span]] | None | Literal[Later.LATER]:
        """The ``(worker, Span)`` pairs to split a batch into; None to send it whole;
        :data:`LATER` to wait (``on_their_way``: batches dispatched and not yet yielded).

        * The epoch's last batches, one per worker run, wait until a worker is idle, and are
          then shared by the idle workers: queued behind other work, they would end the
          epoch on one or two workers while the rest wait (with deep queues, long before
          any worker idles). Waiting costs a round trip per batch at each epoch's end.
        * Otherwise a batch is split when idle workers outnumber the batches already on
          their way (the consumer would wait: the epoch's start, a short epoch).
        * ``split_batches=True`` splits every batch over the workers with room."""
        cfg, dispatcher = self._cfg, self._session.dispatcher
        forced = cfg.split_batches is True
        near_end = (self._length is not None and self._length - planned.seq <= dispatcher.active
                    and not self._fast(len(planned.load)))
        idle = dispatcher.idle_workers()
        if not (forced or near_end or idle > on_their_way):
            return None
        if len(planned.load) < 2 or not self._splittable(planned):
            return None
        live = [not h.exited and dispatcher.accepting[h.id] for h in self._session.supervisor.workers]
        loads = dispatcher.loads()
        if near_end and not forced:
            room = [ok and not load for ok, load in zip(live, loads)]
            now = time.monotonic()
            taking = [load if ok else 0 for ok, load in zip(live, loads)]  # (none waited for that takes no task)
            wait = tail_wait(room, taking, dispatcher.busy_since, now, self._pace, parts)
            if wait > 0 or not any(room):
                self.deadline = now + wait if wait > 0 else None
                return LATER
        else:
            room = [ok and dispatcher.has_room(w) for w, ok in enumerate(live)]
        spans = plan_spans(len(planned.load), parts, loads, room, forced)
        return spans if len(spans) > 1 else None

    def _fast(self, rows: int) -> bool:
        """Does a batch of ``rows`` load in less than :data:`HOLD_BACK_MIN` by the workers'
        measured pace (read once per epoch, at its end)? Such a batch is not held back at
        the epoch's end: the round trip would cost more than an idle worker does."""
        if self._pace is None:
            self._pace = self._session.seconds_per_sample()
        return self._pace is not None and self._pace * rows < HOLD_BACK_MIN

    def _splittable(self, planned: Planned) -> bool:
        """Indices the dataset refuses are left to one worker, whose error names the
        position in the whole batch (``fetch.check_indices``), as an unsplit batch's does."""
        try:
            check_indices(self._cfg.dataset, planned.load)
        except IndexError:
            return False
        return True
