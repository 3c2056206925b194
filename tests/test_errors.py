"""Failures reach the main process as clear errors, at the right batch; nothing hangs."""

import os
import signal
import time

import pytest

import shmload
from shmload import CollateError, DataLoader, LoaderTimeoutError, WorkerDiedError, WorkerError, WorkerStartupError

from .helpers import (
    ExitingDataset,
    FailingDataset,
    ImageDataset,
    NeedsTwoArgsError,
    RangeDataset,
    SlowDataset,
    StopIterationDataset,
    TwoArgsFailingDataset,
    UnpicklableDataset,
    failing_init,
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


@pytest.mark.parametrize("how,signal_text", [("exit", "exit code 7"), ("kill", "SIGKILL")])
def test_worker_death_raises_naming_worker_pid_and_batch(how, signal_text):
    loader = DataLoader(ExitingDataset(20, at=9, how=how), batch_size=2, num_workers=2)
    start = time.monotonic()
    with pytest.raises(WorkerDiedError, match=rf"worker process \d \(pid \d+\) .*{signal_text}.*"
                                              r"dataset indices \[8, 9\]"):
        list(loader)
    assert time.monotonic() - start < 10


def test_external_sigkill_of_a_worker_is_noticed():
    loader = DataLoader(SlowDataset(100, 0.05), batch_size=1, num_workers=2, persistent_workers=True)
    it = iter(loader)
    next(it)
    os.kill(loader._sessions.persistent.supervisor.pids[1], signal.SIGKILL)
    with pytest.raises(WorkerDiedError, match="SIGKILL"):
        for _ in it:
            pass
    loader.close()


def test_timeout_raises_loader_timeout_error_naming_the_worker():
    loader = DataLoader(SlowDataset(4, 6.0, slow={2}), batch_size=2, num_workers=1, timeout=1.5)
    it = iter(loader)
    assert next(it).tolist() == [0, 1]
    with pytest.raises(LoaderTimeoutError, match=r"DataLoader timed out after 1.5 seconds waiting for batch 1: worker 0 "
                                                 r"\(pid \d+\) is loading dataset indices \[2, 3\]") as info:
        next(it)
    assert isinstance(info.value, TimeoutError) and isinstance(info.value, RuntimeError)
    del it
    loader.close()


def test_worker_init_fn_failure_is_a_startup_error(start_method):
    loader = DataLoader(RangeDataset(4), num_workers=2, worker_init_fn=failing_init,
                        multiprocessing_context=start_method)
    with pytest.raises(WorkerStartupError, match=r"(?s)worker process \d failed during start-up.*init failed in "
                                                 r"worker \d.*Traceback"):
        list(loader)


@pytest.mark.parametrize("method", ["spawn", "forkserver"])
def test_unpicklable_dataset_under_spawn_says_so(method):
    loader = DataLoader(UnpicklableDataset(4), num_workers=1, multiprocessing_context=method)
    with pytest.raises(WorkerStartupError, match=rf"the dataset \(UnpicklableDataset\) cannot be pickled, which "
                                                 rf"the '{method}' start method needs.*multiprocessing_context='fork'"):
        iter(loader)


def test_unpicklable_dataset_is_fine_under_fork():
    assert [b.tolist() for b in DataLoader(UnpicklableDataset(4), batch_size=2, num_workers=1)] == [[0, 1], [2, 3]]


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


class NestedLoaderDataset(RangeDataset):
    def __getitem__(self, i):
        inner = DataLoader(RangeDataset(4), batch_size=2, num_workers=1)
        return sum(int(b.sum()) for b in inner)


def test_a_loader_with_workers_inside_a_worker_gets_a_clear_error():
    with pytest.raises(shmload.ShmloadError, match=r"runs inside a daemonic process .*Use num_workers=0"):
        list(DataLoader(NestedLoaderDataset(2), batch_size=1, num_workers=1))


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
