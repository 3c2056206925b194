"""Shared-memory segments: created, reserved, mapped, and never left behind.

Life of a segment (main process)::

    shm_open(O_CREAT | O_EXCL, 0600, "/shmload-<96 random bits>")
    shm_unlink(name)              # at once: from here on the segment has no name
    posix_fallocate(fd, 0, size)  # reserve the pages for real (see below)
    mmap(fd, MAP_SHARED)           # pages mapped on first touch (see _platform.MAP_FLAGS)
    ...fd sent to each worker over its Unix socket (SCM_RIGHTS)...

Why unlink before anyone else attaches: the name exists for a few microseconds inside
one function of one process, so no crash of any process, not even SIGKILL, can leave an
entry in /dev/shm. Workers receive the descriptor itself instead of the name, which
works the same under fork, spawn and forkserver, and for segments created after the
workers started (ring growth).

Why ``posix_fallocate``: on tmpfs, ``ftruncate`` only promises space; the first touch
of a page when /dev/shm is full kills the process with SIGBUS. Reserving up front turns
a shortage into a :class:`SharedMemoryError` at a well-defined moment, with advice.

Memory is freed when the last mapping goes: the main process's views of a retired
segment keep it alive exactly as long as the user holds them. Before that, the ring gives
back the pages of a retired segment's free slots (:meth:`Segment.release`; NOTE [ What
counts against the bound ] in ring.py).
"""

from __future__ import annotations

import errno
import mmap
import os
import secrets
import weakref

import numpy as np

from ._platform import MAP_FLAGS, limit_text, signals_blocked, signals_deferred, too_many_files
from .errors import SharedMemoryError, format_bytes
from .pinning import Pinner, PinnedRegion

SHM_DIR = "/dev/shm"
NAME_PREFIX = "/shmload-"


def shm_free_bytes() -> int | None:
    try:
        st = os.statvfs(SHM_DIR)
    except OSError:
        return None
    return st.f_bavail * st.f_frsize


def default_max_shm_bytes() -> tuple[int, str]:
    """The free space of /dev/shm, at most half the machine's memory, and where it came from."""
    half_ram = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") // 2
    free = shm_free_bytes()
    if free is not None and free < half_ram:
        return free, "the free space of /dev/shm when the workers started"
    return half_ram, "half of this machine's memory"


def _shortage(size: int, cause: OSError) -> SharedMemoryError:
    free = shm_free_bytes()
    free_text = f"{format_bytes(free)} are free" if free is not None else f"{SHM_DIR} is not available"
    return SharedMemoryError(
        f"could not reserve {format_bytes(size)} of shared memory for the loader's ring "
        f"({free_text} in {SHM_DIR}; {cause.strerror or cause}). Give the container more shared "
        "memory (docker run --shm-size=..., or a larger /dev/shm), or make the ring smaller: "
        "lower prefetch_factor, batch_size or num_workers, or set max_shm_bytes."
    )


def _open_unlinked() -> int:
    """A descriptor of a new POSIX segment whose name is already gone. The name lives from
    shm_open to shm_unlink: no signal acts there, not even one whose default action ends
    the process (NOTE [ Interrupts wait for a window ], _platform.py)."""
    import posix_ipc

    for _ in range(8):
        name = NAME_PREFIX + secrets.token_hex(12)
        with signals_blocked():
            try:
                shm = posix_ipc.SharedMemory(name, posix_ipc.O_CREX, mode=0o600, size=0)
            except posix_ipc.ExistentialError:
                continue  # 96 random bits collided: astronomically unlikely, but try another
            except (posix_ipc.Error, OSError) as exc:
                if getattr(exc, "errno", None) in (errno.EMFILE, errno.ENFILE) or "Too many open files" in str(exc):
                    raise too_many_files(exc) from None
                raise SharedMemoryError(f"could not create shared memory in {SHM_DIR}: {exc}") from exc
            try:
                shm.unlink()
                return os.dup(shm.fd)
            except OSError as exc:
                if exc.errno in (errno.EMFILE, errno.ENFILE):
                    raise too_many_files(exc) from None
                raise
            finally:
                shm.close_fd()
    raise SharedMemoryError("could not find an unused shared-memory name")


def _create_anonymous(size: int) -> int:
    """A descriptor for ``size`` reserved bytes of POSIX shared memory, already unlinked."""
    fd = _open_unlinked()
    try:
        reserve(fd, size)
    except BaseException:
        os.close(fd)
        raise
    return fd


def _map(fd: int, size: int) -> mmap.mmap:
    try:
        return mmap.mmap(fd, size, flags=MAP_FLAGS)
    except OSError as exc:
        if exc.errno != errno.ENOMEM:
            raise
        limit = limit_text("AS", format_bytes)
        raise SharedMemoryError(
            f"could not map {format_bytes(size)} of shared memory into this process ({exc.strerror}): its "
            f"address space is full or limited (ulimit -v: {limit}). Raise the limit (ulimit -v unlimited, or "
            "the cluster's memory request), or make the ring smaller: lower prefetch_factor, batch_size or "
            "num_workers, or set max_shm_bytes.") from None


def reserve(fd: int, size: int) -> None:
    try:
        os.posix_fallocate(fd, 0, size)
    except OSError as exc:
        if exc.errno in (errno.ENOSPC, errno.ENOMEM, errno.EFBIG):
            raise _shortage(size, exc) from exc
        raise SharedMemoryError(f"could not reserve {size} bytes of shared memory: {exc}") from exc


class Segment:
    """One shared-memory segment owned by the main process; page-locked for the
    accelerator when a ``pinner`` is given (pinning.py)."""

    def __init__(self, segment_id: int, size: int, pinner: Pinner | None = None):
        self.id = segment_id
        self.size = size
        self.fd = -1
        self._pinned: PinnedRegion | None = None
        self.releases = False  # can release() give pages back? (not page-locked ones)
        # From shm_open to the last attribute set, a Ctrl-C would leave a name in /dev/shm
        # or a descriptor no object owns: it waits (NOTE [ Interrupts wait for a window ]).
        try:
            with signals_deferred():
                fd = _create_anonymous(size)
                try:
                    self.mmap = _map(fd, size)
                    if pinner is not None:
                        try:
                            self._pinned = PinnedRegion(self.mmap, pinner)
                        except BaseException:
                            self.mmap.close()
                            raise
                except BaseException:
                    os.close(fd)
                    raise
                self.fd = fd
                self.releases = self._pinned is None and hasattr(mmap, "MADV_REMOVE")
                # a segment dropped without close() (a Ctrl-C between its creation and its
                # owner's bookkeeping) still gives its descriptor back
                self._fd_closer = weakref.finalize(self, os.close, fd)
        except BaseException:  # (an interrupt handed on as the window closed: the segment is whole)
            if self.fd >= 0:
                self.close()
            raise

    @property
    def pinned(self) -> bool:
        return self._pinned is not None

    def window(self, offset: int, count: int) -> np.ndarray:
        """A uint8 array over ``count`` bytes at ``offset``, whose ``.base`` is not an
        ndarray, so that views of it collapse onto it (see lifetime.py)."""
        if self._pinned is not None:
            return self._pinned.window(offset, count)
        return np.frombuffer(self.mmap, dtype=np.uint8, count=count, offset=offset)

    def release(self, offset: int, nbytes: int) -> bool:
        """Give ``nbytes`` at ``offset`` back to /dev/shm (a retired slot nobody uses): the
        pages leave the tmpfs file, and so every process's mapping of them, and read as
        zeros if touched again. False if they could not be (they stay until close())."""
        if not self.releases or self.fd < 0:
            return False
        try:
            self.mmap.madvise(mmap.MADV_REMOVE, offset, nbytes)
        except (OSError, ValueError):
            return False
        return True

    def close(self) -> None:
        """Give up the main process's own hold. Views the user still holds keep the memory
        valid (an mmap with live exports cannot be closed, and need not be)."""
        if self.fd >= 0:
            self.fd = -1
            self._fd_closer()
        if self._pinned is not None:
            # NOTE [ Unregister before unmap ] (pinning.py): the region unregisters and
            # unmaps once this and the last window over it are gone
            self._pinned = None
            return
        try:
            self.mmap.close()
        except BufferError:
            pass  # the user still holds views; the memory goes when they do


class AttachedSegment:
    """A worker's mapping of a segment, from the descriptor the main process sent."""

    def __init__(self, fd: int, size: int):
        try:
            self.mmap = mmap.mmap(fd, size, flags=MAP_FLAGS)
        finally:
            os.close(fd)
        self.array = np.frombuffer(self.mmap, dtype=np.uint8)

    def close(self) -> None:
        del self.array
        self.mmap.close()
