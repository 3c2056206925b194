"""When an epoch begins: at its iterator's first batch, not at ``iter()``.

What trainers do to a loader between ``iter()`` and the first batch (Lightning throws
its first iterator away, and calls ``sampler.set_epoch()`` after ``iter()``) must neither
use up an epoch nor make ``state_dict()`` describe another order than the one delivered.
"""

from __future__ import annotations

import json
import pickle
import threading

import pytest

from shmload import BatchSampler, DataLoader, RandomSampler
from shmload.testing import flatten, run

from .helpers import AugmentedDataset


def epoch_order(loader):
    return [int(i) for b in loader for i in b[2]]


@pytest.mark.parametrize("workers", [0, 2])
def test_state_dict_describes_the_order_a_sampler_moved_after_iter_delivers(workers):
    """The issue's case: set_epoch(7) on the sampler between iter() and the first batch."""
    loader = DataLoader(AugmentedDataset(), batch_size=4, shuffle=True, seed=0, num_workers=workers, timeout=30)
    it = iter(loader)
    loader.sampler.set_epoch(7)
    head = [next(it)]
    state = json.loads(json.dumps(loader.state_dict()))
    head += list(it)
    # the loader's own sampler carries the epoch: order and augmentation seeds are epoch 7's
    assert state["sampler"]["epoch"] == 7 and state["epoch"] == 7 and state["next_batch"] == 1

    reference = DataLoader(AugmentedDataset(), batch_size=4, shuffle=True, seed=0)
    reference.set_epoch(7)
    assert [flatten(b) for b in head] == run(reference, 1)[0]

    resumed = DataLoader(AugmentedDataset(), batch_size=4, shuffle=True, seed=99, num_workers=workers, timeout=30)
    resumed.load_state_dict(state)
    assert run(resumed, 1)[0] == [flatten(b) for b in head[1:]]


@pytest.mark.pure
@pytest.mark.parametrize("how", ["loader", "sampler", "sampler-in-batch-sampler"])
def test_every_way_of_moving_the_epoch_before_the_first_batch_is_what_the_state_says(how):
    def make(seed=0):
        if how == "sampler-in-batch-sampler":
            ds = AugmentedDataset()
            return DataLoader(ds, batch_sampler=BatchSampler(RandomSampler(ds, seed=3), 4, False), seed=seed)
        return DataLoader(AugmentedDataset(), batch_size=4, shuffle=True, seed=seed)

    loader = make()
    it = iter(loader)
    target = {"loader": loader, "sampler": loader.sampler,
              "sampler-in-batch-sampler": loader.batch_sampler.sampler}[how]
    target.set_epoch(5)
    first = next(it)
    state = loader.state_dict()
    rest = [flatten(b) for b in it]
    del first

    resumed = make(seed=1)
    resumed.load_state_dict(json.loads(json.dumps(state)))
    assert run(resumed, 1)[0] == rest
    assert len(rest) == 9


@pytest.mark.parametrize("workers", [0, 2])
def test_an_iterator_thrown_away_before_its_first_batch_uses_up_no_epoch(workers):
    def make():
        return DataLoader(AugmentedDataset(), batch_size=8, shuffle=True, seed=4, num_workers=workers, timeout=30)

    reference = make()
    expected = [epoch_order(reference), epoch_order(reference)]

    loader = make()
    for _ in range(3):
        iter(loader)  # Lightning's probe: made and dropped
    assert loader.state_dict()["epoch"] == 0 and loader.state_dict()["sampler"]["epoch"] == 0
    first = epoch_order(loader)
    unused = iter(loader)
    assert loader.state_dict()["epoch"] == 1
    del unused
    assert [first, epoch_order(loader)] == expected


@pytest.mark.pure
def test_an_unstarted_iterator_takes_the_epoch_current_at_its_first_batch():
    loader = DataLoader(AugmentedDataset(), batch_size=8, shuffle=True, seed=4)
    a, b = iter(loader), iter(loader)
    order_b = [int(i) for batch in b for i in batch[2]]  # b begins first: epoch 0
    order_a = [int(i) for batch in a for i in batch[2]]  # then a: epoch 1
    reference = DataLoader(AugmentedDataset(), batch_size=8, shuffle=True, seed=4)
    assert [order_b, order_a] == [epoch_order(reference), epoch_order(reference)]
    assert loader.state_dict()["epoch"] == 2


@pytest.mark.pure
def test_a_failed_first_batch_keeps_the_resume_for_a_retry():
    """A sampler moved after load_state_dict is refused when the epoch begins, and the
    resume waits for the retry."""
    saved = DataLoader(AugmentedDataset(), batch_size=4, shuffle=True, seed=3)
    it = iter(saved)
    next(it)
    state = saved.state_dict()
    del it
    loader = DataLoader(AugmentedDataset(), batch_size=4, shuffle=True)
    loader.load_state_dict(state)
    it = iter(loader)
    loader.sampler.set_epoch(3)
    with pytest.raises(ValueError, match=r"the sampler RandomSampler changed after load_state_dict\(\).*"
                                         r"between load_state_dict\(\) and the resumed epoch's first batch"):
        next(it)
    assert loader.state_dict() == state
    loader.sampler.set_epoch(0)
    assert len(list(it)) == 9


def test_a_pickled_loader_has_the_settings_and_begins_the_next_epoch():
    """ddp_spawn pickles the loader to its processes: the copy starts its own workers."""
    def make(seed=6):
        return DataLoader(AugmentedDataset(), batch_size=4, shuffle=True, seed=seed, num_workers=2, timeout=30,
                          multiprocessing_context="fork")
    reference = make()
    expected = [epoch_order(reference), epoch_order(reference)]
    loader = make()
    it = iter(loader)
    next(it)
    copy = pickle.loads(pickle.dumps(loader))
    del it
    assert (copy.state_dict()["epoch"], copy.state_dict()["next_batch"]) == (1, 0)
    assert (copy.num_workers, copy.seed, copy.multiprocessing_context) == (2, 6, "fork")
    assert epoch_order(copy) == expected[1]
    assert epoch_order(pickle.loads(pickle.dumps(make()))) == expected[0]


@pytest.mark.parametrize("workers", [0, 2])
@pytest.mark.parametrize("in_order", [True, False])
def test_at_end_says_which_batch_is_the_epochs_last_without_reading_ahead(workers, in_order):
    loader = DataLoader(AugmentedDataset(), batch_size=6, shuffle=True, num_workers=workers, in_order=in_order,
                        timeout=30)
    it = iter(loader)
    assert it.at_end() is False  # not begun
    ends = []
    for _ in it:
        ends.append(it.at_end())
    assert ends == [False] * 6 + [True]
    state = loader.state_dict()
    assert state["epoch"] == 1 and state["next_batch"] == 0  # nothing was held back


@pytest.mark.pure
def test_at_end_of_a_stream_is_unknown_until_it_is_read():
    from .helpers import WorkerStreams
    it = iter(DataLoader(WorkerStreams([5]), batch_size=2))
    assert [it.at_end() for _ in it] == [None, None, None]
    assert it.at_end() is True


@pytest.mark.pure
def test_for_accelerate_without_accelerate_names_the_extra_to_install():
    import importlib.util
    if importlib.util.find_spec("accelerate") is not None:
        pytest.skip("accelerate is installed: tests/test_accelerate.py runs the adapter")
    from shmload import OptionalDependencyError
    from shmload.integrations import for_accelerate
    with pytest.raises(OptionalDependencyError, match=r"for_accelerate\(\) needs accelerate .*"
                                                      r"pip install 'shmload\[accelerate\]'"):
        for_accelerate(DataLoader(AugmentedDataset()))


@pytest.mark.pure
def test_iterators_begun_by_two_threads_at_once_take_two_epochs():
    """The claim is atomic: two threads' first next() never begin the same epoch."""
    loader = DataLoader(AugmentedDataset(), batch_size=40, shuffle=True, seed=2)
    for _ in range(30):
        its = [iter(loader), iter(loader)]
        start = threading.Barrier(2, timeout=10)

        def first(it):
            start.wait()
            next(it)
        threads = [threading.Thread(target=first, args=(it,)) for it in its]
        for t in threads:
            t.start()
        for t in threads:
            t.join(timeout=10)
        low, high = sorted(it.epoch for it in its)
        assert high == low + 1
        assert loader.sampler.epoch == loader.state_dict()["epoch"] == max(it.epoch for it in its) + 1


@pytest.mark.pure
def test_set_epoch_after_break_makes_the_state_that_epochs_start():
    """An accelerate- or torch-style loop that breaks out of an epoch, then starts the next
    with set_epoch: a save there is the new epoch's start, not the old epoch's position."""
    loader = DataLoader(AugmentedDataset(), batch_size=8, shuffle=True, seed=2)
    for batch in loader:
        break
    assert (loader.state_dict()["epoch"], loader.state_dict()["next_batch"]) == (0, 1)
    loader.set_epoch(1)
    state = loader.state_dict()
    assert (state["epoch"], state["next_batch"], state["sampler"]["epoch"]) == (1, 0, 1)
