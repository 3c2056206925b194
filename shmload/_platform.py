"""Platform specifics, in one place: start methods, mmap flags, inherited descriptors.

shmload's workers need POSIX shared memory and descriptor passing over Unix sockets,
so multiprocess loading is Linux-first (macOS may work, untested); ``num_workers=0``
works everywhere.
"""

from __future__ import annotations

import mmap
import multiprocessing
import os
import sys
import threading

from .errors import ShmloadError

START_METHODS = ("fork", "spawn", "forkserver")

# No MAP_POPULATE: the pages are already allocated (posix_fallocate, see shm.py), so a
# process's first touch of a page only maps it, about 1.5 us per 4 KiB page here. That
# cost is paid once per page and process, whether up front or on first touch; paying it
# up front made the first batch wait for every process to map the whole ring (~180 ms
# for 150 MB), and made the main process map pages the consumer may never read.
MAP_FLAGS = mmap.MAP_SHARED


def check_supported() -> None:
    if not sys.platform.startswith(("linux", "darwin")):
        raise ShmloadError(
            f"shmload's worker processes need POSIX shared memory, which {sys.platform!r} does not "
            "provide; use num_workers=0 on this platform"
        )


def usable_cpus() -> set[int]:
    """The CPUs this process may run on (its affinity, which respects a cpuset)."""
    try:
        return os.sched_getaffinity(0)
    except AttributeError:
        return set(range(os.cpu_count() or 1))


def usable_cores() -> int:
    return len(usable_cpus())


def default_start_method() -> str:
    """fork where it exists (cheapest, and torch's default on Linux), spawn elsewhere."""
    return "fork" if "fork" in multiprocessing.get_all_start_methods() else "spawn"


def resolve_context(value) -> multiprocessing.context.BaseContext:
    """A multiprocessing context from a start-method name, a context object, or None."""
    if value is None:
        return multiprocessing.get_context(default_start_method())
    if isinstance(value, str):
        if value not in multiprocessing.get_all_start_methods():
            raise ValueError(
                f"multiprocessing_context={value!r} is not a start method on this platform; "
                f"expected one of {multiprocessing.get_all_start_methods()}"
            )
        return multiprocessing.get_context(value)
    if isinstance(value, multiprocessing.context.BaseContext):
        return value
    raise TypeError(
        "multiprocessing_context should be a start method name ('fork', 'spawn', 'forkserver') "
        f"or a multiprocessing context, but got {value!r}"
    )


# ---------------------------------------------------------------- parent-only descriptors
# The main process's end of each worker's socket must be held by the main process alone:
# a worker notices that the main process died by end-of-file on its socket, which only
# happens once every copy of the other end is closed. A forked child (another worker,
# another loader's worker, any os.fork() of the user's) inherits copies of every
# descriptor, so right after a fork the child points each registered descriptor at
# /dev/null. dup2 rather than close: the fd number stays valid, so a copied Connection
# object that later closes it cannot close some unrelated file that reused the number.
_parent_only: set[int] = set()
_lock = threading.Lock()


def register_parent_only(fd: int) -> None:
    with _lock:
        _parent_only.add(fd)


def unregister_parent_only(fd: int) -> None:
    with _lock:
        _parent_only.discard(fd)


def _scrub_after_fork() -> None:
    global _lock
    _lock = threading.Lock()  # the parent's lock may have been held by another thread at fork
    if not _parent_only:
        return
    devnull = os.open(os.devnull, os.O_RDWR)
    try:
        for fd in _parent_only:
            try:
                os.dup2(devnull, fd, inheritable=False)
            except OSError:
                pass
    finally:
        os.close(devnull)
    _parent_only.clear()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_scrub_after_fork)
