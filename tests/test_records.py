"""Packed records: write, pack an image folder, read, shuffle with locality, detect
corruption, and load through the DataLoader bit-equal to the files."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

import numpy as np
import pytest

from shmload import DataLoader, DistributedSampler
from shmload.datasets import ImageFolder
from shmload.records import (
    PartShuffleSampler,
    RecordCorruptError,
    RecordDataset,
    RecordFormatError,
    pack_image_folder,
    write,
)
from shmload.records import format as fmt
from shmload.testing import assert_resumes_exactly
from shmload.tools import synthetic
from shmload.transforms import train_pipeline

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


class Blobs:
    """Sample i: i*7 % 300 + 1 bytes of value i % 256, label i, a float pair."""

    def __init__(self, n: int):
        self.n = n

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int):
        return bytes([i % 256]) * (i * 7 % 300 + 1), {"label": i, "xy": np.array([i, -i], np.float32)}


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    return synthetic.image_folder(tmp_path_factory.mktemp("images") / "train", 48, (80, 60), 3)


@pytest.fixture(scope="module")
def packed(folder, tmp_path_factory):
    return pack_image_folder(folder, tmp_path_factory.mktemp("packed") / "records", part_bytes=60_000, workers=2)


# ---------------------------------------------------------------- write and read
@pytest.mark.parametrize("workers", [0, 2])
def test_write_and_read_back_every_sample_and_field(tmp_path, workers):
    out = write(Blobs(200), tmp_path / "blobs", part_bytes=4096, workers=workers)
    ds = RecordDataset(out)
    assert len(ds) == 200 and ds.field_names == ["label", "xy"] and ds.classes is None
    for i in (0, 1, 57, 199, -1):
        data, label, xy = ds[i]
        j = i % 200
        assert bytes(data) == bytes([j % 256]) * (j * 7 % 300 + 1) and label == j and xy.tolist() == [j, -j]
        assert not data.flags.writeable  # a read-only view of the mapped part
    meta = json.loads((tmp_path / "blobs" / fmt.METADATA).read_text())
    assert all(p["bytes"] <= 4096 for p in meta["parts"]) and len(meta["parts"]) >= 7
    assert sum(p["bytes"] for p in meta["parts"]) == sum(j * 7 % 300 + 1 for j in range(200))


@pytest.mark.pure
def test_an_iterable_source_is_written_too(tmp_path):
    blobs = Blobs(150)
    out = write((blobs[i] for i in range(150)), tmp_path / "it", part_bytes=2000)
    ds = RecordDataset(out)
    assert len(ds) == 150 and all(bytes(ds.data(i)) == blobs[i][0] for i in range(150))
    assert ds.fields["label"].tolist() == list(range(150))
    assert len(RecordDataset(write(iter(()), tmp_path / "empty"))) == 0
    with pytest.raises(ValueError, match=r"workers=2, but an iterable source \(a generator\) is read by one process"):
        write((b"x" for _ in range(3)), tmp_path / "par", workers=2)


def test_parallel_writing_gives_the_same_samples_in_the_same_order(tmp_path):
    one = RecordDataset(write(Blobs(300), tmp_path / "one", part_bytes=10_000))
    two = RecordDataset(write(Blobs(300), tmp_path / "two", part_bytes=10_000, workers=3))
    assert all(bytes(one.data(i)) == bytes(two.data(i)) for i in range(300))
    assert np.array_equal(one.fields["xy"], two.fields["xy"])


@pytest.mark.pure
def test_the_format_is_readable_with_numpy_json_and_mmap_alone(tmp_path):
    """What docs/records.md specifies, read without shmload."""
    import mmap
    out = write(Blobs(30), tmp_path / "raw", part_bytes=1000)
    with open(os.path.join(out, "records.json")) as f:
        meta = json.load(f)
    assert (meta["format"], meta["version"], meta["samples"]) == ("shmload-records", 1, 30)
    index = np.load(os.path.join(out, "index.npy"))
    labels = np.load(os.path.join(out, "field-label.npy"))
    part, offset, length, crc = index[17]
    with open(os.path.join(out, meta["parts"][part]["name"]), "rb") as f, \
            mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as m:
        data = m[offset:offset + length]
    import zlib
    assert data == bytes([17]) * (17 * 7 % 300 + 1) and zlib.crc32(data) == crc and labels[17] == 17
    assert index.dtype.names == ("part", "offset", "length", "crc32")


@pytest.mark.pure
@pytest.mark.parametrize("bad,message", [
    ([1, 2], r"sample 0 is a int, expected bytes"),
    ([(b"x", {"name": "a"})], r"field 'name' is str 'a'; fields are numbers"),
    ([(b"x", {"bad name": 1})], r"a field name should be a non-empty string of letters"),
])
def test_bad_samples_are_named(tmp_path, bad, message):
    with pytest.raises((TypeError, ValueError), match=message):
        write(bad, tmp_path / "out")
    assert os.listdir(tmp_path) == []  # nothing left behind


@pytest.mark.pure
def test_fields_that_change_shape_or_set_are_named_and_nothing_is_left(tmp_path):
    with pytest.raises(ValueError, match=r"sample 1 has fields \['other'\], but sample 0 has \['label'\]"):
        write([(b"a", {"label": 1}), (b"b", {"other": 2})], tmp_path / "out")
    with pytest.raises(ValueError, match=r"field 'v' of sample 1 is .*expected <f8 of shape \(2,\)"):
        write([(b"a", {"v": [1.0, 2.0]}), (b"b", {"v": [1.0, 2.0, 3.0]})], tmp_path / "out")
    assert os.listdir(tmp_path) == []
    (tmp_path / "exists").mkdir()
    with pytest.raises(FileExistsError, match=r"exists already; a records directory is written whole"):
        write([b"a"], tmp_path / "exists")


def test_a_pack_killed_midway_leaves_no_dataset_only_a_partial_directory_named_as_such(tmp_path):
    script = textwrap.dedent(f"""
        import os, signal
        from shmload.records import write
        class Dying:
            def __len__(self): return 100
            def __getitem__(self, i):
                if i == 50: os.kill(os.getpid(), signal.SIGKILL)
                return b"x" * 100
        write(Dying(), {str(tmp_path / 'out')!r}, part_bytes=1000)
    """)
    result = subprocess.run([sys.executable, "-c", script], cwd=ROOT, timeout=30, capture_output=True)
    assert result.returncode == -9
    assert not (tmp_path / "out").exists()
    partial = [p for p in os.listdir(tmp_path) if ".partial-" in p]
    assert len(partial) == 1
    with pytest.raises(RecordFormatError, match=r"is not a records directory: it has no records.json \(a '.partial' "
                                                r"directory is what an interrupted `shmload pack` leaves"):
        RecordDataset(tmp_path / partial[0])


# ---------------------------------------------------------------- image folders
def test_pack_round_trip_of_an_image_folder(folder, packed):
    files = ImageFolder(folder)
    ds = RecordDataset(packed)
    assert len(ds) == len(files) == 48 and ds.classes == files.classes
    for i in range(len(ds)):
        data, label = ds[i]
        with open(files.path(i), "rb") as f:
            assert bytes(data) == f.read()  # the encoded bytes as they were
        assert label == files.targets[i]


@pytest.mark.parametrize("workers", [0, 2])
def test_decoded_batches_from_records_equal_those_from_the_files(folder, packed, workers, start_method):
    # split_batches=False: RecordDataset serves a batch by __getitems__, one call seeded
    # once, where ImageFolder's samples are seeded per part (NOTE [ Parts of a batch ])
    kwargs = dict(batch_size=8, shuffle=True, seed=4, num_workers=workers, timeout=30,
                  multiprocessing_context=start_method if workers else None, split_batches=False)
    from_files = DataLoader(ImageFolder(folder, transform=train_pipeline(32)), **kwargs)
    from_records = DataLoader(RecordDataset(packed, transform=train_pipeline(32), image=True), **kwargs)
    pairs = list(zip(from_files, from_records))
    assert len(pairs) == 6
    for (xa, ya), (xb, yb) in pairs:
        assert xa.dtype == xb.dtype == np.uint8 and np.array_equal(xa, xb) and np.array_equal(ya, yb)


def test_the_pack_command(folder, tmp_path):
    result = subprocess.run([sys.executable, "-m", "shmload", "pack", folder, str(tmp_path / "out"), "--part-size",
                             "40k", "--workers", "2", "--quiet"], cwd=ROOT, timeout=60, capture_output=True, text=True)
    assert result.returncode == 0, result.stderr
    assert "packed 48 images of 3 classes into" in result.stdout
    assert len(RecordDataset(tmp_path / "out")) == 48
    again = subprocess.run([sys.executable, "-m", "shmload", "pack", folder, str(tmp_path / "out")], cwd=ROOT,
                           timeout=60, capture_output=True, text=True)
    assert again.returncode != 0 and "exists already" in again.stderr


# ---------------------------------------------------------------- corruption
def copy_of(packed, tmp_path):
    import shutil
    return shutil.copytree(packed, tmp_path / "copy")


def test_a_flipped_byte_is_named_with_part_sample_and_offset(packed, tmp_path):
    path = copy_of(packed, tmp_path)
    ds = RecordDataset(path)
    part, offset, length, _ = ds.index[5]
    name = os.path.join(path, fmt.part_name(int(part)))
    with open(name, "r+b") as f:
        f.seek(int(offset) + int(length) // 2)
        byte = f.read(1)
        f.seek(-1, 1)
        f.write(bytes([byte[0] ^ 0xFF]))
    fresh = RecordDataset(path)
    with pytest.raises(RecordCorruptError, match=rf"sample 5 of .* is corrupt: its bytes {offset}\.\.{offset + length} "
                                                 rf"in part part-{int(part):05d} have CRC-32"):
        fresh[5]
    with pytest.raises(RecordCorruptError, match=rf"part part-{int(part):05d} of .* is corrupt"):
        fresh.verify()
    assert bytes(RecordDataset(path, verify=False).data(5))  # read anyway when asked not to check
    loader = DataLoader(fresh, batch_size=None, num_workers=2, timeout=30)  # raw bytes: one sample a batch
    with pytest.raises(RecordCorruptError, match=r"sample 5 of .* is corrupt.*\n(.|\n)*"):
        for _ in loader:
            pass


@pytest.mark.pure
def test_a_truncated_or_missing_part_and_a_short_index_are_named_at_open(packed, tmp_path):
    path = copy_of(packed, tmp_path)
    last = fmt.part_name(len(fmt.read_metadata(path)["parts"]) - 1)
    with open(os.path.join(path, last), "r+b") as f:
        f.truncate(100)
    with pytest.raises(RecordFormatError, match=rf"part {last} of .* has 100 bytes, but \d+ were written: it is "
                                                r"truncated"):
        RecordDataset(path)
    os.remove(os.path.join(path, last))
    with pytest.raises(RecordFormatError, match=rf"part {last} of .* is missing"):
        RecordDataset(path)
    np.save(os.path.join(path, fmt.INDEX), np.zeros(3, fmt.INDEX_DTYPE))
    with pytest.raises(RecordFormatError, match=r"holds \(3,\) rows of .* expected \(48,\) rows"):
        RecordDataset(path)


@pytest.mark.pure
def test_an_index_pointing_outside_its_part_is_corrupt(tmp_path):
    out = write(Blobs(10), tmp_path / "b", part_bytes=10_000)
    index = np.load(os.path.join(out, fmt.INDEX))
    index[3]["offset"] = 10**9
    np.save(os.path.join(out, fmt.INDEX), index)
    with pytest.raises(RecordCorruptError, match=r"sample 3 of .* is recorded at part 0, bytes 1000000000\.\..*outside "
                                                 r"the part .* the index is corrupt"):
        RecordDataset(out)[3]
    with pytest.raises(IndexError, match=r"RecordDataset index 10 is out of range for 10 samples"):
        RecordDataset(out)[10]


@pytest.mark.pure
def test_other_directories_are_refused_clearly(tmp_path):
    with pytest.raises(FileNotFoundError, match=r"is not a directory"):
        RecordDataset(tmp_path / "nothing")
    (tmp_path / "records.json").write_text(json.dumps({"format": "shmload-records", "version": 9}))
    with pytest.raises(RecordFormatError, match=r"is shmload-records version 9; this shmload reads version 1"):
        RecordDataset(tmp_path)


# ---------------------------------------------------------------- shuffling, resume, processes
@pytest.mark.pure
def test_part_shuffle_visits_every_sample_once_a_few_parts_at_a_time(tmp_path):
    ds = RecordDataset(write(Blobs(400), tmp_path / "b", part_bytes=3000))
    parts = ds.part_of()
    n_parts = int(parts.max()) + 1
    assert n_parts >= 12
    sampler = PartShuffleSampler(ds, window=2, seed=3)
    first, second = list(sampler), list(sampler)
    assert sorted(first) == list(range(400)) and first != second
    changes = sum(1 for a, b in zip(first, first[1:]) if parts[a] != parts[b])
    assert changes > n_parts  # samples are mixed within a window, not read part after part
    groups: list[set] = []
    for idx in first:  # the parts in use form consecutive groups of 2: the windows
        if not groups or len(groups[-1] | {parts[idx]}) > 2:
            groups.append(set())
        groups[-1].add(parts[idx])
    assert len(groups) == -(-n_parts // 2)
    again = PartShuffleSampler(ds, window=2, seed=3)
    again.set_epoch(1)
    assert list(again) == second
    assert list(PartShuffleSampler(ds, window=n_parts, seed=3)) != first


def test_part_shuffle_and_distributed_sampler_resume_exactly(packed):
    for make_sampler in (lambda ds: PartShuffleSampler(ds, window=2, seed=1),
                         lambda ds: DistributedSampler(ds, num_replicas=2, rank=1, seed=5)):
        def make(num_workers, seed):
            ds = RecordDataset(packed, transform=train_pipeline(24), image=True)
            return DataLoader(ds, batch_size=5, sampler=make_sampler(ds), num_workers=num_workers, seed=seed,
                              timeout=30)
        assert_resumes_exactly(make, stops=[2, 6], epochs=2, pairs=[(0, 2), (2, 1)])


def test_records_under_spawn_and_forkserver(packed, all_start_methods):
    ds = RecordDataset(packed, transform=train_pipeline(16), image=True)
    expected = [y.tolist() for _, y in DataLoader(ds, batch_size=6, shuffle=True, seed=2)]
    loader = DataLoader(ds, batch_size=6, shuffle=True, seed=2, num_workers=2, timeout=30,
                        multiprocessing_context=all_start_methods)
    assert [y.tolist() for _, y in loader] == expected
