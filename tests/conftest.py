"""Shared fixtures. The autouse ``no_leaks`` fixture fails any test that leaves behind a
new shared-memory entry of its own, a live child process, or a shmload segment still
mapped or open in the test process.

/dev/shm (where POSIX semaphores live too) and /dev/mqueue are shared by every program
of the machine, and other programs create and remove entries there all the time (their
``multiprocessing`` semaphores, ``sem.mp-...``). So an entry that appeared during the
test counts only if it is attributable to this library or to the test's own processes:

1. its name is shmload's (``shm.NAME_PREFIX``, ``/shmload-...``), whoever made it. The
   library creates no other named object (no POSIX semaphores or queues: its segments
   are its only named objects, unlinked at birth), so every leak of the library shows
   here, even one left by a process that has exited (a worker, a script run by a test);
2. it is a ``multiprocessing`` semaphore of this test session: the session gives
   ``multiprocessing`` its own semaphore prefix (``SEMPREFIX``: entries
   ``sem.mp-shmloadtest<pid>-...``), which every process started through
   ``multiprocessing`` inherits (fork, spawn, forkserver), so a semaphore that a killed
   child abandoned is still ours;
3. the test process or one of its live descendants has it open or mapped (its device
   and inode in ``/proc/<pid>/fd`` or ``/proc/<pid>/maps``; the inode, not the path,
   because glibc's ``sem_open`` maps a temporary file and links it under the name).

Every other new entry is another program's and is ignored, as are entries removed
during the test. What cannot be attributed: an entry under a foreign name that one of
the test's processes created outside ``multiprocessing`` (``posix_ipc``, ``shm_open``,
a fresh interpreter's own ``multiprocessing``), and that is held by no live process of
the test: its creator exited, or closed it without unlinking. Nothing in /dev/shm says
who made a file, and the kernel does not remember. That is acceptable because such an
entry cannot come from the library (rule 1 covers all it names) and a test that makes
one names it itself; tests that need a named object should name it ``/shmload-...`` so
that rule 1 checks its removal. An entry a child still holds is counted, and the child
fails the child-process check besides.

A shmload entry that appears for a moment (another shmload user's segment, named for
microseconds) is not a leak: what is new is looked at again for up to 5 s.

The default backend (memfd) never names a segment at all, so the autouse fixture also
watches /dev/shm (inotify) for a POSIX segment name of this process's own
(``/shmload-<pid>-...``) even appearing: only tests marked ``shm_names``, which ask for
the POSIX backend, may show one (or all, in a run with SHMLOAD_SHM_BACKEND=posix). It sees names the test process makes, not those of
scripts a test runs (their pids are not known by the time the name is read; each such
script's leaks are still caught by rule 1), and sees nothing where inotify cannot be had
or its queue overflowed on a very busy /dev/shm.

A test marked ``pure`` (the fast lane, ``pytest -m pure``) must start no process at all,
not even one that is gone by the test's end: the fixture fails it if this process
started any during the test (:data:`LAUNCHED`, which sees every way Python starts one;
a ``num_workers=0`` loader starts none).
"""

from __future__ import annotations

import ctypes
import functools
import gc
import multiprocessing.process
import multiprocessing.util
import os
import struct
import sys
import threading
import time
from typing import NamedTuple

import psutil
import pytest

from shmload._transport.shm import MEMFD_PATH, NAME_PREFIX

SHM_DIRS = ("/dev/shm", "/dev/mqueue")
OURS = NAME_PREFIX.lstrip("/")  # "shmload-": the library's only named objects
# The name prefix of this session's multiprocessing semaphores (rule 2 above); the pid
# keeps another test session's apart.
SEMPREFIX = f"/mp-shmloadtest{os.getpid()}"
# CPython's own long-lived helpers: started by spawn/forkserver, alive until exit.
HELPERS = ("resource_tracker", "forkserver")


def pytest_configure(config):
    inherited = multiprocessing.process.current_process()._config  # what child processes inherit
    if inherited.get("semprefix") == "/mp":  # CPython's default; a private detail, so only if it is there
        inherited["semprefix"] = SEMPREFIX
    _watch_launches()


# Every process the test process starts, described, in order (the module docstring's last
# paragraph). Python raises an audit event for each way it starts one (os.fork, so
# multiprocessing's fork, os.forkpty, os.posix_spawn(p), os.spawn*, os.system,
# subprocess.Popen), except multiprocessing's spawn and forkserver, which start theirs
# through _posixsubprocess or a request to the fork server: those are seen where they
# begin, BaseProcess.start, and util.spawnv_passfds (which also starts the resource
# tracker and the fork server). One start is one entry: what a start does inside (the
# fork of a ForkProcess, the resource tracker a first SpawnProcess starts) is not counted
# again. Only a fork in C code outside Python goes unseen.
LAUNCHED: list[str] = []
_LAUNCHING_EVENTS = frozenset({"os.fork", "os.forkpty", "os.posix_spawn", "os.spawn", "os.system",
                               "subprocess.Popen"})
_TEST_PID = os.getpid()
_STARTING = threading.local()  # .depth: inside a start already counted


def _launched(what: str) -> None:
    if os.getpid() == _TEST_PID and not getattr(_STARTING, "depth", 0):  # (not a forked child's)
        LAUNCHED.append(what)


def _audit(event: str, args: tuple) -> None:
    if event in _LAUNCHING_EVENTS:
        _launched(f"{event}{args[:2]!r}"[:200])


def _counted(function, describe):
    @functools.wraps(function)
    def counted(*args, **kwargs):
        _launched(describe(*args)[:200])
        _STARTING.depth = getattr(_STARTING, "depth", 0) + 1
        try:
            return function(*args, **kwargs)
        finally:
            _STARTING.depth -= 1
    return counted


def _watch_launches() -> None:
    sys.addaudithook(_audit)  # (for good: an audit hook cannot be removed)
    process = multiprocessing.process.BaseProcess
    process.start = _counted(process.start, lambda self: f"multiprocessing start of {self!r}")
    multiprocessing.util.spawnv_passfds = _counted(multiprocessing.util.spawnv_passfds,
                                                   lambda path, args, passfds: f"spawnv_passfds{tuple(args)!r}")


def assert_started_nothing(since: int, what: str = "a test marked pure") -> None:
    """Fail if this process started a process since ``LAUNCHED`` held ``since`` entries."""
    started = LAUNCHED[since:]
    assert not started, f"{what} started {len(started)} process(es): {'; '.join(started)}"


def pytest_collection_finish(session):
    # Every test's check collects garbage (assert_nothing_new), and a full collection of
    # what the collected suite holds took about 0.2 s a test. What exists now is the
    # modules and the collected tests, garbage for none of them: frozen, each collection
    # looks only at what came since.
    gc.collect()
    gc.freeze()


def _entries() -> set[str]:
    found = set()
    for d in SHM_DIRS:
        try:
            found.update(f"{d}/{name}" for name in os.listdir(d))
        except FileNotFoundError:
            pass
    return found


def _held_by_our_processes() -> dict[tuple[int, int], int]:
    """(device, inode) of every file the test process and its live descendants have open
    or mapped, with the pid of one of them."""
    held = {}
    me = psutil.Process()
    for pid in [me.pid] + [p.pid for p in me.children(recursive=True)]:
        try:
            with open(f"/proc/{pid}/maps") as maps:
                for line in maps:
                    fields = line.split(maxsplit=5)
                    major, minor = fields[3].split(":")
                    held[os.makedev(int(major, 16), int(minor, 16)), int(fields[4])] = pid
            fds = os.listdir(f"/proc/{pid}/fd")
        except OSError:  # exited meanwhile, or not ours to read
            continue
        for fd in fds:
            try:
                st = os.stat(f"/proc/{pid}/fd/{fd}")
            except OSError:
                continue
            held[st.st_dev, st.st_ino] = pid
    return held


def _attributed(entries: set[str]) -> list[str]:
    """Those of ``entries`` that are ours (the module docstring's rules), each with why."""
    found, rest = [], []
    for entry in entries:
        name = os.path.basename(entry)
        if name.startswith(OURS):
            found.append(f"{entry} (a shmload name)")
        elif name.startswith("sem." + SEMPREFIX.lstrip("/") + "-"):
            found.append(f"{entry} (a multiprocessing semaphore of this test session)")
        else:
            rest.append(entry)
    held = _held_by_our_processes() if rest else {}
    for entry in rest:
        try:
            st = os.stat(entry)
        except OSError:  # gone meanwhile
            continue
        pid = held.get((st.st_dev, st.st_ino))
        if pid is not None:
            found.append(f"{entry} (open or mapped by {'the test process' if pid == os.getpid() else f'pid {pid}'})")
    return sorted(found)


def _own_segments() -> list[str]:
    """This process's mappings and descriptors of shmload segments (unlinked, so invisible
    in /dev/shm: a segment the loader forgot to close shows only here)."""
    with open("/proc/self/maps") as maps:
        found = [line.split(maxsplit=5)[-1].strip() for line in maps if NAME_PREFIX in line or MEMFD_PATH in line]
    for fd in os.listdir("/proc/self/fd"):
        try:
            target = os.readlink(f"/proc/self/fd/{fd}")
        except OSError:
            continue
        if NAME_PREFIX in target or target.startswith(MEMFD_PATH):
            found.append(f"fd {fd} -> {target}")
    return found


def _children() -> dict[int, str]:
    out = {}
    for child in psutil.Process().children(recursive=True):
        try:
            cmd = " ".join(child.cmdline())
            if child.status() == psutil.STATUS_ZOMBIE:
                cmd += " <zombie>"
        except psutil.Error:
            continue
        if not any(h in cmd for h in HELPERS):
            out[child.pid] = cmd
    return out


class Snapshot(NamedTuple):
    entries: set[str]
    children: dict[int, str]
    segments: list[str]


def snapshot() -> Snapshot:
    """What exists now: /dev/shm and /dev/mqueue entries, child processes, this process's
    segments."""
    return Snapshot(_entries(), _children(), _own_segments())


def assert_nothing_new(before: Snapshot, what: str = "test", wait: float = 5.0) -> None:
    """Fail if anything of ours appeared since ``before`` (shared-memory entries as the
    module docstring attributes them); what is on its way out gets ``wait`` seconds to go."""
    gc.collect()
    deadline = time.monotonic() + wait
    while True:
        new_children = {p: c for p, c in _children().items() if p not in before.children}
        new_entries = _attributed(_entries() - before.entries)
        new_segments = [s for s in _own_segments() if s not in before.segments]
        if not (new_children or new_entries or new_segments) or time.monotonic() > deadline:
            break
        time.sleep(0.05)
        gc.collect()
    assert not new_entries, f"{what} left shared-memory entries behind: {', '.join(new_entries)}"
    assert not new_children, f"{what} left child processes alive: {new_children}"
    assert not new_segments, f"{what} left shared memory mapped or open in this process: {new_segments}"


class NameWatch:
    """The names created in /dev/shm since the last :meth:`created` (inotify's IN_CREATE),
    or nothing where inotify is not to be had."""

    IN_CREATE = 0x100
    EVENT = struct.Struct("iIII")  # struct inotify_event: wd, mask, cookie, len (then the name)

    def __init__(self, path: str = "/dev/shm"):
        self.fd = -1
        try:
            libc = ctypes.CDLL(None, use_errno=True)
            fd = libc.inotify_init1(os.O_NONBLOCK | os.O_CLOEXEC)
            if fd >= 0 and libc.inotify_add_watch(fd, path.encode(), self.IN_CREATE) < 0:
                os.close(fd)
                fd = -1
            self.fd = fd
        except (OSError, AttributeError):
            pass

    def created(self) -> list[str]:
        names = []
        while self.fd >= 0:
            try:
                data = os.read(self.fd, 1 << 16)
            except BlockingIOError:
                break
            at = 0
            while at + self.EVENT.size <= len(data):
                _, _, _, length = self.EVENT.unpack_from(data, at)
                at += self.EVENT.size
                names.append(data[at:at + length].rstrip(b"\0").decode(errors="replace"))
                at += length
        return names


_WATCH = NameWatch()


def _own_names(names: list[str]) -> list[str]:
    """The POSIX segment names among ``names`` made by this process (``shmload-<pid>-...``)."""
    return [n for n in names if n.startswith(f"{OURS}{os.getpid()}-")]


@pytest.fixture(autouse=True)
def no_leaks(request):
    before = snapshot()
    _WATCH.created()
    launched = len(LAUNCHED)
    yield
    shown = _own_names(_WATCH.created())
    if request.node.get_closest_marker("pure") is not None:
        assert_started_nothing(launched)
    assert_nothing_new(before)
    if request.node.get_closest_marker("shm_names") is None and os.environ.get("SHMLOAD_SHM_BACKEND") != "posix":
        assert not shown, f"the default backend showed segment names in /dev/shm: {shown}"


@pytest.fixture(params=["fork"])
def start_method(request):
    """The cheap start method; tests that matter across methods use ``all_start_methods``."""
    return request.param


@pytest.fixture(params=["fork", "spawn", "forkserver"])
def all_start_methods(request):
    return request.param
