"""Shared-memory segments, both backends: memfd never named, POSIX named for microseconds;
reserved for real; shortage explained; private to the user, and a name placed in advance
never opened. Tests of internals (``shmload._transport.shm``), and the shortage through
the loader."""

import errno
import os
import re
from pathlib import Path

import numpy as np
import pytest

import shmload
from shmload import SharedMemoryError
from shmload._transport import shm

from .conftest import _attributed, _entries
from .scripts import can_unshare, run_script, small_shm

BACKENDS = ["memfd", pytest.param("posix", marks=pytest.mark.shm_names)]


@pytest.mark.pure
@pytest.mark.parametrize("backend", BACKENDS)
def test_a_segment_has_no_name_and_is_mapped_and_writable(backend):
    before = _entries()
    seg = shm.Segment(0, 1 << 16, backend=backend)
    try:
        assert _attributed(_entries() - before) == []  # (entries of other programs do not count)
        link = os.readlink(f"/proc/self/fd/{seg.fd}")
        assert link.startswith(shm.MEMFD_PATH if backend == "memfd" else "/dev/shm" + shm.NAME_PREFIX), link
        assert oct(os.fstat(seg.fd).st_mode & 0o777) == oct(0o600)
        other = shm.AttachedSegment(os.dup(seg.fd), seg.size)  # what a worker does with the fd it receives
        other.array[100:104] = [1, 2, 3, 4]
        assert bytes(seg.mmap[100:104]) == b"\x01\x02\x03\x04"
        other.close()
    finally:
        seg.close()


@pytest.mark.pure
@pytest.mark.parametrize("backend,expected", [
    pytest.param("posix", r"\(.* are free in /dev/shm; No space left on device\)\. .*--shm-size.*shm_backend='memfd'",
                 marks=pytest.mark.shm_names),
    ("memfd", r"\(memfd segments are memory: the ring's default bound would be .*iB, half .*; No space left on "
              r"device\)\. Give the job more memory"),
])
def test_a_reservation_failure_becomes_a_clear_error(monkeypatch, backend, expected):
    def no_space(fd, offset, size):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(os, "posix_fallocate", no_space)
    with pytest.raises(SharedMemoryError, match=r"could not reserve 64.00 MiB of shared memory for the loader's ring "
                                                + expected + ".*prefetch_factor"):
        shm.Segment(0, 64 << 20, backend=backend)


@pytest.mark.pure
def test_views_outlive_closing_the_segment():
    seg = shm.Segment(0, 1 << 12)
    view = np.frombuffer(seg.mmap, np.uint8)
    view[:3] = 7
    seg.close()  # the mmap has a live export: the memory stays until the view goes
    assert view[:3].tolist() == [7, 7, 7]


@pytest.mark.pure
@pytest.mark.shm_names
def test_a_loader_reports_the_shortage_instead_of_crashing(monkeypatch):
    from shmload import DataLoader

    from .helpers import ImageDataset

    def no_space(fd, offset, size):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(os, "posix_fallocate", no_space)
    loader = DataLoader(ImageDataset(8, shape=(1 << 20,)), batch_size=4, num_workers=1)
    with pytest.raises(SharedMemoryError, match=r"could not reserve .*iB .*Give the job more memory"):
        next(iter(loader))
    loader.close()
    posix = DataLoader(ImageDataset(8, shape=(1 << 20,)), batch_size=4, num_workers=1, shm_backend="posix")
    with pytest.raises(SharedMemoryError, match=r"could not reserve .*iB .*docker run --shm-size"):
        next(iter(posix))
    posix.close()


SMALL_SHM_SCRIPT = """
import os, shmload
from tests.helpers import ImageDataset
loader = shmload.DataLoader(ImageDataset(32, shape=(3, 1024, 1024)), batch_size=4, num_workers=2)
try:
    print("finished", sum(1 for _ in loader))
except shmload.ShmloadError as exc:
    print(type(exc).__name__, exc)
"""


@pytest.mark.skipif(not can_unshare(), reason="needs root and unshare to mount a private small /dev/shm")
@pytest.mark.parametrize("backend,size,expected", [
    # the bound: what is free once the loader's own segments exist
    ("posix", "16m", r"RingFullError .*bound of 1[45]\.\d\d MiB \(the free space of /dev/shm.*--shm-size"),
    ("posix", "25m", r"finished 8"),
    ("memfd", "16m", r"finished 8"),  # memfd segments are not in /dev/shm
])
def test_a_small_dev_shm_gives_a_clear_error_or_a_smaller_ring_never_sigbus(backend, size, expected):
    result = run_script(["-c", SMALL_SHM_SCRIPT], timeout=60, prefix=small_shm(size), SHMLOAD_SHM_BACKEND=backend)
    assert result.returncode == 0, result.stderr  # a SIGBUS would be -7 (135 from the shell)
    assert re.search(expected, result.stdout), result.stdout + result.stderr


@pytest.mark.pure
@pytest.mark.parametrize("backend", BACKENDS)
def test_a_released_range_goes_back_to_memory_for_every_mapping(backend):
    # what the ring does with a retired slot nobody uses (NOTE [ What counts against the bound ])
    page = shm.mmap.PAGESIZE
    seg = shm.Segment(0, 4 * page, backend=backend)
    try:
        other = shm.AttachedSegment(os.dup(seg.fd), seg.size)  # a worker's mapping
        other.array[:] = 1
        blocks = os.fstat(seg.fd).st_blocks
        assert seg.releases and seg.release(page, 2 * page)
        assert os.fstat(seg.fd).st_blocks < blocks  # the pages left the file
        assert other.array[page:3 * page].max() == 0 and other.array[:page].min() == 1
        assert bytes(seg.mmap[3 * page:3 * page + 4]) == b"\x01" * 4
        other.close()
    finally:
        seg.close()
    assert not seg.release(0, page)  # closed: nothing to give back


# ---------------------------------------------------------------- security
@pytest.mark.pure
def test_segments_are_private_to_the_user_and_never_named_while_in_use():
    seg = shmload._transport.shm.Segment(0, 1 << 16)
    try:
        st = os.fstat(seg.fd)
        assert st.st_mode & 0o777 == 0o600 and st.st_uid == os.getuid()
        assert st.st_nlink == 0  # unlinked: no name another process could open
    finally:
        seg.close()


@pytest.mark.pure
def test_a_pre_created_name_is_never_opened(monkeypatch):
    """Names are random (96 bits) and created with O_EXCL: a file an attacker placed under
    the name shmload draws is skipped, not opened, and left untouched."""
    names = iter(["a" * 24, "b" * 24])
    monkeypatch.setattr(shmload._transport.shm.secrets, "token_hex", lambda n: next(names))
    squatted = Path("/dev/shm/shmload-" + "a" * 24)
    squatted.write_bytes(b"attacker data")
    os.chmod(squatted, 0o666)
    try:
        seg = shmload._transport.shm.Segment(0, 1 << 12)
        try:
            assert os.fstat(seg.fd).st_ino != squatted.stat().st_ino
            assert bytes(seg.mmap[:13]) == bytes(13)
        finally:
            seg.close()
        assert squatted.read_bytes() == b"attacker data"
    finally:
        squatted.unlink()
