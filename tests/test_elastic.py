"""Elastic loading (issue 36): one global sequence of samples and augmentations for any
world size, ``num_workers`` and splitting, and a state that resumes on another world.

Ranks are simulated in one process by explicit ``DistributedSampler(num_replicas=W,
rank=r, elastic=True)`` loaders stepped in lockstep, as DDP steps them; the real
torchrun and Lightning jobs are in test_elastic_torchrun.py and
test_lightning_elastic.py. The global sequence is rebuilt here from each rank's raw
batches (global batch k = rank 0's k-th batch, then rank 1's, ...).
"""

from __future__ import annotations

import random
import re

import numpy as np
import pytest

from shmload import DataLoader, DistributedSampler
from shmload._ordering import elastic, seeding, sharding
from shmload._transport import wire
from shmload._transport.messages import Indices, Task

from .helpers import TIMEOUT

N, G, SEED, ORDER_SEED = 50, 12, 7, 3


class Augmenting:
    """A sample: its index, and one draw each from Python's and numpy's global RNGs, as an
    augmentation draws them (the draws show which seed the sample had)."""

    def __init__(self, n: int = N):
        self.n = n

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int):
        return np.int64(i), np.float64(random.random()), np.float64(np.random.rand())


def samplers(world: int, n: int = N, shuffle: bool = True, drop_last: bool = False, **kw):
    return [DistributedSampler(Augmenting(n), num_replicas=world, rank=r, shuffle=shuffle, seed=ORDER_SEED,
                               drop_last=drop_last, elastic=True, **kw) for r in range(world)]


def loaders(world: int, workers: int = 0, global_batch: int = G, state: dict | None = None, n: int = N,
            shuffle: bool = True, drop_last: bool = False, seed: int = SEED, **kw) -> list[DataLoader]:
    out = []
    for s in samplers(world, n, shuffle, drop_last):
        loader = DataLoader(Augmenting(n), batch_size=global_batch // world, sampler=s, num_workers=workers,
                            seed=seed, timeout=TIMEOUT if workers else 0, **kw)
        if state is not None:
            loader.load_state_dict(state)
        out.append(loader)
    return out


def rows(batch) -> list[tuple]:
    """A batch as (index, random draw, numpy draw) rows."""
    return list(zip(*(np.asarray(column).tolist() for column in batch)))


def global_sequence(per_rank: list[list]) -> list[tuple]:
    """The ranks' batches, stepped in lockstep, as one sequence of samples."""
    assert len({len(batches) for batches in per_rank}) == 1, "ranks with different batch counts"
    return [row for k in range(len(per_rank[0])) for batches in per_rank for row in rows(batches[k])]


def run(world: int, workers: int = 0, **kw) -> list[tuple]:
    group = loaders(world, workers, **kw)
    try:
        return global_sequence([list(loader) for loader in group])
    finally:
        for loader in group:
            loader.close()


@pytest.fixture(scope="module")
def reference() -> list[tuple]:
    return run(1)


# ---------------------------------------------------------------- the pure parts
@pytest.mark.pure
@pytest.mark.parametrize("n, g, drop_last", [(50, 12, False), (50, 12, True), (48, 12, False), (5, 12, False),
                                             (50, 1, False)])
def test_the_ranks_slices_make_the_global_batches_for_any_world(n, g, drop_last):
    whole = np.random.default_rng(0).permutation(n)
    batches = (n // g) if drop_last else -(-n // g)
    expected = [int(whole[p % n]) for p in range(batches * g)]  # padded from the head, or cut
    for world in (w for w in range(1, g + 1) if g % w == 0):
        b = g // world
        shares = [elastic.RankShare(whole, elastic.Grid(n, g, b, r, 0, drop_last)).tolist() for r in range(world)]
        assert {len(s) for s in shares} == {batches * b}
        got = [i for k in range(batches) for s in shares for i in s[k * b:(k + 1) * b]]
        assert got == expected, (world, got, expected)


@pytest.mark.pure
def test_a_batch_slice_knows_its_global_position():
    share = elastic.RankShare(np.arange(50), elastic.Grid(50, 12, 4, 2, 0, False))  # rank 2 of 3
    for k in range(5):
        batch = share[k * 4:(k + 1) * 4]
        assert share.position_of(batch) == k * 12 + 8
        assert batch.tolist() == [p % 50 for p in range(k * 12 + 8, k * 12 + 12)]


@pytest.mark.pure
def test_a_resumed_grid_starts_at_the_saved_position():
    grid = elastic.Grid(50, 8, 4, 1, elastic.origin(36, 8), False)  # saved at 36 with G=12, resumed with G=8
    assert grid.origin == 4 and grid.batches == 6
    assert grid.first_position(36 // 8) == 36 + 4  # rank 1's first batch after the save


@pytest.mark.pure
def test_the_global_batch_must_divide_among_the_ranks():
    with pytest.raises(ValueError, match=r"global_batch_size=12 is not divisible by the world size 5"):
        DistributedSampler(Augmenting(), num_replicas=5, rank=0, elastic=True, global_batch_size=12)
    with pytest.raises(ValueError, match=r"batch_size=5 with 3 ranks is a global batch of 15, but "
                                         r"global_batch_size=12: batch_size should be .* = 4"):
        DistributedSampler(Augmenting(), num_replicas=3, rank=0, elastic=True, batch_size=5, global_batch_size=12)
    s = DistributedSampler(Augmenting(), num_replicas=3, rank=1, elastic=True, global_batch_size=12)
    assert (s.batch_size, s.global_batch_size) == (4, 12)


@pytest.mark.pure
def test_an_elastic_sampler_needs_its_batch_size():
    s = DistributedSampler(Augmenting(), num_replicas=2, rank=0, elastic=True)
    with pytest.raises(ValueError, match=r"elastic DistributedSampler needs the per-rank batch size"):
        list(s)
    with pytest.raises(ValueError, match=r"batch_size= and global_batch_size= are for elastic=True"):
        DistributedSampler(Augmenting(), num_replicas=2, rank=0, batch_size=4)


@pytest.mark.pure
def test_the_samplers_state_is_the_same_on_every_rank_and_names_no_rank():
    states = [s.state_dict() for s in samplers(3, batch_size=4)]
    assert states[0] == states[1] == states[2]
    assert "rank" not in states[0] and "num_replicas" not in states[0]
    assert states[0]["elastic"] is True and states[0]["position"] == 0 and states[0]["global_batch_size"] == 12


@pytest.mark.pure
def test_states_of_the_other_kind_are_refused_by_the_sampler():
    plain = DistributedSampler(Augmenting(), num_replicas=2, rank=1)
    flexible = samplers(2, batch_size=6)[1]
    with pytest.raises(ValueError, match=r"saved by an elastic sampler \(global position 0\), but this one is not "
                                         r"elastic: pass elastic=True"):
        plain.load_state_dict(flexible.state_dict())
    with pytest.raises(ValueError, match=r"saved by rank 1 of 2, but this sampler is elastic"):
        flexible.load_state_dict(plain.state_dict())
    other = samplers(2, n=N + 1, batch_size=6)[0]
    with pytest.raises(ValueError, match=rf"saved over a dataset of {N} samples, but this one has {N + 1}"):
        other.load_state_dict(flexible.state_dict())
    unshuffled = samplers(2, shuffle=False, batch_size=6)[0]
    with pytest.raises(ValueError, match=r"saved with shuffle=True, but this sampler has shuffle=False"):
        unshuffled.load_state_dict(flexible.state_dict())


@pytest.mark.pure
def test_a_samples_seed_is_its_own_and_depends_on_seed_epoch_and_position():
    seeds = {seeding.sample_seed(s, e, p) for s in (0, 1) for e in (0, 1) for p in range(50)}
    assert len(seeds) == 200
    assert seeding.sample_seed(3, 0, 0) != seeding.batch_seed(3, 0, 0)
    assert seeding.sample_seed(3, 1, 2) == seeding.sample_seed(3, 1, 2)


@pytest.mark.pure
@pytest.mark.parametrize("value", [0, 7, 2**32 + 3, 2**64 - 1])
def test_seeding_is_random_seed_and_numpys_seed(value):
    def draws():
        return random.random(), random.gauss(0, 1), random.randrange(10**9), np.random.rand()

    random.gauss(0, 1)  # (leaves a second normal draw waiting, which seeding must discard)
    seeding.seed_with(value)
    ours = draws()
    random.seed(value)
    np.random.seed(value & 0xFFFFFFFF)
    assert ours == draws()


@pytest.mark.pure
def test_a_tasks_position_crosses_the_wire():
    for position in (None, 0, 12, 2**40):
        task = Task(3, 1, 5, [4, 2, 9], None, 2, position=position)
        head, body = wire.encode_task(task)
        got = wire.decode_to_worker(head + bytes(body))
        assert (got.position, got.load, got.seq, got.parts) == (position, [4, 2, 9], 5, 2)
    head, body = wire.encode_task(Task(0, 0, 0, Indices(np.arange(3), 24), None, position=24))
    assert wire.decode_to_worker(head + bytes(body)).position == 24


# ---------------------------------------------------------------- loaders, one process per "rank"
@pytest.mark.pure
@pytest.mark.parametrize("world", [1, 2, 3, 4, 6, 12])
def test_every_world_that_divides_the_global_batch_gives_the_same_sequence(reference, world):
    assert run(world) == reference
    indices = [row[0] for row in reference]
    assert sorted(set(indices)) == list(range(N)) and len(indices) == 60  # padded to 5 global batches
    assert indices[N:] == indices[:10]  # the padding repeats the head of the order


@pytest.mark.parametrize("workers", [1, 2])
@pytest.mark.parametrize("split", [None, True, False])
def test_workers_and_splitting_do_not_change_the_sequence(reference, start_method, workers, split):
    got = run(3, workers, split_batches=split, multiprocessing_context=start_method, batch_parts=2)
    assert got == reference


class AugmentingImages(Augmenting):
    """Samples large enough to be written row by row into the slot (rowwise.py)."""

    def __getitem__(self, i: int):
        return np.full((64, 64, 4), random.random(), np.float32) * np.random.rand(), np.int64(i)


def test_samples_written_row_by_row_are_seeded_each_by_its_position():
    def sequence(world: int, workers: int) -> list:
        group = [DataLoader(AugmentingImages(), batch_size=G // world, sampler=s, num_workers=workers, seed=SEED,
                            timeout=TIMEOUT) for s in samplers(world)]
        try:
            per_rank = [list(loader) for loader in group]
        finally:
            for loader in group:
                loader.close()
        return [(int(label), float(image[0, 0, 0])) for k in range(len(per_rank[0])) for batches in per_rank
                for image, label in zip(*batches[k])]

    one = sequence(1, 0)
    assert len({value for _, value in one}) == len(one) == 60
    assert sequence(3, 2) == one


def test_spawn_and_forkserver_workers_give_the_same_sequence(reference, all_start_methods):
    assert run(2, 2, multiprocessing_context=all_start_methods) == reference


@pytest.mark.pure
@pytest.mark.parametrize("shuffle, drop_last", [(False, False), (True, True)])
def test_sequential_and_dropped_tails_are_the_same_for_every_world(shuffle, drop_last):
    one = run(1, shuffle=shuffle, drop_last=drop_last)
    assert len(one) == (48 if drop_last else 60)
    if not shuffle:
        assert [row[0] for row in one] == [p % N for p in range(60)]
    for world in (2, 3):
        assert run(world, shuffle=shuffle, drop_last=drop_last) == one


@pytest.mark.pure
def test_the_loaders_own_sampler_alone_is_a_world_of_one(reference):
    with DataLoader(Augmenting(), batch_size=G, shuffle=True, seed=ORDER_SEED, elastic=True) as loader:
        # the order is seeded by seed=, and so are the augmentations: compare with both at ORDER_SEED
        own = [row for batch in loader for row in rows(batch)]
        state = loader.state_dict()
    assert own == run(1, seed=ORDER_SEED)
    assert [row[0] for row in own] == [row[0] for row in reference]
    assert state["sampler"]["elastic"] is True and "rank" not in state["sampler"]
    assert len(loader) == 5


# ---------------------------------------------------------------- resume across worlds
def _stopped(world: int, after: int, workers: int = 0):
    """Ranks stepped ``after`` global batches and stopped: (the head delivered, each rank's state)."""
    group = loaders(world, workers)
    try:
        its = [iter(loader) for loader in group]
        head = global_sequence([[next(it) for _ in range(after)] for it in its])
        return head, [loader.state_dict() for loader in group]
    finally:
        for loader in group:
            loader.close()


def test_a_state_loaded_before_the_process_group_is_cut_for_the_world_found_at_iter(monkeypatch, reference):
    """Loaded while no process group exists (a world of one), resumed once it does (3)."""
    head, states = _stopped(2, 2)
    world: list = [None]
    monkeypatch.setattr(sharding, "torch_world", lambda: world[0])
    per_rank = []
    for rank in range(3):
        world[0] = None
        loader = DataLoader(Augmenting(), batch_size=4, shuffle=True, elastic=True)
        loader.load_state_dict(states[0])
        world[0] = (3, rank)
        with loader:
            per_rank.append(list(loader))
    assert head + global_sequence(per_rank) == reference


@pytest.mark.parametrize("saved_on, resumed_on, global_batch", [(2, 3, G), (3, 1, G), (2, 4, 8), (3, 2, 10)])
def test_a_state_saved_on_one_world_resumes_the_sequence_on_another(reference, saved_on, resumed_on, global_batch):
    head, states = _stopped(saved_on, 2, workers=1)
    assert all(state == states[0] for state in states), "the state differs between ranks"
    assert states[0]["sampler"]["position"] == 2 * G
    rest = run(resumed_on, 1, global_batch=global_batch, state=states[0])
    indices = [row[0] for row in head + rest]
    assert sorted(set(indices)) == list(range(N))  # every sample of the epoch, once (and the padding)
    if global_batch == G:
        assert head + rest == reference
    else:  # another global batch: the same samples and augmentations up to the (new) padding
        assert (head + rest)[:N] == reference[:N]


def test_the_epochs_after_a_resume_are_the_uninterrupted_runs():
    group = loaders(2)
    try:
        two_epochs = [global_sequence([list(loader) for loader in group]) for _ in range(2)]
    finally:
        for loader in group:
            loader.close()
    head, states = _stopped(2, 3)
    resumed = loaders(3, state=states[0])
    try:
        rest = global_sequence([list(loader) for loader in resumed])
        second = global_sequence([list(loader) for loader in resumed])
    finally:
        for loader in resumed:
            loader.close()
    assert head + rest == two_epochs[0]
    assert second == two_epochs[1] != two_epochs[0]


@pytest.mark.pure
def test_set_epoch_chooses_the_same_epoch_in_every_world():
    by_world = {}
    for world in (1, 3):
        group = loaders(world)
        for loader in group:
            loader.set_epoch(4)
        by_world[world] = global_sequence([list(loader) for loader in group])
    assert by_world[1] == by_world[3] != run(1)
    assert sorted({row[0] for row in by_world[1]}) == list(range(N))


@pytest.mark.pure
def test_a_state_taken_before_the_first_batch_and_after_the_epoch():
    group = loaders(2)
    assert group[0].state_dict()["sampler"]["position"] == 0
    for loader in group:
        list(loader)
    state = group[0].state_dict()
    assert (state["epoch"], state["sampler"]["position"], state["sampler"]["epoch"]) == (1, 0, 1)


# ---------------------------------------------------------------- bad input
@pytest.mark.pure
def test_states_of_the_other_kind_are_refused_by_the_loader():
    _, states = _stopped(2, 1)
    plain = DataLoader(Augmenting(), batch_size=6, shuffle=True, seed=SEED)
    with pytest.raises(ValueError, match=r"saved by an elastic loader \(global position 12 of epoch 0\), but this "
                                         r"loader is not elastic: pass elastic=True"):
        plain.load_state_dict(states[0])
    flexible = DataLoader(Augmenting(), batch_size=6, shuffle=True, seed=SEED, elastic=True)
    plain_state = plain.state_dict()
    with pytest.raises(ValueError, match=r"saved by a loader that is not elastic, but this loader is elastic"):
        flexible.load_state_dict(plain_state)
    ranked = loaders(2)[1]
    ranked_plain = DataLoader(Augmenting(), batch_size=6, sampler=DistributedSampler(Augmenting(), 2, 1), seed=SEED)
    with pytest.raises(ValueError, match=r"saved by rank 1 of 2 processes, but this loader is elastic"):
        ranked.load_state_dict(ranked_plain.state_dict())
    longer = DataLoader(Augmenting(N + 5), batch_size=6, shuffle=True, seed=SEED, elastic=True)
    with pytest.raises(ValueError, match=rf"saved over a dataset of {N} samples, but this one has {N + 5}"):
        longer.load_state_dict(states[0])
    # nothing was half loaded: each still starts its epoch at position 0
    assert flexible.state_dict()["sampler"]["position"] == 0 and longer.state_dict()["sampler"]["position"] == 0


@pytest.mark.pure
@pytest.mark.parametrize("kwargs, message", [
    (dict(batch_sampler=[[0, 1]], batch_size=1), r"give batch_size=, not batch_sampler="),
    (dict(batch_size=None), r"needs batches"),
    (dict(in_order=False), r"needs in_order=True"),
    (dict(distributed=False), r"cannot be combined with distributed=False"),
    (dict(sampler=DistributedSampler(Augmenting(), 2, 0)), r"not with DistributedSampler"),
    (dict(elastic="yes"), r"elastic should be True or False, but got elastic='yes'"),
])
def test_what_elastic_loading_cannot_be_combined_with(kwargs, message):
    kwargs = {"batch_size": 4, "elastic": True, **kwargs}
    with pytest.raises(ValueError, match=message):
        DataLoader(Augmenting(), **kwargs)


@pytest.mark.pure
def test_in_order_set_false_later_is_refused_at_iter():
    loader = DataLoader(Augmenting(), batch_size=4, elastic=True)
    loader.in_order = False
    with pytest.raises(ValueError, match=r"elastic=True needs in_order=True"):
        iter(loader)


@pytest.mark.pure
def test_an_iterable_source_is_not_elastic():
    def stream():
        yield from range(10)

    with pytest.raises(ValueError, match=re.escape("elastic=True needs a map-style dataset")):
        DataLoader(stream, batch_size=2, elastic=True)


@pytest.mark.pure
def test_without_a_seed_an_elastic_loaders_seed_is_zero_on_every_rank():
    firsts = []
    for _ in range(2):  # (two "ranks", or two runs)
        with DataLoader(Augmenting(), batch_size=6, shuffle=True, elastic=True) as loader:
            assert loader.seed == 0 and loader.state_dict()["seed"] == 0
            firsts.append(rows(next(iter(loader))))
    assert firsts[0] == firsts[1]
    assert DataLoader(Augmenting(), batch_size=6, seed=5, elastic=True).seed == 5


@pytest.mark.pure
def test_an_elastic_sampler_says_what_it_is():
    assert repr(samplers(2, batch_size=6)[1]) == ("DistributedSampler(rank=1, num_replicas=2, shuffle=True, seed=3, "
                                                   "drop_last=False, epoch=0, elastic=True, batch_size=6)")


@pytest.mark.pure
def test_the_loader_tells_its_sampler_the_batch_size_or_refuses_another():
    s = DistributedSampler(Augmenting(), num_replicas=2, rank=0, elastic=True, global_batch_size=12)
    with pytest.raises(ValueError, match=r"the DataLoader has batch_size=4, but its elastic DistributedSampler cuts "
                                         r"global batches of 12 into slices of 6 for 2 ranks"):
        DataLoader(Augmenting(), batch_size=4, sampler=s)
    loader = DataLoader(Augmenting(), batch_size=6, sampler=s)
    assert loader.elastic and len(loader) == 5
