"""Every way out stops the workers and leaves nothing behind (the autouse fixture checks
/dev/shm and child processes after each test; these tests check the moment it happens)."""

import gc
import os
import subprocess
import sys
import textwrap
import time

import psutil
import pytest

from shmload import DataLoader, ShmloadError

from .conftest import _attributed, _entries
from .helpers import ImageDataset, RangeDataset, SlowDataset

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def gone(pids, within=5.0):
    deadline = time.monotonic() + within
    while time.monotonic() < deadline:
        alive = []
        for pid in pids:
            try:
                if psutil.Process(pid).status() != psutil.STATUS_ZOMBIE:
                    alive.append(pid)
            except psutil.NoSuchProcess:
                pass
        if not alive:
            return True
        time.sleep(0.05)
    return False


def worker_pids(it):
    return list(it._session.supervisor.pids)


def test_break_stops_non_persistent_workers():
    loader = DataLoader(RangeDataset(100), batch_size=2, num_workers=2)
    it = iter(loader)
    next(it)
    pids = worker_pids(it)
    for _ in it:
        break
    del it
    assert gone(pids)


def test_end_of_epoch_stops_non_persistent_workers():
    it = iter(DataLoader(RangeDataset(10), batch_size=5, num_workers=2))
    list(it)
    assert it._session.closed and gone(worker_pids(it))


def test_close_and_with_block_stop_persistent_workers():
    loader = DataLoader(RangeDataset(10), batch_size=5, num_workers=2, persistent_workers=True)
    with loader:
        list(loader)
        pids = worker_pids(iter(loader))
    assert gone(pids)
    assert [b.tolist() for b in loader] == [[0, 1, 2, 3, 4], [5, 6, 7, 8, 9]]  # usable again
    pids = loader._sessions.persistent.supervisor.pids
    loader.close()
    assert gone(pids)


def test_garbage_collection_of_the_loader_stops_workers():
    loader = DataLoader(RangeDataset(10), batch_size=5, num_workers=2, persistent_workers=True)
    list(loader)
    pids = loader._sessions.persistent.supervisor.pids
    del loader
    gc.collect()
    assert gone(pids)


def test_close_while_an_iterator_is_live_makes_it_fail_clearly():
    loader = DataLoader(RangeDataset(10), batch_size=2, num_workers=1)
    it = iter(loader)
    next(it)
    loader.close()
    with pytest.raises(ShmloadError, match="can no longer be used"):
        next(it)


def test_a_worker_stuck_in_getitem_is_stopped_within_seconds():
    loader = DataLoader(SlowDataset(10, 60.0), batch_size=1, num_workers=1, timeout=0.2)
    it = iter(loader)
    pids = worker_pids(it)
    with pytest.raises(TimeoutError):
        next(it)
    start = time.monotonic()
    del it
    assert gone(pids) and time.monotonic() - start < 5


def run_script(body, **kwargs):
    script = textwrap.dedent(body)
    return subprocess.run([sys.executable, "-c", script], cwd=ROOT, capture_output=True, text=True,
                          timeout=60, **kwargs)


@pytest.mark.parametrize("method", ["fork", "spawn"])
def test_interpreter_exit_with_live_workers_is_clean_and_silent(method):
    result = run_script(f"""
        import shmload
        from tests.helpers import ImageDataset
        loader = shmload.DataLoader(ImageDataset(100), batch_size=4, num_workers=2, persistent_workers=True,
                                    multiprocessing_context={method!r})
        it = iter(loader)
        batch = next(it)
        print(*loader._sessions.persistent.supervisor.pids)
    """)
    assert result.returncode == 0, result.stderr
    assert result.stderr == ""  # no warning, no traceback
    assert gone([int(p) for p in result.stdout.split()])


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


def test_nothing_named_appears_in_dev_shm_while_loading():
    before = _entries()
    loader = DataLoader(ImageDataset(40, shape=(4096,)), batch_size=4, num_workers=2)
    it = iter(loader)
    next(it)
    assert _attributed(_entries() - before) == []  # (entries of other programs do not count)
    del it


_CATCH_THEN_CLOSE = """
import os, sys
import numpy as np
import shmload

class Big:
    def __len__(self): return 16
    def __getitem__(self, i): return np.zeros(100_000, np.uint8)

loader = shmload.DataLoader(Big(), batch_size=4, num_workers=2, max_shm_bytes=200_000, timeout=20)
try:
    for b in loader:
        pass
except shmload.RingFullError:
    pass
loader.close()
children = [c for t in os.listdir("/proc/self/task") for c in open(f"/proc/self/task/{t}/children").read().split()]
held = [os.readlink(f"/proc/self/fd/{fd}") for fd in os.listdir("/proc/self/fd")
        if os.path.exists(f"/proc/self/fd/{fd}") and "shmload" in os.readlink(f"/proc/self/fd/{fd}")]
print(len(children), held)
"""


def test_a_finalizer_during_the_first_psutil_import_cleans_up_silently():
    """Issue 32, item 7: close() after a caught RingFullError printed "Exception ignored
    in: <finalize object> ... partially initialized module 'psutil'" and stopped part-way
    (a session's finalizer ran during the first `import psutil`, which close() did lazily)."""
    from .scripts import describe, run_script
    result = run_script(["-c", _CATCH_THEN_CLOSE], timeout=60)
    assert result.returncode == 0 and result.stderr == "", describe(result)
    assert result.stdout.split("\n")[0] == "0 []", describe(result)
