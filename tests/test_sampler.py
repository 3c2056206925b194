"""Samplers: pure, no processes."""

import pytest

from shmload import BatchSampler, RandomSampler, SequentialSampler


def test_sequential():
    assert list(SequentialSampler(range(5))) == [0, 1, 2, 3, 4]


def test_random_is_a_permutation_fixed_by_seed_and_epoch():
    a = RandomSampler(range(100), seed=3)
    first, second = list(a), list(a)  # each iter() advances the epoch
    assert sorted(first) == list(range(100)) and first != second
    b = RandomSampler(range(100), seed=3)
    assert list(b) == first
    b.set_epoch(1)
    assert list(b) == second
    assert list(RandomSampler(range(100), seed=4)) != first
    assert all(type(i) is int for i in first)


@pytest.mark.parametrize("n,batch,drop,expected", [
    (10, 3, False, [[0, 1, 2], [3, 4, 5], [6, 7, 8], [9]]),
    (10, 3, True, [[0, 1, 2], [3, 4, 5], [6, 7, 8]]),
    (9, 3, True, [[0, 1, 2], [3, 4, 5], [6, 7, 8]]),
    (2, 5, True, []),
])
def test_batches_and_len(n, batch, drop, expected):
    sampler = BatchSampler(SequentialSampler(range(n)), batch, drop)
    assert list(sampler) == expected
    assert len(sampler) == len(expected)


def test_batch_sampler_over_a_plain_iterable_matches_the_fast_path():
    fast = BatchSampler(SequentialSampler(range(10)), 4, False)
    slow = BatchSampler(list(range(10)), 4, False)
    assert list(fast) == list(slow)


@pytest.mark.parametrize("bad", [0, -1, 1.5, True, None])
def test_bad_batch_size(bad):
    with pytest.raises(ValueError, match="batch_size should be a positive integer"):
        BatchSampler(SequentialSampler(range(3)), bad, False)


def test_bad_seed_and_epoch():
    with pytest.raises(ValueError, match="seed should be a non-negative integer"):
        RandomSampler(range(3), seed=-1)
    with pytest.raises(ValueError, match="epoch should be a non-negative integer"):
        RandomSampler(range(3)).set_epoch("1")


def test_batch_seeds_are_fixed_by_seed_epoch_and_position_and_differ_between_them():
    from shmload.seeding import batch_seed
    seeds = {batch_seed(seed, epoch, pos) for seed in (0, 1, 2**62) for epoch in range(3) for pos in range(50)}
    assert len(seeds) == 3 * 3 * 50  # no two batches share their seed
    assert batch_seed(7, 1, 3) == batch_seed(7, 1, 3) and 0 <= batch_seed(7, 1, 3) < 2**64
    assert batch_seed(1, 23, 4) != batch_seed(12, 3, 4)  # the fields cannot run into each other
