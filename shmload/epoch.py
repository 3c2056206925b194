"""One epoch: pull index batches from the sampler, get them loaded, yield them in order.

:class:`SingleProcessEpoch` loads in the calling process (``num_workers=0``).
:class:`MultiprocessEpoch` keeps up to ``num_workers * prefetch_factor`` batches
(``Session.outstanding``) outstanding (dispatched or ready but not yet yielded, as torch counts them), feeds
results through a :class:`ReorderBuffer`, and yields views into the ring.

An exception raised while loading a batch is raised at that batch's position; the
iterator stays usable and the next ``next()`` yields the following batch.
"""

from __future__ import annotations

import os
import time
import weakref
from typing import Any, Iterator

from . import layout as _layout
from . import lifetime, seeding
from .collate import make_plan
from .config import LoaderConfig
from .errors import LoaderTimeoutError, ShmloadError, format_indices
from .fetch import fetch
from .reorder import ReorderBuffer
from .profile import Profile
from .session import LoadFailed, Session

POLL_INTERVAL = 0.5  # how often a waiting iterator re-checks released slots
_clock = time.perf_counter


class _Epoch:
    """What both epoch iterators share: ``iter()`` returns itself, ``len()`` is the loader's,
    and every ``next()`` is timed for the profiler (``profile.ConsumerClock``)."""

    _length: int | None
    _profile: Profile
    _nbytes = 0  # array bytes of the batch _produce() returned

    def __iter__(self) -> _Epoch:
        return self

    def __next__(self) -> Any:
        clock = self._profile.consumer
        entered = _clock()  # clock.enter(), in-line
        try:
            batch = self._produce()
        except BaseException:
            clock.ended(entered)
            raise
        clock.leave(entered, self._nbytes)
        return batch

    def _produce(self) -> Any:
        raise NotImplementedError

    def __len__(self) -> int:
        if self._length is None:
            raise TypeError("this loader's sampler has no len()")
        return self._length


class SingleProcessEpoch(_Epoch):
    def __init__(self, cfg: LoaderConfig, batches: Iterator, epoch: int, length: int | None, profile: Profile):
        self._cfg, self._batches, self._epoch, self._length = cfg, batches, epoch, length
        self._profile = profile
        self._seq = 0

    def _produce(self) -> Any:
        indices = next(self._batches)
        seq, self._seq = self._seq, self._seq + 1
        cfg = self._cfg
        # The profile's in-process "worker": no wait for a task; as in a worker, a stage
        # counts once it completes, and the rest (seeding, a failed stage) is "other".
        started = _clock()
        fetch_s = collate_s = 0.0
        self._nbytes = 0
        try:
            with seeding.preserved_globals():
                seeding.seed_globals(cfg.seed, self._epoch, seq)
                try:
                    t0 = _clock()
                    samples = fetch(cfg.dataset, indices, cfg.auto_batch)
                    t1 = _clock()
                    fetch_s = t1 - t0
                    plan = make_plan(samples, indices, cfg.collate_fn, cfg.auto_batch)
                except StopIteration as exc:  # would silently end the caller's for-loop (cf. PEP 479)
                    raise RuntimeError(f"the dataset or collate_fn raised StopIteration while loading batch {seq} "
                                       f"(dataset indices {format_indices(indices)})") from exc
            batch = _layout.build_local(plan, lifetime.to_torch if cfg.output == "torch" else None)
            collate_s = _clock() - t1
            self._nbytes = plan.layout.nbytes
            return batch
        finally:
            samples_n = len(indices) if cfg.auto_batch else 1
            self._profile.inline.batch(seq, started, started, fetch_s, collate_s, _clock(), samples_n, self._nbytes)


class MultiprocessEpoch(_Epoch):
    def __init__(self, cfg: LoaderConfig, session: Session, owns_session: bool,
                 batches: Iterator, epoch: int, length: int | None, loader: Any, profile: Profile):
        self._loader = loader  # `for b in DataLoader(...)`: the loader must live as long as this
        self._profile = profile
        self._cfg, self._session, self._batches = cfg, session, batches
        self._epoch, self._length = epoch, length
        self._iteration = session.begin_iteration()
        self._reorder = ReorderBuffer(cfg.in_order)
        self._next_seq = 0
        self._pending: Any = None  # indices pulled from the sampler, not yet dispatched
        self._exhausted = False
        # Non-persistent workers live as long as this iterator: break, del, garbage
        # collection and interpreter exit all stop them.
        self._stop = weakref.finalize(self, Session.close, session) if owns_session else None
        self._done = False

    def _produce(self) -> Any:
        if self._done:
            raise StopIteration
        if os.getpid() != self._session.owner_pid:
            raise ShmloadError("this iterator's workers belong to the process that created it (pid "
                               f"{self._session.owner_pid}), not to this forked child: call iter(loader) here")
        if self._session.iteration != self._iteration or self._session.closed:
            raise ShmloadError("this iterator can no longer be used: a newer iter() of the same loader "
                               "(persistent_workers=True) or close() took over its workers")
        try:
            return self._next()
        except StopIteration:
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
                return self._yield(popped[1])
            if self._exhausted and len(self._reorder) == 0:
                raise StopIteration
            self._session.check_progress(self._reorder.head)
            wait = POLL_INTERVAL
            if self._cfg.timeout > 0:
                now = time.monotonic()
                deadline = deadline or now + self._cfg.timeout
                if now >= deadline:
                    raise self._timed_out()
                wait = min(wait, deadline - now)
            results = self._session.poll(wait)
            for result in results:
                self._reorder.put(result.seq, result)
            if results:
                deadline = None

    def _fill(self) -> None:
        try:
            self._dispatch()
        finally:
            self._session.flush()  # the tasks of this round leave together, one write per worker

    def _dispatch(self) -> None:
        while not self._exhausted and len(self._reorder) < self._session.outstanding:
            if self._pending is None:
                try:
                    self._pending = next(self._batches)
                except StopIteration:
                    self._exhausted = True
                    return
            if not self._session.try_dispatch(self._epoch, self._next_seq, self._pending):
                return
            self._reorder.expect(self._next_seq)
            self._next_seq += 1
            self._pending = None

    def _yield(self, result: Any) -> Any:
        if type(result) is LoadFailed:
            raise result.error
        self._nbytes = result.layout.nbytes
        consumer = self._profile.consumer
        if _clock() >= consumer.next_sample:  # ring occupancy, at most every 5 ms
            self._session.collect_releases()  # so batches the consumer let go count as free
            consumer.sample_ring(self._session.ring)
        return self._session.deliver(result)

    def _timed_out(self) -> LoaderTimeoutError:
        missing = sorted(self._reorder.missing)
        seq = missing[0] if missing else self._next_seq
        return LoaderTimeoutError(
            f"DataLoader timed out after {self._cfg.timeout} seconds waiting for batch {seq}: "
            f"{self._session.holder_of(seq)}")

    def _finish(self) -> None:
        self._done = True
        if self._stop is not None:
            self._stop()  # workers stop at the end of the epoch, as torch's do
