"""Issue 18, the main process's side: limits and start-up, each a fault found by
attacking the loader, each reproduced here through the public API. (Its interrupts,
threads and forks are in test_interrupts.py.)"""

from __future__ import annotations

import os
import re
import signal
import time

import pytest

from shmload import DataLoader

from .helpers import RangeDataset


def _stuck_init(worker_id):
    time.sleep(30)


def test_a_time_out_while_a_worker_is_still_starting_says_so():
    loader = DataLoader(RangeDataset(8), batch_size=4, num_workers=1, timeout=1, worker_init_fn=_stuck_init)
    with loader, pytest.raises(RuntimeError, match=r"^DataLoader timed out after 1 seconds waiting for batch 0: "
                                                   r"worker 0 \(pid \d+\) has not finished starting: it is still in "
                                                   r"its start \(fork\) or worker_init_fn \(it was given dataset "
                                                   r"indices \[0, 1, 2, 3\]\)\. A worker_init_fn that blocks"):
        next(iter(loader))


class _ForksAHelper(RangeDataset):
    """Index ``at`` starts a helper process that inherits the worker's descriptors and
    outlives it, then the worker is killed, as the OOM killer would."""

    def __init__(self, n, at, pidfile):
        super().__init__(n)
        self.at, self.pidfile = at, pidfile

    def __getitem__(self, i):
        if i == self.at:
            helper = os.fork()
            if helper == 0:
                time.sleep(60)
                os._exit(0)
            with open(self.pidfile, "w") as f:
                f.write(str(helper))
            os.kill(os.getpid(), signal.SIGKILL)
        return i


def test_a_killed_worker_is_noticed_though_its_helper_process_still_holds_its_descriptors(tmp_path):
    from shmload import WorkerDiedError
    pidfile = tmp_path / "helper.pid"
    loader = DataLoader(_ForksAHelper(16, 5, str(pidfile)), batch_size=4, num_workers=1, timeout=30)
    started = time.monotonic()
    try:
        with loader, pytest.raises(WorkerDiedError, match=r"worker process 0 \(pid \d+\) was killed by SIGKILL"):
            list(loader)
        assert time.monotonic() - started < 10  # noticed at once, not at the 30 s time-out
    finally:
        if pidfile.exists():
            helper = int(pidfile.read_text())
            os.kill(helper, signal.SIGKILL)
            assert pidfile.read_text()  # (the helper is not our child: init reaps it)


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


def test_a_mapping_refused_by_the_address_space_limit_is_a_clear_error_and_the_epoch_goes_on(monkeypatch):
    import errno
    import mmap as mmap_module

    from shmload import SharedMemoryError
    from shmload._transport import shm

    from .helpers import VariableDataset
    real, main = mmap_module.mmap, os.getpid()
    refusing = [True]

    def refused(*args, **kwargs):  # the main process's mappings fail, as under ulimit -v, until the error is out
        if os.getpid() == main and len(args) > 1 and args[1] > 1 << 20 and refusing[0]:
            raise OSError(errno.ENOMEM, "Cannot allocate memory")
        return real(*args, **kwargs)
    monkeypatch.setattr(shm.mmap, "mmap", refused)
    loader = DataLoader(VariableDataset(40, scale=100_000), batch_size=1, num_workers=2, timeout=20)
    got, errors = [], []
    with loader:
        it = iter(loader)
        while True:
            try:
                got.append(int(next(it)[0, 0]))
            except StopIteration:
                break
            except SharedMemoryError as exc:  # not before the ring asked for a single slot
                errors.append(str(exc))      # (NOTE [ The ring stops at what fits ], ring.py)
                refusing[0] = False
    assert len(errors) == 1 and re.match(r"could not map .*iB of shared memory into this process \(Cannot allocate "
                                         r"memory\): .*ulimit -v: .*max_shm_bytes", errors[0])
    assert got == list(range(40))


_MANY_WORKERS = """
import resource, sys
sys.path.insert(0, {root!r})
resource.setrlimit(resource.RLIMIT_NOFILE, ({soft}, resource.getrlimit(resource.RLIMIT_NOFILE)[1]))
from shmload import DataLoader
from tests.helpers import RangeDataset
loader = DataLoader(RangeDataset(4096), batch_size=4, num_workers={workers}, prefetch_factor=16, timeout=120)
with loader:
    assert sum(len(b) for b in loader) == 4096
print("ok")
"""


@pytest.mark.parametrize("workers,soft,outcome", [(32, 1024, r"^ok$"),
                                                  (8, 24, r"ShmloadError: this process has run out of file "
                                                          r"descriptors .*ulimit -n\) is 24 ")])
def test_many_workers_with_deep_prefetch_fit_the_usual_descriptor_limit(workers, soft, outcome):
    import subprocess
    import sys
    from pathlib import Path
    root = str(Path(__file__).resolve().parents[1])
    done = subprocess.run([sys.executable, "-c", _MANY_WORKERS.format(root=root, soft=soft, workers=workers)],
                          capture_output=True, text=True, timeout=300)
    assert re.search(outcome, (done.stdout + done.stderr).strip(), re.M), done.stderr[-3000:]
