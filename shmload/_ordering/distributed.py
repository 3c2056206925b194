"""Distributed data parallel: which share of the dataset this rank loads.

Each rank (one process per device, launched by ``torchrun``) runs its own loader with
its own workers and its own ring; :class:`DistributedSampler` picks the rank's indices.
The partition follows ``torch.utils.data.DistributedSampler``, so a job that switches
keeps its batch counts: the epoch's order (a permutation, or ``0..n-1``) is padded by
repeating its head until it divides evenly (or, with ``drop_last``, cut to the largest
multiple of the world size), and rank ``r`` takes every ``num_replicas``-th index from
position ``r``. Every rank therefore gets the same number of samples, which DDP needs:
a rank with one batch fewer would wait forever in the others' all-reduce.

The permutation is shmload's own (``sampler.shuffled``, computed a batch at a time and
split by ``sharding.share``), fixed by the sampler's
``seed`` and epoch: the same on every rank (the shards are disjoint only if all ranks
shuffle alike), whatever seed each rank's loader has.
"""

from __future__ import annotations

import os
from typing import Any, Sized

import numpy as np

from .._core._checks import check_int
from . import elastic as _elastic
from . import sharding
from .sampler import Order, OrderLike, SeededSampler, check_state, shuffled


def world() -> tuple[int, int, str]:
    """(world size, rank, where they came from): ``torch.distributed`` when it is
    initialized, else the ``WORLD_SIZE``/``RANK`` environment that torchrun sets."""
    group = sharding.torch_world()
    if group is not None:
        return group[0], group[1], "torch.distributed"
    size, rank = os.environ.get("WORLD_SIZE"), os.environ.get("RANK")
    if size is None or rank is None:
        raise RuntimeError(
            "DistributedSampler needs num_replicas and rank: torch.distributed is not initialized and "
            "the WORLD_SIZE and RANK environment variables (set by torchrun) are not both set. Launch "
            "with torchrun, call torch.distributed.init_process_group() first, or pass "
            "num_replicas= and rank= yourself")
    try:
        return int(size), int(rank), "the WORLD_SIZE and RANK environment variables"
    except ValueError:
        raise ValueError(f"WORLD_SIZE and RANK should be integers, but the environment has "
                         f"WORLD_SIZE={size!r}, RANK={rank!r}") from None


def world_or_alone() -> tuple[int, int]:
    """(world size, rank) as :func:`world` finds them, else (1, 0): one process alone."""
    try:
        size, rank, _ = world()
    except (RuntimeError, ValueError):
        return 1, 0
    return size, rank


def current_rank(sampler: Any = None) -> int:
    """This process's rank, for the batch seeds (``seeding.batch_seed``): the sampler's if
    it is a :class:`DistributedSampler`, else torch.distributed's or the ``RANK``
    environment's, else 0."""
    if isinstance(sampler, DistributedSampler):
        return sampler.rank
    return world_or_alone()[1]


class DistributedSampler(SeededSampler):
    """This rank's share of ``dataset``, reshuffled every epoch.

    ``num_replicas`` and ``rank`` default to those of ``torch.distributed`` (when
    initialized) or of the ``WORLD_SIZE``/``RANK`` environment; give both and no torch is
    needed. ``seed`` fixes the order (it takes precedence over the loader's seed, which
    only seeds augmentation) and must be the same on every rank.

    It counts epochs like :class:`shmload.RandomSampler` (``sampler.EpochSampler``): calling
    ``set_epoch(epoch)`` before each epoch, as torch requires, gives the same orders;
    forgetting it no longer repeats the first epoch's order.

    ``elastic=True``: the share is this rank's contiguous slice of each global batch
    (NOTE [ The global sequence ], elastic.py), the same global sequence for any number of
    ranks, and the state is the global position, the same on every rank, which resumes
    on any world size. It needs the per-rank ``batch_size`` (or ``global_batch_size``,
    divisible by the world size); a :class:`shmload.DataLoader` given the sampler tells
    it its own ``batch_size``.
    """

    _array_order = True  # (see sampler.EpochSampler)
    _state_keys = SeededSampler._state_keys + ("num_replicas", "rank")
    _elastic_keys = SeededSampler._state_keys + ("elastic", "shuffle", "drop_last", "position", "global_batch_size")

    def __init__(self, dataset: Sized, num_replicas: int | None = None, rank: int | None = None,
                 shuffle: bool = True, seed: int = 0, drop_last: bool = False, *, elastic: bool = False,
                 batch_size: int | None = None, global_batch_size: int | None = None):
        if num_replicas is None or rank is None:
            size, found_rank, source = world()
            if num_replicas is None:
                num_replicas = size
            if rank is None:
                rank = found_rank
        check_int("num_replicas", num_replicas, 1)
        check_int("rank", rank, 0)
        super().__init__(dataset, seed)  # (checks the seed)
        if rank >= num_replicas:
            raise ValueError(f"Invalid rank {rank}, rank should be in the interval [0, {num_replicas - 1}]")
        for name, flag in (("shuffle", shuffle), ("drop_last", drop_last), ("elastic", elastic)):
            if not isinstance(flag, bool):
                raise ValueError(f"{name} should be True or False, but got {name}={flag!r}")
        self.dataset = dataset  # torch's name for data_source
        self.num_replicas = int(num_replicas)
        self.rank = int(rank)
        self.shuffle = shuffle
        self.drop_last = drop_last
        self.elastic = elastic
        if not elastic and (batch_size is not None or global_batch_size is not None):
            raise ValueError("batch_size= and global_batch_size= are for elastic=True (a global batch is cut into "
                             "the ranks' slices): without it, give batch_size to the DataLoader")
        check_int("batch_size", batch_size, 1, allow_none=True)
        check_int("global_batch_size", global_batch_size, 1, allow_none=True)
        self.batch_size, self.global_batch_size = _elastic.batch_sizes(self.num_replicas, batch_size,
                                                                       global_batch_size)
        self.position = 0  # elastic: the global position the next epoch starts from (a loaded state's)

    def bind_batch_size(self, batch_size: int) -> None:
        """An elastic sampler learns the loader's per-rank ``batch_size`` (the loader calls
        this); a ValueError if it was given another."""
        if self.batch_size is None:
            self.batch_size, self.global_batch_size = batch_size, batch_size * self.num_replicas
        elif self.batch_size != batch_size:
            raise ValueError(
                f"the DataLoader has batch_size={batch_size}, but its elastic DistributedSampler cuts global batches "
                f"of {self.global_batch_size} into slices of {self.batch_size} for {self.num_replicas} ranks: give "
                f"the loader batch_size={self.batch_size}, or the sampler the same batch size")

    def _grid(self, n: int) -> _elastic.Grid:
        if self.batch_size is None or self.global_batch_size is None:
            raise ValueError("an elastic DistributedSampler needs the per-rank batch size to cut global batches "
                             "into the ranks' slices: pass batch_size= (or global_batch_size=), or give the "
                             "sampler to a shmload.DataLoader with batch_size")
        return _elastic.Grid(n, self.global_batch_size, self.batch_size, self.rank,
                             _elastic.origin(self.position, self.global_batch_size), self.drop_last)

    @property
    def num_samples(self) -> int:
        """Samples per rank (torch's attribute; computed, so a dataset that grows is followed)."""
        n, world_size = len(self.data_source), self.num_replicas
        if self.elastic:
            grid = self._grid(n)
            return grid.batches * grid.batch
        if self.drop_last:
            return n // world_size
        return -(-n // world_size)

    @property
    def total_size(self) -> int:
        return self.num_samples * self.num_replicas

    def _epoch_order(self, n: int) -> OrderLike | _elastic.RankShare:  # type: ignore[override]
        if n == 0:
            return np.arange(0)  # nothing to share, as torch's
        # computed a batch at a time (sampler.py, NOTE [ Orders are computed a slice at a time ])
        order = shuffled(self.seed, self.epoch, n) if self.shuffle else Order(n)
        if self.elastic:
            return _elastic.RankShare(order, self._grid(n))
        return sharding.share(order, self.total_size, self.rank, self.num_replicas)

    def _order(self) -> Any:
        order = super()._order()
        self.position = 0  # (a resumed position is the drawn epoch's only)
        return order

    def resumed_batch(self) -> int:
        """Elastic: the rank's first batch of the epoch the sampler is at, given its
        position (a loaded state's): the batches before it were delivered."""
        return self.position // self._grid(len(self.data_source)).global_batch

    def __len__(self) -> int:
        return self.num_samples

    def state_dict(self) -> dict:
        if not self.elastic:
            return super().state_dict()
        return {"seed": self.seed, "epoch": self.epoch, "length": len(self.data_source), "elastic": True,
                "shuffle": self.shuffle, "drop_last": self.drop_last, "position": self.position,
                "global_batch_size": self.global_batch_size}

    def load_state_dict(self, state: dict) -> None:
        saved_elastic = _elastic.is_elastic(state)
        if saved_elastic != self.elastic:
            raise ValueError(_elastic_mismatch(saved_elastic, state))
        if not self.elastic:
            return super().load_state_dict(state)
        state = check_state(self, state, self._elastic_keys)
        for key in ("shuffle", "drop_last"):
            if state[key] != getattr(self, key):
                raise ValueError(f"DistributedSampler.load_state_dict: the state was saved with {key}={state[key]}, "
                                 f"but this sampler has {key}={getattr(self, key)}: the global sequence differs")
        check_int("position", state["position"], 0)
        super()._load(state)  # (SeededSampler's: the seed and the epoch; no rank to check)
        self.position = int(state["position"])

    def _load(self, state: dict) -> None:
        if (state["num_replicas"], state["rank"]) != (self.num_replicas, self.rank):
            raise ValueError(
                f"DistributedSampler.load_state_dict: the state was saved by rank {state['rank']} of "
                f"{state['num_replicas']}, but this sampler is rank {self.rank} of {self.num_replicas}: a "
                "position in one rank's shard means nothing in another's. Resume with the same world "
                "size, each rank loading its own state, or use elastic=True (a state that resumes on any "
                "world size)")
        super()._load(state)

    def __repr__(self) -> str:
        more = f", elastic=True, batch_size={self.batch_size}" if self.elastic else ""
        return (f"DistributedSampler(rank={self.rank}, num_replicas={self.num_replicas}, shuffle={self.shuffle}, "
                f"seed={self.seed}, drop_last={self.drop_last}, epoch={self.epoch}{more})")


def _elastic_mismatch(saved_elastic: bool, state: Any) -> str:
    if saved_elastic:
        return ("DistributedSampler.load_state_dict: the state was saved by an elastic sampler (global position "
                f"{state.get('position')}), but this one is not elastic: pass elastic=True to resume it")
    where = (f"rank {state.get('rank')} of {state.get('num_replicas')}" if isinstance(state, dict)
             and "rank" in state else "a sampler that is not elastic")
    return (f"DistributedSampler.load_state_dict: the state was saved by {where}, but this sampler is elastic: "
            "an elastic sampler resumes from an elastic state only (its position is global). Resume without "
            "elastic=True, or start the elastic run from an epoch's start")


NEEDS_IN_ORDER = ("needs in_order=True: with batches delivered out of order no rank's position is the global one, "
                  "and the ranks would deliver differently")


def check_elastic(elastic: Any, iterable: bool, batch_size: int | None, sampler: Any, batch_sampler: Any,
                  in_order: Any, distributed: Any) -> bool:
    """Whether a loader is elastic (NOTE [ The global sequence ], elastic.py): asked with
    ``elastic=True``, or given an elastic sampler, which then learns the loader's
    ``batch_size``. A ValueError names what elastic loading cannot be combined with."""
    if not isinstance(elastic, bool):
        raise ValueError(f"elastic should be True or False, but got elastic={elastic!r}")
    given = isinstance(sampler, DistributedSampler) and sampler.elastic
    if not (elastic or given):
        return False
    why = None
    if iterable:
        why = ("needs a map-style dataset: a stream's position is each reader's own, which another number of "
               "readers cannot continue (docs/distributed.md)")
    elif batch_sampler is not None:
        why = "cuts the loader's own batches into the ranks' slices: give batch_size=, not batch_sampler="
    elif batch_size is None:
        why = "needs batches (each global batch is cut into the ranks' slices): give batch_size="
    elif in_order is False:
        why = NEEDS_IN_ORDER
    elif distributed is False:
        why = "reads this rank's slice of every global batch: it cannot be combined with distributed=False"
    elif sampler is not None and not given:
        why = (f"reads with its own sampler, or with shmload.DistributedSampler(..., elastic=True), not with "
               f"{type(sampler).__name__}")
    if why is not None:
        raise ValueError(f"elastic=True {why}")
    if given:
        sampler.bind_batch_size(batch_size)
    return True
