"""Iterable sources: datasets read as streams (``__iter__``, no ``__getitem__``).

Each worker iterates its own copy of the source: a ``torch.utils.data.IterableDataset``,
a tensorpack-style DataFlow (whose ``reset_state()`` is called once per worker, before
its first iteration), or a generator function wrapped by :class:`GeneratorSource`. A
source shards itself by reading :func:`shmload.get_worker_info` (or torch's, which
reports the same worker): without that, every worker reads the whole stream, as with
torch. The main process decides whose batch comes next (``schedule.RoundRobinSchedule``);
this module is the worker's side: one :class:`Stream` per worker, which turns a
:class:`~shmload.messages.Draw` into the samples of one batch.
"""

from __future__ import annotations

import inspect
import itertools
import sys
from typing import Any, Callable, Iterator

from .messages import Draw, StreamPoint


class GeneratorSource:
    """An iterable source made by a function: each worker's every epoch iterates
    ``fn(*args, **kwargs)``. ``length`` (optional) is the number of samples, for ``len()``.

    Pass the function, not a generator object: a generator can be iterated once, by one
    process. Under the spawn and forkserver start methods ``fn`` must be importable (a
    module-level function)."""

    def __init__(self, fn: Callable[..., Any], *args: Any, length: int | None = None, **kwargs: Any):
        if not callable(fn):
            raise TypeError(f"GeneratorSource needs a function that returns an iterator, but got {fn!r}")
        self.fn, self.args, self.kwargs, self.length = fn, args, kwargs, length

    def __iter__(self) -> Iterator[Any]:
        return iter(self.fn(*self.args, **self.kwargs))

    def __len__(self) -> int:
        if self.length is None:
            raise TypeError(f"GeneratorSource({getattr(self.fn, '__name__', self.fn)!r}) has no length: "
                            "pass length= for len()")
        return self.length

    def __repr__(self) -> str:
        return f"GeneratorSource({getattr(self.fn, '__qualname__', self.fn)})"


def _torch_data() -> Any:
    """``torch.utils.data`` if torch is imported already, else None (never imports it)."""
    return getattr(getattr(sys.modules.get("torch"), "utils", None), "data", None)


def is_iterable_source(dataset: Any) -> bool:
    """Is ``dataset`` read as a stream? A torch IterableDataset always is (torch's Dataset
    base class defines a ``__getitem__`` that only raises); otherwise anything with
    ``__iter__`` and no ``__getitem__``."""
    iterable_type = getattr(_torch_data(), "IterableDataset", None)
    if iterable_type is not None and isinstance(dataset, iterable_type):
        return True
    return hasattr(dataset, "__iter__") and not hasattr(dataset, "__getitem__")


def as_source(dataset: Any) -> Any:
    """The dataset, or a generator function wrapped as a :class:`GeneratorSource`; a
    generator object is refused with the fix.

    An object that is its own iterator (``__iter__`` returns ``self``, as many torch
    IterableDatasets do) is accepted, as torch accepts it: each worker iterates its own
    copy, and with ``num_workers=0`` the object itself is iterated. A generator object
    is the exception: it cannot be pickled to a spawned worker, and a copy (a forked one)
    would re-run the same frame in every worker."""
    if inspect.isgenerator(dataset) or inspect.isasyncgen(dataset) or inspect.iscoroutine(dataset):
        raise TypeError(
            f"the dataset is an iterator ({type(dataset).__name__}), which can be read once, by one process. "
            "Pass a function that makes it (DataLoader(make_iter) or shmload.GeneratorSource(make_iter, ...)), "
            "or an object whose __iter__ starts a fresh iteration")
    if callable(dataset) and not hasattr(dataset, "__iter__") and not hasattr(dataset, "__getitem__"):
        return GeneratorSource(dataset)
    return dataset


def classify(dataset: Any) -> tuple[Any, bool]:
    """(the dataset to load from, whether it is read as a stream): a map-style dataset as
    it is, an iterable source as it is, a generator function wrapped (iterable.py)."""
    if not hasattr(dataset, "__getitem__") or is_iterable_source(dataset):
        dataset = as_source(dataset)
        if hasattr(dataset, "__iter__"):
            return dataset, True
    missing = [m for m in ("__getitem__", "__len__") if not hasattr(dataset, m)]
    if missing:
        raise TypeError(f"dataset should be a map-style dataset (with __getitem__ and __len__), an iterable "
                        f"source (with __iter__) or a function returning an iterator, but "
                        f"{type(dataset).__name__} has no {' or '.join(missing)}")
    return dataset, False


def check_stream_options(shuffle: Any, sampler: Any, batch_sampler: Any) -> None:
    """An iterable source decides its own order: as torch, refuse the options that order."""
    for name, value in (("shuffle", shuffle), ("sampler", sampler), ("batch_sampler", batch_sampler)):
        if value not in (None, False):
            raise ValueError(f"DataLoader with an iterable source: expected unspecified {name} option, but got "
                             f"{name}={value!r}. A stream is read in its own order; shuffle inside it "
                             "(for example with a shuffle buffer), or give a map-style dataset")


class Stream:
    """One worker's stream over its copy of the source, for one epoch at a time.

    ``seed(number)`` seeds the global RNGs for draw ``number``; the stream calls it for
    the draws it skips, so a skipped draw consumes the same randomness as when it was
    first made (a worker restarted without the source's state re-reads up to where its
    predecessor was)."""

    def __init__(self, source: Any):
        self.source = source
        reset = getattr(source, "reset_state", None)
        if callable(reset):  # tensorpack's DataFlow: once per process, before iterating
            reset()
        self._epoch_key: Any = None
        self._it: Iterator[Any] | None = None
        self._draws = 0  # draws made this epoch
        self._ended = False

    @property
    def draws(self) -> int:
        return self._draws

    def state(self) -> Any:
        """The source's ``state_dict()`` now, or None if it has none."""
        state_dict = getattr(self.source, "state_dict", None)
        return state_dict() if callable(state_dict) else None

    def point(self, failed: bool = False) -> StreamPoint:
        """Where the stream is after a draw: the draws made and the source's state. After
        a draw that raised (``failed``), a state that cannot be had either is None."""
        try:
            return StreamPoint(self._draws, self.state())
        except Exception:
            if not failed:
                raise
            return StreamPoint(self._draws, None)

    def draw(self, epoch_key: Any, draw: Draw, seed: Callable[[int], None]) -> Any:
        """The samples of ``draw`` (a list, or one sample when unbatched), or None if the
        stream has ended. ``epoch_key`` changes with every epoch: a new key starts a new
        iteration of the source (where ``draw.restore`` says)."""
        if epoch_key != self._epoch_key:
            self._begin(epoch_key, draw.restore)
        while self._draws < draw.number and not self._ended:  # catch up: see StreamPoint
            seed(self._draws)
            try:
                self._take(draw)
            except Exception:
                pass  # reported when the draw was first made
        if self._ended:  # (also if it ended while catching up: a stream read again may be shorter)
            self._draws = max(self._draws, draw.number) + 1
            return None
        if self._draws != draw.number:
            raise RuntimeError(f"{draw.describe()} came after draw {self._draws - 1}: draws go in order")
        seed(draw.number)
        return self._take(draw)

    def _begin(self, epoch_key: Any, restore: StreamPoint | None) -> None:
        """Start the epoch's iteration. If the source cannot start (its ``iter()`` or
        ``load_state_dict()`` raises), the error is this draw's and the stream is ended:
        never read on from the previous epoch's iterator."""
        self._epoch_key = epoch_key
        self._it = None
        self._ended = True
        self._draws = 0
        if restore is not None and restore.state is not None:
            self.source.load_state_dict(restore.state)
            self._draws = restore.draws
        self._it = iter(self.source)
        self._ended = False

    def _take(self, draw: Draw) -> Any:
        self._draws += 1
        if self._ended:
            return None
        try:
            if draw.size is None:
                return next(self._it)
            # next() draw.size times, in C. Not islice(): it calls iter() on what it is
            # given, and a source that is its own iterator may start over in __iter__.
            samples = list(map(next, itertools.repeat(self._it, draw.size)))
        except StopIteration:
            self._ended = True
            return None
        # (an exception from the source propagates: it is this draw's error, and the next
        # draw asks the iterator again; a generator that raised is finished, so it ends)
        if len(samples) < draw.size:
            self._ended = True  # stopped early: the source is exhausted
            if not samples or draw.drop_last:
                return None
        return samples


def share_worker_info_with_torch(worker_id: int, num_workers: int, seed: int, dataset: Any) -> bool:
    """Make ``torch.utils.data.get_worker_info()`` report this shmload worker, so torch
    IterableDatasets that shard themselves work unchanged. Only if torch is imported
    already (importing it costs a worker about a second); True once done."""
    worker_module = getattr(getattr(_torch_data(), "_utils", None), "worker", None)
    if worker_module is None:
        return False
    try:
        # torch gives each worker base_seed + id; so do we (shmload's own seeds are per batch)
        info = worker_module.WorkerInfo(id=worker_id, num_workers=num_workers,
                                        seed=(seed + worker_id) % 2**64, dataset=dataset)
    except TypeError:
        return False  # another torch whose WorkerInfo takes other fields: leave it alone
    worker_module._worker_info = info
    return True
