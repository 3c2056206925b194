"""The DataLoader: validates its arguments once, then wires sampler, session and epoch.

The constructor mirrors ``torch.utils.data.DataLoader`` (same positional order, same
keywords, same mutual-exclusion rules and messages), so swapping the import is a
one-line change. Keywords torch has and shmload cannot honour are refused when given a
non-default value, never silently ignored.
"""

from __future__ import annotations

import copy
import functools
import itertools
import numbers
import threading
import types
import warnings
import weakref
from typing import Any, NamedTuple

from . import _platform, pinning, seeding, sharding
from . import resume as _resume
from ._checks import check_int
from .collate import default_collate
from .config import LoaderConfig
from .dispatch import DEFAULT_PREFETCH
from .epoch import MultiprocessEpoch, SingleProcessEpoch
from .errors import OptionalDependencyError, ShmloadWarning
from .profile import Profile
from .distributed import DistributedSampler, current_rank
from .iterable import Stream, as_source, is_iterable_source
from .resume import BatchProgress, StreamProgress
from .sampler import BatchSampler, RandomSampler, SequentialSampler
from .schedule import RoundRobinSchedule, SamplerSchedule
from .session import RestartBudget, Session
from .stats import LoaderStats
from .supervisor import owned_here

_FROZEN_AFTER_INIT = ("dataset", "batch_size", "batch_sampler", "sampler", "drop_last", "persistent_workers")
# Read again at the next iter(), as torch does: setting them takes effect then.
_SETTINGS = ("num_workers", "collate_fn", "prefetch_factor", "timeout", "worker_init_fn", "multiprocessing_context",
             "in_order", "seed", "output", "slot_bytes", "max_shm_bytes", "max_worker_restarts", "pin_memory")


def _classify(dataset: Any) -> tuple[Any, bool]:
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


def _check_stream_options(shuffle: Any, sampler: Any, batch_sampler: Any) -> None:
    """An iterable source decides its own order: as torch, refuse the options that order."""
    for name, value in (("shuffle", shuffle), ("sampler", sampler), ("batch_sampler", batch_sampler)):
        if value not in (None, False):
            raise ValueError(f"DataLoader with an iterable source: expected unspecified {name} option, but got "
                             f"{name}={value!r}. A stream is read in its own order; shuffle inside it "
                             "(for example with a shuffle buffer), or give a map-style dataset")


class _Sessions:
    """The loader's live sessions, kept apart from the loader so its finalizer can close them."""

    def __init__(self) -> None:
        self.persistent: Session | None = None
        self.live: weakref.WeakSet[Session] = weakref.WeakSet()
        self.restarts = RestartBudget()  # max_worker_restarts counts per loader, across its sessions
        self.profile = Profile()  # always on: see profile.py and loader.stats()
        self.stream: Stream | None = None  # an iterable source's in num_workers=0 epochs

    def close(self) -> None:
        for session in [self.persistent, *self.live]:
            if session is not None:
                session.close()
        self.persistent = None


class _Unsaveable(NamedTuple):
    """What the loader keeps instead of a state when the order's source has none."""

    reason: str


def _capture(source: Any, kind: str = "sampler") -> Any:
    """The state of the sampler (or batch sampler) that fixes the epoch's order: a copy,
    since the sampler may go on changing the dict it returned."""
    try:
        _check_resumable(source, kind)
    except TypeError as exc:
        return _Unsaveable(str(exc))
    return copy.deepcopy(source.state_dict())


# NOTE [ Saving without the sampler's state ]
# A sampler (or iterable source) without state_dict() cannot be restored, only re-read.
# state_dict() does not raise for it: trainers call state_dict() at every checkpoint of
# any loader that has the method (Lightning does), and a checkpoint must not crash a
# training that torch's loader would not crash (torch's DistributedSampler has no state).
# The state then holds the position alone (the sampler's part is None), and a resume
# re-reads the order (or each worker's stream, from its start) and skips what was
# delivered, as torchdata's StatefulDataLoader does: the same batches if the order is
# the same then (torch's DistributedSampler after the same set_epoch; a stream that reads
# the same), other ones if not (an unseeded random sampler). One ShmloadWarning says so.
def _fast_forward_note(reason: str, kind: str) -> str:
    again = ("re-reads each worker's stream from its start and skips the draws delivered" if kind != "sampler" else
             "iterates the sampler again and skips the batches delivered")
    return (f"DataLoader.state_dict(): {reason}. The state holds the position alone: a resume {again}, which gives "
            "the same batches only if the order is the same then (torch's DistributedSampler after the same "
            "set_epoch: yes; a sampler or stream drawing from an unseeded generator: no)")


def _check_resumable(source: Any, kind: str = "sampler") -> None:
    missing = [m for m in ("state_dict", "load_state_dict") if not callable(getattr(source, m, None))]
    if not missing:
        return
    if kind == "sampler":
        raise TypeError(
            f"the sampler {type(source).__name__} has no {' or '.join(missing)}, which restoring the epoch's "
            "order needs. Give it both (state_dict() returning what fixes the order of its next iter(), such as "
            "its seed and epoch), or use shmload's SequentialSampler, RandomSampler or DistributedSampler, which "
            "have them")
    raise TypeError(
        f"the iterable source {type(source).__name__} has no {' or '.join(missing)}, which restoring a position "
        "in the middle of an epoch needs. Give it both: state_dict() returning where its iteration is, "
        "load_state_dict(state) making the next iter() continue from there. Saving between epochs needs neither")


def _check_unchanged(source: Any, resume: dict, state: Any) -> None:
    """A position in the middle of an epoch means something only in the saved order: the
    sampler must not have been moved (by a ``set_epoch`` of another epoch, say) since its
    state was loaded."""
    if resume["sampler"] is None:
        return  # saved without the sampler's state: nothing to compare (NOTE [ Saving without ...])
    try:
        same = bool(state == resume["sampler"])
    except Exception:  # states that do not compare (arrays): nothing to check with
        return
    if not same:
        raise ValueError(
            f"the sampler {type(source).__name__} changed after load_state_dict(): its state is {state!r}, "
            f"but the saved position (batch {resume['next_batch']} of epoch {resume['epoch']}) belongs to the "
            f"saved state {resume['sampler']!r}. Do not move the sampler (set_epoch of another epoch) between "
            "load_state_dict() and the resumed epoch's first batch")


def _check_streams(cfg: LoaderConfig, resume: dict) -> None:
    """An iterable state resumes only with as many worker streams as saved it (the resume
    then waits for a retry with the right ``num_workers``)."""
    saved, streams = len(resume["streams"]), max(1, cfg.num_workers)
    if saved != streams:
        raise ValueError(
            f"the loaded state is of an iterable source read by {saved} stream(s) (num_workers="
            f"{saved if saved > 1 else '0 or 1'}), but this loader has num_workers={cfg.num_workers}: each "
            "worker reads its own shard of the stream, so resume with the same number of workers")


class DataLoader:
    """Loads batches from a map-style dataset (or an iterable source) with worker processes
    writing into shared memory.

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
                 max_shm_bytes: int | None = None, max_worker_restarts: int = 0, distributed: bool | None = None):
        user_dataset = dataset
        dataset, iterable = _classify(dataset)
        if iterable:
            _check_stream_options(shuffle, sampler, batch_sampler)
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
        self._seed_given = seed is not None or generator is not None  # the same on every rank, presumably
        self._own_sampler = sampler is None and batch_sampler is None
        auto_batch = batch_size is not None or batch_sampler is not None
        # What fixes the epoch's order, and whose state resume saves (resume.py)
        order_source = batch_sampler if batch_sampler is not None else sampler
        if type(order_source) is BatchSampler:
            order_source = order_source.sampler  # ours has no state of its own
        if iterable:
            order_source = None  # the source orders itself
        else:
            if sampler is None:
                sampler = RandomSampler(dataset, self.seed) if shuffle else SequentialSampler(dataset)
            if order_source is None:
                order_source = sampler
            if batch_size is not None and batch_sampler is None:
                batch_sampler = BatchSampler(sampler, batch_size, drop_last)
        if collate_fn is None and auto_batch:
            collate_fn = default_collate

        self.dataset = user_dataset
        self._source = dataset  # the dataset, or a generator function's GeneratorSource
        self._iterable = iterable
        self._order_source = order_source
        self._rank = current_rank(sampler)
        self.batch_size = batch_size
        self.drop_last = drop_last
        self.sampler = sampler
        self.batch_sampler = batch_sampler
        self.num_workers = num_workers
        self.collate_fn = collate_fn
        self.prefetch_factor = prefetch_factor  # None: automatic (see dispatch.prefetch_depth)
        self.persistent_workers = persistent_workers
        self.pin_memory = pin_memory  # page-locks the ring with CUDA (pinning.py); without, warned about at iter()
        self.pin_memory_device = pin_memory_device
        self.timeout = timeout
        self.worker_init_fn = worker_init_fn
        self.multiprocessing_context = multiprocessing_context
        self.generator = generator
        self.in_order = in_order
        self.output = output
        self.slot_bytes = slot_bytes
        self.max_shm_bytes = max_shm_bytes
        self.max_worker_restarts = max_worker_restarts
        self.distributed = distributed  # read at every iter(): see sharding.py
        self._auto_batch = auto_batch
        self._shuffle = bool(shuffle)
        self._base_sampler = sampler  # the loader's own sampler, while it does not shard (sharding.py)
        self._shard: tuple[int, int] | None = None  # (world size, rank) the own sampler shards by
        self._reported_len: int | None = None  # len(dataset) of an iterable source, once len(loader) was asked
        self._notes: set[str] = set()  # messages given once already (sharding, saving without state)
        self._claiming = threading.Lock()  # two threads' iterators must not begin the same epoch
        self._cfg: LoaderConfig | None = None  # built from the attributes at the next iter()
        self._config()  # check the settings now, not at the first iter()
        self._next_epoch = 0  # the epoch the next iterator claims at its first batch
        self._resume: dict | None = None  # a loaded state, for the next epoch to begin
        self._progress: Any = None  # the newest iterator's record (resume.py), kept when it is gone; None: not begun
        self._sessions = _Sessions()
        self._finalizer = weakref.finalize(self, _Sessions.close, self._sessions)
        self._initialized = True

    # DataLoader[Batch] in annotations, as torch's DataLoader is Generic
    __class_getitem__ = classmethod(types.GenericAlias)

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
            pinner, self._pin_note = pinning.choose(bool(self.pin_memory))
            self._cfg = LoaderConfig(
                dataset=self._source, auto_batch=self._auto_batch,
                collate_fn=None if collate_fn is default_collate else collate_fn,
                num_workers=self.num_workers, prefetch_factor=self.prefetch_factor,
                persistent_workers=bool(self.persistent_workers), timeout=float(self.timeout),
                worker_init_fn=self.worker_init_fn, in_order=bool(self.in_order), seed=self.seed,
                context=self.multiprocessing_context, output=self.output, slot_bytes=self.slot_bytes,
                max_shm_bytes=self.max_shm_bytes, max_worker_restarts=self.max_worker_restarts,
                rank=self._rank, iterable=self._iterable, batch_size=self.batch_size, drop_last=self.drop_last,
                pinner=pinner)
        return self._cfg

    def _check_settings(self) -> None:
        """The checks for every setting that may change after construction (``_SETTINGS``)."""
        check_int("num_workers", self.num_workers, 0)
        check_int("prefetch_factor", self.prefetch_factor, 1, allow_none=True)
        check_int("seed", self.seed, 0)
        check_int("slot_bytes", self.slot_bytes, 1, allow_none=True)
        check_int("max_shm_bytes", self.max_shm_bytes, 1, allow_none=True)
        check_int("max_worker_restarts", self.max_worker_restarts, 0)
        # persistent_workers and in_order are taken for their truth, as torch takes them (1, 0, None)
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
            self._check_resume(cfg)  # at once, as well as when the epoch begins
        length = self._length()
        sessions = self._sessions
        if sessions.persistent is not None and not owned_here(sessions.persistent.owner_pid):
            sessions.persistent = None  # inherited through a fork: those workers are not ours
            sessions.live = weakref.WeakSet()
        if sessions.persistent is not None and sessions.persistent.cfg is not cfg:
            sessions.persistent.close()  # settings changed since its workers started
            sessions.persistent = None
        self._warn_as_torch(cfg)
        claim = functools.partial(self._claim, cfg)
        if cfg.num_workers == 0:
            if cfg.iterable and sessions.stream is None:
                sessions.stream = Stream(cfg.dataset)  # reset_state(), once per loader
            it: Any = SingleProcessEpoch(cfg, claim, length, sessions.profile, sessions.stream)
        else:
            # Starting workers is one window (_platform.py, NOTE [ Ctrl-C waits for a
            # window ]): a Ctrl-C is raised once the session is whole and owned, by the
            # loader (persistent) or by the iterator, whose finalizer closes it.
            entered = _platform.defer_sigint()
            try:
                if not cfg.persistent_workers:
                    session = Session(cfg, sessions.restarts, sessions.profile)
                    try:
                        sessions.live.add(session)
                        it = MultiprocessEpoch(cfg, session, True, claim, length, self, sessions.profile)
                    except BaseException:
                        session.close()
                        raise
                else:
                    if sessions.persistent is None or sessions.persistent.closed:
                        sessions.persistent = Session(cfg, sessions.restarts, sessions.profile)
                        sessions.live.add(sessions.persistent)
                    it = MultiprocessEpoch(cfg, sessions.persistent, False, claim, length, self, sessions.profile)
            finally:
                _platform.resume_sigint(entered)
        self._progress = None  # state_dict() now describes the start of the epoch this iterator will claim
        it.reported_len = self._reported_len  # an iterable source's len(), if len(loader) was asked
        return it

    def _warn_as_torch(self, cfg: LoaderConfig) -> None:
        """The warnings torch's DataLoader gives when an iterator is made, in its words
        (scripts filter them by message), once per loader."""
        if cfg.num_workers > 0:
            cores = _platform.usable_cores()
            if cfg.num_workers > cores:
                self._note(f"This DataLoader will create {cfg.num_workers} worker processes in total. Our suggested "
                           f"max number of worker in current system is {cores}, which is smaller than what this "
                           "DataLoader is going to create. Please be aware that excessive worker creation might get "
                           "DataLoader running slow or even freeze, lower the worker number to avoid potential "
                           "slowness/freeze if necessary.", UserWarning)
        if self.pin_memory:
            if self.pin_memory_device:
                self._note("pin_memory_device is deprecated, the current accelerator will be used as the device,"
                           f"ignore pin_memory_device='{self.pin_memory_device}'.", UserWarning)
            if self._pin_note == pinning.NO_ACCELERATOR:
                self._note(self._pin_note, UserWarning)  # torch's
            elif self._pin_note:
                self._note(self._pin_note, ShmloadWarning)

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
            if cfg.iterable:
                schedule, progress = self._stream_plan(cfg, resume)
            else:
                schedule, progress = self._sampler_plan(resume)
            progress.epoch = epoch
            self._resume, self._next_epoch, self._progress = None, epoch + 1, progress
            return epoch, schedule, progress

    def _upcoming_epoch(self) -> int:
        """The number the next epoch takes: a loaded state's; else the loader's own
        sampler's epoch, so a ``set_epoch`` on it (trainers call ``loader.sampler.set_epoch``)
        moves the epoch's seeds with its order, and one number means the epoch; else the
        loader's own count (a sampler of yours may not count epochs, or be told the same
        one every time, and a batch's seeds must still change from epoch to epoch)."""
        if self._resume is not None:
            return self._resume["epoch"]
        if self._own_sampler and not self._iterable:
            return self.sampler.epoch
        return self._next_epoch

    def _check_resume(self, cfg: LoaderConfig) -> None:
        """Refuse at iter() what the loaded state cannot be resumed with."""
        if cfg.iterable:
            _check_streams(cfg, self._resume)
        elif self._resume["next_batch"] or self._resume["delivered_beyond"]:
            _check_unchanged(self._order_source, self._resume, _capture(self._order_source))

    def _sampler_plan(self, resume: dict | None) -> tuple[SamplerSchedule, BatchProgress]:
        """The epoch's batches, from the position a loaded state says. The order is drawn
        now, right after the sampler's state is taken, so the state is the one it was drawn
        from; and before the first batch is pulled, since the loader pulls batches ahead of
        the consumer (see resume.py)."""
        source = self._order_source
        sampler_state = _capture(source)
        if resume is not None and (resume["next_batch"] or resume["delivered_beyond"]):
            _check_unchanged(source, resume, sampler_state)
        start = resume["next_batch"] if resume is not None else 0
        skip = frozenset(resume["delivered_beyond"]) if resume is not None else frozenset()
        if isinstance(self.batch_sampler, BatchSampler):
            batches = self.batch_sampler.batches_from(start)
        else:
            batches = itertools.islice(iter(self.batch_sampler if self._auto_batch else self.sampler), start, None)
        schedule = SamplerSchedule(batches, start, skip, batched=self._auto_batch)
        schedule.peek()  # draws the order (samplers and batch samplers are lazy generators)
        return schedule, BatchProgress(start, skip, sampler_state)

    def _stream_plan(self, cfg: LoaderConfig, resume: dict | None) -> tuple[RoundRobinSchedule, StreamProgress]:
        streams = max(1, cfg.num_workers)
        if resume is None:
            return RoundRobinSchedule(streams, cfg.batch_size, cfg.drop_last), StreamProgress(streams)
        _check_streams(cfg, resume)
        progress = StreamProgress.resumed(resume)
        schedule = RoundRobinSchedule(streams, cfg.batch_size, cfg.drop_last, draws=progress.draws,
                                      ended=progress.ended, first=progress.next_worker,
                                      restores=_resume.restores(resume))
        return schedule, progress

    def _length(self) -> int | None:
        """The epoch's length for its iterator (``len(it)``), without counting as asked."""
        try:
            return self._count()
        except TypeError:
            return None

    def __len__(self) -> int:
        n = self._count()
        if self._iterable:
            # you were told: an epoch yielding more warns, as torch's does, with torch's figures
            # (it compares the batches yielded with len(dataset), and calls them samples)
            self._reported_len = len(self._source)
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
        if not self._iterable:  # (a stream shards itself, by get_worker_info() and the rank)
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
                                         seed=self.seed if self._seed_given else 0)
        sampler.set_epoch(epoch)
        batch_sampler = BatchSampler(sampler, self.batch_size, self.drop_last) if self.batch_size is not None else None
        for name, value in (("sampler", sampler), ("batch_sampler", batch_sampler), ("_order_source", sampler),
                            ("_shard", shard)):
            object.__setattr__(self, name, value)  # (sampler and batch_sampler are frozen to the user)

    # ------------------------------------------------------------ resume
    def state_dict(self) -> dict:
        """Where the loader is: at an epoch's start or in the middle of one (the latest
        ``iter()``), for :meth:`load_state_dict` in a new loader, with any ``num_workers``
        (for an iterable source: the same). Small, and JSON-serializable when the
        sampler's (or source's) own state is; see docs/api.md."""
        if self._resume is not None:
            return self._resume  # loaded, not used yet
        self._sync_distributed()
        current = self._progress
        live = current is not None and not current.finished
        if self._iterable:
            if live:
                self._saveable(_capture(self._source, kind="iterable source"), "iterable source")
                return _resume.stream_state(current.epoch, self.seed, len(current.draws), current, self._batching())
            return _resume.stream_state(self._next_epoch, self.seed, max(1, self.num_workers), None, self._batching())
        if live:
            return _resume.map_state(current.epoch, self.seed, self._saveable(current.sampler_state), current,
                                     self._batching())
        return _resume.map_state(self._upcoming_epoch(), self.seed, self._saveable(_capture(self._order_source)),
                                 None, self._batching())

    def _saveable(self, state: Any, kind: str = "sampler") -> Any:
        """``state``, or None (with one warning) for a sampler or source that has none
        (NOTE [ Saving without the sampler's state ])."""
        if type(state) is not _Unsaveable:
            return state
        self._note(_fast_forward_note(state.reason, kind), ShmloadWarning)
        return None

    def _batching(self) -> dict:
        """How samples are grouped into batches: a position means something only under the
        same grouping."""
        return {"batch_size": self.batch_size, "drop_last": self.drop_last}

    def load_state_dict(self, state: dict) -> None:
        """Continue where ``state`` (from :meth:`state_dict`) was saved: the next ``iter()``
        yields the rest of the saved epoch, bit-identical to an uninterrupted run (with
        ``in_order=False``: every batch not delivered before the save, once each, in
        any order); later ones the epochs after it. Sets this loader's seed to the
        saved one. Epoch iterators already running are not changed.

        The sampler's saved state is loaded now, so a ``set_epoch()`` of yours afterwards
        acts as it would have in the uninterrupted run (torch's idiom calls it before
        every epoch); in the middle of an epoch, ``iter()`` then checks that the sampler's
        state is still the saved one. ``loader.set_epoch(n)`` with another epoch than
        the saved one cancels the resume."""
        state = _resume.check(state, "iterable" if self._iterable else "map")  # its whole shape
        saved, ours = state["batching"], self._batching()
        if saved != ours:
            raise ValueError(f"load_state_dict: the state was saved by a loader with batch_size="
                             f"{saved['batch_size']}, drop_last={saved['drop_last']}, but this one has batch_size="
                             f"{ours['batch_size']}, drop_last={ours['drop_last']}: the saved position counts batches "
                             "of the saved size")
        if not self._iterable:
            self._sync_distributed()
            self._check_same_sharding(state["sampler"])
            if state["sampler"] is not None:  # None: saved without it, the order is re-read (NOTE above)
                _check_resumable(self._order_source)
                self._order_source.load_state_dict(state["sampler"])
        elif any(s["state"] is not None for s in state["streams"]):
            _check_resumable(self._source, "iterable source")
        if state["seed"] != self.seed:
            self.seed = int(state["seed"])
        self._resume = state
        self._next_epoch = int(state["epoch"])

    def _check_same_sharding(self, saved: Any) -> None:
        """A state saved by a rank that sharded by itself loads only into a loader that
        shards alike (``DistributedSampler`` checks the rank and world size)."""
        if not self._own_sampler or not isinstance(saved, dict):
            return
        if "num_replicas" in saved and self._shard is None:
            raise ValueError(
                f"load_state_dict: the state was saved by rank {saved.get('rank')} of {saved['num_replicas']} "
                "processes, where this loader read only its rank's share, but torch.distributed is not initialized "
                "here (or distributed=False): initialize the process group before load_state_dict(), with the same "
                "world size")
        if "num_replicas" not in saved and self._shard is not None:
            raise ValueError(
                f"load_state_dict: the state was saved by a loader reading the whole dataset, but this one reads "
                f"rank {self._shard[1]}'s share of {self._shard[0]} processes (torch.distributed is initialized): a "
                "position means nothing in another order. Resume in the same kind of job, or pass distributed=False")

    def set_epoch(self, epoch: int) -> None:
        """Make the next epoch ``epoch`` (later ones continue epoch+1, ...), also for an
        iterator made by ``iter()`` that has not yielded its first batch yet; forwarded to
        the sampler (or batch sampler) that has ``set_epoch``. After
        :meth:`load_state_dict`, another epoch than the saved one cancels the resume; the
        saved one keeps it, and leaves the loaded sampler as it is."""
        check_int("epoch", epoch, 0)
        self._next_epoch = int(epoch)
        if self._progress is not None and not self._progress.finished:
            self._progress = None  # an epoch left with break: state_dict() now describes epoch `epoch`
        if self._resume is not None:
            if self._resume["epoch"] == epoch:
                return
            self._resume = None
        source = self._order_source
        if source is not None and hasattr(source, "set_epoch"):
            source.set_epoch(epoch)

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
                                               memory=memory, dataset=self.dataset)

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
        self.__dict__.update(state, _cfg=None, _sessions=_Sessions(), _claiming=threading.Lock())
        self.__dict__["_finalizer"] = weakref.finalize(self, _Sessions.close, self._sessions)

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
