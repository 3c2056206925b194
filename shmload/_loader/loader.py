"""The DataLoader: validates its arguments once, then wires sampler, session and epoch.

The constructor mirrors ``torch.utils.data.DataLoader`` (same positional order, same
keywords, same mutual-exclusion rules and messages), so swapping the import is a
one-line change. Keywords torch has and shmload cannot honour are refused when given a
non-default value, never silently ignored.
"""

from __future__ import annotations

import functools
import itertools
import threading
import types
import warnings
import weakref
from typing import Any, Iterator

from .._batching.collate import default_collate
from .._batching.parts import DEFAULT_PARTS
from .._core import _platform
from .._ordering import seeding, sharding
from .._ordering.distributed import DistributedSampler, check_elastic, current_rank, world_or_alone
from .._ordering.sampler import BatchSampler, orders
from .._ordering.schedule import Schedule
from .._ordering.shuffle import StreamShuffle
from .._ordering.sources import check_shuffle_buffer, check_stream_options, classify
from .._session.config import (
    SETTINGS,
    LoaderConfig,
    check_arguments,
    check_settings,
    iter_warnings,
    read_settings,
    resolve_workers,
    warn_too_many_workers,
)
from .._session.dispatch import DEFAULT_PREFETCH
from .._session.scaling import default_cap
from ..profiler.stats import LoaderStats
from . import elastic_state as _elastic_state
from . import resume as _resume
from .epoch import SingleProcessEpoch
from .pool import SessionPool
from .stateful import Stateful
from .worker_epoch import MultiprocessEpoch

_FROZEN_AFTER_INIT = ("dataset", "batch_size", "batch_sampler", "sampler", "drop_last", "persistent_workers",
                      "shuffle_buffer", "elastic")


class DataLoader(Stateful):
    """Loads batches from a map-style dataset (or an iterable source) with worker processes
    writing into shared memory.

    See docs/api.md for every argument; those shared with
    ``torch.utils.data.DataLoader`` mean what they mean there. Yielded arrays are views
    into shared memory, valid for as long as you hold them (see docs/architecture.md).
    """

    def __init__(self, dataset: Any, batch_size: int | None = 1, shuffle: bool | None = None,
                 sampler: Any = None, batch_sampler: Any = None, num_workers: int | str = 0,
                 collate_fn: Any = None, pin_memory: bool = False, drop_last: bool = False,
                 timeout: float = 0, worker_init_fn: Any = None, multiprocessing_context: Any = None,
                 generator: Any = None, *, prefetch_factor: int | None = None,
                 persistent_workers: bool = False, pin_memory_device: str = "", in_order: bool = True,
                 seed: int | None = None, output: str = "numpy", slot_bytes: int | None = None,
                 max_shm_bytes: int | None = None, max_worker_restarts: int = 0, distributed: bool | None = None,
                 split_batches: bool | None = None, batch_parts: int = DEFAULT_PARTS,
                 shuffle_buffer: int | None = None, shm_backend: str | None = None, elastic: bool = False,
                 max_workers: int | None = None):
        user_dataset, (dataset, iterable) = dataset, classify(dataset)
        check_shuffle_buffer(shuffle_buffer, iterable)
        if iterable:
            check_stream_options(shuffle, sampler, batch_sampler, shuffle_buffer)
        batch_size, drop_last = check_arguments(batch_size, shuffle, sampler, batch_sampler, drop_last, num_workers,
                                                prefetch_factor, seed, generator, multiprocessing_context, distributed,
                                                max_workers)
        elastic = check_elastic(elastic, iterable, batch_size, sampler, batch_sampler, in_order, distributed)
        if iterable:
            shuffle = None  # (taken with a shuffle buffer: the stream is not ordered by a sampler)

        seed = 0 if elastic and seed is None and generator is None else seed  # (the same on every rank)
        self.seed = int(seed) if seed is not None else seeding.draw_base_seed(generator)
        self._seed_given = seed is not None or generator is not None  # the same on every rank, presumably
        self._own_sampler = sampler is None and batch_sampler is None
        auto_batch = batch_size is not None or batch_sampler is not None
        sampler, batch_sampler, order_source = orders(dataset, iterable, shuffle, sampler, batch_sampler, batch_size,
                                                      drop_last, self.seed)
        if collate_fn is None and auto_batch:
            collate_fn = default_collate

        self.dataset = user_dataset
        self.batch_size = batch_size
        self.drop_last = drop_last
        self.sampler = sampler
        self.batch_sampler = batch_sampler
        self.num_workers, self.max_workers = num_workers, max_workers  # "auto": sized as it runs (scaling.py)
        self.collate_fn = collate_fn
        self.prefetch_factor = prefetch_factor  # None: automatic (see dispatch.prefetch_depth)
        self.persistent_workers = persistent_workers
        self.pin_memory = pin_memory  # page-locks the ring with CUDA (pinning.py); without, warned about at iter()
        self.pin_memory_device = pin_memory_device
        self.timeout = timeout
        self.worker_init_fn = worker_init_fn
        self.multiprocessing_context = multiprocessing_context
        self.generator = generator
        self.in_order, self.output = in_order, output
        self.slot_bytes = slot_bytes
        self.max_shm_bytes = max_shm_bytes
        self.shm_backend = shm_backend  # None: memfd where the kernel has it ($SHMLOAD_SHM_BACKEND first; shm.py)
        self.max_worker_restarts = max_worker_restarts
        self.split_batches = split_batches  # None: split when workers would idle (parts.py)
        self.batch_parts = batch_parts
        self.distributed = distributed  # read at every iter(): see sharding.py
        self.shuffle_buffer = shuffle_buffer  # an iterable source's, samples per worker stream (shuffle.py)
        self._init_state(dataset, iterable, order_source, auto_batch, bool(shuffle), elastic)
        self._config()  # check the settings now, not at the first iter()
        warn_too_many_workers(self.num_workers)  # as torch's constructor (NOTE in config.py)
        self._initialized = True

    def __class_getitem__(cls, item: Any) -> types.GenericAlias:  # DataLoader[Batch] in annotations, as torch's
        return types.GenericAlias(cls, item)

    def _init_state(self, source: Any, iterable: bool, order_source: Any, auto_batch: bool, shuffle: bool,
                    elastic: bool) -> None:
        """The loader's own state, beside the attributes users see; and ``elastic``, which
        users see (NOTE [ The global sequence ], elastic.py)."""
        self.elastic = elastic
        self._source = source  # the dataset, or a generator function's GeneratorSource
        self._iterable = iterable
        self._order_source = order_source
        self._rank = current_rank(self.sampler)
        self._auto_batch = auto_batch
        self._shuffle = shuffle
        self._base_sampler = self.sampler  # the loader's own sampler, while it does not shard (sharding.py)
        self._shard: tuple[int, int] | None = None  # (world size, rank) the own sampler shards by
        self._reported_len: int | None = None  # len(dataset) of an iterable source, once len(loader) was asked
        self._notes: set[str] = set()  # messages given once already (sharding, saving without state)
        self._claiming = threading.Lock()  # two threads' iterators must not begin the same epoch
        self._cfg: LoaderConfig | None = None  # built from the attributes at the next iter()
        self._world = (1, 0)  # (world size, rank) of the readers of an iterable source (stream_parts)
        self._parts_seed: int | None = None  # the seed of a stream's parts' order, once a loaded state said it
        self._next_epoch = 0  # the epoch the next iterator claims at its first batch
        self._resume: dict | None = None  # a loaded state, for the next epoch to begin
        self._progress: Any = None  # the newest iterator's record (resume.py), kept when it is gone; None: not begun
        self._sessions = SessionPool()
        self._finalizer = weakref.finalize(self, SessionPool.close, self._sessions, True)

    def __setattr__(self, name: str, value: Any) -> None:
        if getattr(self, "_initialized", False):
            if name in _FROZEN_AFTER_INIT:
                raise ValueError(f"{name} attribute should not be set after {type(self).__name__} is initialized")
            if name in SETTINGS:  # read again at the next iter(), as torch does
                super().__setattr__("_cfg", None)
        super().__setattr__(name, value)

    def _config(self) -> LoaderConfig:
        """The settings for the next epoch, checked again since attributes may have been set."""
        if self._cfg is None:
            check_settings(self)
            if self.num_workers != 0 and not hasattr(self.multiprocessing_context, "get_start_method"):
                self.multiprocessing_context = _platform.resolve_context(self.multiprocessing_context)
            settings = resolve_workers(read_settings(self), self._iterable, default_cap)
            self._cfg = LoaderConfig(**settings, dataset=self._source, auto_batch=self._auto_batch,
                                     rank=self._rank, iterable=self._iterable,
                                     stream_shuffle=self._stream_shuffle() if self._iterable else None)
        return self._cfg

    def _stream_shuffle(self) -> StreamShuffle:
        """An iterable source's shuffling and readers; its parts are shuffled by a seed that
        is the same on every rank (as sharding.py's): the loader's if given, else 0."""
        parts_seed = self._parts_seed if self._parts_seed is not None else self.seed if self._seed_given else 0
        return StreamShuffle(self.shuffle_buffer or 0, parts_seed, *self._world)

    # ------------------------------------------------------------ iteration
    # NOTE [ An epoch begins at its first batch ]
    # iter() starts the workers (as torch's does) but claims no epoch: the epoch's number,
    # its order and the sampler state that resume saves are all fixed at the iterator's
    # first next(), by _claim(). Two things need this. Trainers call iter() and throw
    # the iterator away (Lightning probes every loader that is not torch's), and such an
    # iterator must not use up an epoch. And trainers move the sampler between iter()
    # and the first batch (Lightning calls sampler.set_epoch() after iter() in the first
    # epoch of a run), so the order is only known then, and the saved state must be the
    # one the order was drawn from. Nothing is loaded before the claim, so nothing is
    # lost when an iterator is thrown away unstarted.
    def __iter__(self) -> SingleProcessEpoch | MultiprocessEpoch:
        self._sync_distributed(unshard=True)
        cfg = self._config()
        if self._resume is not None:
            self._check_resume(cfg, self._resume)  # at once, as well as when the epoch begins
        length = self._length()
        self._warn_as_torch(cfg)
        if self._sessions.starts_workers(cfg) and not cfg.auto_workers:
            warn_too_many_workers(cfg.num_workers)  # as torch's iter() (NOTE in config.py)
        it = self._sessions.open_epoch(cfg, functools.partial(self._claim, cfg), length, self)
        self._progress = None  # state_dict() now describes the start of the epoch this iterator will claim
        it.reported_len = self._reported_len  # an iterable source's len(), if len(loader) was asked
        return it

    def _warn_as_torch(self, cfg: LoaderConfig) -> None:
        """The warnings torch's DataLoader gives when an iterator is made, once per loader."""
        for message, category in iter_warnings(self.pin_memory, self.pin_memory_device):
            self._note(message, category)

    def _note(self, message: str, category: type) -> None:
        """Warn once per loader (trainers call iter(), len() and state_dict() many times)."""
        if message not in self._notes:
            self._notes.add(message)
            warnings.warn(message, category, stacklevel=4)

    def _claim(self, cfg: LoaderConfig) -> tuple[int, Any, Any]:
        """The epoch begins (see the note above): (its number, schedule, progress). The
        loader's own fields change only if all of it succeeds, so a failure (a sampler
        moved after load_state_dict, say) leaves the resume for a retry; a sampler that
        raises after drawing its order has moved itself, which a retry then follows."""
        with self._claiming:
            resume = self._resume
            epoch = self._upcoming_epoch()
            schedule: Schedule
            progress: Any
            if cfg.iterable:
                schedule, progress = _resume.plan_stream_epoch(cfg.num_workers, cfg.batch_size, cfg.drop_last, resume)
            else:
                schedule, progress = _resume.plan_sampler_epoch(self._order_source, self._batches_from,
                                                                self._auto_batch, resume)
            progress.epoch = epoch
            self._resume, self._next_epoch, self._progress = None, epoch + 1, progress
            return epoch, schedule, progress

    def _batches_from(self, start: int) -> Iterator[Any]:
        """The epoch's batches (samples, with batch_size=None) from position ``start``."""
        if isinstance(self.batch_sampler, BatchSampler):
            return self.batch_sampler.batches_from(start, as_indices=True)
        return itertools.islice(iter(self.batch_sampler if self._auto_batch else self.sampler), start, None)

    def _length(self) -> int | None:
        """The epoch's length for its iterator (``len(it)``), without counting as asked; None
        if the sampler (or iterable source) has no len(). The loader's own sampler over a
        map-style dataset always has one, so a TypeError there is the dataset's ``__len__``
        returning no int: raised now, once, at iter() (as torch's iter() with workers raises
        it), not at every next() (each would try again to begin the epoch, which reads it)."""
        try:
            return self._count()
        except TypeError:
            if self._own_sampler and not self._iterable:
                raise
            return None

    def __len__(self) -> int:
        n = self._count()
        if self._iterable:
            self._reported_len = len(self._source)  # NOTE [ torch's length warning ], epoch.py
        return n

    def _count(self) -> int:
        if self._iterable:
            n = len(self._source)  # TypeError if the source has no len(), as in torch
            if self.batch_size is not None:
                n = n // self.batch_size if self.drop_last else -(-n // self.batch_size)
            return n
        self._sync_distributed()
        return len(self.batch_sampler) if self.batch_sampler is not None else len(self.sampler)

    # ------------------------------------------------------------ distributed (sharding.py)
    def _sync_distributed(self, unshard: bool = False) -> None:
        """Follow torch.distributed: shard the loader's own sampler while a process group
        of more than one process is initialized, warn about a user's sampler that does not
        shard, and mix the current rank into the batch seeds. Only ``iter()`` undoes a
        shard (``unshard``): a job that has destroyed its process group may still save a
        state its restart, sharded again, must be able to load."""
        if self._iterable:  # (a stream shards itself: stream_parts() or get_worker_info() and the rank)
            world = _stream_world(self.distributed)
            if world != self._world:
                self._world = world
                self._cfg = None
        elif self.elastic and self._own_sampler:  # every rank reads its slice, a world of one included
            shard = sharding.torch_world() or (1, 0)
            if shard != self._shard:
                self._reshard(shard)
        else:
            order = self._order_source if not self._own_sampler else None
            decision = sharding.decide(self.distributed, self._own_sampler, order, sharding.torch_world())
            if decision.warn is not None:
                self._note(decision.warn, sharding.DistributedWarning)
            if self._own_sampler and decision.shard != self._shard and (decision.shard is not None or unshard):
                self._reshard(decision.shard)
        rank = current_rank(self.sampler)
        if rank != self._rank:
            self._rank = rank
            self._cfg = None

    def _reshard(self, shard: tuple[int, int] | None) -> None:
        epoch = self._upcoming_epoch()
        sampler = self._base_sampler
        if shard is not None:
            size, rank = shard
            sampler = DistributedSampler(self._source, num_replicas=size, rank=rank, shuffle=self._shuffle,
                                         seed=self.seed if self._seed_given else 0,
                                         drop_last=self.elastic and self.drop_last, elastic=self.elastic,
                                         batch_size=self.batch_size if self.elastic else None)
        if self.elastic:
            # a loaded global position, and an order seed a loaded state set, hold in any world
            previous = self.sampler if isinstance(self.sampler, DistributedSampler) else None
            if previous is not None and previous.elastic:
                sampler.seed, sampler.position = previous.seed, previous.position
            if self._resume is not None:  # loaded before this world was known (before init_process_group)
                self._resume = _elastic_state.elastic_resume(self._resume, sampler)
        sampler.set_epoch(epoch)
        batch_sampler = BatchSampler(sampler, self.batch_size, self.drop_last) if self.batch_size is not None else None
        for name, value in (("sampler", sampler), ("batch_sampler", batch_sampler), ("_order_source", sampler),
                            ("_shard", shard)):
            object.__setattr__(self, name, value)  # (sampler and batch_sampler are frozen to the user)

    # ------------------------------------------------------------ profile
    def stats(self, memory: bool = True) -> LoaderStats:
        """A frozen snapshot of the profile since the loader was created or since the
        last :meth:`reset_stats`: per worker, its time per stage and utilization; for the
        consumer, its time waiting in ``next()`` (the data stall) and between calls;
        throughput, ring occupancy, CPU and memory per process. ``print()`` it for a
        table and a diagnosis with a recommendation; see docs/profiling.md.

        Works during and after an epoch. ``memory=False`` skips reading each process's
        memory map (PSS/USS) now, which takes a few milliseconds per process; each worker's
        USS over time, sampled all along (profiler/memory.py), is reported either way."""
        live = [s for s in self._sessions.live if not s.closed]  # (its ring's backend, if settings changed since)
        cfg, pool = live[-1].cfg if live else self._config(), self._sessions
        auto = cfg.auto_workers  # (before any epoch: the count it will start with, and no change yet)
        running = (pool.tuner.count if pool.tuner else pool.first_count or 1) if auto else cfg.num_workers
        return pool.profile.snapshot(running, self.prefetch_factor or DEFAULT_PREFETCH, memory=memory,
                                     dataset=self.dataset, shm_backend=cfg.shm_backend,
                                     counts=(pool.tuner.history if pool.tuner else []) if auto else None,
                                     max_workers=cfg.num_workers if auto else None)

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

    def __getstate__(self) -> dict:
        """A pickled loader (Lightning's ddp_spawn sends it to its processes) carries its
        settings, its sampler and the epoch it is at, not its workers (the copy starts its
        own) nor an epoch running in this process: the copy begins the next epoch. To
        continue a running epoch elsewhere, save ``state_dict()``."""
        state = dict(self.__dict__)
        for name in ("_sessions", "_finalizer", "_cfg", "_claiming"):
            del state[name]
        state["_progress"] = None
        context = state["multiprocessing_context"]
        if hasattr(context, "get_start_method"):
            state["multiprocessing_context"] = context.get_start_method()
        return state

    def __setstate__(self, state: dict) -> None:
        self.__dict__.update(state, _cfg=None, _sessions=SessionPool(), _claiming=threading.Lock())
        self.__dict__["_finalizer"] = weakref.finalize(self, SessionPool.close, self._sessions, True)

    def __repr__(self) -> str:
        if self.num_workers == 0:
            where = "loading in the main process"
        else:
            method = self.multiprocessing_context.get_start_method()
            live = [s for s in self._sessions.live if not s.closed]
            ring = live[-1].describe_ring() if live else "no workers running"
            where = f"start_method={method!r}, {ring}"
        return (f"DataLoader(dataset={type(self.dataset).__name__}, batch_size={self.batch_size}, "
                f"num_workers={self.num_workers!r}, prefetch_factor={self.prefetch_factor}, "
                f"persistent_workers={self.persistent_workers}, seed={self.seed}, output={self.output!r}; "
                f"{where})")


def _stream_world(distributed: bool | None) -> tuple[int, int]:
    """(world size, rank) among which ``stream_parts()`` divides a stream's parts:
    torch.distributed's or torchrun's environment (``distributed.world()``); one process
    with ``distributed=False``, which has every rank read everything."""
    return (1, 0) if distributed is False else world_or_alone()
