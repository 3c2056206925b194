"""The loader's settings, validated once and frozen, so no stage takes a long argument list."""

from __future__ import annotations

import numbers
import os
import warnings
from dataclasses import dataclass, field, fields
from functools import cached_property
from typing import Any, Callable

from .._batching.collate import default_collate
from .._batching.parts import DEFAULT_PARTS, MAX_PARTS, parts_of
from .._core import _platform
from .._core._checks import check_int
from .._ordering.distributed import NEEDS_IN_ORDER
from .._ordering.shuffle import StreamShuffle
from .._transport import pinning
from .._transport.shm import resolve_backend
from ..errors import OptionalDependencyError, ShmloadWarning


# NOTE [ One list of settings ]
# LoaderConfig's fields are the one list of what an epoch runs with. A field made by
# setting() is read from the DataLoader attribute of the same name (or ``attr``) at
# every iter(), after ``convert``: DataLoader's ``SETTINGS`` (setting one makes the
# next iter() read them all again) and ``read_settings()`` are derived from the fields,
# and a test checks that each such attribute is a keyword of DataLoader's signature.
# The other fields come from the loader's own state (its dataset as a source, its rank).
def setting(convert: Callable[[Any], Any] | None = None, attr: str | None = None, **kw: Any) -> Any:
    """A field read from the loader's attribute ``attr`` (default: the field's name)."""
    return field(metadata={"attr": attr, "convert": convert}, **kw)


def _nondefault_collate(fn: Any) -> Any:
    return None if fn is default_collate else fn


def _pinner(pin_memory: Any) -> Any:
    return pinning.choose(bool(pin_memory))[0]


@dataclass(frozen=True, kw_only=True)
class LoaderConfig:
    dataset: Any  # the dataset, or a generator function's GeneratorSource
    auto_batch: bool  # False with batch_size=None: one sample per step, nothing stacked
    collate_fn: Callable | None = setting(_nondefault_collate)  # None: the default collate, written into the slot
    num_workers: int = setting()  # with "auto": the most workers, the cap (auto_workers is True)
    max_workers: int | None = setting(default=None)  # num_workers="auto"'s cap; None: the usable cores
    auto_workers: bool = False  # num_workers="auto": the count changes as the loader runs (scaling.py)
    prefetch_factor: int | None = setting()  # None: 2, deeper for small batches (dispatch.prefetch_depth)
    persistent_workers: bool = setting(bool)
    timeout: float = setting(float)
    worker_init_fn: Callable | None = setting()
    in_order: bool = setting(bool)
    seed: int = setting()
    context: Any = setting(attr="multiprocessing_context")  # a multiprocessing context
    output: str = setting()  # "numpy" | "torch"
    slot_bytes: int | None = setting()
    max_shm_bytes: int | None = setting()
    shm_backend: str = setting(resolve_backend)  # "memfd" | "posix", resolved (shm.resolve_backend)
    max_worker_restarts: int = setting(default=0)
    rank: int = 0  # this process's rank in a distributed job, mixed into the batch seeds (seeding.py)
    iterable: bool = False  # the dataset is read as a stream (sources.py, stream.py)
    batch_size: int | None = setting(default=None)  # an iterable source's draws (a sampler batches a map-style one)
    drop_last: bool = setting(default=False)
    pinner: Any = setting(_pinner, attr="pin_memory", default=None)  # page-locks the ring's segments (pinning.py)
    split_batches: bool | None = setting(default=None)  # None: when workers would idle; True: always (parts.py)
    batch_parts: int = setting(default=DEFAULT_PARTS)
    stream_shuffle: StreamShuffle | None = None  # an iterable source's shuffle buffer and readers (shuffle.py)

    @cached_property  # (asked for every task; the settings are frozen and the dataset's class fixed)
    def parts(self) -> int:
        """Each batch's parts (NOTE [ Parts of a batch ], parts.py): 1 where a batch is never
        split, the collate or ``__getitems__`` making one result for the whole batch."""
        if (self.split_batches is False or self.iterable or not self.auto_batch or self.collate_fn is not None
                or hasattr(self.dataset, "__getitems__")):
            return 1
        return self.batch_parts

    def parts_at(self, seq: int, length: int | None) -> int:
        """Batch ``seq``'s parts in an epoch of ``length`` batches (``parts.parts_of``)."""
        return parts_of(seq, length, self.parts, self.split_batches is True)


AUTO = "auto"


def resolve_workers(settings: dict[str, Any], iterable: bool, cap: Callable[[int | None], int]) -> dict[str, Any]:
    """``settings`` (read_settings()) with num_workers="auto" turned into its cap, ``cap(max_workers)``,
    and auto_workers set. An iterable source's data depends on its worker count (a
    stream per worker), so it is refused one that changes."""
    if settings["num_workers"] != AUTO:
        return settings
    if iterable:
        raise ValueError("num_workers='auto' needs a map-style dataset: an iterable source is read as one stream "
                         "per worker, so its worker count decides which samples each batch holds; give a count "
                         "(num_workers=2, say)")
    return {**settings, "num_workers": cap(settings["max_workers"]), "auto_workers": True}


SETTINGS = tuple(f.metadata["attr"] or f.name for f in fields(LoaderConfig) if "attr" in f.metadata)


def read_settings(loader: Any) -> dict[str, Any]:
    """LoaderConfig's setting() fields, read from ``loader``'s attributes and converted."""
    out = {}
    for f in fields(LoaderConfig):
        if "attr" in f.metadata:
            value = getattr(loader, f.metadata["attr"] or f.name)
            convert = f.metadata["convert"]
            out[f.name] = convert(value) if convert is not None else value
    return out


def check_arguments(batch_size: Any, shuffle: Any, sampler: Any, batch_sampler: Any, drop_last: Any,
                    num_workers: Any, prefetch_factor: Any, seed: Any, generator: Any, multiprocessing_context: Any,
                    distributed: Any, max_workers: Any = None) -> tuple[int | None, bool]:
    """The constructor's checks, with torch's rules and words where torch has them; the
    ``batch_size`` and ``drop_last`` the loader takes (None and False with a batch_sampler)."""
    check_int("prefetch_factor", prefetch_factor, 1, allow_none=True)
    check_int("seed", seed, 0, allow_none=True)
    if not isinstance(drop_last, bool):  # torch's BatchSampler refuses other values, in these words
        raise ValueError(f"drop_last should be a boolean value, but got drop_last={drop_last!r}")
    if distributed not in (None, False, True):
        raise ValueError(f"distributed should be True, False or None, but got distributed={distributed!r}")
    if shuffle not in (None, False, True):
        raise ValueError(f"shuffle should be True, False or None, but got shuffle={shuffle!r}")
    if multiprocessing_context is not None and num_workers == 0:  # torch's check and words
        raise ValueError("multiprocessing_context can only be used with multi-process loading (num_workers > 0), "
                         f"but got num_workers={num_workers}")
    if max_workers is not None and num_workers != AUTO:  # (a count set later simply leaves it unused)
        raise ValueError(f"max_workers is the cap of num_workers='auto', but got num_workers={num_workers!r}: "
                         "pass num_workers='auto', or leave max_workers out")
    if generator is not None and seed is not None:
        raise ValueError("give seed= or generator=, not both: both choose the loader's random seed")

    if batch_sampler is not None:
        if batch_size != 1 or shuffle or sampler is not None or drop_last:
            raise ValueError("batch_sampler option is mutually exclusive with batch_size, shuffle, "
                             "sampler, and drop_last")
        batch_size, drop_last = None, False
    elif batch_size is None:
        if drop_last:
            raise ValueError("batch_size=None option disables auto-batching and is mutually exclusive "
                             "with drop_last")
    else:
        check_int("batch_size", batch_size, 1)
    if sampler is not None and shuffle:
        raise ValueError("sampler option is mutually exclusive with shuffle")
    return batch_size, drop_last


def check_settings(loader: Any) -> None:
    """The checks for every setting that may change after construction (``SETTINGS``)."""
    # (torch's words too, which scripts match: "num_workers option should be non-negative")
    if loader.num_workers != AUTO:
        check_int("num_workers", loader.num_workers, 0,
                  also="num_workers option should be non-negative; use num_workers=0 to disable multiprocessing, "
                       "or num_workers='auto'")
    _platform.check_supported(1 if loader.num_workers == AUTO else loader.num_workers)
    check_int("max_workers", loader.max_workers, 1, allow_none=True)  # (ignored without "auto": check_arguments)
    check_int("prefetch_factor", loader.prefetch_factor, 1, allow_none=True)
    check_int("seed", loader.seed, 0)
    check_int("slot_bytes", loader.slot_bytes, 1, allow_none=True)
    check_int("max_shm_bytes", loader.max_shm_bytes, 1, allow_none=True)
    check_int("max_worker_restarts", loader.max_worker_restarts, 0)
    check_int("batch_parts", loader.batch_parts, 1)
    if loader.batch_parts > MAX_PARTS:
        raise ValueError(f"batch_parts should be at most {MAX_PARTS}, but got batch_parts={loader.batch_parts!r}")
    if loader.split_batches not in (None, False, True):
        raise ValueError(f"split_batches should be True, False or None, but got split_batches={loader.split_batches!r}")
    # persistent_workers and in_order are taken for their truth, as torch takes them (1, 0, None)
    if getattr(loader, "elastic", False) and not loader.in_order:  # (as distributed.check_elastic at construction)
        raise ValueError(f"elastic=True {NEEDS_IN_ORDER}")
    timeout = loader.timeout
    if isinstance(timeout, bool) or not isinstance(timeout, numbers.Real) or timeout < 0:
        raise ValueError(f"timeout option should be non-negative, but got timeout={timeout!r}")
    for name in ("collate_fn", "worker_init_fn"):
        fn = getattr(loader, name)
        if fn is not None and not callable(fn):
            raise TypeError(f"{name} should be callable or None, but got {fn!r}")
    if loader.output not in ("numpy", "torch"):
        raise ValueError(f"output should be 'numpy' or 'torch', but got output={loader.output!r}")
    if loader.output == "torch":
        try:
            import torch  # noqa: F401  (only imported when asked for)
        except ImportError as exc:
            raise OptionalDependencyError("output='torch' needs torch: pip install torch==2.13.0 (the version "
                                          "shmload is tested with; or pip install 'shmload[torch]')") from exc


# NOTE [ torch's excessive-worker warning ]
# torch's DataLoader (check_worker_number_rationality) warns when num_workers exceeds the
# CPUs the process may use (_platform.cpu_count), at construction and again whenever an
# iterator starts workers: every iter() with num_workers > 0, only the first of a
# persistent loader (here also one whose workers restart for changed settings, since
# those are new workers). Scripts filter it by its words, and torch's tests expect it
# from the constructor, so it is given then, in those words. torch attributes it to its
# own lines, not the caller's, so Python's default filter shows it once per process and
# place however many loaders are made; it is attributed here to the loader's own lines
# (stacklevel 2: DataLoader.__init__ or __iter__) for the same effect.
def too_many_workers(num_workers: int | str) -> str | None:
    """torch's warning for ``num_workers`` workers, in its words; None if it has none
    ("auto" never runs more workers than cores are free)."""
    if not isinstance(num_workers, int) or not num_workers:
        return None
    cores = _platform.cpu_count()
    if cores is not None and num_workers <= cores:
        return None
    if cores is None:
        suggested = "DataLoader is not able to compute a suggested max number of worker in current system."
    else:
        unchecked = "" if hasattr(os, "sched_getaffinity") else " (`cpuset` is not taken into account)"
        suggested = (f"Our suggested max number of worker in current system is {cores}{unchecked}, which is smaller "
                     "than what this DataLoader is going to create.")
    return (f"This DataLoader will create {num_workers} worker processes in total. {suggested} Please be aware that "
            "excessive worker creation might get DataLoader running slow or even freeze, lower the worker number to "
            "avoid potential slowness/freeze if necessary.")


def warn_too_many_workers(num_workers: int | str) -> None:
    """Give torch's excessive-worker warning if it applies (NOTE above), attributed to the caller."""
    message = too_many_workers(num_workers)
    if message is not None:
        warnings.warn(message, UserWarning, stacklevel=2)


def iter_warnings(pin_memory: Any, pin_memory_device: str) -> list[tuple[str, type]]:
    """The warnings torch's DataLoader gives when an iterator is made, in its words
    (scripts filter them by message), as (message, category)."""
    out: list[tuple[str, type]] = []
    if pin_memory:
        pin_note = pinning.choose(True)[1]
        if pin_memory_device:
            out.append(("pin_memory_device is deprecated, the current accelerator will be used as the device,"
                        f"ignore pin_memory_device='{pin_memory_device}'.", UserWarning))
        if pin_note == pinning.NO_ACCELERATOR:
            out.append((pin_note, UserWarning))  # torch's
        elif pin_note:
            out.append((pin_note, ShmloadWarning))
    return out
