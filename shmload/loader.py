"""The DataLoader: validates its arguments once, then wires sampler, session and epoch.

The constructor mirrors ``torch.utils.data.DataLoader`` (same positional order, same
keywords, same mutual-exclusion rules and messages), so swapping the import is a
one-line change. Keywords torch has and shmload cannot honour are refused when given a
non-default value, never silently ignored.
"""

from __future__ import annotations

import numbers
import sys
import weakref
from typing import Any

from . import _platform, seeding
from ._checks import check_int
from .collate import default_collate
from .config import LoaderConfig
from .dispatch import DEFAULT_PREFETCH
from .epoch import MultiprocessEpoch, SingleProcessEpoch
from .errors import OptionalDependencyError
from .profile import Profile
from .sampler import BatchSampler, RandomSampler, SequentialSampler
from .session import RestartBudget, Session
from .stats import LoaderStats
from .supervisor import owned_here

_FROZEN_AFTER_INIT = ("dataset", "batch_size", "batch_sampler", "sampler", "drop_last", "persistent_workers")
# Read again at the next iter(), as torch does: setting them takes effect then.
_SETTINGS = ("num_workers", "collate_fn", "prefetch_factor", "timeout", "worker_init_fn", "multiprocessing_context",
             "in_order", "seed", "output", "slot_bytes", "max_shm_bytes", "max_worker_restarts")


def _check_map_style(dataset: Any) -> None:
    torch = sys.modules.get("torch")
    iterable_type = getattr(getattr(getattr(torch, "utils", None), "data", None), "IterableDataset", None)
    if iterable_type is not None and isinstance(dataset, iterable_type):
        raise ValueError("shmload.DataLoader takes map-style datasets (with __getitem__ and __len__); "
                         f"{type(dataset).__name__} is a torch IterableDataset, which is not supported yet")
    missing = [m for m in ("__getitem__", "__len__") if not hasattr(dataset, m)]
    if missing:
        raise TypeError(f"dataset should be a map-style dataset with __getitem__ and __len__, but "
                        f"{type(dataset).__name__} has no {' or '.join(missing)}")


def _check_bool(name: str, value: Any) -> None:
    if not isinstance(value, bool):
        raise ValueError(f"{name} should be True or False, but got {name}={value!r}")


class _Sessions:
    """The loader's live sessions, kept apart from the loader so its finalizer can close them."""

    def __init__(self) -> None:
        self.persistent: Session | None = None
        self.live: weakref.WeakSet[Session] = weakref.WeakSet()
        self.restarts = RestartBudget()  # max_worker_restarts counts per loader, across its sessions
        self.profile = Profile()  # always on: see profile.py and loader.stats()

    def close(self) -> None:
        for session in list(self.live):
            session.close()
        self.persistent = None


class DataLoader:
    """Loads batches from a map-style dataset with worker processes writing into shared memory.

    See the README's API table for every argument; those shared with
    ``torch.utils.data.DataLoader`` mean what they mean there. Yielded arrays are views
    into shared memory, valid for as long as you hold them (see docs/architecture.md).
    """

    def __init__(self, dataset: Any, batch_size: int | None = 1, shuffle: bool | None = None,
                 sampler: Any = None, batch_sampler: Any = None, num_workers: int = 0,
                 collate_fn: Any = None, pin_memory: bool = False, drop_last: bool = False,
                 timeout: float = 0, worker_init_fn: Any = None, multiprocessing_context: Any = None,
                 generator: Any = None, *, prefetch_factor: int | None = None,
                 persistent_workers: bool = False, pin_memory_device: str = "", in_order: bool = True,
                 seed: int | None = None, output: str = "numpy", slot_bytes: int | None = None,
                 max_shm_bytes: int | None = None, max_worker_restarts: int = 0):
        _check_map_style(dataset)
        check_int("prefetch_factor", prefetch_factor, 1, allow_none=True)
        check_int("seed", seed, 0, allow_none=True)
        for name, flag in (("persistent_workers", persistent_workers), ("drop_last", drop_last)):
            _check_bool(name, flag)
        if shuffle not in (None, False, True):
            raise ValueError(f"shuffle should be True, False or None, but got shuffle={shuffle!r}")
        if pin_memory:
            raise ValueError("pin_memory=True is not supported: shmload yields views into shared memory, "
                             "which it does not page-lock per batch. Pin what you transfer yourself "
                             "(tensor.pin_memory()), or leave pin_memory=False.")
        if pin_memory_device:
            raise ValueError(f"pin_memory_device={pin_memory_device!r} is not supported (pin_memory is not)")
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

        self.seed = int(seed) if seed is not None else seeding.draw_base_seed(generator)
        self._own_sampler = sampler is None
        if sampler is None:
            sampler = RandomSampler(dataset, self.seed) if shuffle else SequentialSampler(dataset)
        auto_batch = batch_size is not None or batch_sampler is not None
        if batch_size is not None and batch_sampler is None:
            batch_sampler = BatchSampler(sampler, batch_size, drop_last)
        if collate_fn is None and auto_batch:
            collate_fn = default_collate

        self.dataset = dataset
        self.batch_size = batch_size
        self.drop_last = drop_last
        self.sampler = sampler
        self.batch_sampler = batch_sampler
        self.num_workers = num_workers
        self.collate_fn = collate_fn
        self.prefetch_factor = prefetch_factor  # None: automatic (see dispatch.prefetch_depth)
        self.persistent_workers = persistent_workers
        self.pin_memory = False
        self.pin_memory_device = ""
        self.timeout = timeout
        self.worker_init_fn = worker_init_fn
        self.multiprocessing_context = multiprocessing_context
        self.generator = generator
        self.in_order = in_order
        self.output = output
        self.slot_bytes = slot_bytes
        self.max_shm_bytes = max_shm_bytes
        self.max_worker_restarts = max_worker_restarts
        self._auto_batch = auto_batch
        self._cfg: LoaderConfig | None = None  # built from the attributes at the next iter()
        self._config()  # check the settings now, not at the first iter()
        self._next_epoch = 0
        self._sessions = _Sessions()
        self._finalizer = weakref.finalize(self, _Sessions.close, self._sessions)
        self._initialized = True

    def __setattr__(self, name: str, value: Any) -> None:
        if getattr(self, "_initialized", False):
            if name in _FROZEN_AFTER_INIT:
                raise ValueError(f"{name} attribute should not be set after {type(self).__name__} is initialized")
            if name in _SETTINGS:
                super().__setattr__("_cfg", None)
        super().__setattr__(name, value)

    def _config(self) -> LoaderConfig:
        """The settings for the next epoch, checked again since attributes may have been set."""
        if self._cfg is None:
            self._check_settings()
            if self.num_workers > 0 and not hasattr(self.multiprocessing_context, "get_start_method"):
                self.multiprocessing_context = _platform.resolve_context(self.multiprocessing_context)
            collate_fn = self.collate_fn
            self._cfg = LoaderConfig(
                dataset=self.dataset, auto_batch=self._auto_batch,
                collate_fn=None if collate_fn is default_collate else collate_fn,
                num_workers=self.num_workers, prefetch_factor=self.prefetch_factor,
                persistent_workers=self.persistent_workers, timeout=float(self.timeout),
                worker_init_fn=self.worker_init_fn, in_order=self.in_order, seed=self.seed,
                context=self.multiprocessing_context, output=self.output, slot_bytes=self.slot_bytes,
                max_shm_bytes=self.max_shm_bytes, max_worker_restarts=self.max_worker_restarts)
        return self._cfg

    def _check_settings(self) -> None:
        """The checks for every setting that may change after construction (``_SETTINGS``)."""
        check_int("num_workers", self.num_workers, 0)
        check_int("prefetch_factor", self.prefetch_factor, 1, allow_none=True)
        check_int("seed", self.seed, 0)
        check_int("slot_bytes", self.slot_bytes, 1, allow_none=True)
        check_int("max_shm_bytes", self.max_shm_bytes, 1, allow_none=True)
        check_int("max_worker_restarts", self.max_worker_restarts, 0)
        _check_bool("in_order", self.in_order)
        timeout = self.timeout
        if isinstance(timeout, bool) or not isinstance(timeout, numbers.Real) or timeout < 0:
            raise ValueError(f"timeout option should be non-negative, but got timeout={timeout!r}")
        for name in ("collate_fn", "worker_init_fn"):
            fn = getattr(self, name)
            if fn is not None and not callable(fn):
                raise TypeError(f"{name} should be callable or None, but got {fn!r}")
        if self.output not in ("numpy", "torch"):
            raise ValueError(f"output should be 'numpy' or 'torch', but got output={self.output!r}")
        if self.output == "torch":
            try:
                import torch  # noqa: F401  (only imported when asked for)
            except ImportError as exc:
                raise OptionalDependencyError("output='torch' needs torch: pip install torch==2.13.0 (the version "
                                              "shmload is tested with; or pip install 'shmload[torch]')") from exc

    # ------------------------------------------------------------ iteration
    def __iter__(self) -> SingleProcessEpoch | MultiprocessEpoch:
        epoch = self._next_epoch
        self._next_epoch += 1
        if self._own_sampler and isinstance(self.sampler, RandomSampler):
            self.sampler.set_epoch(epoch)
        cfg = self._config()
        batches = iter(self.batch_sampler) if cfg.auto_batch else iter(self.sampler)
        length = self._length()
        sessions = self._sessions
        if sessions.persistent is not None and not owned_here(sessions.persistent.owner_pid):
            sessions.persistent = None  # inherited through a fork: those workers are not ours
            sessions.live = weakref.WeakSet()
        if sessions.persistent is not None and sessions.persistent.cfg is not cfg:
            sessions.persistent.close()  # settings changed since its workers started
            sessions.persistent = None
        if cfg.num_workers == 0:
            return SingleProcessEpoch(cfg, batches, epoch, length, sessions.profile)
        if cfg.persistent_workers:
            if sessions.persistent is None or sessions.persistent.closed:
                sessions.persistent = Session(cfg, sessions.restarts, sessions.profile)
                sessions.live.add(sessions.persistent)
            return MultiprocessEpoch(cfg, sessions.persistent, False, batches, epoch, length, self, sessions.profile)
        session = Session(cfg, sessions.restarts, sessions.profile)
        sessions.live.add(session)
        return MultiprocessEpoch(cfg, session, True, batches, epoch, length, self, sessions.profile)

    def _length(self) -> int | None:
        try:
            return len(self)
        except TypeError:
            return None

    def __len__(self) -> int:
        return len(self.batch_sampler) if self.batch_sampler is not None else len(self.sampler)

    def set_epoch(self, epoch: int) -> None:
        """Make the next ``iter()`` epoch ``epoch`` (later ones continue epoch+1, ...); also
        forwarded to a sampler or batch sampler of yours that has ``set_epoch``."""
        check_int("epoch", epoch, 0)
        self._next_epoch = int(epoch)
        if not self._own_sampler and hasattr(self.sampler, "set_epoch"):
            self.sampler.set_epoch(epoch)
        if self.batch_sampler is not None and not isinstance(self.batch_sampler, BatchSampler) \
                and hasattr(self.batch_sampler, "set_epoch"):
            self.batch_sampler.set_epoch(epoch)

    # ------------------------------------------------------------ profile
    def stats(self, memory: bool = True) -> LoaderStats:
        """A frozen snapshot of the profile since the loader was created or since the
        last :meth:`reset_stats`: per worker, its time per stage and utilization; for the
        consumer, its time waiting in ``next()`` (the data stall) and between calls;
        throughput, ring occupancy, CPU and memory per process. ``print()`` it for a
        table and a diagnosis with a recommendation; see docs/profiling.md.

        Works during and after an epoch. ``memory=False`` skips reading each process's
        memory map (PSS/USS), which takes a few milliseconds per process."""
        return self._sessions.profile.snapshot(self.num_workers, self.prefetch_factor or DEFAULT_PREFETCH,
                                               memory=memory)

    def reset_stats(self) -> None:
        """Start a new profile window now (``loader.stats().reset()`` does the same)."""
        self._sessions.profile.reset()

    # ------------------------------------------------------------ lifetime
    def close(self) -> None:
        """Stop the workers and release the loader's shared memory. Batches you still hold
        stay valid. Iterating again afterwards starts new workers."""
        self._sessions.close()

    def __enter__(self) -> DataLoader:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def __repr__(self) -> str:
        if self.num_workers == 0:
            where = "loading in the main process"
        else:
            method = self.multiprocessing_context.get_start_method()
            live = [s for s in self._sessions.live if not s.closed]
            ring = live[-1].describe_ring() if live else "no workers running"
            where = f"start_method={method!r}, {ring}"
        return (f"DataLoader(dataset={type(self.dataset).__name__}, batch_size={self.batch_size}, "
                f"num_workers={self.num_workers}, prefetch_factor={self.prefetch_factor}, "
                f"persistent_workers={self.persistent_workers}, seed={self.seed}, output={self.output!r}; "
                f"{where})")
