"""Shared fixtures. The autouse ``no_leaks`` fixture fails any test that leaves a new
entry in /dev/shm, a POSIX queue, or a live child process behind."""

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


@pytest.fixture(autouse=True)
def no_leaks():
    entries, children = _entries(), _children()
    yield
    gc.collect()
    deadline = time.monotonic() + 5.0
    while True:
        new_children = {p: c for p, c in _children().items() if p not in children}
        new_entries = _entries() - entries
        if not (new_children or new_entries) or time.monotonic() > deadline:
            break
        time.sleep(0.05)
        gc.collect()
    assert not new_entries, f"test left shared-memory entries behind: {sorted(new_entries)}"
    assert not new_children, f"test left child processes alive: {new_children}"


@pytest.fixture(params=["fork"])
def start_method(request):
    """The cheap start method; tests that matter across methods use ``all_start_methods``."""
    return request.param


@pytest.fixture(params=["fork", "spawn", "forkserver"])
def all_start_methods(request):
    return request.param
