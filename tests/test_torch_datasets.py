"""torch's own datasets, as torch's DataLoader takes them: a dataset holding tensors under
spawn and forkserver (each worker gets its own pickle: a tensor's storage travels as a
descriptor only one process can take), and an IterableDataset that is its own iterator.
Skipped without torch. One test counts the dataset's pickles where the session makes them
(``shmload._session.shipping``), on purpose."""

import os
import signal
import time

import numpy as np
import pytest

from shmload import DataLoader, ShmloadWarning
from shmload._session import shipping

torch = pytest.importorskip("torch")
pytestmark = pytest.mark.torch

from torch.utils.data import IterableDataset, TensorDataset  # noqa: E402


def tensors():
    return TensorDataset(torch.arange(40.).view(20, 2), torch.arange(20))


def rows(loader):
    """Every batch as plain lists (copies: nothing of the ring is kept)."""
    return [(np.asarray(x).tolist(), np.asarray(y).tolist()) for x, y in loader]


class SlowTensors(TensorDataset):
    """A TensorDataset whose samples take a while, so a worker is killed mid-epoch."""

    def __getitem__(self, i):
        time.sleep(0.02)
        return super().__getitem__(i)


class Arrays:
    """A dataset of a numpy array: no tensors, so one pickle serves every worker."""

    def __init__(self, n):
        self.a = np.arange(n)

    def __len__(self):
        return len(self.a)

    def __getitem__(self, i):
        return self.a[i]


# ---------------------------------------------------------------- tensors in the dataset
def test_a_tensor_dataset_loads_with_two_workers_under_every_start_method(all_start_methods):
    expected = rows(DataLoader(tensors(), batch_size=4, num_workers=0))
    loader = DataLoader(tensors(), batch_size=4, num_workers=2, multiprocessing_context=all_start_methods,
                        timeout=30)
    assert rows(loader) == expected and len(expected) == 5


def test_a_tensor_dataset_with_persistent_workers_serves_two_epochs(start_method):
    """(Under spawn and forkserver, where each worker gets the tensors by a pickle of its
    own, the restart test below serves a second epoch with persistent workers too.)"""
    expected = rows(DataLoader(tensors(), batch_size=3, num_workers=0))
    loader = DataLoader(tensors(), batch_size=3, num_workers=2, multiprocessing_context=start_method,
                        persistent_workers=True, timeout=30)
    with loader:
        assert [rows(loader), rows(loader)] == [expected, expected]


@pytest.mark.parametrize("method", ["spawn", "forkserver"])
def test_a_restarted_worker_gets_the_tensors_too(method):
    ds = SlowTensors(torch.arange(40.).view(20, 2), torch.arange(20))
    expected = rows(DataLoader(ds, batch_size=2, num_workers=0))
    loader = DataLoader(ds, batch_size=2, num_workers=2, multiprocessing_context=method, prefetch_factor=2,
                        persistent_workers=True, max_worker_restarts=1, timeout=30)
    with loader:
        it = iter(loader)
        got = [(x.tolist(), y.tolist()) for x, y in (next(it) for _ in range(3))]
        victim = loader._sessions.persistent.supervisor.pids[0]
        os.kill(victim, signal.SIGKILL)
        with pytest.warns(ShmloadWarning, match=rf"pid {victim}\) was killed by SIGKILL"):
            got += rows(it)
        assert got == expected
        assert victim not in loader._sessions.persistent.supervisor.pids
        assert rows(loader) == expected  # the replacement, with its own tensors, serves the next epoch


@pytest.mark.parametrize("dataset,pickles", [(Arrays(20), 1), (tensors(), 2)], ids=["arrays", "tensors"])
def test_the_dataset_is_pickled_again_per_worker_only_when_it_holds_tensors(monkeypatch, dataset, pickles):
    calls = []
    real = shipping._pickled_user_code

    def counted(*args):
        calls.append(1)
        return real(*args)

    monkeypatch.setattr(shipping, "_pickled_user_code", counted)
    loader = DataLoader(dataset, batch_size=5, num_workers=2, multiprocessing_context="spawn", timeout=30)
    assert len(list(loader)) == 4
    assert len(calls) == pickles


# ---------------------------------------------------------------- an IterableDataset that is its own iterator
class SelfIterating(IterableDataset):
    """As in torch's tutorials: ``__iter__`` returns ``self``; sharded by worker."""

    def __init__(self, n):
        self.n = n
        self.i = 0
        self.step = 1

    def __iter__(self):
        info = torch.utils.data.get_worker_info()
        self.i, self.step = (info.id, info.num_workers) if info is not None else (0, 1)
        return self

    def __next__(self):
        if self.i >= self.n:
            raise StopIteration
        value = self.i
        self.i += self.step
        return np.array([value, value * value])


def batches(loader):
    return sorted(np.asarray(b).tolist() for b in loader)


@pytest.mark.parametrize("method, workers", [(None, 0), ("fork", 2), ("spawn", 2), ("forkserver", 2)],
                         ids=["no-workers", "fork-2", "spawn-2", "forkserver-2"])  # (no start method without workers)
def test_an_iterable_dataset_that_returns_itself_loads_as_with_torch(method, workers):
    context = {"multiprocessing_context": method} if workers else {}
    expected = batches(torch.utils.data.DataLoader(SelfIterating(23), batch_size=3, num_workers=workers,
                                                   timeout=30 if workers else 0))
    ds = SelfIterating(23)
    got = batches(DataLoader(ds, batch_size=3, num_workers=workers, timeout=30, **context))
    assert got == expected
    assert sorted(v for batch in got for v, _ in batch) == list(range(23))  # every sample once
    # num_workers=0 iterates the object itself, as torch; workers iterate their own copies
    assert ds.i == (23 if workers == 0 else 0)


def _offset_by_worker(worker_id):
    torch.utils.data.get_worker_info().dataset.n -= worker_id  # this worker's copy only


def test_worker_init_fn_sees_each_workers_own_copy_of_a_self_iterating_dataset():
    ds = SelfIterating(10)
    got = batches(DataLoader(ds, batch_size=None, num_workers=2, worker_init_fn=_offset_by_worker, timeout=30))
    assert [v for v, _ in got] == [0, 1, 2, 3, 4, 5, 6, 7, 8]  # worker 1 stops before 9
    assert ds.n == 10


def test_a_generator_object_is_still_refused():
    with pytest.raises(TypeError, match=r"the dataset is an iterator \(generator\).*Pass a function that makes it"):
        DataLoader(torch.tensor([i]) for i in range(3))
