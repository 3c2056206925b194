"""The ring's bound: what counts against it, and where the ring stops growing. Each case
once hung or failed with memory to spare; each must now load every batch, or raise
RingFullError at once when the ring really cannot hold what a for-loop needs.

The /dev/shm cases run a script on a private tmpfs of the size in question (as root, in
a mount namespace of its own: scripts.small_shm); images of 3x224x224 bytes in batches of
64 make 9.19 MiB slots, of which a 4-worker ring wants ten.
"""

import re

import pytest

from shmload import DataLoader

from .helpers import SizedDataset
from .scripts import can_unshare, describe, run_script, small_shm

KIB = 1 << 10

IMAGES_SCRIPT = """
import os, sys, numpy as np, shmload
from tests.helpers import ImageDataset
batches, other = int(sys.argv[1]), int(sys.argv[2])

class Images(ImageDataset):
    def __getitem__(self, i):
        if i == 0 and other:  # another program takes some of /dev/shm once the loader has read its bound
            fd = os.open("/dev/shm/other", os.O_CREAT | os.O_RDWR)
            os.posix_fallocate(fd, 0, other << 20)
            os.close(fd)
        return super().__getitem__(i)

loader = shmload.DataLoader(Images(64 * batches, shape=(3, 224, 224), delay=0.001), batch_size=64,
                            num_workers=4, timeout=10)
got = 0
try:
    for batch in loader:
        assert (batch["image"][:, 0, 0, 0] == np.arange(got * 64, got * 64 + 64) % 256).all()
        got += 1
    print("finished", got)
except shmload.ShmloadError as exc:
    print("after", got, type(exc).__name__, exc)
"""

needs_unshare = pytest.mark.skipif(not can_unshare(), reason="needs root and unshare to mount a private /dev/shm")


def images(size: str, batches: int, other: int = 0) -> str:
    """Run ``batches`` batches on a /dev/shm of ``size``, of which another program takes
    ``other`` MiB once the loader has started: what the script printed."""
    result = run_script(["-c", IMAGES_SCRIPT, str(batches), str(other)], timeout=50, prefix=small_shm(size),
                        SHMLOAD_SHM_BACKEND="posix")
    assert result.returncode == 0, describe(result)
    return result.stdout


@needs_unshare
def test_a_ring_too_small_for_a_for_loop_raises_at_once_with_four_workers():
    # One slot fits, a for-loop needs two. Batch 1, split over the idle workers, could not
    # have its slot and was loaded again whole behind a later batch that waited for space,
    # which could not overtake it: next() waited for ever (LoaderTimeoutError here).
    out = images("16m", 20)
    assert re.search(r"^after [01] RingFullError the loader's ring cannot add a slot for another batch: that needs "
                     r"18\.38 MiB of shared memory, over its bound of 1[45]\.\d\d MiB \(the free space of /dev/shm",
                     out), out


@needs_unshare
@pytest.mark.parametrize("size", ["37m", "66m"])
def test_the_ring_stops_growing_at_what_dev_shm_holds(size):
    # The bound used to count the board and the control segment as free: the ring grew to
    # a size it could not reserve (SharedMemoryError before the first batch).
    assert images(size, 12) == "finished 12\n"


@needs_unshare
def test_the_ring_stops_growing_at_what_dev_shm_holds_when_others_take_some():
    # 30 of 66 MiB taken after the bound was read: the ring could not have the slots the
    # bound allowed, and a batch waiting for one raised SharedMemoryError. It asks for
    # fewer, and waits while slots can come back (NOTE [ The ring stops at what fits ]).
    assert images("66m", 12, other=30) == "finished 12\n"


@pytest.mark.parametrize("split", [None, True, False])
def test_growing_batches_run_under_a_bound_of_four_of_the_largest(split):
    # Batches of 8, 248, 488 and 728 KiB in turn. The first 728 KiB batch is slow, so the
    # batches after it are loaded into 488 KiB slots meanwhile; it then needs a larger slot
    # beside them and the one the for-loop holds. A retired segment counted in full while
    # any slot of it was busy (RingFullError "cannot grow its slots"), and a later batch
    # could take the room an earlier one needed ("cannot add a slot").
    sizes = [8 * KIB, 248 * KIB, 488 * KIB, 728 * KIB] * 6
    loader = DataLoader(SizedDataset(sizes, slow={3}, delay=0.3), batch_size=None, num_workers=2,
                        max_shm_bytes=3_000_000, split_batches=split, persistent_workers=True, timeout=20)
    with loader:
        for _ in range(2):
            assert [(int(a[0]), a.nbytes) for a in loader] == list(enumerate(sizes))
