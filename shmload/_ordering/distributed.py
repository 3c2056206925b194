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
from . import sharding
from .sampler import Order, OrderLike, SeededSampler, shuffled


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
    """

    _array_order = True  # (see sampler.EpochSampler)
    _state_keys = SeededSampler._state_keys + ("num_replicas", "rank")

    def __init__(self, dataset: Sized, num_replicas: int | None = None, rank: int | None = None,
                 shuffle: bool = True, seed: int = 0, drop_last: bool = False):
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
        for name, flag in (("shuffle", shuffle), ("drop_last", drop_last)):
            if not isinstance(flag, bool):
                raise ValueError(f"{name} should be True or False, but got {name}={flag!r}")
        self.dataset = dataset  # torch's name for data_source
        self.num_replicas = int(num_replicas)
        self.rank = int(rank)
        self.shuffle = shuffle
        self.drop_last = drop_last

    @property
    def num_samples(self) -> int:
        """Samples per rank (torch's attribute; computed, so a dataset that grows is followed)."""
        n, world_size = len(self.data_source), self.num_replicas
        if self.drop_last:
            return n // world_size
        return -(-n // world_size)

    @property
    def total_size(self) -> int:
        return self.num_samples * self.num_replicas

    def _epoch_order(self, n: int) -> OrderLike:
        if n == 0:
            return np.arange(0)  # nothing to share, as torch's
        # computed a batch at a time (sampler.py, NOTE [ Orders are computed a slice at a time ])
        order = shuffled(self.seed, self.epoch, n) if self.shuffle else Order(n)
        return sharding.share(order, self.total_size, self.rank, self.num_replicas)

    def __len__(self) -> int:
        return self.num_samples

    def _load(self, state: dict) -> None:
        if (state["num_replicas"], state["rank"]) != (self.num_replicas, self.rank):
            raise ValueError(
                f"DistributedSampler.load_state_dict: the state was saved by rank {state['rank']} of "
                f"{state['num_replicas']}, but this sampler is rank {self.rank} of {self.num_replicas}: a "
                "position in one rank's shard means nothing in another's. Resume with the same world "
                "size, each rank loading its own state")
        super()._load(state)

    def __repr__(self) -> str:
        return (f"DistributedSampler(rank={self.rank}, num_replicas={self.num_replicas}, shuffle={self.shuffle}, "
                f"seed={self.seed}, drop_last={self.drop_last}, epoch={self.epoch})")
