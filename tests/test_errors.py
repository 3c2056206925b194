"""Failures reach the main process as clear errors, at the right batch; nothing hangs."""

import pytest

import shmload
from shmload import CollateError, DataLoader, WorkerError

from .helpers import (
    FailingDataset,
    ImageDataset,
    NeedsTwoArgsError,
    RangeDataset,
    StopIterationDataset,
    TwoArgsFailingDataset,
)


def test_worker_exception_is_raised_at_its_batch_with_type_worker_indices_and_traceback(start_method):
    loader = DataLoader(FailingDataset(12, bad={5}), batch_size=4, num_workers=2,
                        multiprocessing_context=start_method)
    it = iter(loader)
    assert next(it).tolist() == [0, 1, 2, 3]
    with pytest.raises(ValueError) as info:
        next(it)
    text = str(info.value)
    assert "Caught ValueError in DataLoader worker process" in text
    assert "while loading batch 1 (dataset indices [4, 5, 6, 7])" in text
    assert "Traceback (most recent call last)" in text and "bad sample 5" in text
    assert "helpers.py" in text  # the worker's own frames
    assert next(it).tolist() == [8, 9, 10, 11]  # the iterator stays usable
    with pytest.raises(StopIteration):
        next(it)


def test_key_error_message_stays_readable():
    loader = DataLoader(FailingDataset(4, bad={2}, exc_type=KeyError), batch_size=2, num_workers=1)
    it = iter(loader)
    next(it)
    with pytest.raises(KeyError, match=r"Caught KeyError .*\nOriginal Traceback"):
        next(it)


def test_exception_that_cannot_be_rebuilt_becomes_worker_error():
    loader = DataLoader(TwoArgsFailingDataset(6), batch_size=2, num_workers=1)
    with pytest.raises(WorkerError, match=r"Caught NeedsTwoArgsError .*dataset indices \[2, 3\]") as info:
        list(loader)
    assert isinstance(info.value, RuntimeError) and not isinstance(info.value, NeedsTwoArgsError)


def test_mismatched_samples_name_field_and_index_from_a_worker():
    class Mixed(ImageDataset):
        def __getitem__(self, i):
            sample = super().__getitem__(i)
            if i == 6:
                sample["image"] = sample["image"][:, :4]
            return sample

    loader = DataLoader(Mixed(8), batch_size=4, num_workers=1)
    with pytest.raises(CollateError, match=r"field sample\['image'\]: dataset index 6 \(position 2 in the "
                                           r"batch\) has an array of shape \(3, 4, 8\)"):
        list(loader)


def test_unpicklable_value_in_a_batch_is_reported_not_hung():
    class Lambdas(RangeDataset):
        def __getitem__(self, i):
            return lambda: i

    with pytest.raises(WorkerError, match="cannot be pickled to the main process"):
        list(DataLoader(Lambdas(4), batch_size=2, num_workers=1))


def test_bad_getitems_result_is_named():
    class Short(RangeDataset):
        def __getitems__(self, indices):
            return [0]

    with pytest.raises(shmload.ShmloadError, match=r"Short.__getitems__\(\[0, 1\]\) returned 1 samples, expected "
                                                  r"a sequence of 2"):
        list(DataLoader(Short(4), batch_size=2, num_workers=1))


@pytest.mark.parametrize("workers", [0, 1])
def test_stop_iteration_in_the_dataset_is_an_error_not_a_silent_end_of_epoch(workers):
    loader = DataLoader(StopIterationDataset(8), batch_size=2, num_workers=workers)
    it = iter(loader)
    assert next(it).tolist() == [0, 1]
    with pytest.raises(RuntimeError, match=r"StopIteration .*batch 1 .*dataset indices \[2, 3\]"):
        next(it)


def test_a_python_int_beyond_int64_is_named():
    class Huge(RangeDataset):
        def __getitem__(self, i):
            return {"id": 2**70 if i == 1 else i}

    with pytest.raises(CollateError, match=r"field sample\['id'\]: the Python int 1180591620717411303424 does not "
                                           r"fit in int64"):
        list(DataLoader(Huge(4), batch_size=2, num_workers=1))


@pytest.mark.parametrize("platform", ["darwin", "win32", "freebsd14"])
def test_worker_processes_are_refused_off_linux_with_what_to_do(monkeypatch, platform):
    monkeypatch.setattr("sys.platform", platform)
    with pytest.raises(shmload.ShmloadError, match=rf"num_workers=2: shmload's worker processes run on Linux only "
                                                   rf".*this is '{platform}'\. Use num_workers=0 here"):
        DataLoader(RangeDataset(8), batch_size=4, num_workers=2)
    loader = DataLoader(RangeDataset(8), batch_size=4)  # in-process loading works anywhere
    assert [b.tolist() for b in loader] == [[0, 1, 2, 3], [4, 5, 6, 7]]
    loader.num_workers = 2  # a setting changed later is refused at the next iter()
    with pytest.raises(shmload.ShmloadError, match="run on Linux only"):
        iter(loader)
