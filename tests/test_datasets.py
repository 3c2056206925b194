"""ImageFolder, ArrayDataset and the write-into-slot protocol (DeferredArray, Batched),
through the public loader with and without workers."""

from __future__ import annotations

import os
import re

import numpy as np
import pytest
from PIL import Image

import shmload
from shmload import Batched, CollateError, DataLoader, ImageDecodeError, ShmloadWarning, default_collate
from shmload.datasets import ArrayDataset, ImageFolder, StringArray
from shmload.tools import synthetic
from shmload.transforms import train_pipeline

from .helpers import DeferredDataset, RampArray, ramp

pytestmark = pytest.mark.timeout(60)


@pytest.fixture(scope="module")
def folder(tmp_path_factory) -> str:
    """36 small JPEGs in 3 classes (class000 .. class002)."""
    return synthetic.image_folder(tmp_path_factory.mktemp("images"), count=36, size=(120, 90), classes=3,
                                  processes=1)


def batches(loader) -> list:
    return [tuple(np.array(v) for v in b) for b in loader]


# ---------------------------------------------------------------- ImageFolder
@pytest.mark.pure
def test_image_folder_lists_classes_and_files_in_sorted_order(folder):
    ds = ImageFolder(folder)
    assert ds.classes == ["class000", "class001", "class002"]
    assert ds.class_to_idx == {"class000": 0, "class001": 1, "class002": 2}
    assert len(ds) == 36 and ds.targets.dtype == np.int64
    paths = [ds.path(i) for i in range(len(ds))]
    assert paths == sorted(paths)  # class by class, files sorted
    assert [int(os.path.basename(os.path.dirname(p))[5:]) for p in paths] == ds.targets.tolist()
    image, label = ds[5]
    with Image.open(ds.path(5)) as img:
        assert np.array_equal(image, np.asarray(img.convert("RGB")))
    assert image.dtype == np.uint8 and image.ndim == 3 and image.shape[2] == 3 and label == ds.targets[5]
    assert np.array_equal(ds[-1][0], ds[35][0])
    with pytest.raises(IndexError, match="ImageFolder index 36 is out of range for 36 images"):
        ds[36]


@pytest.mark.pure
def test_image_folder_scans_subfolders_filters_extensions_and_keeps_no_python_lists(tmp_path):
    for rel in ["b/x.JPG", "b/deep/er/y.png", "b/notes.txt", "a/z.jpeg", "a/.hidden/q.bmp"]:
        path = tmp_path / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        Image.new("RGB", (4, 4)).save(path, format="PNG")  # content does not matter to the scan
    (tmp_path / "stray.jpg").write_bytes(b"")  # a file directly under root is not a class
    ds = ImageFolder(tmp_path)
    assert ds.classes == ["a", "b"]
    rel = [os.path.relpath(ds.path(i), tmp_path) for i in range(len(ds))]
    assert rel == ["a/z.jpeg", "a/.hidden/q.bmp", "b/x.JPG", "b/deep/er/y.png"] and ds.targets.tolist() == [0, 0, 1, 1]
    # the file list is a StringArray (two numpy arrays) and the labels, not a list of strings (see folder.py)
    held = [v for v in vars(ds).values() if isinstance(v, (np.ndarray, StringArray))]
    assert len(held) == 2 and not any(isinstance(v, list) and len(v) == len(ds) for v in vars(ds).values())
    assert len(ImageFolder(tmp_path, extensions=(".png",), allow_empty=True)) == 1


@pytest.mark.pure
def test_image_folder_names_what_is_missing(tmp_path):
    with pytest.raises(FileNotFoundError, match=r"the root folder .*nowhere' does not exist"):
        ImageFolder(tmp_path / "nowhere")
    with pytest.raises(FileNotFoundError, match=r"no class folders in .*; expected the layout root/<class>/<image>"):
        ImageFolder(tmp_path)
    (tmp_path / "cats").mkdir()
    with pytest.raises(FileNotFoundError, match=r"found no image files .* for the classes \['cats'\]"):
        ImageFolder(tmp_path)
    assert len(ImageFolder(tmp_path, allow_empty=True)) == 0
    with pytest.raises(ValueError, match="on_error must be 'raise' or 'skip', got 'ignore'"):
        ImageFolder(tmp_path, on_error="ignore", allow_empty=True)


@pytest.fixture
def broken_folder(tmp_path, folder) -> str:
    """The module's folder, copied, with file 4 truncated and file 5 not an image at all."""
    import shutil
    root = tmp_path / "broken"
    shutil.copytree(folder, root)
    ds = ImageFolder(root)
    from pathlib import Path
    data = Path(ds.path(4)).read_bytes()
    Path(ds.path(4)).write_bytes(data[:len(data) // 2])
    Path(ds.path(5)).write_bytes(b"this is not a JPEG")
    return str(root)


@pytest.mark.parametrize("num_workers", [0, 2])
@pytest.mark.parametrize("transform", [None, "fused"])
def test_a_corrupt_image_is_an_error_naming_the_file_and_index(broken_folder, num_workers, transform):
    ds = ImageFolder(broken_folder, transform=train_pipeline(32) if transform else None)
    loader = DataLoader(ds, batch_size=1, num_workers=num_workers)  # without a transform, sizes differ
    with pytest.raises(ImageDecodeError, match=r"cannot read image file '.*/class000/img0000(12|15)\.jpg' "
                                               r"\(dataset index 4, class 'class000'\): OSError: .*truncated"):
        for _ in loader:
            pass
    loader.close()


@pytest.mark.pure
def test_skip_replaces_a_corrupt_image_by_the_next_readable_one_with_a_warning(broken_folder):
    ds = ImageFolder(broken_folder, on_error="skip")
    with pytest.warns(ShmloadWarning) as caught:
        image, label = ds[4]
    messages = [str(w.message) for w in caught]
    # 4 is truncated, 5 is not an image: both named, and 6 takes 4's place
    assert len(messages) == 2 and re.search(r"dataset index 4.*skipped, dataset index 5 takes its place", messages[0])
    assert re.search(r"dataset index 5.*UnidentifiedImageError.*dataset index 6 takes its place", messages[1])
    assert np.array_equal(image, ds[6][0]) and label == ds[6][1]


@pytest.mark.parametrize("output", ["uint8-hwc", "float32-chw"])
def test_fused_pipeline_is_bit_identical_for_0_1_and_2_workers(folder, output):
    ds = ImageFolder(folder, transform=train_pipeline(48, output))
    runs = {}
    for workers in (0, 1, 2):
        with DataLoader(ds, batch_size=5, shuffle=True, num_workers=workers, seed=123) as loader:
            runs[workers] = batches(loader)
    images, labels = runs[0][0]
    assert images.shape == ((5, 48, 48, 3) if output == "uint8-hwc" else (5, 3, 48, 48))
    assert len(runs[0]) == 8 and images.std() > 0
    for workers in (1, 2):
        assert all(np.array_equal(a, b) for x, y in zip(runs[0], runs[workers]) for a, b in zip(x, y))
    with DataLoader(ds, batch_size=5, shuffle=True, num_workers=0, seed=124) as loader:
        assert not np.array_equal(batches(loader)[0][0], images)  # another seed, other crops


def test_fused_pipeline_with_spawn_workers(folder, all_start_methods):
    ds = ImageFolder(folder, transform=train_pipeline(32, "float32-chw"))
    with DataLoader(ds, batch_size=6, num_workers=2, seed=5, multiprocessing_context=all_start_methods) as loader:
        got = batches(loader)
    with DataLoader(ds, batch_size=6, num_workers=0, seed=5) as loader:
        assert all(np.array_equal(a, b) for x, y in zip(batches(loader), got) for a, b in zip(x, y))


# ---------------------------------------------------------------- the protocol
@pytest.mark.parametrize("num_workers", [0, 2])
def test_deferred_arrays_are_written_straight_into_the_batch(num_workers):
    with DataLoader(DeferredDataset(10), batch_size=4, num_workers=num_workers) as loader:
        got = [({"x": b["x"].copy(), "y": b["y"].copy()}) for b in loader]
    assert [b["y"].tolist() for b in got] == [[0, 1, 2, 3], [4, 5, 6, 7], [8, 9]]
    for b in got:
        assert b["x"].dtype == np.float32
        assert np.array_equal(b["x"], np.stack([ramp(i) for i in b["y"]]))


@pytest.mark.parametrize("num_workers", [0, 2])
def test_large_deferred_samples_stream_into_the_slot(num_workers):
    # 40,000 rows x 4 float32 = 640 kB a sample: above the streaming threshold
    with DataLoader(DeferredDataset(5, rows=40_000), batch_size=2, num_workers=num_workers) as loader:
        for b in loader:
            assert np.array_equal(b["x"], np.stack([ramp(i, 40_000) for i in b["y"]]))


@pytest.mark.parametrize("num_workers", [0, 2])
def test_a_deferred_sample_of_another_shape_is_named(num_workers):
    loader = DataLoader(DeferredDataset(8, big_at=6), batch_size=4, num_workers=num_workers)
    with pytest.raises(CollateError, match=re.escape("cannot batch field sample['x']: dataset index 6 (position 2 in "
                                                     "the batch) has a deferred array of shape (4, 4) and dtype "
                                                     "float32, expected an array of shape (3, 4) and dtype float32")):
        for _ in loader:
            pass
    loader.close()


@pytest.mark.pure
def test_deferred_arrays_outside_the_loader():
    batch = default_collate([{"x": RampArray(i), "y": i} for i in range(3)])
    assert np.array_equal(batch["x"], np.stack([ramp(i) for i in range(3)]))
    assert np.array_equal(np.asarray(RampArray(2)), ramp(2))  # materialized for code that knows nothing of it
    class Seven(shmload.DeferredArray):
        shape, dtype = (), np.dtype(np.float64)

        def write_into(self, out):
            out[...] = 7.0

    assert default_collate([Seven(), Seven()]).tolist() == [7.0, 7.0]  # 0-d rows are views too
    mixed = default_collate([ramp(0), RampArray(1)])
    assert np.array_equal(mixed, np.stack([ramp(0), ramp(1)]))
    with pytest.raises(CollateError, match=r"cannot batch field sample: .* has a RampArray without a valid shape"):
        bad = RampArray(0)
        bad.shape = "wide"
        default_collate([bad])


# ---------------------------------------------------------------- ArrayDataset
@pytest.mark.pure
def test_array_dataset_rows_and_errors():
    x, y = np.arange(40, dtype=np.float32).reshape(10, 4), np.arange(10) * 10
    ds = ArrayDataset(x, y)
    assert len(ds) == 10 and ds[3][0].tolist() == [12, 13, 14, 15] and ds[3][1] == 30
    got = ds.__getitems__([7, 1])
    assert isinstance(got, Batched) and len(got) == 2
    assert [s[1] for s in got.samples()] == [70, 10]
    with pytest.raises(IndexError, match=r"ArrayDataset index 10 is out of range: expected 0 <= index < 10"):
        ds.__getitems__([1, 10])
    with pytest.raises(ValueError, match="array 1 has 9 rows, expected 10 like array 0"):
        ArrayDataset(x, y[:9])
    with pytest.raises(ValueError, match="array 0 is 0-d"):
        ArrayDataset(np.float32(1))


@pytest.mark.parametrize("num_workers", [0, 2])
def test_array_dataset_gathers_batches_into_the_slot(num_workers):
    x = np.random.default_rng(0).standard_normal((200, 3, 5)).astype(np.float32)
    y = np.arange(200)
    with DataLoader(ArrayDataset(x, y), batch_size=32, shuffle=True, num_workers=num_workers, seed=3) as loader:
        seen = []
        for xb, yb in loader:
            assert xb.dtype == np.float32 and xb.shape[1:] == (3, 5) and yb.dtype == y.dtype
            assert np.array_equal(xb, x[yb])
            seen.extend(yb.tolist())
    assert sorted(seen) == list(range(200))


@pytest.mark.pure
def test_array_dataset_with_a_collate_fn_gets_samples():
    def count(samples):
        return {"n": len(samples), "first": samples[0][1]}

    ds = ArrayDataset(np.zeros((6, 2)), np.arange(6))
    with DataLoader(ds, batch_size=4, num_workers=0, collate_fn=count) as loader:
        assert [(b["n"], b["first"]) for b in loader] == [(4, 0), (2, 4)]


@pytest.mark.pure
def test_the_public_names_are_exported():
    assert shmload.DeferredArray is not None and shmload.Batched is Batched
    assert issubclass(ImageDecodeError, OSError)


@pytest.mark.timeout(120)
def test_the_demo_command_runs_the_image_pipeline_and_explains_the_time(tmp_path):
    import subprocess
    import sys
    env = dict(os.environ, SHMLOAD_CACHE=str(tmp_path))
    run = subprocess.run([sys.executable, "-m", "shmload", "demo", "--images", "64", "--batch-size", "8", "--size",
                          "64", "--workers", "2"], capture_output=True, text=True, timeout=100, env=env)
    assert run.returncode == 0, run.stderr
    out = run.stdout
    assert re.search(r"shmload demo: 64 JPEGs \(~500x375, 10 classes\)", out)
    assert re.search(r"epoch 0: [\d,]+ images/s", out)
    assert re.search(r"then [\d,]+ images/s \(\[8, 64, 64, 3\] uint8 batches\), the consumer waited \d+% of the time", out)
    assert re.search(r"worker 1 \(\d+\) .* fetch", out, re.S) and "diagnosis:" in out
    assert len(os.listdir(tmp_path / "demo-images-64-500x375")) == 11  # 10 classes and the marker
