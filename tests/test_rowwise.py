"""Row-wise collate: large samples fetched and written one at a time must give exactly
the default path's batches and errors. Tested as internals first
(``shmload._loading.rowwise``, ``shmload._batching``), then through the loader."""

import numpy as np
import pytest

from shmload import CollateError, DataLoader
from shmload._batching import collate as C
from shmload._batching import layout as L
from shmload._loading.rowwise import MIN_SAMPLE_BYTES, RowwiseBatch

from .helpers import LiveSamplesDataset


def _samples(n, shape=(64, 300)):
    rng = np.random.default_rng(1)
    return [{"image": rng.random(shape, dtype=np.float32), "label": i, "flag": i % 2 == 0,
             "meta": (f"name{i}", np.int16(i))} for i in range(n)]


@pytest.mark.pure
def test_rowwise_batch_writes_the_same_bytes_and_layout_as_the_default_path():
    samples = _samples(5)
    reference = C.plan_stack(samples, list(range(5)))
    ref_buf = np.full(reference.layout.nbytes, 0xAB, np.uint8)  # the same padding bytes
    C.write(reference, L.slot_destination(ref_buf))

    batch = RowwiseBatch(samples[0], list(range(5)))
    assert batch.nbytes == reference.layout.nbytes and batch.sample_bytes >= MIN_SAMPLE_BYTES
    buf = np.full(batch.nbytes, 0xAB, np.uint8)
    plan = batch.write(L.slot_destination(buf), iter(samples[1:]))
    C.write(plan, L.slot_destination(buf))
    assert plan.layout == reference.layout
    np.testing.assert_array_equal(buf, ref_buf)
    built = L.build(plan.layout, L.slot_destination(buf))
    assert built["meta"][0] == tuple(f"name{i}" for i in range(5))  # a field of a tuple sample, as torch's


@pytest.mark.pure
def test_rowwise_batch_names_the_first_mismatching_sample():
    samples = _samples(4)
    samples[2]["image"] = samples[2]["image"][:, :299]
    batch = RowwiseBatch(samples[0], [10, 11, 12, 13])
    buf = np.zeros(batch.nbytes, np.uint8)
    with pytest.raises(CollateError, match=r"field sample\['image'\]: dataset index 12 \(position 2 in the batch\) "
                                           r"has an array of shape \(64, 299\)"):
        batch.write(L.slot_destination(buf), iter(samples[1:]))


@pytest.mark.pure
def test_rowwise_batch_refuses_a_short_batch():
    samples = _samples(3)
    batch = RowwiseBatch(samples[0], [0, 1, 2, 3])
    with pytest.raises(RuntimeError, match="expected 4 samples, got 3"):
        batch.write(L.slot_destination(np.zeros(batch.nbytes, np.uint8)), iter(samples[1:]))


def test_workers_hold_one_large_sample_at_a_time_and_batches_match_the_default_path():
    ds = LiveSamplesDataset(48)
    loader = DataLoader(ds, batch_size=8, num_workers=2, timeout=20)
    batches = [(b[0].copy(), b[1].copy(), b[2].copy(), b[3]) for b in loader]
    assert [b[2].tolist() for b in batches] == [list(range(i, i + 8)) for i in range(0, 48, 8)]
    for image, _, index, names in batches:
        assert (image == index[:, None, None]).all() and names == tuple(f"s{i}" for i in index)
    # A worker holds at most one earlier sample while it makes the next, even in the
    # batches sent before the ring was sized (they ask for a slot after their first sample).
    counts = np.concatenate([b[1] for b in batches])
    assert counts.max() <= 1, counts
    reference = list(DataLoader(ds, batch_size=8, num_workers=0))
    # The in-process path holds the whole batch, so the same check fails there: it can fail.
    assert max(int(b[1].max()) for b in reference) >= 6
    for got, want in zip(batches, reference):
        np.testing.assert_array_equal(got[0], want[0])


def test_a_bad_sample_mid_batch_gets_the_default_paths_error_through_the_loader():
    loader = DataLoader(LiveSamplesDataset(40, bad=29), batch_size=8, num_workers=2, timeout=20)
    got = []
    with pytest.raises(CollateError, match=r"field sample\[0\]: dataset index 29 \(position 5 in the batch\) has an "
                                           r"array of shape \(128, 191\) and dtype float32, expected an array of "
                                           r"shape \(128, 192\)"):
        for batch in loader:
            got.append(int(batch[2][0]))
    assert got == [0, 8, 16]
