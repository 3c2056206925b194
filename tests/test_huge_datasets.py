"""Huge and "endless" map-style datasets (issue 18): an epoch over 2**40 samples, or over
a dataset whose ``len()`` is ``sys.maxsize``, starts at once and takes memory for its
batches only (NOTE [ Orders are computed a slice at a time ] in shmload/_ordering/sampler.py).
The lazy orders, their shuffle and their shares (``shmload._ordering``) are also tested
alone, as internals."""

from __future__ import annotations

import itertools
import json
import sys
import tracemalloc

import numpy as np
import pytest

from shmload import BatchSampler, DataLoader, DistributedSampler, RandomSampler, SequentialSampler
from shmload._ordering.sampler import Order
from shmload._ordering.seeding import RangeShuffle
from shmload._ordering.sharding import share

from .helpers import RangeDataset

ENDLESS = sys.maxsize  # the "endless dataset" idiom: the largest len() Python allows
HUGE = 2**40  # np.arange(HUGE) is 8 TiB


def first_batches(loader, count, start=0):
    """Batches ``start`` to ``start + count`` of the loader's next epoch, as lists; the
    iterator is dropped before returning (the loader's close() ends its workers)."""
    it = iter(loader)
    batches = [b.tolist() for b in itertools.islice(it, start, start + count)]
    del it
    return batches


@pytest.mark.parametrize("workers", [0, 2])
def test_an_endless_dataset_yields_its_batches_in_order_lazily(workers):
    with DataLoader(RangeDataset(ENDLESS), batch_size=4, num_workers=workers, timeout=30) as loader:
        assert len(loader) == 2**61
        assert first_batches(loader, 3) == [[0, 1, 2, 3], [4, 5, 6, 7], [8, 9, 10, 11]]


@pytest.mark.parametrize("workers", [0, 2])
def test_an_endless_dataset_shuffles_lazily_fixed_by_the_seed(workers):
    def batches(seed, num_workers):
        with DataLoader(RangeDataset(ENDLESS), batch_size=4, shuffle=True, seed=seed, num_workers=num_workers,
                        timeout=30) as loader:
            return first_batches(loader, 3)

    got = batches(1, workers)
    flat = [i for b in got for i in b]
    assert [len(b) for b in got] == [4, 4, 4] and len(set(flat)) == 12 and all(0 <= i < ENDLESS for i in flat)
    assert got == batches(1, 0) and got != batches(2, 0)
    # far from sorted: a huge range is shuffled over all of it, not within a window at its start
    assert max(flat) > ENDLESS // 4


@pytest.mark.pure
@pytest.mark.parametrize("make", [SequentialSampler, RandomSampler], ids=["sequential", "random"])
@pytest.mark.parametrize("n", [HUGE, ENDLESS], ids=["2**40", "maxsize"])
def test_a_huge_epoch_takes_memory_for_its_batches_only(make, n):
    sampler = BatchSampler(make(RangeDataset(n)), 256, False)
    tracemalloc.start()  # numpy reports its arrays to tracemalloc
    try:
        batches = list(itertools.islice(iter(sampler), 50))
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert len(batches) == 50 and all(len(b) == 256 for b in batches)
    flat = [i for b in batches for i in b]
    assert len(set(flat)) == len(flat) and all(0 <= i < n for i in flat)
    if make is SequentialSampler:
        assert flat == list(range(50 * 256))
    assert peak < 2**20, f"{peak} bytes traced to take 50 batches of 256"
    assert len(sampler) == -(-n // 256)


@pytest.mark.pure
def test_iterating_a_huge_random_sampler_yields_ints_lazily():
    sampler = RandomSampler(RangeDataset(HUGE), seed=3)
    head = list(itertools.islice(iter(sampler), 10_000))
    assert all(type(i) is int for i in head) and len(set(head)) == len(head) and max(head) > HUGE // 2
    assert sampler.epoch == 1 and list(itertools.islice(iter(RandomSampler(RangeDataset(HUGE), seed=3)), 10)) == head[:10]


@pytest.mark.parametrize("shuffle", [False, True])
@pytest.mark.parametrize("saved_with,resumed_with", [(0, 2), (2, 0)])
def test_a_huge_epoch_resumes_exactly_mid_epoch(shuffle, saved_with, resumed_with):
    def loader(num_workers, seed):
        return DataLoader(RangeDataset(HUGE), batch_size=8, shuffle=shuffle, seed=seed, num_workers=num_workers,
                          timeout=30)

    with loader(0, 5) as reference:
        expected = first_batches(reference, 6)
    with loader(saved_with, 5) as first:
        it = iter(first)
        head = [b.tolist() for b in itertools.islice(it, 3)]
        state = json.loads(json.dumps(first.state_dict()))
        del it
    assert head == expected[:3] and state["next_batch"] == 3
    with loader(resumed_with, 99) as second:  # the state's seed wins
        second.load_state_dict(state)
        assert first_batches(second, 3) == expected[3:]


@pytest.mark.pure
@pytest.mark.parametrize("n", [1, 2, 7, 12, 13])
@pytest.mark.parametrize("size", [1, 2, 3, 5])
@pytest.mark.parametrize("drop_last", [False, True])
def test_a_share_of_a_lazy_order_is_the_share_of_its_array(n, size, drop_last):
    total = (n // size if drop_last else -(-n // size)) * size
    shuffle = RangeShuffle(1, 0, n)
    for order, array in ((Order(n), np.arange(n)), (Order(n, shuffle), shuffle(np.arange(n)))):
        for rank in range(size):
            expected = np.resize(array, max(total, n))[rank:total:size].tolist()  # torch's partition
            lazy, eager = share(order, total, rank, size), share(array, total, rank, size)
            assert isinstance(lazy, Order) and isinstance(eager, np.ndarray)
            assert lazy.tolist() == eager.tolist() == expected and len(lazy) == len(expected)
            assert [lazy[i:i + 2].tolist() for i in range(0, len(lazy), 2)] == \
                [expected[i:i + 2] for i in range(0, len(expected), 2)]  # batches across the padding


@pytest.mark.pure
def test_a_share_of_an_endless_order_is_lazy_and_padded_at_its_end():
    rank1 = share(Order(ENDLESS), ENDLESS + 1, 1, 2)  # two ranks: one sample of padding
    assert len(rank1) == 2**62 and rank1[:3].tolist() == [1, 3, 5]
    assert rank1[-2:].tolist() == [ENDLESS - 2, 0]  # the last position wraps to the order's head


@pytest.mark.pure
@pytest.mark.parametrize("shuffle", [False, True])
def test_a_distributed_share_of_an_endless_dataset_is_lazy(shuffle):
    shares = [DistributedSampler(RangeDataset(ENDLESS), num_replicas=2, rank=r, shuffle=shuffle, seed=4)
              for r in range(2)]
    heads = [list(itertools.islice(iter(s), 1000)) for s in shares]
    assert all(len(h) == 1000 for h in heads) and not set(heads[0]) & set(heads[1])
    if not shuffle:
        assert heads == [list(range(0, 2000, 2)), list(range(1, 2000, 2))]
    batches = BatchSampler(DistributedSampler(RangeDataset(ENDLESS), num_replicas=2, rank=0, shuffle=shuffle,
                                              seed=4), 100, False)
    assert [i for b in itertools.islice(iter(batches), 10) for i in b] == heads[0]
