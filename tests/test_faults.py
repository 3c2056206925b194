"""Faults a long training run meets: a worker dies or is killed (and is restarted), the
main process is killed, workers fail to start or take too long, a loader is nested in
another's worker, and the machine's limits are reached (the ring's bound, address space,
file descriptors). Each gets the behaviour docs/reliability.md promises, checked by regex
on the message. One test reaches into ``shmload._transport.shm`` to refuse its mappings
as ``ulimit -v`` would."""

import os
import re
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import numpy as np
import pytest

import shmload
from shmload import (
    DataLoader,
    LoaderTimeoutError,
    RingFullError,
    ShmloadWarning,
    WorkerDiedError,
    WorkerStartupError,
)

from .helpers import (
    TIMEOUT,
    DyingDataset,
    ExitingDataset,
    ImageDataset,
    RangeDataset,
    SlowDataset,
    UnpicklableDataset,
    failing_init,
    gone,
    rows_of,
)

ROOT = Path(__file__).resolve().parent.parent


def rows(loader):
    """Every batch as plain lists (copies: nothing of the ring is kept)."""
    return [(x.tolist(), y.tolist()) for x, y in loader]


def reference(dataset, **kwargs):
    return rows(DataLoader(dataset, num_workers=0, **kwargs))


# ---------------------------------------------------------------- a worker dies
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


@pytest.mark.parametrize("how,text", [("kill", "SIGKILL"), ("exit", "exit code 7"), ("segv", "SIGSEGV")])
def test_a_dead_worker_is_replaced_and_the_epoch_is_exactly_as_without_the_fault(tmp_path, how, text):
    ds = DyingDataset(64, at=21, marker_dir=tmp_path, how=how)
    expected = reference(ds, batch_size=4, shuffle=True, seed=5)
    loader = DataLoader(ds, batch_size=4, shuffle=True, seed=5, num_workers=2, max_worker_restarts=1, timeout=30)
    with pytest.warns(ShmloadWarning, match=rf"worker process \d \(pid \d+\) .*{text} unexpectedly; started pid "
                                            r"\d+ in its place \(restart 1 of max_worker_restarts=1\) and sent it "
                                            r"batch(es)? \d+.* again"):
        got = rows(loader)
    assert got == expected  # same order, same augmentation randomness
    assert os.path.exists(tmp_path / "died-0")


def test_restarts_are_counted_per_loader_and_then_the_death_is_raised(tmp_path):
    ds = DyingDataset(40, at=9, marker_dir=tmp_path, times=3)
    loader = DataLoader(ds, batch_size=2, num_workers=2, max_worker_restarts=2, timeout=30)
    with pytest.warns(ShmloadWarning) as warned:
        with pytest.raises(WorkerDiedError, match=r"SIGKILL unexpectedly; it was loading batch 4 \(dataset "
                                                  r"indices \[8, 9\]\).*All 2 restarts allowed"):
            rows(loader)
    assert [re.search(r"restart \d of max_worker_restarts=2", str(w.message)).group(0) for w in warned] == \
        ["restart 1 of max_worker_restarts=2", "restart 2 of max_worker_restarts=2"]
    assert len(os.listdir(tmp_path)) == 3


def test_without_restarts_the_death_says_how_to_allow_them(tmp_path):
    loader = DataLoader(DyingDataset(20, at=3, marker_dir=tmp_path), batch_size=2, num_workers=1, timeout=30)
    with pytest.raises(WorkerDiedError, match=r"pid \d+\) was killed by SIGKILL .*Pass max_worker_restarts=N"):
        rows(loader)


def test_an_external_sigkill_is_survived_with_persistent_workers(tmp_path):
    ds = SlowDataset(40, 0.02)
    loader = DataLoader(ds, batch_size=2, num_workers=2, persistent_workers=True, max_worker_restarts=1, timeout=30)
    with loader:
        it = iter(loader)
        got = [next(it).tolist() for _ in range(3)]
        victim = loader._sessions.persistent.supervisor.pids[0]
        os.kill(victim, signal.SIGKILL)
        with pytest.warns(ShmloadWarning, match=rf"pid {victim}\) was killed by SIGKILL"):
            got += [b.tolist() for b in it]
        assert got == [[i, i + 1] for i in range(0, 40, 2)]
        assert victim not in loader._sessions.persistent.supervisor.pids
        assert [b.tolist() for b in loader] == got  # the replacement serves later epochs too


def test_a_restart_under_spawn_reattaches_the_ring(tmp_path):
    ds = DyingDataset(48, at=30, marker_dir=tmp_path)
    expected = reference(ds, batch_size=4, seed=2)
    loader = DataLoader(ds, batch_size=4, seed=2, num_workers=2, multiprocessing_context="spawn",
                        max_worker_restarts=1, timeout=30)
    with pytest.warns(ShmloadWarning, match="restart 1 of"):
        assert rows(loader) == expected


def test_a_worker_that_dies_at_start_up_is_not_restarted():
    loader = DataLoader(RangeDataset(8), batch_size=2, num_workers=1, max_worker_restarts=3,
                        worker_init_fn=_die_at_init, timeout=30)
    with pytest.raises(WorkerStartupError, match=r"worker process 0 \(pid \d+\) exited with exit code 3 during "
                                                 r"start-up"):
        rows(loader)


def _die_at_init(worker_id):
    os._exit(3)


# ---------------------------------------------------------------- the main process dies
@pytest.mark.parametrize("method,dataset", [
    ("fork", "SlowDataset(1000, 0.01)"), ("spawn", "SlowDataset(1000, 0.01)"), ("forkserver", "SlowDataset(1000, 0.01)"),
    ("fork", "shmload.GeneratorSource(slow_count, 1000, 0.01)"),  # an iterable source's workers too
])
def test_workers_exit_when_the_main_process_is_killed(method, dataset):
    proc = subprocess.Popen([sys.executable, "-c", textwrap.dedent(f"""
        import sys, time, shmload
        from tests.helpers import SlowDataset, slow_count
        if __name__ == "__main__":
            loader = shmload.DataLoader({dataset}, batch_size=1, num_workers=2,
                                        multiprocessing_context={method!r}, persistent_workers=True)
            it = iter(loader)
            next(it)
            print(*loader._sessions.persistent.supervisor.pids, flush=True)
            time.sleep(60)
    """)], cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        pids = [int(p) for p in proc.stdout.readline().split()]
        assert len(pids) == 2, proc.stderr.read()
        proc.kill()
        proc.wait(10)
        assert gone(pids, within=3.0), f"workers {pids} outlived the killed main process"
    finally:
        proc.kill()
        proc.wait(10)
        proc.stdout.close()
        proc.stderr.close()


@pytest.mark.parametrize("method", ["fork", "spawn", "forkserver"])
def test_workers_busy_in_a_long_getitem_exit_when_the_main_process_is_killed(method):
    proc = subprocess.Popen([sys.executable, "-c", textwrap.dedent(f"""
        import time, shmload
        from tests.helpers import SlowDataset
        if __name__ == "__main__":
            loader = shmload.DataLoader(SlowDataset(100, 120.0, slow=set(range(2, 100))), batch_size=1,
                                        num_workers=2, multiprocessing_context={method!r}, persistent_workers=True)
            it = iter(loader)
            next(it), next(it)
            print(*loader._sessions.persistent.supervisor.pids, flush=True)
            time.sleep(1.0)  # both workers are now inside a 120 s __getitem__
            print("busy", flush=True)
            time.sleep(60)
    """)], cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        pids = [int(p) for p in proc.stdout.readline().split()]
        assert len(pids) == 2, proc.stderr.read()
        assert proc.stdout.readline().strip() == "busy"
        proc.kill()
        proc.wait(10)
        assert gone(pids, within=6.0), f"workers {pids} outlived the killed main process (bound: 2 s)"
    finally:
        proc.kill()
        proc.wait(10)
        proc.stdout.close()
        proc.stderr.close()


# ---------------------------------------------------------------- start-up
def test_worker_init_fn_failure_is_a_startup_error(start_method):
    loader = DataLoader(RangeDataset(4), num_workers=2, worker_init_fn=failing_init,
                        multiprocessing_context=start_method)
    with pytest.raises(WorkerStartupError, match=r"(?s)worker process \d failed during start-up.*init failed in "
                                                 r"worker \d.*Traceback"):
        list(loader)


def test_an_import_error_in_a_spawned_worker_is_a_start_up_error_with_its_traceback(tmp_path, monkeypatch):
    (tmp_path / "parent_only_module.py").write_text(textwrap.dedent("""
        import multiprocessing
        if multiprocessing.parent_process() is not None:
            raise ImportError("this module refuses to load in a child process")

        class Dataset:
            def __len__(self):
                return 8

            def __getitem__(self, i):
                return i
    """))
    monkeypatch.syspath_prepend(str(tmp_path))
    import parent_only_module

    try:
        loader = DataLoader(parent_only_module.Dataset(), batch_size=2, num_workers=1,
                            multiprocessing_context="spawn", timeout=30)
        with pytest.raises(WorkerStartupError, match=r"(?s)worker process 0 failed during start-up.*ImportError: "
                                                     r"this module refuses to load in a child process.*Traceback"):
            rows(loader)
    finally:
        del sys.modules["parent_only_module"]


@pytest.mark.parametrize("method", ["spawn", "forkserver"])
def test_unpicklable_dataset_under_spawn_says_so(method):
    loader = DataLoader(UnpicklableDataset(4), num_workers=1, multiprocessing_context=method)
    with pytest.raises(WorkerStartupError, match=rf"the dataset \(UnpicklableDataset\) cannot be pickled, which "
                                                 rf"the '{method}' start method needs.*multiprocessing_context='fork'"):
        iter(loader)


def test_unpicklable_dataset_is_fine_under_fork():
    assert [b.tolist() for b in DataLoader(UnpicklableDataset(4), batch_size=2, num_workers=1)] == [[0, 1], [2, 3]]


# ---------------------------------------------------------------- time-outs
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


def _stuck_init(worker_id):
    time.sleep(30)


def test_a_time_out_while_a_worker_is_still_starting_says_so():
    loader = DataLoader(RangeDataset(8), batch_size=4, num_workers=1, timeout=1, worker_init_fn=_stuck_init)
    with loader, pytest.raises(RuntimeError, match=r"^DataLoader timed out after 1 seconds waiting for batch 0: "
                                                   r"worker 0 \(pid \d+\) has not finished starting: it is still in "
                                                   r"its start \(fork\) or worker_init_fn \(it was given dataset "
                                                   r"indices \[0, 1, 2, 3\]\)\. A worker_init_fn that blocks"):
        next(iter(loader))


# ---------------------------------------------------------------- nested use
def test_a_loader_inside_a_dataset_loads_in_its_worker_without_workers():
    outer = DataLoader(NestedDataset(4), batch_size=2, num_workers=2, timeout=30)
    assert [b.tolist() for b in outer] == [[6, 22], [38, 54]]


class NestedDataset(RangeDataset):
    """Each sample sums a batch of an inner loader without workers (which is allowed)."""

    def __getitem__(self, i):
        inner = DataLoader(RangeDataset(4 * (i + 1)), batch_size=4, num_workers=0)
        return int(list(inner)[i].sum())


class NestedLoaderDataset(RangeDataset):
    def __getitem__(self, i):
        inner = DataLoader(RangeDataset(4), batch_size=2, num_workers=1)
        return sum(int(b.sum()) for b in inner)


def test_a_loader_with_workers_inside_a_worker_gets_a_clear_error():
    with pytest.raises(shmload.ShmloadError, match=r"runs inside a daemonic process .*Use num_workers=0"):
        list(DataLoader(NestedLoaderDataset(2), batch_size=1, num_workers=1))


# ---------------------------------------------------------------- the machine's limits
def test_a_sample_larger_than_the_ring_bound_is_a_clear_error_not_a_crash():
    loader = DataLoader(HugeDataset(4), batch_size=2, num_workers=1, max_shm_bytes=8 << 20, timeout=30)
    with pytest.raises(RingFullError, match=r"cannot grow its slots to 32.00 MiB for a batch of 32.00 MiB: .*"
                                            r"over its bound of 8.00 MiB \(max_shm_bytes\)"):
        rows_of(loader)


class HugeDataset(RangeDataset):
    def __getitem__(self, i):
        return np.zeros(16 << 20, np.uint8)


def test_a_tiny_max_shm_bytes_is_caught_as_a_shared_memory_error():
    page = 4096
    loader = DataLoader(ImageDataset(8, shape=(4 * page,)), batch_size=2, num_workers=1, max_shm_bytes=page,
                        timeout=TIMEOUT)
    with loader:
        try:
            list(loader)
        except shmload.SharedMemoryError as exc:
            caught = exc
        else:
            caught = None
    assert isinstance(caught, shmload.RingFullError)
    assert re.search(r"bound of 4.0 KiB \(max_shm_bytes\)", str(caught))


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
