"""One epoch: take tasks from the schedule, get them loaded, yield the batches in order.

:class:`Epoch` is what both epochs share: ``next()`` as one window, the epoch beginning
at its first batch, ``len()``, the profile's clock. :class:`SingleProcessEpoch` loads in
the calling process (``num_workers=0``); ``worker_epoch.MultiprocessEpoch`` has workers
load. The schedule (``schedule.py``) says what each task loads: a sampler's batches, or
draws from the workers' streams. Both epochs record what they delivered in ``progress``
(``resume.py``), from which ``DataLoader.state_dict()`` is made.

An exception raised while loading a batch is raised at that batch's position; the
iterator stays usable and the next ``next()`` yields the following batch.
"""

from __future__ import annotations

import threading
import time
import warnings
from typing import Any, Callable

from .._batching.collate import StackPlans, build_local
from .._core import _signals
from .._loading.loading import ENDED, BatchSource, BatchTimer, load_batch
from .._ordering import seeding
from .._ordering.schedule import Planned, Schedule
from .._ordering.stream import Stream
from .._session import lifetime
from .._session.config import LoaderConfig
from .._transport.messages import Draw, StreamPoint
from ..errors import ShmloadError, describe_load
from ..profiler.profile import Profile

_clock = time.perf_counter


class _Outcome:
    """What a next() interrupted as it ended had for its caller (NOTE [ An interrupt during next() ])."""

    __slots__ = ("value", "error")

    def __init__(self, value: Any, error: BaseException | None):
        self.value, self.error = value, error


class Epoch:
    """What both epoch iterators share: ``iter()`` returns itself, ``len()`` is the loader's,
    every ``next()`` is timed for the profiler (``profile.ConsumerClock``), and the epoch
    begins at the first ``next()`` (see NOTE [ An epoch begins at its first batch ] in
    loader.py): ``_claim()`` then gives its number, schedule and progress."""

    _length: int | None
    _profile: Profile
    _cfg: LoaderConfig
    _lock: Any  # one next() at a time: the session's lock, or the epoch's own
    _claim: Callable[[], tuple[int, Schedule, Any]]
    _nbytes = 0  # array bytes of the batch _produce() returned
    epoch: int | None = None
    schedule: Schedule | None = None  # None until the epoch begins
    progress: Any = None

    reported_len: int | None = None  # len(dataset) of an iterable source, if len(loader) was asked (loader.py)
    _yielded = 0
    _replay: _Outcome | None = None  # NOTE [ An interrupt during next() ]

    # NOTE [ torch's length warning ]
    # torch's iterator warns at every next() past what len(loader) reported, as long as
    # len(loader) was asked before the iterator was made (its _IterableDataset_len_called,
    # copied at iter()). Its figures are a quirk kept as they are: len(dataset), not the
    # batches len(loader) returned, against the batches this iterator yielded, which it
    # calls samples (they differ unless batch_size is None or 1). Scripts and torch's own
    # tests match its words and count its warnings, so they are torch's, each time, and
    # point at the line that called next() (stacklevel: this method, then __next__).
    def _check_reported_len(self, reported: int, stacklevel: int) -> None:
        self._yielded += 1
        if self._yielded > reported:
            warnings.warn(
                f"Length of IterableDataset {self._cfg.dataset} was reported to be {reported}(when "
                f"accessing len(dataloader)), but {self._yielded} samples have been fetched. "
                + ("For multiprocessing data-loading, this could be caused by not properly configuring the "
                   "IterableDataset replica at each worker. Please see "
                   "https://pytorch.org/docs/stable/data.html#torch.utils.data.IterableDataset for examples."
                   if self._cfg.num_workers > 0 else ""), UserWarning, stacklevel=stacklevel)

    def _begin(self) -> None:
        self.epoch, self.schedule, self.progress = self._claim()

    @property
    def _sched(self) -> Schedule:
        """The schedule, once the epoch has begun (its first ``next()``: _begin)."""
        assert self.schedule is not None, "the epoch has not begun"
        return self.schedule

    @property
    def _number(self) -> int:
        """The epoch's number, once it has begun."""
        assert self.epoch is not None, "the epoch has not begun"
        return self.epoch

    def at_end(self) -> bool | None:
        """Whether the batch ``next()`` returned last was the epoch's last, so the next
        ``next()`` raises StopIteration (what accelerate's gradient accumulation needs to
        know at that batch, see integrations/hf_accelerate.py). None when that cannot be
        known without waiting: an iterable source's end shows only when it is read."""
        if self.schedule is None:
            return False
        if self._cfg.iterable:
            return True if self.progress.finished else None
        return self.schedule.peek() is None and self._pending() == 0

    def _pending(self) -> int:
        return 0

    def __iter__(self) -> Epoch:
        return self

    # NOTE [ An interrupt during next() ]
    # next() is the loader's own bookkeeping plus one wait (for the workers; with
    # num_workers=0, the dataset's own code, which an interrupt must be able to cut; and
    # for another thread's next() of the same iterator or session), and an interrupt
    # (Ctrl-C, or a preemption handler's SystemExit) cutting the bookkeeping in two would
    # lose a batch or leave a slot, a task or a result half filed. So next() runs as one
    # window (_signals.py, NOTE [ Interrupts wait for a window ]) in which only those
    # waits are open to a signal's handler (nothing is half done there, and nothing was
    # taken: the same batch comes next). A signal that came during the bookkeeping is
    # handed on as next() ends, after the lock is given back, and the batch (or the
    # dataset's exception) this next() had ready is kept and is what the following next()
    # returns: going on with the same iterator yields every batch exactly once, and a
    # state saved meanwhile (the handler's checkpoint) counts a kept batch as not
    # delivered (progress.held). The window's close is next()'s last call, so in a `for`
    # loop the batch is bound to the loop's variable before any handler can run.
    def __next__(self) -> Any:
        # One next() at a time: threads sharing an iterator get each batch exactly once.
        entered = _signals.defer_signals()
        if entered < 0:  # another thread than the main one: Python runs handlers in the main one
            with self._lock:
                outcome = self._outcome()
        else:
            try:
                _signals.acquire(self._lock)
                try:
                    outcome = self._outcome()
                finally:
                    self._lock.release()
            except BaseException:  # an interrupt from a wait: nothing was taken
                _signals.resume_signals(entered)
                raise
            progress = self.progress if outcome.error is None else None
            self._replay = outcome  # kept if the close below hands on an interrupt that raises
            if progress is not None:
                progress.held = True  # until handed over: a state saved by the interrupt's handler has it to come
            _signals.resume_signals(entered)
            if progress is not None:
                progress.held = False
            self._replay = None
        if outcome.error is not None:  # (in-line: a call here would let a handler run, the batch kept by no one)
            error = outcome.error
            del outcome
            try:
                raise error
            finally:
                del error  # (this frame, in the error's traceback, must not hold the error: a cycle)
        return outcome.value

    def _outcome(self) -> _Outcome:
        """What this next() hands over: the batch (or error) a next() cut by an interrupt
        kept, else the next batch, or its error. An interrupt from a wait is raised."""
        replay = self._replay
        if replay is not None:
            self._replay = None
            if self.progress is not None:  # (None: the epoch's start raised)
                self.progress.held = False
            return replay
        try:
            batch = self._next_timed()
        except BaseException as exc:
            if _signals.raised_by_signal(exc):
                raise
            return _Outcome(None, exc)
        if self.reported_len is not None:
            self._check_reported_len(self.reported_len, 4)  # (pointing at the caller of next(): this, __next__, it)
        return _Outcome(batch, None)

    def _next_timed(self) -> Any:
        clock = self._profile.consumer
        entered = _clock()  # clock.enter(), in-line
        try:
            batch = self._produce()
        except BaseException:
            clock.ended(entered)
            raise
        clock.leave(entered, self._nbytes)
        if not self._cfg.iterable and self.at_end():
            # the epoch's last batch is out: a state saved now is the next epoch's start,
            # though the caller (a trainer that counts batches) may never ask for more
            self.progress.finished = True
        return batch

    def _produce(self) -> Any:
        raise NotImplementedError

    def __len__(self) -> int:
        if self._length is None:
            raise TypeError("this loader has no len(): its sampler (or iterable source) has none")
        return self._length


class SingleProcessEpoch(Epoch):
    """``num_workers=0``: each batch is loaded when asked for, in the calling process."""

    _cut_stream = False  # an interrupt cut the source's own code in a draw (_produce)

    def __init__(self, cfg: LoaderConfig, claim: Callable[[], tuple[int, Schedule, Any]], length: int | None,
                 profile: Profile, stream: Stream | None = None):
        self._cfg, self._claim, self._length = cfg, claim, length
        self._profile = profile
        self._stream = stream  # an iterable source's, kept by the loader across epochs
        self._source = BatchSource(cfg.dataset, cfg.collate_fn, cfg.auto_batch, cfg.seed, cfg.rank, stream,
                                   plans=StackPlans(), shuffle=cfg.stream_shuffle)
        self._timer = BatchTimer()
        self._key = object()  # this epoch, for the stream (which must not keep the iterator alive)
        self._lock = threading.Lock()
        # each array of a batch: copied into page-locked memory with pin_memory=True and CUDA
        # (there is no ring to pin: pinning.py), then made a tensor for output="torch"
        self._wrap: Callable[[Any], Any] | None = lifetime.to_torch if cfg.output == "torch" else None
        if cfg.pinner is not None:
            pin, wrap = cfg.pinner.copy, self._wrap
            self._wrap = pin if wrap is None else (lambda a: wrap(pin(a)))

    def _produce(self) -> Any:
        if self._cut_stream:
            raise ShmloadError(
                "this epoch's iterable source was interrupted inside its own code, which cannot be taken up "
                "where it was cut (a generator ends where an exception passes through it): to go on, call "
                "loader.load_state_dict(loader.state_dict()) and iterate again; the draw that was cut is read again")
        if self.schedule is None:
            self._begin()
        while True:
            planned = self._sched.peek()
            if planned is None:
                self.progress.finished = True
                raise StopIteration
            # The task is taken only once its load ended, in a batch or in the dataset's
            # exception (raised at its position, as with workers). An interrupt cutting
            # the dataset's code (NOTE [ An interrupt during next() ]) leaves it planned,
            # so the next next() loads the same batch again, with the same seeds, as the
            # saved state (which did not count it as delivered) says. A stream's draw
            # cannot be taken back from the source: one cut ends the iterator (above).
            draw = type(planned.load) is Draw
            if draw:
                self._sched.commit()
            try:
                batch = self._load(planned)  # (which takes the task as it records it: _consumed)
            except BaseException as exc:
                self._cut_stream = draw and _signals.raised_by_signal(exc)
                raise
            if batch is not ENDED:
                return batch

    def _load(self, planned: Planned) -> Any:
        """Load the batch in this process (loading.py, as a worker does), into fresh arrays.
        The profile counts it as an in-process "worker" with no wait for a task; as in a
        worker, a stage counts once it completes, and the rest (seeding, a failed stage)
        is "other"."""
        seq, load = planned.seq, planned.load
        draw = load if type(load) is Draw else None
        timer = self._timer
        timer.begin(seq, None)
        self._nbytes = 0
        ended = False
        try:
            with seeding.preserved_globals():
                try:
                    with _signals.interruptible():  # the dataset's and collate_fn's code
                        plan = load_batch(self._source, self._number, seq, load, self._key, timer,
                                          parts=self._cfg.parts_at(seq, self._length))
                    point = self._stream_of().point() if draw is not None and plan is not ENDED else None
                except StopIteration as exc:  # would silently end the caller's for-loop (cf. PEP 479)
                    raise RuntimeError(f"the dataset or collate_fn raised StopIteration while loading batch {seq} "
                                       f"({describe_load(load)})") from exc
            if plan is ENDED:
                ended = True
                self._sched.ended(0)
                self.progress.end(0)
                return ENDED
            timer.to_other()
            batch = build_local(plan, self._wrap)
            timer.to_collate()
            self._nbytes = timer.nbytes = plan.layout.nbytes
            self._consumed(seq, draw, point)
            return batch
        except Exception as exc:
            if _signals.raised_by_signal(exc):  # an interrupt, not the batch's error
                raise
            # raised at its position: consumed all the same, the next next() goes on
            self._consumed(seq, draw, None)
            raise
        finally:
            if not ended:
                timer.record(self._profile.inline)

    def _stream_of(self) -> Stream:
        """The iterable source's stream (a draw is only planned for one)."""
        assert self._stream is not None, "a draw without a stream"
        return self._stream

    def _consumed(self, seq: int, draw: Draw | None, point: StreamPoint | None) -> None:
        """Batch ``seq`` was loaded or raised its error: recorded, and its task taken (a
        draw's was taken before its load: _produce)."""
        if draw is None:
            self._sched.commit()
        elif point is None:  # the draw raised
            point = self._stream_of().point(failed=True)
        self.progress.record(seq, (0, point) if draw is not None else None)
