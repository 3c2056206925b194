"""Issue 18, the main process's side: forks, interrupts, limits and start-up, each a
fault found by attacking the loader, each reproduced here through the public API."""

from __future__ import annotations

import gc
import multiprocessing.util
import os
import random
import re
import signal
import threading
import time

import psutil
import pytest

from shmload import DataLoader

from .helpers import RangeDataset


def test_a_forked_child_that_exits_leaves_the_parents_workers_alone():
    """At exit multiprocessing SIGTERMs the daemonic children it knows of; a raw fork's
    child inherited the parent's list and must not act on it (_platform.py)."""
    loader = DataLoader(RangeDataset(40), batch_size=4, num_workers=2, timeout=20)
    with loader:
        it = iter(loader)
        got = [next(it).tolist()]
        pid = os.fork()
        if pid == 0:  # the child ends as a script ends: multiprocessing's exit handler runs
            try:
                multiprocessing.util._exit_function()
            finally:
                os._exit(0)
        _, status = os.waitpid(pid, 0)
        assert os.waitstatus_to_exitcode(status) == 0
        got += [b.tolist() for b in it]
    assert got == [list(range(i, i + 4)) for i in range(0, 40, 4)]


def _children() -> set[int]:
    return {p.pid for p in psutil.Process().children() if p.status() != psutil.STATUS_ZOMBIE}


def _fds() -> int:
    return len(os.listdir("/proc/self/fd"))


class _Interrupt:
    """A real Ctrl-C (or ``signum``): the signal sent to this process by another thread
    after ``delay`` seconds (Python runs its handler in the main thread, wherever it is
    then: a KeyboardInterrupt, or what the handler raises)."""

    def __init__(self, delay: float, signum: int = signal.SIGINT):
        self._timer = threading.Timer(delay, os.kill, (os.getpid(), signum))

    def __enter__(self):
        self._timer.start()
        return self

    def __exit__(self, *exc):
        self._timer.cancel()
        self._timer.join(5)
        return False


def test_a_close_interrupted_before_it_released_anything_is_finished_by_the_next(monkeypatch):
    children_before = _children()
    from shmload._session import session as session_module
    loader = DataLoader(RangeDataset(16), batch_size=4, num_workers=2, timeout=20)
    it = iter(loader)  # (held: an iterator dropped closes its workers itself)
    assert next(it).tolist() == [0, 1, 2, 3]
    fds = _fds()
    calls = []

    def interrupted(pid):  # the first thing close() does: read the workers' CPU times
        calls.append(pid)
        raise KeyboardInterrupt
    monkeypatch.setattr(session_module, "cpu_seconds", interrupted)
    with pytest.raises(KeyboardInterrupt):
        loader.close()
    monkeypatch.undo()
    assert calls and _fds() == fds  # nothing released yet
    loader.close()
    assert _fds() < fds - 2  # the sockets and the segments are gone
    assert _children() <= children_before


def test_closes_interrupted_at_random_points_leak_nothing():
    """Ctrl-C at a random moment of close(), then close() again, 30 times: every
    descriptor, mapping and worker is released (the autouse leak check covers /dev/shm)."""
    children_before = _children()
    rng = random.Random(18)
    gc.collect()
    fds, maps = _fds(), _mappings()
    interrupted = 0
    for _ in range(30):
        loader = DataLoader(RangeDataset(16), batch_size=4, num_workers=2, timeout=20)
        it = iter(loader)
        assert len(next(it)) == 4
        try:
            with _Interrupt(rng.uniform(0.0001, 0.004)):
                loader.close()
                time.sleep(0.01)  # the timer fires here when close() was quicker
        except KeyboardInterrupt:
            interrupted += 1
        loader.close()
        del loader, it
    gc.collect()
    assert interrupted >= 5
    assert _fds() == fds and _mappings() <= maps
    assert _children() <= children_before


def _mappings() -> int:
    with open("/proc/self/maps") as maps:
        return sum(1 for line in maps if "/dev/shm/shmload-" in line)


def _our_entries() -> set[str]:
    return {name for name in os.listdir("/dev/shm") if name.startswith("shmload-")}


def _raise_system_exit(signum, frame):
    raise SystemExit(143)


@pytest.mark.shm_names
@pytest.mark.parametrize("signum,handler,exc", [(signal.SIGINT, signal.default_int_handler, KeyboardInterrupt),
                                                (signal.SIGTERM, _raise_system_exit, SystemExit)])
def test_an_interrupt_while_a_posix_segment_has_a_name_leaves_no_entry(monkeypatch, signum, handler, exc):
    """The POSIX backend's name window (shm.py): the signal lands exactly inside it,
    deterministically; Ctrl-C, and a preemption handler's SystemExit."""
    import posix_ipc

    from shmload._transport import shm
    real = posix_ipc.SharedMemory
    names = []

    def signal_inside(name, *args, **kwargs):
        segment = real(name, *args, **kwargs)
        names.append(name)
        os.kill(os.getpid(), signum)  # while the name exists
        return segment
    monkeypatch.setattr(posix_ipc, "SharedMemory", signal_inside)
    previous = signal.signal(signum, handler)
    fds = _fds()
    try:
        with pytest.raises(exc):
            shm.Segment(0, 1 << 16, backend="posix")
    finally:
        signal.signal(signum, previous)
    assert names and not os.path.exists("/dev/shm" + names[0])
    assert _fds() == fds  # the descriptor was closed on the interrupt's way out


def test_loader_creation_interrupted_at_random_points_leaves_no_entry():
    children_before = _children()
    rng = random.Random(1818)
    before, fds = _our_entries(), _fds()
    interrupted = 0
    for _ in range(40):
        loader = DataLoader(RangeDataset(8), batch_size=4, num_workers=1, timeout=20, slot_bytes=1 << 16)
        it = None
        try:
            with _Interrupt(rng.uniform(0.00005, 0.003)):
                it = iter(loader)
                next(it)
                time.sleep(0.01)
        except KeyboardInterrupt:
            interrupted += 1
        loader.close()
        del loader, it
        gc.collect()
    assert interrupted >= 5  # (a Ctrl-C that lands in a finalizer or weakref callback is ignored by Python)
    assert _our_entries() <= before and _fds() == fds
    assert _children() <= children_before


@pytest.mark.parametrize("in_order", [True, False])
def test_ctrl_c_inside_next_then_going_on_yields_every_batch_exactly_once(in_order):
    """NOTE [ An interrupt during next() ] (epoch.py): SIGINT at random moments of an epoch,
    the same iterator taken up again after each KeyboardInterrupt."""
    rng = random.Random(9 + in_order)
    loader = DataLoader(RangeDataset(400), batch_size=2, num_workers=2, timeout=20, in_order=in_order,
                        prefetch_factor=4)
    got: list[list[int]] = []
    interrupts = 0
    with loader:
        it = iter(loader)
        b = None
        while True:
            try:
                with _Interrupt(rng.uniform(0.0, 0.002)):
                    for b in it:
                        got.append(b.tolist())
                        time.sleep(0.0002)  # (the timer mostly lands in next(), not here)
                break
            except KeyboardInterrupt:
                interrupts += 1
                # the for-loop bound b before the interrupt could land in its body: file it once
                if b is not None and (not got or got[-1] != b.tolist()):
                    got.append(b.tolist())
    assert interrupts >= 20
    expected = [[i, i + 1] for i in range(0, 400, 2)]
    assert (got if in_order else sorted(got)) == expected


def test_threads_sharing_one_iterator_get_each_batch_exactly_once():
    loader = DataLoader(RangeDataset(800), batch_size=4, num_workers=2, timeout=20)
    got: list[list[int]] = []
    errors: list[BaseException] = []

    def take(it):
        try:
            for b in it:
                got.append(b.tolist())
        except BaseException as exc:  # (reported below: a thread's exception would be lost)
            errors.append(exc)
    with loader:
        it = iter(loader)
        threads = [threading.Thread(target=take, args=(it,)) for _ in range(4)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(60)
        assert not any(t.is_alive() for t in threads)
    assert errors == []
    assert sorted(got) == [[i, i + 1, i + 2, i + 3] for i in range(0, 800, 4)]


def test_threads_sharing_one_single_process_iterator_get_each_batch_exactly_once():
    loader = DataLoader(RangeDataset(400), batch_size=4)
    it = iter(loader)
    got: list[list[int]] = []
    threads = [threading.Thread(target=lambda: got.extend(b.tolist() for b in it)) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert sorted(got) == [[i, i + 1, i + 2, i + 3] for i in range(0, 400, 4)]


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


_CTRL_C_AT_START = """
import os, signal, sys, threading, time
sys.path.insert(0, {root!r})
from shmload import DataLoader
from tests.helpers import RangeDataset
loader = DataLoader(RangeDataset(64), batch_size=4, num_workers=2, multiprocessing_context={method!r}, timeout=60)
# Ctrl-C in a terminal reaches the whole process group: the workers too, while they start
threading.Timer({delay}, os.killpg, (os.getpgid(0), signal.SIGINT)).start()
for _ in loader:
    time.sleep(0.05)
"""


@pytest.mark.parametrize("method,delay", [("spawn", 0.05), ("spawn", 0.3)])  # (forkserver: see reliability.md)
def test_ctrl_c_while_spawned_workers_start_is_one_traceback(method, delay):
    import subprocess
    import sys
    from pathlib import Path
    root = str(Path(__file__).resolve().parents[1])
    done = subprocess.run([sys.executable, "-c", _CTRL_C_AT_START.format(root=root, method=method, delay=delay)],
                          capture_output=True, text=True, timeout=120, start_new_session=True)
    assert done.returncode != 0
    assert done.stderr.count("Traceback (most recent call last)") == 1, done.stderr
    assert "KeyboardInterrupt" in done.stderr and "Fatal Python error" not in done.stderr


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
