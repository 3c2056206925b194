"""The leak check of the autouse fixture (tests/conftest.py) itself: it catches what the
library or the test's own processes leave behind, ignores what other programs of the
machine create or remove in /dev/shm meanwhile, and sees every process a test marked
``pure`` starts. Each test cleans up what it made. It names its segments as the library
does (``shmload._transport.shm``), on purpose."""

import contextlib
import multiprocessing
import multiprocessing.resource_tracker
import os
import secrets
import select
import subprocess
import sys
import textwrap

import posix_ipc
import psutil
import pytest

from shmload import DataLoader
from shmload._transport.shm import NAME_PREFIX

from .conftest import LAUNCHED, assert_nothing_new, assert_started_nothing, snapshot
from .helpers import RangeDataset

QUICK = 0.3  # seconds the check waits for a leak to go away, where one is made on purpose


def python(script: str, **kwargs) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-c", textwrap.dedent(script)], text=True, **kwargs)


def readline(proc: subprocess.Popen, timeout: float = 30) -> str:
    if not select.select([proc.stdout], [], [], timeout)[0]:
        raise TimeoutError(f"no line from pid {proc.pid} within {timeout} s")
    return proc.stdout.readline().strip()


def stop(proc: subprocess.Popen) -> None:
    """End a child that waits on its stdin: EOF first, then SIGKILL."""
    proc.stdin.close()
    try:
        proc.wait(10)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait(10)
    proc.stdout.close()


@pytest.mark.pure
def test_a_segment_left_under_shmload_s_name_is_caught():
    before = snapshot()
    name = NAME_PREFIX + "leakcheck-" + secrets.token_hex(8)
    posix_ipc.SharedMemory(name, posix_ipc.O_CREX, mode=0o600, size=4096).close_fd()  # nobody holds it
    try:
        with pytest.raises(AssertionError, match=rf"(?m)left shared-memory entries behind: "
                                                 rf"/dev/shm{name} \(a shmload name\)$"):
            assert_nothing_new(before, wait=QUICK)
    finally:
        posix_ipc.unlink_shared_memory(name)


def test_a_segment_left_by_a_child_process_that_exited_is_caught():
    before = snapshot()
    name = NAME_PREFIX + "leakcheck-" + secrets.token_hex(8)
    child = python(f"import posix_ipc; posix_ipc.SharedMemory({name!r}, posix_ipc.O_CREX, size=4096)")
    try:
        assert child.wait(30) == 0
        with pytest.raises(AssertionError, match=rf"(?m)entries behind: /dev/shm{name} \(a shmload name\)$"):
            assert_nothing_new(before, wait=QUICK)
    finally:
        child.kill()
        child.wait(10)
        with contextlib.suppress(posix_ipc.ExistentialError):
            posix_ipc.unlink_shared_memory(name)


def abandon_a_semaphore(conn) -> None:
    """In a spawned child: make a multiprocessing semaphore, say its name, die without
    cleaning up (as a killed process would)."""
    lock = multiprocessing.get_context("spawn").Lock()
    conn.send(lock._semlock.name)
    os._exit(0)


def test_a_multiprocessing_semaphore_abandoned_by_a_dead_child_is_caught():
    """Held by no live process, under a name like any program's semaphores: caught because
    the session's multiprocessing names its semaphores apart."""
    ctx = multiprocessing.get_context("spawn")
    before = snapshot()
    ours, theirs = ctx.Pipe()
    child = ctx.Process(target=abandon_a_semaphore, args=(theirs,))
    child.start()
    name = None
    try:
        assert ours.poll(30)
        name = ours.recv()
        child.join(30)
        assert child.exitcode == 0
        with pytest.raises(AssertionError, match=rf"(?m)entries behind: /dev/shm/sem\.{name[1:]} "
                                                 r"\(a multiprocessing semaphore of this test session\)$"):
            assert_nothing_new(before, wait=QUICK)
    finally:
        child.kill()
        child.join(10)
        ours.close()
        theirs.close()
        if name is not None:  # what the resource tracker would do at the session's end, silently
            with contextlib.suppress(posix_ipc.ExistentialError):
                posix_ipc.unlink_semaphore(name)
            multiprocessing.resource_tracker.unregister(name, "semaphore")


def test_an_entry_of_any_name_held_by_the_test_or_a_live_child_is_caught():
    before = snapshot()
    name = "/leakcheck-" + secrets.token_hex(8)
    held = posix_ipc.Semaphore(name, posix_ipc.O_CREX, mode=0o600)
    try:
        with pytest.raises(AssertionError,
                           match=rf"(?m)behind: /dev/shm/sem\.{name[1:]} \(open or mapped by the test process\)$"):
            assert_nothing_new(before, wait=QUICK)
    finally:
        held.unlink()
        held.close()
    child = python(f"""
        import posix_ipc, sys
        held = posix_ipc.Semaphore({name!r}, posix_ipc.O_CREX, mode=0o600)
        print("ready", flush=True)
        sys.stdin.readline()
        held.unlink()
    """, stdin=subprocess.PIPE, stdout=subprocess.PIPE)
    try:
        assert readline(child) == "ready"
        with pytest.raises(AssertionError,
                           match=rf"(?m)behind: /dev/shm/sem\.{name[1:]} \(open or mapped by pid {child.pid}\)$"):
            assert_nothing_new(before, wait=QUICK)
    finally:
        stop(child)
        with contextlib.suppress(posix_ipc.ExistentialError):
            posix_ipc.unlink_semaphore(name)


@pytest.mark.skipif(not os.path.isdir("/dev/mqueue"), reason="/dev/mqueue is not mounted here")
def test_a_message_queue_left_or_held_is_caught():
    before = snapshot()
    left = NAME_PREFIX + "leakcheck-" + secrets.token_hex(8)
    held_name = "/leakcheck-" + secrets.token_hex(8)
    posix_ipc.MessageQueue(left, posix_ipc.O_CREX, mode=0o600).close()
    held = posix_ipc.MessageQueue(held_name, posix_ipc.O_CREX, mode=0o600)
    try:
        with pytest.raises(AssertionError, match=rf"(?m)behind: /dev/mqueue{held_name} \(open or mapped by the test "
                                                 rf"process\), /dev/mqueue{left} \(a shmload name\)$"):
            assert_nothing_new(before, wait=QUICK)
    finally:
        held.close()
        for name in (left, held_name):
            posix_ipc.unlink_message_queue(name)


UNRELATED = """
    import multiprocessing, os, sys, threading
    if os.fork():  # the first child exits at once: its child is reparented away from the test
        os._exit(0)
    ctx = multiprocessing.get_context("spawn")  # named semaphores, like any program's: sem.mp-...
    old = ctx.Lock()
    print(os.getpid(), old._semlock.name, flush=True)
    sys.stdin.readline()
    new = ctx.Lock()
    del old  # its finalizer unlinks it
    done = threading.Event()
    def churn():  # a busy /dev/shm: semaphores made and removed every few ms
        while not done.wait(0.002):
            ctx.Lock()
    threading.Thread(target=churn, daemon=True).start()
    print(new._semlock.name, flush=True)
    sys.stdin.readline()  # until the test says so, or is gone (EOF)
    done.set()
"""


def test_entries_other_programs_create_or_remove_meanwhile_are_ignored():
    """Another program (not a descendant of the test: double-forked, in its own session)
    removes a semaphore, creates one it keeps open, and churns more while a loader runs."""
    launcher = python(UNRELATED, stdin=subprocess.PIPE, stdout=subprocess.PIPE, start_new_session=True)
    pid = old = None
    try:
        assert launcher.wait(30) == 0
        pid, old = readline(launcher).split()
        pid = int(pid)
        assert pid not in [p.pid for p in psutil.Process().children(recursive=True)]
        before = snapshot()
        launcher.stdin.write("go\n")
        launcher.stdin.flush()
        new = readline(launcher)
        with DataLoader(RangeDataset(64), batch_size=4, num_workers=2, timeout=30) as loader:
            assert [b.tolist() for b in loader][-1] == [60, 61, 62, 63]
        appeared = snapshot().entries - before.entries
        assert f"/dev/shm/sem.{new[1:]}" in appeared and f"/dev/shm/sem.{old[1:]}" not in snapshot().entries
        assert_nothing_new(before)
    finally:
        launcher.stdin.close()  # EOF: the unrelated process ends and its semaphores are unlinked
        if pid is not None:
            try:
                process = psutil.Process(pid)
                try:
                    process.wait(10)
                except psutil.TimeoutExpired:
                    if process.status() != psutil.STATUS_ZOMBIE:  # unreaped by its new parent: gone enough
                        process.kill()
            except psutil.NoSuchProcess:
                pass
        launcher.wait(10)
        launcher.stdout.close()


def test_a_child_process_left_alive_is_caught():
    before = snapshot()
    child = python("import time; time.sleep(60)")
    try:
        with pytest.raises(AssertionError, match=rf"left child processes alive: {{{child.pid}: '.*sleep"):
            assert_nothing_new(before, wait=QUICK)
    finally:
        child.kill()
        child.wait(10)


@pytest.mark.pure
@pytest.mark.shm_names
def test_the_name_watch_sees_a_posix_segments_name_and_no_memfd_one():
    # what lets the autouse check fail a test in which the default backend shows a name
    from shmload._transport import shm

    from .conftest import NameWatch, _own_names

    watch = NameWatch()
    if watch.fd < 0:
        pytest.skip("inotify is not available here (or this user's inotify instances are used up)")
    try:
        shm.Segment(0, 1 << 12, backend="posix").close()
        assert len(_own_names(watch.created())) == 1
        shm.Segment(0, 1 << 12).close()  # memfd: never a name
        assert _own_names(watch.created()) == []
    finally:
        os.close(watch.fd)


def _fork_and_exit():
    pid = os.fork()
    if pid == 0:
        os._exit(0)
    os.waitpid(pid, 0)


def _multiprocessing(method):
    def start():
        process = multiprocessing.get_context(method).Process(target=os.getpid)
        process.start()
        process.join(30)
    return start


def _loader(num_workers):
    def load():
        with DataLoader(RangeDataset(8), batch_size=4, num_workers=num_workers, timeout=30) as loader:
            assert [b.tolist() for b in loader] == [[0, 1, 2, 3], [4, 5, 6, 7]]
    return load


@pytest.mark.parametrize("start,count,seen", [
    (_fork_and_exit, 1, r"os\.fork\(\)$"),
    (lambda: subprocess.run(["true"], check=True), 1, r"subprocess\.Popen\('true', \['true'\]\)$"),
    (lambda: os.system("true"), 1, r"os\.system\(b'true',\)$"),
    (lambda: os.waitpid(os.posix_spawnp("true", ["true"], os.environ), 0), 1, r"os\.posix_spawn\('true', \['true'\]\)$"),
    (_multiprocessing("fork"), 1, r"multiprocessing start of <ForkProcess name='ForkProcess-\d+' .*>$"),
    (_multiprocessing("spawn"), 1, r"multiprocessing start of <SpawnProcess name='SpawnProcess-\d+' .*>$"),
    (_multiprocessing("forkserver"), 1, r"multiprocessing start of <ForkServerProcess name='ForkServerProcess-\d+' .*>$"),
    (_loader(2), 2, r"multiprocessing start of <ForkProcess name='shmload-worker-0' .*>; "
                    r"multiprocessing start of <ForkProcess name='shmload-worker-1' .*>$"),
], ids=["fork", "subprocess", "system", "posix_spawn", "mp-fork", "mp-spawn", "mp-forkserver", "loader"])
def test_a_process_started_and_gone_is_seen_by_the_pure_check(start, count, seen):
    """Each way of starting a process, one entry a process, though it exited before the
    check: what fails a test marked pure."""
    since = len(LAUNCHED)
    start()
    with pytest.raises(AssertionError, match=rf"(?m)^a test marked pure started {count} process\(es\): {seen}"):
        assert_started_nothing(since)


@pytest.mark.pure
def test_a_loader_without_workers_starts_no_process():
    since = len(LAUNCHED)
    _loader(0)()
    assert_started_nothing(since)
