"""Iterable sources: datasets read as streams (``__iter__``, no ``__getitem__``), and how
the loader tells them from map-style datasets.

Each worker iterates its own copy of the source: a ``torch.utils.data.IterableDataset``,
a tensorpack-style DataFlow (whose ``reset_state()`` is called once per worker, before
its first iteration), or a generator function wrapped by :class:`GeneratorSource`. A
source shards itself by reading :func:`shmload.get_worker_info` (or torch's, which
reports the same worker, :func:`share_worker_info_with_torch`) or :func:`stream_parts`
(stream.py): without that, every worker reads the whole stream, as with torch.
"""

from __future__ import annotations

import inspect
import numbers
from typing import Any, Callable, Iterator

from .._core._torch import loaded_torch


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
    return getattr(getattr(loaded_torch(), "utils", None), "data", None)


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
    it is, an iterable source as it is, a generator function wrapped (below)."""
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


def check_stream_options(shuffle: Any, sampler: Any, batch_sampler: Any, shuffle_buffer: int | None) -> None:
    """An iterable source is read in its own order unless a shuffle buffer (of more than
    one sample) is given: as torch, refuse the options that order a map-style dataset;
    ``shuffle=True`` is taken together with such a buffer, and ``shuffle=False``
    contradicts one. (Other values of ``shuffle`` are config.check_arguments' to refuse.)"""
    shuffles = shuffle_buffer is not None and shuffle_buffer > 1
    if shuffle is False and shuffles:
        raise ValueError(f"DataLoader with an iterable source: shuffle=False contradicts shuffle_buffer="
                         f"{shuffle_buffer!r}, which shuffles the stream. Leave shuffle unspecified")
    for name, value in (("shuffle", shuffle), ("sampler", sampler), ("batch_sampler", batch_sampler)):
        if value not in (None, False) and not (name == "shuffle" and shuffles):
            raise ValueError(f"DataLoader with an iterable source: expected unspecified {name} option, but got "
                             f"{name}={value!r}. A stream is read in its own order: shuffle it with a shuffle "
                             "buffer (shuffle_buffer=N samples per worker, N above 1, for example 10000), or "
                             "give a map-style dataset")


def check_shuffle_buffer(shuffle_buffer: Any, iterable: bool) -> None:
    if shuffle_buffer is None:
        return
    if isinstance(shuffle_buffer, bool) or not isinstance(shuffle_buffer, numbers.Integral) or shuffle_buffer < 0:
        raise ValueError(f"shuffle_buffer should be a non-negative int (samples per worker stream) or None, "
                         f"but got shuffle_buffer={shuffle_buffer!r}")
    if shuffle_buffer and not iterable:
        raise ValueError(f"shuffle_buffer={shuffle_buffer!r} is for iterable sources (datasets read as streams); "
                         "a map-style dataset is shuffled by shuffle=True (or a sampler)")


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
