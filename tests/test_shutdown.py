"""Every ordinary way out stops the workers and leaves nothing behind (the autouse
fixture checks /dev/shm and child processes after each test; these tests check the
moment it happens). Interrupts are in test_interrupts.py, a killed main process in
test_faults.py."""

import gc
import subprocess
import sys
import textwrap
import time

import pytest

from shmload import DataLoader, ShmloadError

from .conftest import _attributed, _entries
from .helpers import ImageDataset, RangeDataset, SlowDataset, gone
from .scripts import ROOT


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
