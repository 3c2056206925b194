"""Samplers: pure, no processes. The orders under them and their seeding
(``shmload._ordering.sampler`` and ``seeding``) are tested too, as internals."""

import itertools
import sys

import numpy as np
import pytest

from shmload import BatchSampler, RandomSampler, SequentialSampler
from shmload._ordering import seeding
from shmload._ordering.sampler import Order
from shmload._ordering.seeding import RangeShuffle, permutation
from shmload._transport.messages import Indices

pytestmark = pytest.mark.pure


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


@pytest.mark.parametrize("kind", ["ours", "list", "generator"])  # our order's slices, or islice over the sampler
@pytest.mark.parametrize("n,batch,drop,expected", [
    (10, 3, False, [[0, 1, 2], [3, 4, 5], [6, 7, 8], [9]]),
    (10, 3, True, [[0, 1, 2], [3, 4, 5], [6, 7, 8]]),
    (9, 3, True, [[0, 1, 2], [3, 4, 5], [6, 7, 8]]),
    (9, 3, False, [[0, 1, 2], [3, 4, 5], [6, 7, 8]]),
    (2, 5, True, []),
    (2, 5, False, [[0, 1]]),
    (0, 3, False, []),
])
def test_batches_and_len(kind, n, batch, drop, expected):
    source = {"ours": lambda: SequentialSampler(range(n)), "list": lambda: list(range(n)),
              "generator": lambda: _Sized(lambda: iter(range(n)), n)}[kind]()
    sampler = BatchSampler(source, batch, drop)
    assert list(sampler) == expected
    assert list(sampler) == expected  # a second epoch: the sampler iterated afresh
    assert len(sampler) == len(expected)


def test_batch_sampler_over_a_plain_iterable_matches_the_fast_path():
    fast = BatchSampler(SequentialSampler(range(10)), 4, False)
    slow = BatchSampler(list(range(10)), 4, False)
    assert list(fast) == list(slow)


@pytest.mark.parametrize("drop", [False, True])
def test_a_foreign_sampler_is_drawn_only_as_far_as_the_batches_asked_for(drop):
    drawn = []

    def sampler():  # a generator: each index drawn is recorded
        for i in range(10):
            drawn.append(i)
            yield i

    batches = BatchSampler(_Sized(sampler, 10), 4, drop)
    it = iter(batches)
    assert next(it) == [0, 1, 2, 3] and drawn == [0, 1, 2, 3]  # not one index ahead
    assert next(it) == [4, 5, 6, 7] and drawn == list(range(8))
    assert list(it) == ([] if drop else [[8, 9]]) and drawn == list(range(10))


class _Sized:
    def __init__(self, make, n):
        self.make, self.n = make, n

    def __iter__(self):
        return self.make()

    def __len__(self):
        return self.n


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
    from shmload._ordering.seeding import batch_seed
    seeds = {batch_seed(seed, epoch, pos) for seed in (0, 1, 2**62) for epoch in range(3) for pos in range(50)}
    assert len(seeds) == 3 * 3 * 50  # no two batches share their seed
    assert batch_seed(7, 1, 3) == batch_seed(7, 1, 3) and 0 <= batch_seed(7, 1, 3) < 2**64
    assert batch_seed(1, 23, 4) != batch_seed(12, 3, 4)  # the fields cannot run into each other


def test_random_sampler_orders_are_those_of_earlier_versions():
    """Pinned (computed by the version before lazy orders): below the size limit of the lazy
    shuffle, orders and so saved states mean what they meant."""
    sampler = RandomSampler(range(12), seed=7)
    assert list(sampler) == [9, 10, 3, 8, 6, 0, 11, 1, 5, 2, 7, 4]
    assert list(sampler) == [6, 2, 8, 1, 3, 0, 9, 5, 4, 7, 11, 10]


def slices(n):
    ends = (None, 0, 2, -3, n, n + 5)
    return [slice(a, b, s) for a in ends for b in ends for s in (None, 1, 3, -1, -2)]


@pytest.mark.parametrize("n", [0, 1, 7, 10])
def test_an_order_slices_like_the_index_array_it_stands_for(n):
    shuffle = RangeShuffle(3, 0, n)
    for order, array in ((Order(n), np.arange(n)), (Order(n, shuffle), shuffle(np.arange(n)))):
        assert len(order) == n and list(order) == np.asarray(order).tolist() == order.tolist() == array.tolist()
        for key in slices(n):
            part = order[key]
            assert isinstance(part, Order) and len(part) == len(array[key])
            assert part.tolist() == array[key].tolist() and part[1::2].tolist() == array[key][1::2].tolist()
        assert [order[i] for i in range(-n, n)] == [array[i] for i in range(-n, n)]
        assert all(type(i) is int for i in order.tolist() + list(order) + [order[i] for i in range(n)])
        with pytest.raises(IndexError):
            order[n]


def test_sequential_and_random_samplers_iterate_and_batch_as_before_through_orders():
    assert list(BatchSampler(RandomSampler(range(10), seed=7), 4, False)) == \
        [o[i:i + 4] for o in [permutation(7, 0, 10).tolist()] for i in range(0, 10, 4)]
    assert all(type(i) is int for i in RandomSampler(range(10)))
    assert list(BatchSampler(SequentialSampler(range(10)), 4, True)) == [[0, 1, 2, 3], [4, 5, 6, 7]]


def test_the_lazy_shuffle_is_a_bijection_of_the_range():
    for n in list(range(1, 300)) + [1000, 4099, 65535, 65536, 65537]:
        for seed, epoch in ((5, 2), (0, 0)):
            assert sorted(RangeShuffle(seed, epoch, n)(np.arange(n)).tolist()) == list(range(n)), (n, seed, epoch)


def test_the_lazy_shuffle_is_fixed_by_seed_and_epoch_and_differs_between_them():
    positions = np.arange(0, 2**40, 2**40 // 1000)
    orders = {(seed, epoch): RangeShuffle(seed, epoch, 2**40)(positions).tolist() for seed in (0, 1) for epoch in (0, 1)}
    assert orders[0, 0] == RangeShuffle(0, 0, 2**40)(positions).tolist()
    assert len({tuple(o) for o in orders.values()}) == 4
    n = 1000  # a whole small range: not the identity, and unrelated between epochs
    a, b = RangeShuffle(0, 0, n)(np.arange(n)), RangeShuffle(0, 1, n)(np.arange(n))
    assert (a == np.arange(n)).sum() < 10 and (a == b).sum() < 10


SPLITMIX = (0xBF58476D1CE4E5B9, 0x94D049BB133111EB)


def reference_round(key, half):
    """A round's F in plain Python ints: SplitMix64's finalizer of ``half ^ key``."""
    z = half ^ key
    z ^= z >> 30
    z = z * SPLITMIX[0] % 2**64
    z ^= z >> 27
    z = z * SPLITMIX[1] % 2**64
    return z ^ (z >> 31)


def reference_shuffle(shuffle, x, backwards=False):
    """RangeShuffle's bijection (or its inverse) written from its definition in Python's
    unbounded ints, one position at a time: nothing to overflow."""
    a, c, keys = shuffle.a, shuffle.c, [int(k) for k in shuffle.keys]
    while True:
        left, right = divmod(x, c)
        if backwards:
            for i in reversed(range(len(keys))):
                p = a if i % 2 == 0 else c  # round i's left modulus
                left, right = (right - reference_round(keys[i], left)) % p, left
        else:
            p, q = a, c
            for key in keys:
                left, right, p, q = right, (left + reference_round(key, right)) % p, q, p
        x = left * c + right
        if x < shuffle.n:  # cycle-walking
            return x


@pytest.mark.parametrize("n", [2**32 + 1, 2**40, 3 * 2**40 + 12345, 2**62 + 1, sys.maxsize])
def test_the_lazy_shuffle_of_a_huge_range_is_its_definition_and_inverts(n):
    shuffle = RangeShuffle(9, 4, n)
    rng = np.random.default_rng(0)
    positions = [0, 1, n - 2, n - 1] + [int(p) for p in rng.integers(0, n, 300)]
    got = shuffle(np.array(positions, dtype=np.uint64)).tolist()
    assert got == [reference_shuffle(shuffle, p) for p in positions]
    assert all(0 <= i < n for i in got) and len(set(got)) == len(got)
    assert [reference_shuffle(shuffle, i, backwards=True) for i in got] == positions


def test_the_exact_permutation_is_kept_up_to_the_limit_and_the_lazy_shuffle_used_above(monkeypatch):
    monkeypatch.setattr(seeding, "EXACT_SHUFFLE_LIMIT", 50)
    assert list(RandomSampler(range(50), seed=3)) == permutation(3, 0, 50).tolist()
    above = RandomSampler(range(51), seed=3)
    order = above._order()
    assert isinstance(order, Order) and sorted(order.tolist()) == list(range(51))
    assert list(above) != order.tolist() and RandomSampler(range(51), seed=3)._order().tolist() == order.tolist()


def test_an_order_too_large_to_build_says_so_instead_of_being_empty():
    with pytest.raises(MemoryError, match="a slice at a time"):
        np.asarray(Order(sys.maxsize))


@pytest.mark.parametrize("shuffle", [False, True])
@pytest.mark.parametrize("drop_last", [False, True])
@pytest.mark.parametrize("batch_size, first", [(1, 0), (300, 0), (300, 7), (4096, 1), (5000, 1)])
def test_the_loaders_batches_computed_a_chunk_at_a_time_are_the_batches(shuffle, drop_last, batch_size, first):
    # batches_from(as_indices=True) slices a chunk of whole batches at once (sampler._indices_from);
    # the list path slices the order batch by batch
    def batches():  # (a fresh sampler each: every iter() of a RandomSampler is a new epoch)
        sampler = RandomSampler(range(10_007), seed=3) if shuffle else SequentialSampler(range(10_007))
        return BatchSampler(sampler, batch_size, drop_last)

    taken = list(batches().batches_from(first, as_indices=True))
    assert all(type(b) is Indices and b.array.dtype == np.int64 for b in taken)
    assert [b.tolist() for b in taken] == list(itertools.islice(iter(batches()), first, None))
    assert len(taken) == len(batches()) - first
