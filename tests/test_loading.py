"""End to end through the public API, with real worker processes."""

import numpy as np
import psutil
import pytest

import shmload
from shmload import DataLoader

from .helpers import (
    AugmentedDataset,
    GetitemsDataset,
    ImageDataset,
    InitRecordingDataset,
    Pair,
    RangeDataset,
    SlowDataset,
    WorkerInfoDataset,
    pair_collate,
    record_init,
)


def labels(loader):
    return [b.tolist() for b in loader]


def test_every_index_exactly_once_in_sampler_order(all_start_methods):
    ds = ImageDataset(103)
    with DataLoader(ds, batch_size=8, shuffle=True, seed=5, num_workers=2,
                    multiprocessing_context=all_start_methods) as loader:
        got = [(b["label"].tolist(), b["name"], b["image"][:, 0, 0, 0].tolist()) for b in loader]
    reference = [(b["label"].tolist(), b["name"], b["image"][:, 0, 0, 0].tolist())
                 for b in DataLoader(ds, batch_size=8, shuffle=True, seed=5)]
    assert got == reference
    flat = [i for lab, _, _ in got for i in lab]
    assert sorted(flat) == list(range(103)) and len(got) == 13
    assert got[-1][1] == [f"sample-{i}" for i in got[-1][0]]


@pytest.mark.parametrize("num_workers", [2, 3])
def test_order_equals_a_single_process_run_whatever_order_workers_finish(num_workers):
    # index 0 is slow, so later batches finish first; in_order must still hold
    ds = SlowDataset(40, 0.2, slow={0})
    got = labels(DataLoader(ds, batch_size=4, num_workers=num_workers, prefetch_factor=3))
    assert got == [list(range(i, i + 4)) for i in range(0, 40, 4)]


def test_in_order_false_yields_every_batch_once_finished_first():
    ds = SlowDataset(24, 1.0, slow={0})
    got = labels(DataLoader(ds, batch_size=4, num_workers=2, in_order=False))
    assert sorted(map(tuple, got)) == [tuple(range(i, i + 4)) for i in range(0, 24, 4)]
    assert got[0] != [0, 1, 2, 3]  # the slow first batch was overtaken


def test_same_seed_gives_bit_identical_batches_for_any_num_workers():
    runs = []
    for workers in (0, 1, 2):
        loader = DataLoader(AugmentedDataset(), batch_size=5, shuffle=True, seed=11, num_workers=workers)
        runs.append([(x.copy(), y.copy(), i.copy()) for x, y, i in loader])
    assert [len(r) for r in runs] == [8, 8, 8]
    for other in runs[1:]:
        for (x0, y0, i0), (x, y, i) in zip(runs[0], other):
            assert x0.tobytes() == x.tobytes() and y0.tobytes() == y.tobytes() and (i0 == i).all()
    # and a different seed changes the augmentations
    other_seed = [x.copy() for x, _, _ in DataLoader(AugmentedDataset(), batch_size=5, shuffle=True, seed=12)]
    assert any(a.tobytes() != b.tobytes() for a, (b, _, _) in zip(other_seed, runs[0]))


@pytest.mark.pure
def test_num_workers_zero_does_not_disturb_the_callers_random_state():
    np.random.seed(0)
    expected = np.random.rand()
    np.random.seed(0)
    list(DataLoader(AugmentedDataset(), batch_size=5, seed=1))
    assert np.random.rand() == expected


def test_epochs_reshuffle_and_set_epoch_reproduces_one():
    loader = DataLoader(RangeDataset(30), batch_size=30, shuffle=True, seed=2, num_workers=2,
                        persistent_workers=True)
    with loader:
        e0, e1 = labels(loader), labels(loader)
        loader.set_epoch(1)
        again = labels(loader)
        e2 = labels(loader)
    assert e0 != e1 and again == e1 and e2 not in (e0, e1)
    assert sorted(e2[0]) == list(range(30))


@pytest.mark.pure
def test_seed_none_is_drawn_once_and_recorded():
    loader = DataLoader(RangeDataset(10), batch_size=10, shuffle=True)
    assert isinstance(loader.seed, int)
    replay = DataLoader(RangeDataset(10), batch_size=10, shuffle=True, seed=loader.seed)
    assert labels(loader) == labels(replay)


def test_getitems_serves_the_whole_batch(start_method):
    loader = DataLoader(GetitemsDataset(10), batch_size=4, num_workers=2, multiprocessing_context=start_method)
    batches = list(loader)
    assert [b[0].tolist() for b in batches] == [[0, 1, 2, 3], [4, 5, 6, 7], [8, 9]]
    assert [b[1].tolist() for b in batches] == [[4] * 4, [4] * 4, [2] * 2]


def test_custom_collate_runs_in_the_worker_and_its_result_is_placed_in_the_slot():
    loader = DataLoader(RangeDataset(10), batch_size=4, num_workers=2, collate_fn=pair_collate)
    batches = list(loader)
    assert all(isinstance(b, Pair) for b in batches)
    assert batches[0].image.tolist() == [[0, 0], [1, 1], [2, 2], [3, 3]] and batches[0].label == 4
    assert batches[2].label == 2 and batches[2].image.shape == (2, 2)


def test_batch_size_none_yields_samples_one_by_one():
    loader = DataLoader(ImageDataset(5), batch_size=None, num_workers=2)
    samples = list(loader)
    assert len(samples) == 5 == len(loader)
    assert samples[3]["image"].shape == (3, 8, 8) and samples[3]["label"] == 3
    assert type(samples[3]["label"]) is int and samples[3]["name"] == "sample-3"
    reference = list(DataLoader(ImageDataset(5), batch_size=None))
    assert all((a["image"] == b["image"]).all() for a, b in zip(samples, reference))


def test_user_sampler_and_batch_sampler():
    sampler = [9, 3, 5, 1]
    assert labels(DataLoader(RangeDataset(10), batch_size=3, sampler=sampler, num_workers=2)) == [[9, 3, 5], [1]]
    batch_sampler = [[1, 2], [7], [0, 0, 3]]
    loader = DataLoader(RangeDataset(10), batch_sampler=batch_sampler, num_workers=2)
    assert labels(loader) == batch_sampler and len(loader) == 3


class _SetBatches:
    """A batch sampler yielding sets (and a generator) of 20 indices."""

    def __iter__(self):
        yield set(range(0, 20))
        yield (i for i in range(20, 40))
        yield tuple(range(40, 60))

    def __len__(self):
        return 3


@pytest.mark.parametrize("num_workers", [0, 2])
def test_a_batch_sampler_may_yield_any_iterable_of_indices(num_workers):
    loader = DataLoader(RangeDataset(60), batch_sampler=_SetBatches(), num_workers=num_workers, timeout=20)
    with loader:
        assert [sorted(b.tolist()) for b in loader] == [list(range(k, k + 20)) for k in (0, 20, 40)]


def test_drop_last():
    loader = DataLoader(RangeDataset(10), batch_size=4, drop_last=True, num_workers=2)
    assert labels(loader) == [[0, 1, 2, 3], [4, 5, 6, 7]] and len(loader) == 2


def test_worker_info_and_worker_init_fn():
    assert shmload.get_worker_info() is None
    loader = DataLoader(WorkerInfoDataset(6), batch_size=None, num_workers=2, seed=42)
    infos = list(loader)
    assert {i[0] for i in infos} <= {0, 1} and all(i[1:] == [2, 42, "WorkerInfoDataset"] for i in infos)  # (a list: torch's default_convert)
    inits = labels(DataLoader(InitRecordingDataset(8), batch_size=2, num_workers=2, worker_init_fn=record_init))
    assert {v for batch in inits for v in batch} <= {0, 1} and -1 not in {v for b in inits for v in b}


def test_persistent_workers_are_reused_across_epochs():
    loader = DataLoader(RangeDataset(12), batch_size=4, num_workers=2, persistent_workers=True)
    with loader:
        labels(loader)
        pids = loader._sessions.persistent.supervisor.pids
        assert labels(loader) == [[0, 1, 2, 3], [4, 5, 6, 7], [8, 9, 10, 11]]
        assert loader._sessions.persistent.supervisor.pids == pids


def test_break_with_persistent_workers_then_a_full_epoch():
    loader = DataLoader(RangeDataset(40), batch_size=2, num_workers=2, persistent_workers=True, prefetch_factor=3)
    with loader:
        for i, _ in enumerate(loader):
            if i == 2:
                break
        assert labels(loader) == [[i, i + 1] for i in range(0, 40, 2)]


def test_a_new_iterator_supersedes_the_old_one_with_persistent_workers():
    loader = DataLoader(RangeDataset(8), batch_size=2, num_workers=1, persistent_workers=True)
    with loader:
        first = iter(loader)
        next(first)
        second = iter(loader)
        with pytest.raises(shmload.ShmloadError, match="newer iter"):
            next(first)
        assert [b.tolist() for b in second] == [[0, 1], [2, 3], [4, 5], [6, 7]]


def test_two_iterators_of_a_non_persistent_loader_are_independent():
    loader = DataLoader(RangeDataset(6), batch_size=2, num_workers=1)
    a, b = iter(loader), iter(loader)
    assert [x.tolist() for x in a] == [[0, 1], [2, 3], [4, 5]]
    assert [x.tolist() for x in b] == [[0, 1], [2, 3], [4, 5]]


def test_two_loaders_alive_at_once():
    a = DataLoader(RangeDataset(20), batch_size=5, num_workers=2)
    b = DataLoader(RangeDataset(20), batch_size=5, num_workers=2, shuffle=True, seed=1)
    got = [(x.tolist(), y.tolist()) for x, y in zip(a, b)]
    assert [x for x, _ in got] == [list(range(i, i + 5)) for i in range(0, 20, 5)]
    assert sorted(v for _, y in got for v in y) == list(range(20))


def test_empty_dataset_yields_nothing():
    assert list(DataLoader(RangeDataset(0), batch_size=4, num_workers=2)) == []


def test_a_sampler_subclass_keeps_its_own_order():
    class Backwards(shmload.SequentialSampler):
        def __iter__(self):
            return iter(range(len(self.data_source) - 1, -1, -1))

    loader = DataLoader(RangeDataset(6), batch_size=2, sampler=Backwards(range(6)), num_workers=1)
    assert labels(loader) == [[5, 4], [3, 2], [1, 0]]


def test_settings_changed_after_construction_apply_at_the_next_iter():
    loader = DataLoader(WorkerInfoDataset(4), batch_size=None, num_workers=2, persistent_workers=True)
    with loader:
        assert all(info is not None for info in loader)
        pids = loader._sessions.persistent.supervisor.pids
        loader.num_workers = 0
        assert list(loader) == [None] * 4  # loaded in the main process now
        assert loader._sessions.persistent is None and all(not psutil.pid_exists(p) for p in pids)
        loader.num_workers = 1
        loader.collate_fn = lambda sample: ("mine", sample)
        assert [b[0] for b in loader] == ["mine"] * 4


@pytest.mark.pure
@pytest.mark.parametrize("name,value,match", [
    ("timeout", None, "timeout option should be non-negative"),
    ("slot_bytes", "1MB", "slot_bytes should be a positive integer or None"),
    ("output", "pandas", "output should be 'numpy' or 'torch'"),
    ("num_workers", -2, "num_workers should be a non-negative integer"),
])
def test_settings_set_after_construction_are_checked_at_the_next_iter(name, value, match):
    loader = DataLoader(RangeDataset(4), batch_size=2)
    setattr(loader, name, value)
    with pytest.raises((ValueError, TypeError), match=match):
        iter(loader)


@pytest.mark.parametrize("iterating", [False, True])
def test_a_loader_deep_copies_and_pickles_and_each_copy_starts_its_own_workers(iterating):
    import copy
    import pickle
    loader = DataLoader(RangeDataset(8), batch_size=4, num_workers=2, timeout=20)
    expected = [[0, 1, 2, 3], [4, 5, 6, 7]]
    with loader:
        it = iter(loader)
        if iterating:
            assert next(it).tolist() == expected[0]
        for clone in (copy.deepcopy(loader), pickle.loads(pickle.dumps(loader))):
            with clone:
                assert clone is not loader and [b.tolist() for b in clone] == expected
        assert [b.tolist() for b in it] == (expected[1:] if iterating else expected)
