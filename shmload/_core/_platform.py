"""Platform specifics, in one place: start methods, mmap flags, inherited descriptors.

shmload's workers are Linux only: besides POSIX shared memory and descriptor passing
over Unix sockets they use ``posix_fallocate`` on shared memory (shm.py), ``POLLRDHUP``
to notice a dead main process (worker.py) and pidfds to notice a dead worker (below),
none of which macOS has. So ``num_workers > 0`` is refused elsewhere, with a clear
message (:func:`check_supported`); ``num_workers=0`` works everywhere.
"""

from __future__ import annotations

import contextlib
import errno
import mmap
import multiprocessing
import os
import sys
import threading
import weakref
from typing import Any, Callable, Iterator

from ..errors import ShmloadError

# No MAP_POPULATE: the pages are already allocated (posix_fallocate, see shm.py), so a
# process's first touch of a page only maps it, about 1.5 us per 4 KiB page. That cost
# is paid once per page and process, whether up front or on first touch; paying it up
# front made the first batch wait for every process to map the whole ring (for a 150 MB
# ring, 114 ms to create plus ~68 ms per process to map: docs/performance.md), and made
# the main process map pages the consumer may never read.
MAP_FLAGS = mmap.MAP_SHARED


def check_supported(num_workers: int) -> None:
    """Refuse worker processes off Linux (see the module's docstring for why)."""
    if num_workers > 0 and not sys.platform.startswith("linux"):
        raise ShmloadError(
            f"num_workers={num_workers}: shmload's worker processes run on Linux only (they use POSIX shared "
            f"memory with posix_fallocate, POLLRDHUP and pidfds), and this is {sys.platform!r}. Use "
            "num_workers=0 here, or torch.utils.data.DataLoader for worker processes on this platform")


def owned_here(pid: int) -> bool:
    """False in a forked child that inherited a copy of the main process's objects."""
    return os.getpid() == pid


def usable_cpus() -> set[int]:
    """The CPUs this process may run on (its affinity, which respects a cpuset)."""
    try:
        return os.sched_getaffinity(0)
    except AttributeError:
        return set(range(os.cpu_count() or 1))


def cpu_count() -> int | None:
    """torch's count of the CPUs this process may use (``torch._utils.cpu_count``): its
    affinity where ``os.sched_getaffinity`` exists, else ``os.cpu_count()`` (None if unknown)."""
    if hasattr(os, "sched_getaffinity"):
        return len(os.sched_getaffinity(0))
    return os.cpu_count()


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


# ---------------------------------------------------------------- resource limits
def limit_text(name: str, unit: Callable[[int], str] = str) -> str:
    """The soft and hard limit ``resource.RLIMIT_<name>``, for an error message."""
    try:
        import resource
        soft, hard = resource.getrlimit(getattr(resource, f"RLIMIT_{name}"))
    except (ImportError, AttributeError, OSError, ValueError):
        return "unknown"

    def show(value: int) -> str:
        return "unlimited" if value == resource.RLIM_INFINITY else unit(value)
    return f"{show(soft)} (hard limit {show(hard)})"


def too_many_files(exc: BaseException) -> ShmloadError:
    """The error for EMFILE/ENFILE: which limit, and what to do."""
    limit = limit_text("NOFILE")
    return ShmloadError(
        f"this process has run out of file descriptors ({exc}); its limit (ulimit -n) is {limit}. The loader "
        "holds one per shared-memory segment and a few per worker. Raise the limit (ulimit -n 65536, or "
        "resource.setrlimit(resource.RLIMIT_NOFILE, ...) up to the hard limit), or use fewer workers.")


@contextlib.contextmanager
def fd_limit_named() -> Iterator[None]:
    """Turn EMFILE/ENFILE into :func:`too_many_files`'s error."""
    try:
        yield
    except OSError as exc:
        if exc.errno in (errno.EMFILE, errno.ENFILE):
            raise too_many_files(exc) from None
        raise


def check_can_start_children() -> None:
    """A daemonic process (a worker of another loader) may not have children: say so."""
    if multiprocessing.current_process().daemon:
        raise ShmloadError(
            "this loader cannot start worker processes: it runs inside a daemonic process (for example "
            "a worker of another loader), which may not have children. Use num_workers=0 for a loader "
            "created inside a dataset.")


# ---------------------------------------------------------------- noticing a worker's death
# multiprocessing's sentinel is a pipe whose write end the child holds, so it reports the
# child's exit only once every copy of that end is closed: a helper process the dataset
# forked (and that outlives the worker, killed by the OOM killer, say) keeps it open, and
# the main process would wait for ever. A pidfd (Linux 5.3) becomes readable when the
# process itself exits, whoever holds what.
def death_watch(process: Any) -> int:
    """A descriptor that becomes readable when ``process`` exits: a pidfd where the
    kernel has them, else multiprocessing's sentinel."""
    pidfd_open = getattr(os, "pidfd_open", None)
    if pidfd_open is not None:
        try:
            fd = pidfd_open(process.pid)
        except OSError:  # an old kernel, or a seccomp filter (some containers) refuses it
            pass
        else:
            os.set_inheritable(fd, False)
            return fd
    return process.sentinel


# ---------------------------------------------------------------- parent-only descriptors
# The main process's end of each worker's socket must be held by the main process alone:
# a worker notices that the main process died by end-of-file on its socket, which only
# happens once every copy of the other end is closed. A forked child (another worker,
# another loader's worker, any os.fork() of the user's) inherits copies of every
# descriptor, so right after a fork the child points each registered descriptor at
# /dev/null. dup2 rather than close: the fd number stays valid, so a copied Connection
# object that later closes it cannot close some unrelated file that reused the number.
#
# The same holds for the worker processes themselves: multiprocessing records every
# started child in a module-level set, and at interpreter exit SIGTERMs the daemonic ones
# it still believes alive. A raw os.fork() copies that set, and a waitpid() on another
# process's child fails, which multiprocessing reads as "still running": a forked child
# that simply exits would kill the parent's workers. So the child forgets them too.
_parent_only: set[int] = set()
_parent_only_processes: weakref.WeakSet = weakref.WeakSet()
_lock = threading.Lock()


def register_parent_only(fd: int) -> None:
    with _lock:
        _parent_only.add(fd)


def unregister_parent_only(fd: int) -> None:
    with _lock:
        _parent_only.discard(fd)


def register_parent_only_process(process: Any) -> None:
    """A worker that a forked child must not consider its own (see above)."""
    with _lock:
        _parent_only_processes.add(process)


def _scrub_after_fork() -> None:
    global _lock
    _lock = threading.Lock()  # the parent's lock may have been held by another thread at fork
    children = getattr(multiprocessing.process, "_children", None)
    if isinstance(children, set):
        for process in list(_parent_only_processes):
            children.discard(process)
    _parent_only_processes.clear()
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
