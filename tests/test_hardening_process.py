"""Issue 18, the main process's side: batch samplers and copies of a loader, each a
fault found by attacking the loader, each reproduced here through the public API. (Its
interrupts, threads and forks are in test_interrupts.py, its faults in test_faults.py.)"""

from __future__ import annotations

import pytest

from shmload import DataLoader

from .helpers import RangeDataset


@pytest.mark.parametrize("num_workers", [0, 2])
def test_a_sampler_of_single_indices_passed_as_batch_sampler_is_torchs_type_error(num_workers):
    from shmload import SequentialSampler
    loader = DataLoader(RangeDataset(8), batch_sampler=SequentialSampler(range(8)), num_workers=num_workers,
                        timeout=20)
    with loader, pytest.raises(TypeError, match=r"^'int' object is not iterable: the batch sampler yielded 0 for "
                                                r"batch 0, .*goes in sampler= \(with batch_size=\)"):
        next(iter(loader))


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
