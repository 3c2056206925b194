"""DistributedSampler (pure: no processes) and several ranks' loaders on one node. The
real torchrun job is in tests/test_torchrun.py. Where the rank comes from and how it
seeds the batches are read from the internals (``shmload._ordering.distributed`` and
``seeding``), on purpose."""

from __future__ import annotations

import numpy as np
import pytest

from shmload import DataLoader, DistributedSampler
from shmload._ordering.distributed import current_rank, world
from shmload._ordering.seeding import batch_seed

from .helpers import AugmentedDataset, RangeDataset


def shards(n, world_size, **kwargs):
    return [list(DistributedSampler(range(n), num_replicas=world_size, rank=r, **kwargs)) for r in range(world_size)]


@pytest.mark.pure
@pytest.mark.parametrize("n", [1, 7, 10, 12, 13])
@pytest.mark.parametrize("world_size", [1, 2, 3, 5])
@pytest.mark.parametrize("shuffle", [False, True])
def test_torch_partition_rules(n, world_size, shuffle):
    """Every rank gets ceil(n / world) samples; the padding repeats the order's head, so
    the union covers the dataset and only the padded samples repeat."""
    parts = shards(n, world_size, shuffle=shuffle, seed=3)
    per_rank = -(-n // world_size)
    assert all(len(p) == per_rank for p in parts)
    flat = [i for p in parts for i in p]
    assert sorted(set(flat)) == list(range(n))
    assert len(flat) - len(set(flat)) == per_rank * world_size - n
    if not shuffle:  # rank r takes every world-th index of 0..n-1 padded with its head, as torch does
        padded = np.resize(np.arange(n), per_rank * world_size)
        assert parts == [padded[r::world_size].tolist() for r in range(world_size)]


@pytest.mark.pure
@pytest.mark.parametrize("n,world_size", [(10, 3), (12, 3), (2, 3)])
def test_drop_last_cuts_to_an_even_share_and_the_shares_are_disjoint(n, world_size):
    parts = shards(n, world_size, drop_last=True, shuffle=True)
    assert all(len(p) == n // world_size for p in parts)
    flat = [i for p in parts for i in p]
    assert len(flat) == len(set(flat))


@pytest.mark.pure
def test_the_order_is_fixed_by_seed_and_epoch_and_advances_each_epoch():
    a = DistributedSampler(range(100), num_replicas=2, rank=0, seed=4)
    first, second = list(a), list(a)
    assert first != second and a.epoch == 2
    b = DistributedSampler(range(100), num_replicas=2, rank=0, seed=4)
    b.set_epoch(1)
    assert list(b) == second
    assert list(DistributedSampler(range(100), num_replicas=2, rank=0, seed=5)) != first
    c = DistributedSampler(range(100), num_replicas=2, rank=0, seed=4)
    c.set_epoch(0)  # torch's idiom: set_epoch before every epoch
    assert list(c) == first and len(c) == 50 and c.num_samples == 50 and c.total_size == 100


@pytest.mark.pure
@pytest.mark.torch
@pytest.mark.parametrize("n,world_size,drop_last", [(10, 3, False), (10, 3, True), (2, 3, False), (12, 4, False)])
def test_the_same_partition_as_torch_without_shuffle(n, world_size, drop_last):
    torch_data = pytest.importorskip("torch.utils.data")
    for r in range(world_size):
        theirs = torch_data.DistributedSampler(range(n), num_replicas=world_size, rank=r, shuffle=False,
                                               drop_last=drop_last)
        ours = DistributedSampler(range(n), num_replicas=world_size, rank=r, shuffle=False, drop_last=drop_last)
        assert list(ours) == list(theirs) and len(ours) == len(theirs)


@pytest.mark.pure
def test_rank_and_world_size_come_from_the_torchrun_environment(monkeypatch):
    monkeypatch.setenv("WORLD_SIZE", "4")
    monkeypatch.setenv("RANK", "3")
    s = DistributedSampler(range(10))
    assert (s.num_replicas, s.rank) == (4, 3) and current_rank() == 3
    assert world()[2] == "the WORLD_SIZE and RANK environment variables"
    assert DistributedSampler(range(10), rank=1).rank == 1  # given beats found


@pytest.mark.pure
def test_without_torchrun_or_arguments_the_error_says_what_to_do(monkeypatch):
    monkeypatch.delenv("WORLD_SIZE", raising=False)
    monkeypatch.delenv("RANK", raising=False)
    with pytest.raises(RuntimeError, match=r"DistributedSampler needs num_replicas and rank: torch.distributed is not "
                                           r"initialized and the WORLD_SIZE and RANK environment variables"):
        DistributedSampler(range(10))
    assert current_rank() == 0
    assert DistributedSampler(range(10), num_replicas=2, rank=1).rank == 1  # no torch, no environment needed
    monkeypatch.setenv("WORLD_SIZE", "two")
    monkeypatch.setenv("RANK", "0")
    with pytest.raises(ValueError, match=r"WORLD_SIZE and RANK should be integers, but the environment has "
                                         r"WORLD_SIZE='two', RANK='0'"):
        DistributedSampler(range(10))


@pytest.mark.pure
@pytest.mark.parametrize("kwargs,message", [
    (dict(num_replicas=2, rank=2), r"Invalid rank 2, rank should be in the interval \[0, 1\]"),
    (dict(num_replicas=0, rank=0), r"num_replicas should be a positive integer, but got num_replicas=0"),
    (dict(num_replicas=2, rank=-1), r"rank should be a non-negative integer, but got rank=-1"),
    (dict(num_replicas=2, rank=0, shuffle=1), r"shuffle should be True or False, but got shuffle=1"),
    (dict(num_replicas=2, rank=0, seed=-3), r"seed should be a non-negative integer, but got seed=-3"),
])
def test_bad_arguments(kwargs, message):
    with pytest.raises(ValueError, match=message):
        DistributedSampler(range(10), **kwargs)


@pytest.mark.pure
def test_an_empty_dataset_gives_every_rank_nothing_as_torchs_does():
    sampler = DistributedSampler([], num_replicas=2, rank=1)
    assert (list(sampler), len(sampler), sampler.epoch) == ([], 0, 1)


@pytest.mark.pure
def test_the_samplers_seed_orders_and_the_rank_decorrelates_augmentation():
    """Two ranks' loaders with different loader seeds still split the data by the
    sampler's seed; with the same loader seed their augmentation still differs."""
    ds = AugmentedDataset()
    loaders = [DataLoader(ds, batch_size=4, seed=s, sampler=DistributedSampler(ds, num_replicas=2, rank=r, seed=8))
               for r, s in ((0, 1), (1, 2))]
    labels = [[i for b in loader for i in b[2].tolist()] for loader in loaders]
    assert sorted(labels[0] + labels[1]) == list(range(40))
    assert batch_seed(1, 0, 5, rank=0) != batch_seed(1, 0, 5, rank=1)
    same_seed = [DataLoader(ds, batch_size=4, seed=1, sampler=DistributedSampler(ds, num_replicas=2, rank=r,
                                                                                  shuffle=False)) for r in (0, 1)]
    first = [next(iter(loader))[0] for loader in same_seed]
    assert not np.array_equal(first[0], first[1])


def test_ranks_on_one_node_each_own_a_ring(start_method):
    """Two loaders with workers at once, as two ranks on one node: separate rings, no
    collision, each its shard."""
    ds = RangeDataset(50)
    loaders = [DataLoader(ds, batch_size=5, num_workers=2, timeout=30, multiprocessing_context=start_method,
                          sampler=DistributedSampler(ds, num_replicas=2, rank=r, seed=3)) for r in (0, 1)]
    iters = [iter(loader) for loader in loaders]
    got = [[], []]
    for _ in range(len(loaders[0])):
        for r in (0, 1):
            got[r] += next(iters[r]).tolist()
    assert sorted(got[0] + got[1]) == list(range(50)) and not set(got[0]) & set(got[1])
    del iters
