"""The epoch with workers: tasks dispatched ahead, results reordered, views yielded.

:class:`MultiprocessEpoch` keeps up to ``num_workers * prefetch_factor`` batches
(``Session.outstanding``) outstanding (dispatched or ready but not yet yielded, as torch
counts them), feeds results through a :class:`ReorderBuffer`, and yields views into the
ring. What it shares with the in-process epoch (``next()`` as one window, the epoch
beginning at the first batch, ``len()``) is ``epoch.Epoch``'s.
"""

from __future__ import annotations

import os
import time
import weakref
from typing import Any, Callable

from .._core import _signals
from .._ordering.schedule import Planned, Schedule
from .._session.config import LoaderConfig
from .._session.results import Ended, LoadFailed
from .._session.scaling import Tuner
from .._session.session import Session
from .._session.split_policy import LATER, SplitPolicy
from ..errors import LoaderTimeoutError, ShmloadError
from ..profiler.profile import Profile
from .epoch import Epoch
from .reorder import ReorderBuffer

_clock = time.perf_counter
POLL_INTERVAL = 0.5  # how often a waiting iterator re-checks released slots

_TAKEN_OVER = ("this iterator can no longer be used: a newer iter() of the same loader (persistent_workers=True) "
               "or close() took over its workers")


class MultiprocessEpoch(Epoch):
    def __init__(self, cfg: LoaderConfig, session: Session, owns_session: bool,
                 claim: Callable[[], tuple[int, Schedule, Any]], length: int | None, loader: Any, profile: Profile,
                 tuner: Tuner | None = None):
        self._loader = loader  # `for b in DataLoader(...)`: the loader must live as long as this
        self._profile = profile
        self._tuner = tuner  # num_workers="auto" (scaling.py)
        self._cfg, self._session = cfg, session
        self._claim, self._length = claim, length
        self._lock = session.lock  # NOTE [ Threads sharing a session ] (session.py)
        _signals.acquire(self._lock)  # (in open_epoch's window: waiting for another thread's next())
        try:
            self._iteration = session.begin_iteration()
        finally:
            self._lock.release()
        self._reorder = ReorderBuffer(cfg.in_order)
        self._exhausted = False
        # Non-persistent workers live as long as this iterator: break, del, garbage
        # collection and interpreter exit all stop them.
        self._stop = weakref.finalize(self, Session.close, session, True) if owns_session else None
        self._done = False
        self._splits = SplitPolicy(cfg, length, session)  # which batches are split (split_policy.py)

    def _produce(self) -> Any:
        if self._done:
            raise StopIteration
        if os.getpid() != self._session.owner_pid:
            raise ShmloadError("this iterator's workers belong to the process that created it (pid "
                               f"{self._session.owner_pid}), not to this forked child: call iter(loader) here")
        if self._session.iteration != self._iteration or self._session.closed:
            raise ShmloadError(_TAKEN_OVER)
        if self.schedule is None:
            self._begin()
        try:
            return self._next()
        except StopIteration:
            self.progress.finished = True
            self._finish()
            raise
        except ShmloadError:
            if self._session.closed:  # a worker died: nothing more will come
                self._finish()
            raise

    def _next(self) -> Any:
        deadline = None
        while True:
            self._fill()
            popped = self._reorder.pop()
            if popped is not None:
                if type(popped[1]) is Ended:
                    self.progress.end(popped[1].worker)
                    continue
                return self._yield(popped[1])
            if self._exhausted and len(self._reorder) == 0:
                raise StopIteration
            self._session.raise_if_stuck(self._reorder.head)
            wait = POLL_INTERVAL
            if self._splits.deadline is not None:
                wait = max(0.0, min(wait, self._splits.deadline - time.monotonic()))
                self._splits.deadline = None
            if self._cfg.timeout > 0:
                now = time.monotonic()
                deadline = deadline or now + self._cfg.timeout
                if now >= deadline:
                    raise self._timed_out()
                wait = min(wait, deadline - now)
            results = self._session.poll(wait)
            if self._session.closed:  # close() from another thread, waiting for this next() to let go
                raise ShmloadError(_TAKEN_OVER)
            for result in results:
                if type(result) is Ended:
                    self._sched.ended(result.worker)  # no more draws from it
                self._reorder.put(result.seq, result)
            if results:
                deadline = None

    def _fill(self) -> None:
        try:
            self._dispatch()
        finally:
            self._session.flush()  # the tasks of this round leave together, one write per worker

    def _dispatch(self) -> None:
        session = self._session
        if not session.worth_dispatching(session.outstanding - len(self._reorder)) or not session.ready_to_send():
            return
        schedule = self._sched
        while not self._exhausted and len(self._reorder) < session.outstanding:
            planned = schedule.peek()
            if planned is None:
                self._exhausted = True
                return
            if not self._send(planned):
                return
            self._reorder.expect(planned.seq)
            schedule.commit()

    def _send(self, planned: Planned) -> bool:
        """Dispatch one batch: whole, or in spans where workers would otherwise idle
        (parts.py), or always with ``split_batches=True``. False if it must wait."""
        session = self._session
        parts = self._cfg.parts_at(planned.seq, self._length)
        spans = (self._splits.spans(planned, parts, len(self._reorder)) if parts > 1 and planned.worker is None
                 else None)
        if spans is LATER:
            return False
        if spans:
            return session.try_dispatch_spans(self._number, planned.seq, planned.load, parts, spans)
        return session.try_dispatch(self._number, planned.seq, planned.load, planned.worker, parts)

    def _yield(self, result: Any) -> Any:
        self.progress.record(result.seq, result.stream)
        if type(result) is LoadFailed:
            raise result.error
        self._nbytes = result.layout.nbytes
        consumer = self._profile.consumer
        now = _clock()
        if self._tuner is not None:
            self._tuner.on_batch(self._session, self._profile, result.seq, now)
        if now >= consumer.next_sample:  # ring occupancy, at most every 5 ms
            self._session.collect_releases()  # so batches the consumer let go count as free
            consumer.sample_ring(self._session.ring.counts())
            self._profile.sample_memory(self._session)  # a worker's USS, now and then (profiler/memory.py)
        return self._session.deliver(result)

    def _pending(self) -> int:
        return len(self._reorder)  # dispatched, or ready, and not yet yielded

    def _timed_out(self) -> LoaderTimeoutError:
        missing = sorted(self._reorder.missing)
        planned = self._sched.peek()
        seq = missing[0] if missing else planned.seq if planned is not None else -1
        return LoaderTimeoutError(
            f"DataLoader timed out after {self._cfg.timeout:g} seconds waiting for batch {seq}: "
            f"{self._session.why_waiting(seq)}")

    def _finish(self) -> None:
        self._done = True
        if self._stop is not None:
            # workers stop at the end of the epoch, as torch's do; the finalizer stays armed
            # until close() has finished (NOTE [ A close() that did not finish ], session.py)
            self._session.close()
            self._stop.detach()
