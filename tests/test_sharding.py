"""Sharding under a trainer (shmload/_ordering/sharding.py): the pure rule, tested as
internals, and the loader following it. The world is given by hand here;
tests/test_torchrun.py, test_lightning.py and test_accelerate.py run the same with real
torch.distributed process groups, Lightning and accelerate."""

from __future__ import annotations

import json

import numpy as np
import pytest

from shmload import DataLoader, DistributedSampler, RandomSampler, SequentialSampler
from shmload._ordering import sharding
from shmload._ordering.sharding import DistributedWarning, decide, looks_distributed

from .helpers import AugmentedDataset, RangeDataset

pytestmark = pytest.mark.pure


class TorchLikeDistributed:
    """What torch's, Lightning's and accelerate's distributed samplers have in common."""
    num_replicas, rank = 2, 0


class AccelerateLikeShard:
    num_processes, process_index = 2, 1


def test_the_rule_shards_only_the_loaders_own_sampler_and_only_with_more_than_one_process():
    assert decide(None, True, None, None) == (None, None)
    assert decide(None, True, None, (1, 0)) == (None, None)
    assert decide(False, True, None, (4, 2)) == (None, None)
    shard, note = decide(None, True, None, (4, 2))
    assert shard == (4, 2) and "reads only rank 2's share" in note and "distributed=False" in note
    assert decide(True, True, None, (4, 2)) == ((4, 2), None)  # asked for: no message


def test_the_rule_warns_about_a_users_sampler_that_does_not_shard_and_names_the_fix():
    shard, note = decide(None, False, SequentialSampler(range(8)), (2, 1))
    assert shard is None
    assert note is not None and "SequentialSampler you gave is not distributed" in note
    assert "shmload.DistributedSampler(dataset)" in note and "distributed=False" in note
    for distributed in (TorchLikeDistributed(), AccelerateLikeShard(), DistributedSampler(range(8), 2, 1)):
        assert looks_distributed(distributed)
        assert decide(None, False, distributed, (2, 1)) == (None, None)
    assert decide(False, False, SequentialSampler(range(8)), (2, 1)) == (None, None)


def test_a_batch_sampler_over_a_distributed_sampler_counts_as_distributed():
    class Batches:
        sampler = TorchLikeDistributed()
    assert looks_distributed(Batches())
    assert not looks_distributed(RandomSampler(range(4)))


def in_world(monkeypatch, size, rank):
    monkeypatch.setattr(sharding, "torch_world", lambda: (size, rank) if size else None)


@pytest.mark.parametrize("shuffle", [False, True])
def test_the_loader_reads_this_ranks_share_as_distributed_sampler_would(monkeypatch, shuffle):
    n, world = 23, 3
    for rank in range(world):
        in_world(monkeypatch, world, rank)
        loader = DataLoader(RangeDataset(n), batch_size=4, shuffle=shuffle, seed=5)
        with pytest.warns(DistributedWarning, match=rf"reads only rank {rank}'s share"):
            got = [int(i) for b in loader for i in b]
        assert len(loader) == 2 == -(-len(got) // 4)
        expected = list(DistributedSampler(RangeDataset(n), world, rank, shuffle=shuffle, seed=5))
        assert got == expected
        assert isinstance(loader.sampler, DistributedSampler)


def test_shares_cover_the_dataset_pad_alike_and_differ_between_epochs(monkeypatch):
    n, world = 10, 4
    shares = []
    for rank in range(world):
        in_world(monkeypatch, world, rank)
        loader = DataLoader(RangeDataset(n), batch_size=2, shuffle=True, distributed=True)
        shares.append([[int(i) for b in loader for i in b] for _ in range(2)])
    for epoch in range(2):
        ids = [i for share in shares for i in share[epoch]]
        assert sorted(set(ids)) == list(range(n)) and len(ids) == 12  # padded to 3 each
    assert [s[0] for s in shares] != [s[1] for s in shares]


def test_without_a_seed_every_rank_shuffles_alike(monkeypatch):
    """seed=None draws a seed per process: the share's order must not depend on it."""
    in_world(monkeypatch, 2, 0)
    a = DataLoader(RangeDataset(16), batch_size=4, shuffle=True, distributed=True)
    b = DataLoader(RangeDataset(16), batch_size=4, shuffle=True, distributed=True)
    assert a.seed != b.seed
    assert [list(x) for x in a] == [list(x) for x in b]


def test_distributed_false_reads_everything_and_says_nothing(monkeypatch, recwarn):
    in_world(monkeypatch, 2, 1)
    loader = DataLoader(RangeDataset(10), batch_size=5, distributed=False)
    assert len(loader) == 2 and sorted(int(i) for b in loader for i in b) == list(range(10))
    assert not recwarn.list


def test_a_users_plain_sampler_is_used_as_given_with_one_warning(monkeypatch):
    in_world(monkeypatch, 2, 1)
    loader = DataLoader(RangeDataset(10), batch_size=5, sampler=SequentialSampler(RangeDataset(10)))
    with pytest.warns(DistributedWarning, match=r"the sampler SequentialSampler you gave is not distributed"):
        assert len(loader) == 2
    assert [int(i) for b in loader for i in b] == list(range(10))  # no second warning (strict filters)


def test_the_loader_follows_the_process_group_from_one_iter_to_the_next(monkeypatch):
    loader = DataLoader(RangeDataset(8), batch_size=2, distributed=True)
    in_world(monkeypatch, 2, 1)
    assert [int(i) for b in loader for i in b] == [1, 3, 5, 7]
    in_world(monkeypatch, None, 0)  # destroy_process_group()
    state = loader.state_dict()  # a job saving after it destroyed its group: still its share's state
    assert len(loader) == 2 and state["sampler"]["num_replicas"] == 2
    assert [int(i) for b in loader for i in b] == list(range(8))  # the next iter() reads everything
    assert len(loader) == 4 and isinstance(loader.sampler, SequentialSampler)


def test_a_sharded_state_resumes_only_in_a_sharded_loader(monkeypatch):
    in_world(monkeypatch, 2, 1)
    loader = DataLoader(AugmentedDataset(), batch_size=4, shuffle=True, seed=2, distributed=True)
    it = iter(loader)
    head = [next(it)[2].tolist()]
    state = json.loads(json.dumps(loader.state_dict()))
    rest = [b[2].tolist() for b in it]
    assert state["sampler"]["num_replicas"] == 2
    resumed = DataLoader(AugmentedDataset(), batch_size=4, shuffle=True, seed=2, distributed=True)
    resumed.load_state_dict(state)
    assert [b[2].tolist() for b in resumed] == rest and len(head + rest) == 5

    in_world(monkeypatch, None, 0)
    alone = DataLoader(AugmentedDataset(), batch_size=4, shuffle=True, seed=2)
    with pytest.raises(ValueError, match=r"saved by rank 1 of 2 processes, where this loader read only its rank's "
                                         r"share, but torch.distributed is not initialized here"):
        alone.load_state_dict(state)
    plain_state = alone.state_dict()
    in_world(monkeypatch, 2, 0)
    with pytest.raises(ValueError, match=r"saved by a loader reading the whole dataset, but this one reads rank 0's "
                                         r"share of 2 processes"):
        DataLoader(AugmentedDataset(), batch_size=4, shuffle=True, distributed=True).load_state_dict(plain_state)


def test_the_rank_is_mixed_into_the_batch_seeds_when_the_group_appears_after_construction(monkeypatch):
    loaders = [DataLoader(AugmentedDataset(), batch_size=4, seed=1, distributed=False) for _ in range(2)]
    firsts = []
    for rank, loader in enumerate(loaders):
        in_world(monkeypatch, 2, rank)
        firsts.append(next(iter(loader))[0])
    assert not np.array_equal(firsts[0], firsts[1])  # same seed, same indices: other augmentations


def test_distributed_takes_true_false_or_none():
    with pytest.raises(ValueError, match=r"distributed should be True, False or None, but got distributed='yes'"):
        DataLoader(RangeDataset(4), distributed="yes")


def test_an_iterable_source_gets_the_rank_in_its_seeds_too(monkeypatch):
    from .helpers import WorkerStreams
    firsts = []
    for rank in range(2):
        loader = DataLoader(WorkerStreams([4]), batch_size=2, seed=1)  # made before the group exists
        in_world(monkeypatch, 2, rank)
        firsts.append(next(iter(loader))[0])  # (the rows are random, the labels are not)
        in_world(monkeypatch, None, 0)
    assert not np.array_equal(firsts[0], firsts[1])


def test_an_empty_dataset_shards_into_empty_epochs(monkeypatch):
    in_world(monkeypatch, 2, 1)
    loader = DataLoader(RangeDataset(0), batch_size=2, distributed=True)
    assert len(loader) == 0 and list(loader) == []
