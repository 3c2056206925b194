"""Shared-memory segments: never named for long, reserved for real, shortage explained."""

import errno
import os

import numpy as np
import pytest

from shmload import SharedMemoryError
from shmload import shm


def test_a_segment_has_no_name_and_is_mapped_and_writable():
    before = set(os.listdir("/dev/shm"))
    seg = shm.Segment(0, 1 << 16)
    try:
        assert set(os.listdir("/dev/shm")) == before
        assert oct(os.fstat(seg.fd).st_mode & 0o777) == oct(0o600)
        other = shm.AttachedSegment(os.dup(seg.fd), seg.size)  # what a worker does with the fd it receives
        other.array[100:104] = [1, 2, 3, 4]
        assert bytes(seg.mmap[100:104]) == b"\x01\x02\x03\x04"
        other.close()
    finally:
        seg.close()


def test_a_reservation_failure_becomes_a_clear_error(monkeypatch):
    def no_space(fd, offset, size):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(os, "posix_fallocate", no_space)
    with pytest.raises(SharedMemoryError, match=r"could not reserve 64.00 MiB of shared memory for the loader's ring "
                                                r"\(.* are free in /dev/shm.*--shm-size.*prefetch_factor"):
        shm.Segment(0, 64 << 20)


def test_views_outlive_closing_the_segment():
    seg = shm.Segment(0, 1 << 12)
    view = np.frombuffer(seg.mmap, np.uint8)
    view[:3] = 7
    seg.close()  # the mmap has a live export: the memory stays until the view goes
    assert view[:3].tolist() == [7, 7, 7]


def test_a_loader_reports_the_shortage_instead_of_crashing(monkeypatch):
    from shmload import DataLoader

    from .helpers import ImageDataset

    def no_space(fd, offset, size):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(os, "posix_fallocate", no_space)
    loader = DataLoader(ImageDataset(8, shape=(1 << 20,)), batch_size=4, num_workers=1)
    with pytest.raises(SharedMemoryError, match=r"could not reserve .*iB .*docker run --shm-size"):
        next(iter(loader))
    loader.close()
