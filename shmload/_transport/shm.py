"""Shared-memory segments: created, reserved, mapped, and never left behind.

Two backends make a segment; everything after its creation is the same:

* ``memfd`` (the default where the kernel has it, Linux 3.17): ``memfd_create`` makes
  memory that never has a name. Nothing appears in /dev/shm, ever, so no crash or
  interrupt can leave an entry there, and the size of /dev/shm (64 MB in Docker's and
  Kubernetes' default) does not bound the ring: memory does (limits.py).
* ``posix``: ``shm_open`` in /dev/shm, unlinked at once (posix-ipc), for kernels without
  memfd and for anyone who wants it. The name lives from shm_open to shm_unlink, a few
  microseconds inside one function of one process, with every signal blocked: no crash
  of any process, not even SIGKILL, can leave the entry. /dev/shm bounds the ring.

Life of a segment (main process)::

    memfd_create("shmload", MFD_CLOEXEC)    # or shm_open + shm_unlink (posix)
    posix_fallocate(fd, 0, size)           # reserve the pages for real (see below)
    mmap(fd, MAP_SHARED)                   # pages mapped on first touch (see _platform.MAP_FLAGS)
    ...fd sent to each worker over its Unix socket (SCM_RIGHTS)...

Workers receive the descriptor itself, never a name, which works the same under fork,
spawn and forkserver, for both backends, and for segments created after the workers
started (ring growth).

Why ``posix_fallocate``: on tmpfs (memfd is tmpfs too), ``ftruncate`` only promises
space; the first touch of a page that cannot be had kills the process with SIGBUS.
Reserving up front turns a shortage into a :class:`SharedMemoryError` at a well-defined
moment, with advice, before any page is touched.

Memory is freed when the last mapping and descriptor go: the main process's views of a
retired segment keep it alive exactly as long as the user holds them. Before that, the
ring gives back the pages of a retired segment's free slots (:meth:`Segment.release`;
NOTE [ What counts against the bound ] in ring.py).
"""

from __future__ import annotations

import errno
import mmap
import os
import secrets
import weakref

import numpy as np

from .._core._platform import MAP_FLAGS, limit_text, too_many_files
from .._core._signals import signals_blocked, signals_deferred
from .._core._units import binary_size
from ..errors import SharedMemoryError
from . import limits
from .pinning import PinnedRegion, Pinner

SHM_DIR = limits.SHM_DIR
NAME_PREFIX = "/shmload-"  # posix: "/shmload-<pid>-<96 random bits>", the library's only names
MEMFD_NAME = "shmload"  # memfd: shown as "/memfd:shmload (deleted)" in /proc/<pid>/fd and maps
MEMFD_PATH = "/memfd:" + MEMFD_NAME
BACKENDS = ("memfd", "posix")
_BYTE = np.dtype(np.uint8)  # a window's dtype (window())
BACKEND_ENV = "SHMLOAD_SHM_BACKEND"  # the default backend for loaders given shm_backend=None


_memfd: bool | None = None  # memfd_supported()'s answer, once the kernel has given one


def memfd_supported() -> bool:
    """Can this process make memfd segments (os.memfd_create, and a kernel that has it)?
    Only the kernel's "no such call" (or a sandbox's refusal) is an answer kept for good;
    a passing failure (out of descriptors) is for the segment's own creation to report."""
    global _memfd
    if _memfd is None:
        if not hasattr(os, "memfd_create"):
            _memfd = False
            return False
        try:
            with signals_deferred():  # (a handler's exception between the two calls would leak the fd)
                os.close(os.memfd_create(MEMFD_NAME, os.MFD_CLOEXEC))
        except OSError as exc:
            if exc.errno in (errno.ENOSYS, errno.EPERM, errno.EINVAL):
                _memfd = False
            return False if _memfd is False else True
        _memfd = True
    return _memfd


def resolve_backend(requested: str | None) -> str:
    """The backend a loader uses: ``requested``, else $SHMLOAD_SHM_BACKEND, else memfd
    where this kernel has it and posix where not."""
    source = "shm_backend"
    if requested is None:
        requested, source = os.environ.get(BACKEND_ENV) or None, f"${BACKEND_ENV}"
        if requested is None:
            return "memfd" if memfd_supported() else "posix"
    if requested not in BACKENDS:
        raise ValueError(f"{source} should be 'memfd' or 'posix' (or unset: memfd where the kernel has it), "
                         f"but got {requested!r}")
    if requested == "memfd" and not memfd_supported():
        raise SharedMemoryError(f"{source}='memfd', but this system cannot make memfd segments "
                                "(os.memfd_create is missing, or the kernel refused it: it needs Linux 3.17 or later, "
                                "and a sandbox may forbid it): use shm_backend='posix'")
    return requested


def _shortage(size: int, cause: OSError, backend: str) -> SharedMemoryError:
    if backend == "posix":
        free = limits.shm_free(SHM_DIR)
        where = f"{binary_size(free)} are free" if free is not None else f"{SHM_DIR} is not available"
        where += f" in {SHM_DIR}"
        remedy = ("Give the container more shared memory (docker run --shm-size=..., or a larger /dev/shm), "
                  "use shm_backend='memfd' (not bounded by /dev/shm)")
    else:
        bound = limits.default_bound(backend)
        where = f"memfd segments are memory: the ring's default bound would be {binary_size(bound.bytes)}, " \
                f"{bound.source}"
        remedy = f"Give the job more memory ({bound.remedy})"
    return SharedMemoryError(
        f"could not reserve {binary_size(size)} of shared memory for the loader's ring "
        f"({where}; {cause.strerror or cause}). {remedy}, or make the ring smaller: "
        "lower prefetch_factor, batch_size or num_workers, or set max_shm_bytes."
    )


def _creation_failed(exc: BaseException, what: str) -> BaseException:
    if getattr(exc, "errno", None) in (errno.EMFILE, errno.ENFILE) or "Too many open files" in str(exc):
        return too_many_files(exc)
    return SharedMemoryError(f"could not create shared memory ({what}): {exc}")


def _open_memfd() -> int:
    """A descriptor of a new memfd segment: it never has a name."""
    try:
        fd = os.memfd_create(MEMFD_NAME, os.MFD_CLOEXEC)
    except OSError as exc:
        raise _creation_failed(exc, "memfd_create") from None
    try:
        os.fchmod(fd, 0o600)  # (as the POSIX backend's: only through /proc/<pid>/fd, by its owner)
    except BaseException:
        os.close(fd)
        raise
    return fd


def _open_posix() -> int:
    """A descriptor of a new POSIX segment whose name is already gone. The name lives from
    shm_open to shm_unlink: no signal acts there, not even one whose default action ends
    the process (NOTE [ Interrupts wait for a window ], _signals.py)."""
    import posix_ipc

    for _ in range(8):
        name = f"{NAME_PREFIX}{os.getpid()}-{secrets.token_hex(12)}"
        with signals_blocked():
            try:
                shm = posix_ipc.SharedMemory(name, posix_ipc.O_CREX, mode=0o600, size=0)
            except posix_ipc.ExistentialError:
                continue  # 96 random bits collided: astronomically unlikely, but try another
            except (posix_ipc.Error, OSError) as exc:
                raise _creation_failed(exc, f"shm_open in {SHM_DIR}") from None
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


def _check_room(size: int) -> None:
    """NOTE [ Check the room before reserving ] (limits.py)."""
    short = limits.shortage(size)
    if short is not None:
        raise SharedMemoryError(
            f"could not reserve {binary_size(size)} of shared memory for the loader's ring: only "
            f"{binary_size(short.bytes)} are left under {short.source}. Reserving more would {short.harm}. "
            f"{short.remedy[0].upper() + short.remedy[1:]}, or make the ring smaller: lower "
            "prefetch_factor, batch_size or num_workers, or set max_shm_bytes.")


def _create_anonymous(size: int, backend: str) -> int:
    """A descriptor for ``size`` reserved bytes of shared memory that has no name."""
    _check_room(size)
    fd = _open_memfd() if backend == "memfd" else _open_posix()
    try:
        reserve(fd, size, backend)
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
        limit = limit_text("AS", binary_size)
        raise SharedMemoryError(
            f"could not map {binary_size(size)} of shared memory into this process ({exc.strerror}): its "
            f"address space is full or limited (ulimit -v: {limit}). Raise the limit (ulimit -v unlimited, or "
            "the cluster's memory request), or make the ring smaller: lower prefetch_factor, batch_size or "
            "num_workers, or set max_shm_bytes.") from None


def reserve(fd: int, size: int, backend: str) -> None:
    try:
        os.posix_fallocate(fd, 0, size)
    except OSError as exc:
        if exc.errno in (errno.ENOSPC, errno.ENOMEM, errno.EFBIG):
            raise _shortage(size, exc, backend) from exc
        raise SharedMemoryError(f"could not reserve {size} bytes of shared memory: {exc}") from exc


class Segment:
    """One shared-memory segment owned by the main process; page-locked for the
    accelerator when a ``pinner`` is given (pinning.py)."""

    def __init__(self, segment_id: int, size: int, pinner: Pinner | None = None, backend: str = "memfd"):
        self.id = segment_id
        self.size = size
        self.backend = backend
        self.fd = -1
        self._pinned: PinnedRegion | None = None
        self.releases = False  # can release() give pages back? (not page-locked ones)
        # From creation to the last attribute set, an interrupt would leave a descriptor
        # no object owns: it waits (NOTE [ Interrupts wait for a window ]).
        try:
            with signals_deferred():
                fd = _create_anonymous(size, backend)
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
        return np.frombuffer(self.mmap, _BYTE, count, offset)  # (positional: keywords cost ~1 us a batch)

    def release(self, offset: int, nbytes: int) -> bool:
        """Give ``nbytes`` at ``offset`` back to memory (a retired slot nobody uses): the
        pages leave the (tmpfs or memfd) file, and so every process's mapping of them, and read as
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
