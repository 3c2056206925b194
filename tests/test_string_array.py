"""StringArray: a sequence of names in two numpy arrays (copy-on-read guarded), through
its public API, in ImageFolder, and read by forked and spawned workers. Module-level
dataset: spawn workers import it."""

from __future__ import annotations

import collections.abc
import os
import pathlib
import pickle
import sys
import tracemalloc

import numpy as np
import pytest

from shmload import DataLoader
from shmload.datasets import ImageFolder, StringArray

pytestmark = pytest.mark.timeout(60)

NAMES = ["cat.jpg", "dog.png", "", "naïve café.jpeg", "日本語.png", "x" * 300, "last"]
WIDTH = 32  # bytes of a name a sample carries, zero-padded


def fs_name(raw: bytes) -> str:
    """A file name as os.listdir gives it: bytes that are not UTF-8 as lone surrogates."""
    return os.fsdecode(raw)


# ---------------------------------------------------------------- indexing and slicing
@pytest.mark.pure
def test_an_int_index_gives_the_item_from_either_end_numpy_ints_too():
    names = StringArray(NAMES)
    assert [names[i] for i in range(len(NAMES))] == NAMES
    assert names[-1] == "last" and names[-len(NAMES)] == "cat.jpg"
    assert names[np.int64(3)] == NAMES[3] and names[np.uint8(4)] == NAMES[4] and names[np.int32(-2)] == NAMES[-2]


@pytest.mark.pure
@pytest.mark.parametrize("index", [7, -8, 10**12, np.int64(7)])
def test_an_index_out_of_range_names_the_index_and_the_length(index):
    with pytest.raises(IndexError, match=rf"^StringArray index {int(index)} is out of range for 7 items$"):
        StringArray(NAMES)[index]


@pytest.mark.pure
@pytest.mark.parametrize("index", [1.0, "1", [0, 1], None])
def test_an_index_neither_int_nor_slice_is_a_type_error(index):
    with pytest.raises(TypeError, match=rf"StringArray indices must be integers or slices, not {type(index).__name__}"):
        StringArray(NAMES)[index]


@pytest.mark.pure
@pytest.mark.parametrize("sl", [slice(None), slice(1, 4), slice(2, None, 2), slice(None, None, -1), slice(-2, 1, -2),
                                slice(5, 2), slice(100, 200), slice(None, None, 3), slice(-100, 100, 4)])
def test_a_slice_is_a_string_array_of_the_lists_slice(sl):
    part = StringArray(NAMES)[sl]
    assert isinstance(part, StringArray) and list(part) == NAMES[sl] and len(part) == len(NAMES[sl])
    assert part.offsets[0] == 0 and part.data.nbytes == sum(len(n.encode()) for n in NAMES[sl])


@pytest.mark.pure
def test_length_iteration_and_sequence_methods():
    names = StringArray(NAMES)
    assert isinstance(names, collections.abc.Sequence) and len(names) == 7 and list(names) == NAMES
    assert list(reversed(names)) == NAMES[::-1] and names.index("日本語.png") == 4 and names.count("") == 1
    assert "dog.png" in names and "dog" not in names and b"dog.png" not in names and 3 not in names
    assert len(StringArray()) == 0 and list(StringArray([])) == []


@pytest.mark.pure
def test_iteration_and_building_cross_chunk_boundaries():
    names = [f"{i:x}" * (i % 5) for i in range(150_000)]  # more than two chunks, empty items too
    built = StringArray(iter(names))
    assert len(built) == len(names) and list(built) == names
    assert built[65_535] == names[65_535] and built[65_536] == names[65_536] and built[-1] == names[-1]
    assert list(built[::7]) == names[::7] and list(built[70_000:60_000:-3]) == names[70_000:60_000:-3]


# ---------------------------------------------------------------- what goes in
@pytest.mark.pure
def test_equality_with_string_arrays_and_lists():
    names = StringArray(NAMES)
    assert names == StringArray(NAMES) and names == NAMES and NAMES == names
    assert names != NAMES[:-1] and names != StringArray(NAMES[::-1]) and names != tuple(NAMES)
    assert StringArray(["a"]) != StringArray([b"a"]) and StringArray(["a"]) != [b"a"]
    assert StringArray() == StringArray([b"a"])[:0] == []  # empty: equal, as empty lists are
    with pytest.raises(TypeError, match="unhashable"):
        hash(names)


@pytest.mark.pure
def test_bytes_stay_bytes_and_str_stays_str():
    raw = [b"\x00\xff", b"plain", b""]
    as_bytes, as_str = StringArray(raw), StringArray(["\x00\xff", "plain", ""])
    assert as_bytes.kind is bytes and list(as_bytes) == raw and all(type(x) is bytes for x in as_bytes)
    assert as_str.kind is str and all(type(x) is str for x in as_str) and as_str != as_bytes
    assert as_bytes.data.tobytes() == b"\x00\xffplain"
    assert as_str.data.tobytes() == "\x00\xffplain".encode()  # str is stored UTF-8 encoded


@pytest.mark.pure
def test_non_ascii_and_surrogate_escaped_file_names_round_trip():
    raw = [b"caf\xc3\xa9.jpg", b"latin1-caf\xe9.jpg", b"\xff\xfe", "日本".encode()]
    names = [fs_name(r) for r in raw]
    assert "\udce9" in names[1]  # not UTF-8: os.fsdecode escaped it
    stored = StringArray(names)
    assert list(stored) == names and [os.fsencode(n) for n in stored] == raw
    assert stored.data.tobytes() == b"".join(raw)  # the bytes on disk, as os.fsencode gives them
    assert list(pickle.loads(pickle.dumps(stored))) == names


@pytest.mark.pure
def test_other_inputs_generators_numpy_arrays_paths_and_string_arrays():
    assert StringArray(n for n in NAMES) == NAMES
    assert StringArray(np.array(NAMES)) == NAMES
    assert StringArray(np.array([b"ab", b"c"])) == [b"ab", b"c"]
    assert StringArray(np.array(NAMES, dtype=object)) == NAMES
    assert StringArray([pathlib.Path("a/b.jpg"), "c.jpg"]) == ["a/b.jpg", "c.jpg"]  # os.PathLike: os.fspath
    names = StringArray(NAMES)
    assert StringArray(names) == names
    with pytest.raises(ValueError, match=r"expects a 1-d array of strings, got shape \(2, 1\)"):
        StringArray(np.array([["a"], ["b"]]))


@pytest.mark.pure
@pytest.mark.parametrize("items,message", [
    (["a", "b", b"c"], r"^StringArray: item 2 is bytes, expected str like item 0 \(the items must be all str or all "
                       r"bytes\)$"),
    ([b"a", "b"], r"^StringArray: item 1 is str, expected bytes like item 0"),
    (["a", None], r"^StringArray: item 1 is NoneType \(None\), expected str or bytes$"),
    ([3, "a"], r"^StringArray: item 0 is int \(3\), expected str or bytes$"),
    (["a", bytearray(b"b")], r"^StringArray: item 1 is bytearray \(bytearray\(b'b'\)\), expected str or bytes$"),
    (np.arange(3), r"^StringArray: item 0 is int \(0\), expected str or bytes$"),
    ("abc", r"expects an iterable of str or bytes, got a str itself; wrap it in a list"),
    (b"abc", r"expects an iterable of str or bytes, got a bytes itself"),
])
def test_a_bad_item_is_a_type_error_naming_its_index_and_type(items, message):
    with pytest.raises(TypeError, match=message):
        StringArray(items)


@pytest.mark.pure
def test_a_bad_item_after_the_first_chunk_is_named_by_its_index():
    with pytest.raises(TypeError, match=r"^StringArray: item 70000 is int \(7\), expected str or bytes$"):
        StringArray([str(i) for i in range(70_000)] + [7])


@pytest.mark.pure
def test_a_lone_surrogate_that_no_file_name_has_is_a_value_error():
    with pytest.raises(ValueError, match=r"StringArray: item 1 \('bad\\ud800'\) cannot be stored: surrogates not "
                                         r"allowed"):
        StringArray(["ok", "bad\ud800"])


# ---------------------------------------------------------------- immutability, size, repr
@pytest.mark.pure
def test_it_cannot_be_changed():
    names = StringArray(NAMES)
    with pytest.raises(TypeError, match="does not support item assignment"):
        names[0] = "other"
    with pytest.raises(TypeError, match="doesn't support item deletion|does not support item deletion"):
        del names[0]
    for array in (names.data, names.offsets, names[::2].data, pickle.loads(pickle.dumps(names)).offsets):
        assert not array.flags.writeable
        with pytest.raises(ValueError, match="read-only"):
            array[0] = 1
    with pytest.raises(AttributeError):
        names.data = np.zeros(3, np.uint8)
    with pytest.raises(AttributeError):
        names.extra = 1  # no __dict__
    assert list(names) == NAMES


@pytest.mark.pure
def test_nbytes_is_the_encoded_text_and_the_offsets():
    names = StringArray(NAMES)
    assert names.data.dtype == np.uint8 and names.offsets.dtype == np.int64 and len(names.offsets) == 8
    assert names.nbytes == sum(len(n.encode()) for n in NAMES) + 8 * 8


@pytest.mark.pure
def test_repr_shows_the_first_items_and_the_length():
    assert repr(StringArray(["a", "b"])) == "StringArray(['a', 'b'], len=2)"
    long = repr(StringArray(f"name{i}" for i in range(100_000)))
    assert long == "StringArray(['name0', 'name1', 'name2', ...], len=100000)"
    assert repr(StringArray()) == "StringArray([], len=0)"


@pytest.mark.pure
def test_building_from_a_generator_holds_about_one_chunk_of_python_objects():
    n = 300_000
    names = (f"n01440764/n01440764_{i}.JPEG" for i in range(n))
    tracemalloc.start()
    try:
        built = StringArray(names)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    as_list = [f"n01440764/n01440764_{i}.JPEG" for i in range(n)]
    list_bytes = sys.getsizeof(as_list) + sum(map(sys.getsizeof, as_list))
    assert built == as_list and built.nbytes < list_bytes / 2
    assert peak - built.nbytes < list_bytes / 2, (peak, built.nbytes, list_bytes)


# ---------------------------------------------------------------- pickling
@pytest.mark.pure
@pytest.mark.parametrize("items", [NAMES, [b"\x00", b"", b"\xff" * 70_000], []])
def test_pickling_round_trips(items):
    for protocol in (2, pickle.HIGHEST_PROTOCOL):
        back = pickle.loads(pickle.dumps(StringArray(items), protocol=protocol))
        assert isinstance(back, StringArray) and back == items and back.kind is StringArray(items).kind


@pytest.mark.pure
def test_a_pickle_is_about_the_bytes_of_the_names_not_a_list_of_strings():
    names = [f"train/n{i % 1000:08d}/n{i % 1000:08d}_{i}.JPEG" for i in range(100_000)]
    stored = StringArray(names)
    encoded = sum(len(n.encode()) for n in names)
    size = len(pickle.dumps(stored, protocol=5))
    assert size <= 1.2 * (encoded + stored.offsets.nbytes)
    assert size <= encoded + len(names) + 1000  # the offsets travel as one-byte lengths here
    assert size < len(pickle.dumps(names, protocol=5))
    buffers: list[pickle.PickleBuffer] = []
    in_band = pickle.dumps(stored, protocol=5, buffer_callback=buffers.append)
    assert len(in_band) < 1000 and sum(b.raw().nbytes for b in buffers) == encoded + len(names)
    assert pickle.loads(in_band, buffers=buffers) == names


# ---------------------------------------------------------------- in a dataset, with workers
class NameDataset:
    """Sample i: the length of name i, its file-system bytes zero-padded to WIDTH, and
    whether the worker holds the names as a StringArray."""

    def __init__(self, names: StringArray):
        self.names = names

    def __len__(self) -> int:
        return len(self.names)

    def __getitem__(self, i: int):
        name = self.names[i]
        raw = np.zeros(WIDTH, np.uint8)
        encoded = os.fsencode(name)
        raw[:len(encoded)] = np.frombuffer(encoded, np.uint8)
        return len(name), raw, int(isinstance(self.names, StringArray))


def expected(names: list[str]) -> tuple[np.ndarray, np.ndarray]:
    raw = np.zeros((len(names), WIDTH), np.uint8)
    for i, n in enumerate(names):
        encoded = os.fsencode(n)
        raw[i, :len(encoded)] = np.frombuffer(encoded, np.uint8)
    return np.array([len(n) for n in names]), raw


def load(dataset: NameDataset, **kwargs) -> tuple[np.ndarray, ...]:
    with DataLoader(dataset, batch_size=7, timeout=30, **kwargs) as loader:
        batches = [tuple(np.array(v) for v in b) for b in loader]
    return tuple(np.concatenate(column) for column in zip(*batches))


@pytest.mark.parametrize("context", ["fork", "spawn"])
def test_workers_read_the_same_names_as_the_main_process(context):
    names = [f"img_{i:03d}_été.jpg" if i % 4 else fs_name(b"raw\xff%d.png" % i) for i in range(60)]
    dataset = NameDataset(StringArray(names))
    lengths, raw, is_string_array = load(dataset, num_workers=2, multiprocessing_context=context)
    in_main = load(dataset, num_workers=0)
    assert all(np.array_equal(a, b) for a, b in zip((lengths, raw, is_string_array), in_main))
    want_lengths, want_raw = expected(names)
    assert np.array_equal(lengths, want_lengths) and np.array_equal(raw, want_raw) and is_string_array.all()


@pytest.mark.pure
def test_image_folder_finds_files_whose_names_are_not_utf8(tmp_path):
    cls = tmp_path / "café"
    cls.mkdir()
    raw_names = [b"plain.png", b"caf\xe9.png", "日本.png".encode()]
    for raw in raw_names:
        with open(os.path.join(os.fsencode(cls), raw), "wb"):
            pass
    ds = ImageFolder(tmp_path, loader=len)
    assert len(ds) == 3 and all(os.path.exists(ds.path(i)) for i in range(3))
    assert sorted(os.fsencode(os.path.basename(ds.path(i))) for i in range(3)) == sorted(raw_names)
    back = pickle.loads(pickle.dumps(ds))
    assert [back.path(i) for i in range(3)] == [ds.path(i) for i in range(3)]
    assert ds[-1] == (len(ds.path(2)), 0)


@pytest.mark.pure
def test_a_stepped_slice_of_long_items_is_right_and_copied_an_item_at_a_time():
    from shmload.datasets import strings

    items = [bytes([k]) * (strings.GATHER_BYTES // 3 + k) for k in range(7)]  # chunks past GATHER_BYTES
    sa = StringArray(items)
    assert sa[::-1] == items[::-1] and sa[1::3] == items[1::3] and sa[-2:0:-2] == items[-2:0:-2]


@pytest.mark.pure
def test_the_arrays_cannot_be_made_writeable_again():
    sa = StringArray(["a", "bc"])
    for array in (sa.data, sa.offsets):
        with pytest.raises(ValueError, match="WRITEABLE"):
            array.flags.writeable = True
    assert sa[1:][0] == "bc" and pickle.loads(pickle.dumps(sa[::-1])) == ["bc", "a"]
