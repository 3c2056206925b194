"""The ring under pressure: growth against the memory bound, abandoned epochs, big messages.
Each of these once hung; each must now finish or fail clearly."""

import numpy as np
import pytest

from shmload import DataLoader, RingFullError, WorkerError

from .helpers import (
    KeyedDataset,
    ListBatchSampler,
    SizedDataset,
    SlowSizesDataset,
    StringRowsDataset,
    WorkerOnlyDataset,
    ZeroSizeDataset,
)

PAGE = 4096
MIB = 1 << 20


def values(loader):
    return [int(a[0]) for a in loader]


def test_a_larger_last_batch_is_loaded_after_the_sampler_is_exhausted():
    loader = DataLoader(SizedDataset([PAGE] * 11 + [3 * PAGE]), batch_size=None, num_workers=2, timeout=20)
    assert values(loader) == list(range(12))


def test_growth_that_cannot_fit_the_bound_raises_once_waiting_cannot_help():
    # A Docker-like bound: six slots of 1 MiB fill it, then batch 20 needs 6 MiB, which fits
    # only once every other slot is free. Its request waits while earlier (slow) batches are
    # still coming, and fails once batch 20 is next: the consumer then holds batch 19.
    sizes = [MIB - PAGE] * 20 + [6 * MIB] + [MIB - PAGE] * 5
    loader = DataLoader(SizedDataset(sizes, slow=range(15, 21), delay=0.1), batch_size=None, num_workers=2,
                        max_shm_bytes=6 * MIB + MIB // 2)
    got = []
    with pytest.raises(RingFullError, match=r"cannot grow its slots .* over its bound of 6.50 MiB "
                                            r"\(max_shm_bytes\).*slot_bytes="):
        for a in loader:
            got.append(int(a[0]))
    assert got == list(range(20))


def test_growth_that_fits_beside_the_old_slots_goes_on_without_a_pause():
    # batch 6 needs larger slots; old and new segments fit under the bound together
    sizes = [PAGE] * 6 + [3 * PAGE] + [PAGE] * 6
    loader = DataLoader(SizedDataset(sizes, slow={0}, delay=0.3), batch_size=None, num_workers=2,
                        prefetch_factor=2, max_shm_bytes=6 * PAGE + 4 * 4 * PAGE, timeout=20)
    assert values(loader) == list(range(13))


def test_a_space_request_left_by_break_does_not_leak_into_later_epochs():
    sizes = [PAGE, 2 * PAGE, PAGE, PAGE]
    loader = DataLoader(SizedDataset(sizes, slow={0}, delay=0.3), batch_size=None, num_workers=2, slot_bytes=PAGE,
                        max_shm_bytes=13 * PAGE - 1, persistent_workers=True, timeout=20)
    with loader:
        for first in loader:
            break  # batch 1 may still be waiting for a larger slot
        assert values(loader) == [0, 1, 2, 3]
        assert values(loader) == [0, 1, 2, 3]
        session = loader._sessions.persistent
        assert [len(session.dispatcher.held_by(w)) for w in (0, 1)] == [0, 0]
        del first


def test_huge_batches_of_strings_do_not_deadlock_the_sockets():
    loader = DataLoader(StringRowsDataset(100_000), batch_size=50_000, num_workers=1, timeout=30)
    batches = list(loader)
    assert [b[0][-1] for b in batches] == [49_999, 99_999]
    assert batches[1][1][-1] == "row-00099999"


def test_zero_size_arrays_come_back_as_arrays():
    for workers in (0, 1):
        batch = next(iter(DataLoader(ZeroSizeDataset(4), batch_size=2, num_workers=workers)))
        assert isinstance(batch[0], np.ndarray) and batch[0].shape == (2, 0, 4) and batch[1] == ("no boxes",) * 2


def test_a_value_the_main_process_cannot_unpickle_fails_only_its_batch():
    loader = DataLoader(WorkerOnlyDataset(8), batch_size=2, num_workers=1, timeout=20)
    it = iter(loader)
    assert next(it)["x"][:, 0].tolist() == [0, 1]
    with pytest.raises(WorkerError, match=r"batch 1 from DataLoader worker process 0 could not be unpickled in the "
                                          r"main process \(ModuleNotFoundError"):
        next(it)
    assert [b["x"][:, 0].tolist() for b in it] == [[4, 5], [6, 7]]


@pytest.mark.parametrize("in_order", [True, False])
def test_a_batch_that_can_never_fit_raises_in_either_order(in_order):
    loader = DataLoader(SlowSizesDataset(8, {}, MIB), batch_size=2, num_workers=1, in_order=in_order,
                        max_shm_bytes=MIB)
    with pytest.raises(RingFullError, match=r"bound of 1.00 MiB \(max_shm_bytes\)\. It needs 4 slots"):
        list(loader)


def test_space_freed_by_another_workers_request_is_used_rather_than_failing():
    # all batches outgrow slot_bytes; the old segment empties as the other worker's
    # request gives its slot back, after which the larger slots fit
    loader = DataLoader(SlowSizesDataset(6, {}, 2 * MIB, slow=1, delay=0.3), batch_size=None, num_workers=2,
                        prefetch_factor=1, slot_bytes=MIB, max_shm_bytes=5 * MIB)
    assert sum(1 for _ in loader) == 6


def test_the_next_batchs_request_is_not_held_up_behind_a_larger_later_one():
    sizes = {0: MIB // 2, 1: 3 * MIB // 2, 2: 3 * MIB}
    loader = DataLoader(SlowSizesDataset(6, sizes, MIB // 2, slow=1, delay=0.5), batch_size=None, num_workers=2,
                        prefetch_factor=1, slot_bytes=MIB, max_shm_bytes=6 * MIB)
    assert [a.nbytes for a in loader] == [MIB // 2, 3 * MIB // 2, 3 * MIB] + [MIB // 2] * 3


def test_a_segment_announced_through_a_backlogged_socket_arrives_intact():
    # Worker 1 is busy while a 4 MiB task fills its socket; meanwhile the ring grows twice,
    # so the segment announced to it first is retired and closed before its turn comes.
    batches = [[(2 * MIB, 0, b"")], [(1024, 4.0, b"")], [(3 * MIB, 0.5, b"")], [(1024, 0, b"x" * (4 * MIB))]]
    batches += [[(1024, 0.05, b"")]] * 20
    loader = DataLoader(KeyedDataset(0), batch_sampler=ListBatchSampler(batches), num_workers=2, in_order=False,
                        slot_bytes=MIB, timeout=20)
    sizes = sorted(b.nbytes for b in loader)
    assert sizes == [1024] * 22 + [2 * MIB, 3 * MIB]
