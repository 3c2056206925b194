"""Zero copy is safe: data never changes under a held view, held batches grow the ring.
One test counts the dispatcher's assignments (``shmload._session.dispatch``), on
purpose."""

import gc

import numpy as np
import pytest

from shmload import DataLoader, RingFullError

from .helpers import ImageDataset, RangeDataset, SlowDataset, VariableDataset


def test_data_never_changes_under_held_views():
    ds = ImageDataset(64, shape=(4, 256))
    loader = DataLoader(ds, batch_size=2, num_workers=2, prefetch_factor=2)
    held = list(loader)  # 32 batches held at once; the ring starts with 2*2+2 slots
    assert len(held) == 32
    for k, batch in enumerate(held):
        assert batch["label"].tolist() == [2 * k, 2 * k + 1]
        assert (batch["image"][0] == (2 * k) % 256).all() and (batch["image"][1] == (2 * k + 1) % 256).all()


def test_views_share_one_slot_and_stay_valid_after_the_loader_is_closed():
    loader = DataLoader(ImageDataset(8), batch_size=4, num_workers=1)
    batch = next(iter(loader))
    image, label = batch["image"], batch["label"]
    assert image.base is label.base  # one owner per batch
    assert image.flags.writeable
    loader.close()
    del batch
    gc.collect()
    assert image[3, 0, 0, 0] == 3 and label.tolist() == [0, 1, 2, 3]


@pytest.mark.parametrize("prefetch_factor, depth", [(2, 2), (None, 64)])  # None: small batches go deep
def test_a_for_loop_reuses_the_ring_without_growing_it(prefetch_factor, depth):
    # 500 batches of ~4 KiB: more than the 2 * 64 in flight at the automatic depth
    loader = DataLoader(ImageDataset(2000, shape=(1024,)), batch_size=4, num_workers=2, persistent_workers=True,
                        prefetch_factor=prefetch_factor)
    with loader:
        for batch in loader:
            assert batch["image"][:, 0].tolist() == (batch["label"] % 256).tolist()
        session = loader._sessions.persistent
        per_worker = session.dispatcher.per_worker
        slots, nbytes, slot_bytes = session.ring.num_slots, session.ring.nbytes, session.ring.slot_bytes
    # the ring holds the batches in flight, 2 * depth by bytes (the pace may retune the
    # depth lower: dispatch.DEPTH_SECONDS), + the one the loop holds; the target allows
    # one more held, never more
    assert 2 <= per_worker <= depth and (prefetch_factor is not None or per_worker > 2)
    assert 2 * per_worker + 1 <= slots <= 2 * depth + 2 and nbytes == slots * slot_bytes


def test_small_batches_slow_to_load_keep_torchs_depth(monkeypatch):
    # ~10 ms per batch of one int: the bytes rule alone would queue 64 per worker, which a
    # break leaves behind for persistent workers to load (dispatch.DEPTH_SECONDS)
    from shmload._session.dispatch import Dispatcher
    held, assign = [], Dispatcher.assign

    def counted(self, wid, key, task):
        assign(self, wid, key, task)
        held.append(len(self._tasks[wid]))

    monkeypatch.setattr(Dispatcher, "assign", counted)
    loader = DataLoader(SlowDataset(40, 0.01), batch_size=1, num_workers=2, persistent_workers=True, timeout=60)
    with loader:
        for epoch in range(2):
            assert [int(b[0]) for b in loader] == list(range(40))
        session = loader._sessions.persistent
        assert session.dispatcher.completed == 80 and session.dispatcher.per_worker == 2
    assert len(held) >= 80 and max(held) == 2  # at no time more than torch's 2 per worker (assign also re-records a task given a slot)


def test_a_derived_view_keeps_the_slot_held():
    loader = DataLoader(ImageDataset(40, shape=(64,)), batch_size=1, num_workers=1, prefetch_factor=1,
                        persistent_workers=True)
    with loader:
        it = iter(loader)
        first = next(it)["image"][0, ::2]  # a view of a view; the batch dict is gone
        rest = [b["image"][0, 0] for b in it]  # keep only scalars: slots can be reused
        assert (first == 0).all()
        assert rest == [i % 256 for i in range(1, 40)]
        assert loader._sessions.persistent.ring.num_slots == 3  # never needed to grow


def test_holding_past_the_bound_raises_a_clear_error():
    page = 4096
    loader = DataLoader(ImageDataset(40, shape=(page,)), batch_size=1, num_workers=1, prefetch_factor=1,
                        max_shm_bytes=8 * page)
    held = []
    with pytest.raises(RingFullError, match=r"bound of 32.0 KiB \(max_shm_bytes\)\. It has \d+ slots of 8.0 KiB\. The consumer holds \d+ "
                                           r"batches .*copy batches you keep"):
        for batch in loader:
            held.append(batch)
    assert 4 <= len(held) <= 8
    assert [b["label"][0] for b in held] == list(range(len(held)))
    del held, batch
    loader.close()


def test_variable_size_batches_grow_the_slots_and_lose_nothing(start_method):
    ds = VariableDataset(60, scale=3000)
    loader = DataLoader(ds, batch_size=None, num_workers=2, multiprocessing_context=start_method,
                        persistent_workers=True)
    with loader:
        got = [(a.shape[0], int(a[0])) for a in loader]
        ring = loader._sessions.persistent.ring
        assert ring.slot_bytes >= 7 * 3000 * 8
    assert got == [((i % 7 + 1) * 3000, i) for i in range(60)]


def test_slot_bytes_presizes_the_ring():
    loader = DataLoader(VariableDataset(20, scale=10), batch_size=3, collate_fn=lambda s: np.concatenate(s),
                        num_workers=1, slot_bytes=1 << 16, persistent_workers=True)
    with loader:
        got = [b.tolist() for b in loader]
        assert loader._sessions.persistent.ring.slot_bytes == 1 << 16
        assert "slots x 64.0 KiB" in repr(loader)
    assert got[0] == [0] * 10 + [1] * 20 + [2] * 30


def test_range_dataset_batches_hold_no_stale_values():
    # many small batches through a tiny ring: a reused slot must never show old data
    loader = DataLoader(RangeDataset(500), batch_size=3, num_workers=2, prefetch_factor=1)
    assert [v for b in loader for v in b.tolist()] == list(range(500))
