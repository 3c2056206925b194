"""Shared fixtures. The autouse ``no_leaks`` fixture fails any test that leaves a new
entry in /dev/shm, a POSIX queue, a live child process, or a shmload segment still
mapped or open in the test process behind."""

from __future__ import annotations

import gc
import os
import time

import psutil
import pytest

SHM_DIRS = ("/dev/shm", "/dev/mqueue")
# CPython's own long-lived helpers: started by spawn/forkserver, alive until exit.
HELPERS = ("resource_tracker", "forkserver")


def _entries() -> set[str]:
    found = set()
    for d in SHM_DIRS:
        try:
            found.update(f"{d}/{name}" for name in os.listdir(d))
        except FileNotFoundError:
            pass
    return found


def _own_segments() -> list[str]:
    """This process's mappings and descriptors of shmload segments (unlinked, so invisible
    in /dev/shm: a segment the loader forgot to close shows only here)."""
    with open("/proc/self/maps") as maps:
        found = [line.split()[-2] for line in maps if "/shmload-" in line]
    for fd in os.listdir("/proc/self/fd"):
        try:
            target = os.readlink(f"/proc/self/fd/{fd}")
        except OSError:
            continue
        if "/shmload-" in target:
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


def snapshot() -> tuple:
    """What exists now: /dev/shm entries, child processes, this process's segments."""
    return _entries(), _children(), _own_segments()


def assert_nothing_new(before: tuple, what: str = "test") -> None:
    """Fail if anything appeared since ``before``; what is on its way out gets 5 s to go."""
    entries, children, segments = before
    gc.collect()
    deadline = time.monotonic() + 5.0
    while True:
        new_children = {p: c for p, c in _children().items() if p not in children}
        new_entries = _entries() - entries
        new_segments = [s for s in _own_segments() if s not in segments]
        if not (new_children or new_entries or new_segments) or time.monotonic() > deadline:
            break
        time.sleep(0.05)
        gc.collect()
    assert not new_entries, f"{what} left shared-memory entries behind: {sorted(new_entries)}"
    assert not new_children, f"{what} left child processes alive: {new_children}"
    assert not new_segments, f"{what} left shared memory mapped or open in this process: {new_segments}"


@pytest.fixture(autouse=True)
def no_leaks():
    before = snapshot()
    yield
    assert_nothing_new(before)


@pytest.fixture(params=["fork"])
def start_method(request):
    """The cheap start method; tests that matter across methods use ``all_start_methods``."""
    return request.param


@pytest.fixture(params=["fork", "spawn", "forkserver"])
def all_start_methods(request):
    return request.param
