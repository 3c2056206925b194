"""Batches have the structure and dtypes of torch's ``default_collate`` (a side-by-side
run against torch 2.13's DataLoader): a tuple sample batches to a list, container
subclasses are copied from sample 0, and numeric types that differ between the samples of
a batch are promoted as torch promotes them (layout.py: NOTE [ Batch containers ], NOTE
[ Mixed numeric types ]). The rules are checked without torch, with torch's results
written out, then side by side with torch's own DataLoader (marked ``torch``). The
rules are read at the collate's internals (``shmload._batching``) as well as through the
loader."""

from __future__ import annotations

import collections
import importlib.util
import itertools
from collections.abc import Mapping
from typing import NamedTuple

import numpy as np
import pytest

from shmload import CollateError, DataLoader, DeferredArray, default_collate
from shmload._batching import collate as C
from shmload._batching import layout as L
from shmload._batching.batcher import RowwiseTypeMismatch
from shmload._batching.promotion import promote_types
from shmload._loading.rowwise import RowwiseBatch

needs_torch = pytest.mark.skipif(importlib.util.find_spec("torch") is None, reason="torch is not installed")


# ---------------------------------------------------------------- datasets (module level: workers pickle them)
class Point(NamedTuple):
    x: np.ndarray
    name: str


class Tagged(list):
    """A list subclass with an attribute: torch copies sample 0's, attribute and all."""

    def __init__(self, items=(), tag=""):
        super().__init__(items)
        self.tag = tag


class MyTuple(tuple):
    pass


class Frozen(Mapping):
    """An immutable mapping type: torch builds the batch's as ``Frozen(dict)``."""

    def __init__(self, data):
        self._data = dict(data)

    def __getitem__(self, key):
        return self._data[key]

    def __iter__(self):
        return iter(self._data)

    def __len__(self):
        return len(self._data)


class Samples:
    """Sample i is ``make(i)``."""

    def __init__(self, make, n=8):
        self.make, self.n = make, n

    def __len__(self):
        return self.n

    def __getitem__(self, i):
        if not 0 <= i < self.n:
            raise IndexError(i)
        return self.make(i)


def plain_containers(i):
    return (np.full(3, i, np.float32), i, f"s{i}", [i / 2, f"l{i}", (i, f"t{i}")],
            {"s": f"d{i}", "n": i}, Point(np.zeros(2) + i, f"p{i}"))


def container_subclasses(i):
    return {"tagged": Tagged([i, f"x{i}"], tag=f"tag{i}"),
            "default": collections.defaultdict(list, a=i),
            "ordered": collections.OrderedDict(b=float(i), a=i),
            "frozen": Frozen({"k": i}),
            "tuple_subclass": MyTuple((i, f"m{i}"))}


def mixed_numbers(i):
    """Batches of 4: sample 0 of each batch has one type, the others another (torch's
    dtype for each field in its comment)."""
    first = i % 4 == 0
    return {"int_then_float": 0 if first else 0.5,                       # float32
            "float_then_int": 0.5 if first else i,                       # float64
            "int_then_np_int64": 1 if first else np.int64(i),            # int64
            "bool_then_int": True if first else i,                       # int64
            "np_float32_then_float": np.float32(i) if first else i + .5,  # float32
            "np_int8_then_int": np.int8(i) if first else 300 + i,        # int64
            "np_float16_then_np_int64": np.float16(i) if first else np.int64(i),  # float16
            "int_then_np_float64": i if first else np.float64(i + .5),   # float64
            "bool": i % 2 == 0}                                          # bool


def mixed_arrays(i):
    pos = i % 4
    return (np.full(3, i, np.float64 if pos == 2 else np.float32),      # float64
            np.full(2, i, np.int32 if pos == 0 else np.float32),        # float32
            np.full(2, i, np.uint8 if pos == 0 else np.int8),           # int16
            np.full((2, 2), i % 2, bool if pos == 0 else np.int64))     # int64


def mixed_tensors(i):
    import torch
    return (torch.full((2,), float(i), dtype=torch.float64 if i % 4 == 1 else torch.float32),
            torch.tensor(i, dtype=torch.int32 if i % 2 else torch.int64))


def _batches(make, num_workers, output="numpy", n=8, batch_size=4):
    with DataLoader(Samples(make, n), batch_size=batch_size, num_workers=num_workers, output=output,
                    timeout=30) as loader:
        return list(loader)


# ---------------------------------------------------------------- without torch: structure
@pytest.mark.parametrize("num_workers", [0, 2])
def test_a_tuple_sample_batches_to_a_list_and_a_namedtuple_stays_itself(num_workers):
    batch = _batches(plain_containers, num_workers)[1]
    assert type(batch) is list and len(batch) == 6
    image, ints, names, tags, mapping, point = batch
    assert image.dtype == np.float32 and image[:, 0].tolist() == [4, 5, 6, 7]
    assert ints.dtype == np.int64 and ints.tolist() == [4, 5, 6, 7]
    assert type(tags) is list and tags[0].dtype == np.float64 and tags[0].tolist() == [2, 2.5, 3, 3.5]
    assert type(tags[2]) is list and tags[2][0].tolist() == [4, 5, 6, 7]
    assert type(point) is Point and point.x.shape == (4, 2)
    assert type(mapping) is dict and mapping["n"].tolist() == [4, 5, 6, 7]


@pytest.mark.parametrize("num_workers", [0, 2])
def test_non_array_fields_come_as_torch_hands_them_down(num_workers):
    # torch zips the fields of a tuple, list or namedtuple (tuples), and lists a dict's
    # values and the batch itself (lists)
    _, _, names, tags, mapping, point = _batches(plain_containers, num_workers)[0]
    assert names == ("s0", "s1", "s2", "s3")
    assert tags[1] == ("l0", "l1", "l2", "l3") and tags[2][1] == ("t0", "t1", "t2", "t3")
    assert point.name == ("p0", "p1", "p2", "p3")
    assert mapping["s"] == ["d0", "d1", "d2", "d3"]
    assert default_collate(["a", "b"]) == ["a", "b"]


@pytest.mark.parametrize("num_workers", [0, 2])
def test_container_subclasses_are_copied_from_sample_0_as_torch_copies_them(num_workers):
    for k, batch in enumerate(_batches(container_subclasses, num_workers)):
        tagged = batch["tagged"]
        assert type(tagged) is Tagged and tagged.tag == f"tag{4 * k}"  # each batch its own sample 0's
        assert tagged[0].tolist() == [4 * k + j for j in range(4)] and tagged[1] == tuple(f"x{4 * k + j}"
                                                                                          for j in range(4))
        default = batch["default"]
        assert type(default) is collections.defaultdict and default.default_factory is list
        assert default["a"].tolist() == [4 * k + j for j in range(4)] and default["missing"] == []
        ordered = batch["ordered"]
        assert type(ordered) is collections.OrderedDict and list(ordered) == ["b", "a"]
        assert ordered["b"].dtype == np.float64
        assert type(batch["frozen"]) is Frozen and batch["frozen"]["k"].tolist() == [4 * k + j for j in range(4)]
        assert type(batch["tuple_subclass"]) is list


@pytest.mark.pure
def test_a_container_that_cannot_be_copied_falls_back_to_list_or_dict_as_in_torch():
    class NoSetItem(list):
        def __setitem__(self, i, value):
            raise TypeError("read-only")

    class NoUpdate(dict):
        def update(self, *args, **kwargs):
            raise TypeError("read-only")

    batch = default_collate([(NoSetItem([i]), NoUpdate(a=i)) for i in range(3)])
    assert type(batch[0]) is list and batch[0][0].tolist() == [0, 1, 2]
    assert type(batch[1]) is dict and batch[1]["a"].tolist() == [0, 1, 2]


@pytest.mark.pure
def test_batch_size_none_can_turn_tuples_into_lists_as_torchs_default_convert():
    sample = ("a", 1, np.zeros(2), Point(np.ones(1), "p"))
    converted = C.build_local(C.plan_convert(sample, tuple_as_list=True))
    assert type(converted) is list and converted[:2] == ["a", 1] and type(converted[3]) is Point
    assert type(C.build_local(C.plan_convert(sample))) is tuple  # a collate_fn's result is kept as it is


# ---------------------------------------------------------------- without torch: numbers
# The dtypes torch 2.13's default_collate gives (checked against torch below).
NUMBER_CASES = [
    ([0, 0.5], np.float32),                        # torch.tensor: a Python float is the default dtype
    ([0.5, 0], np.float64),                        # collate_float_fn: dtype=torch.float64
    ([1, np.int64(2)], np.int64),
    ([np.int64(1), 2], np.int64),
    ([True, 2], np.int64),
    ([2, True], np.int64),
    ([True, 0.5], np.float32),
    ([np.float32(1), 2.5], np.float32),
    ([2.5, np.float32(1)], np.float64),
    ([np.int32(1), np.int64(2)], np.int64),
    ([np.int32(1), np.float32(2)], np.float32),
    ([np.int8(1), 300], np.int64),
    ([np.uint8(1), -1], np.int64),
    ([np.float16(1), np.int64(2)], np.float16),
    ([1, 2.5, True], np.float32),
    ([1, np.float64(1.5)], np.float64),
    ([np.int64(1), 2.5], np.float32),
    ([np.complex64(1), 2], np.complex64),
    ([np.zeros((), np.int32), True], np.int32),
    ([np.zeros((), np.int32), 1.0], np.float32),
    ([np.zeros((), np.int8), 300], np.int64),
    ([1, 2**40, 0.5], np.float32),
]


@pytest.mark.pure
@pytest.mark.parametrize("values, dtype", NUMBER_CASES, ids=[str(v) for v, _ in NUMBER_CASES])
def test_python_and_numpy_numbers_of_different_types_are_promoted_as_torch_does(values, dtype):
    batch = default_collate(values)
    assert batch.dtype == dtype and batch.shape == (len(values),)
    assert batch.tolist() == [complex(v) if dtype == np.complex64 else float(v) for v in values]


ARRAY_CASES = [
    ((np.float32, np.float64), np.float64),
    ((np.int32, np.float32), np.float32),
    ((np.uint8, np.int8), np.int16),
    ((np.bool_, np.int64), np.int64),
    ((np.int64, np.float16), np.float16),
    ((np.float64, np.complex64), np.complex128),
    ((np.uint16, np.float32), np.float32),
    ((np.float32, np.float32, np.float64, np.int32), np.float64),
]


@pytest.mark.pure
@pytest.mark.parametrize("dtypes, dtype", ARRAY_CASES, ids=[str(d) for d, _ in ARRAY_CASES])
def test_arrays_of_one_shape_and_different_dtypes_are_promoted_as_torch_stack_does(dtypes, dtype):
    samples = [np.full((2, 3), i, d) for i, d in enumerate(dtypes)]
    plan, slot = _plan_and_write(samples)  # the worker's way: into a slot sized by the plan
    batch = L.build(plan.layout, L.slot_destination(slot))
    assert batch.dtype == dtype and batch.shape == (len(dtypes), 2, 3)
    assert batch[:, 0, 0].tolist() == list(range(len(dtypes)))
    assert default_collate(samples).dtype == dtype


@pytest.mark.parametrize("num_workers", [0, 2])
def test_mixed_types_in_a_loader_give_torchs_dtypes_with_and_without_workers(num_workers):
    numbers = _batches(mixed_numbers, num_workers)[1]
    assert {k: v.dtype.name for k, v in numbers.items()} == {
        "int_then_float": "float32", "float_then_int": "float64", "int_then_np_int64": "int64",
        "bool_then_int": "int64", "np_float32_then_float": "float32", "np_int8_then_int": "int64",
        "np_float16_then_np_int64": "float16", "int_then_np_float64": "float64", "bool": "bool"}
    assert numbers["int_then_float"].tolist() == [0, 0.5, 0.5, 0.5]
    assert numbers["np_int8_then_int"].tolist() == [4, 305, 306, 307]
    arrays = _batches(mixed_arrays, num_workers)[0]
    assert [a.dtype.name for a in arrays] == ["float64", "float32", "int16", "int64"]
    assert arrays[0][:, 0].tolist() == [0, 1, 2, 3] and arrays[3][:, 0, 0].tolist() == [0, 1, 0, 1]


@pytest.mark.pure
def test_uniform_batches_keep_the_fast_path_and_mixed_ones_are_planned_at_their_promoted_size(monkeypatch):
    calls = []
    slow = C._plan_stack_slowly
    monkeypatch.setattr(C, "_plan_stack_slowly", lambda s, i: calls.append(1) or slow(s, i))
    C.plan_stack([(np.zeros(64, np.float32), i, float(i)) for i in range(16)])
    assert calls == []
    # a dtype differing in an array of ndim >= 1 is caught while planning, not left to the
    # write: the slot must be sized for the promoted dtype
    plan = C.plan_stack([np.zeros(64, np.float64 if i == 9 else np.float32) for i in range(16)])
    assert calls == [1] and plan.layout.nbytes == 16 * 64 * 8 and plan.layout.leaves[0].dtype == np.float64


@pytest.mark.pure
def test_a_python_int_beyond_int64_in_a_promoted_column_is_named():
    with pytest.raises(CollateError, match=r"field sample: the Python int 9223372036854775808 does not fit in int64"):
        default_collate([np.int8(1), 2**63])


class _Ramp(DeferredArray):
    def __init__(self, dtype):
        self.shape, self.dtype = (2,), np.dtype(dtype)

    def write_into(self, out):
        out[...] = np.arange(2)


@pytest.mark.pure
@pytest.mark.parametrize("bad, pattern", [
    ([np.zeros(3, np.float32), np.zeros(4, np.float64)], r"field sample: position 1 .*shape \(4,\)"),
    ([(1, 2), [1, 2]], r"field sample: position 1 .* has a list of length 2, expected a tuple"),
    ([{"n": 1}, {"n": "1"}], r"field sample\['n'\]: position 1 .* has a str, expected a Python int"),
    ([np.int64(1), "2"], r"field sample: position 1 .* has a str, expected an array of shape \(\)"),
    ([np.zeros(3, np.uint64), np.zeros(3, np.int64)],
     r"position 1 .*dtype int64, expected a value of a type that promotes with uint64.*no common type for uint64 and int64"),
    ([0.5, np.complex64(1)], r"position 1 .* has an array of shape \(\) and dtype complex64, expected a real number"),
    ([np.zeros(3, "<f4"), np.zeros(3, ">f8")], r"position 1 .*dtype >f8"),
    ([np.zeros(2, "U2"), np.zeros(2, "U3")], r"position 1 .*dtype <U3"),
    ([_Ramp(np.float32), _Ramp(np.float64)], r"position 1 .* has a deferred array of shape \(2,\) and dtype float64"),
    ([_Ramp(np.float32), np.zeros(2, np.float64)], r"position 1 .*dtype float64, expected an array of shape"),
])
def test_real_mismatches_stay_collate_errors(bad, pattern):
    with pytest.raises(CollateError, match=pattern):
        default_collate(bad)
    with pytest.raises(CollateError, match=pattern):
        _plan_and_write(bad)


@pytest.mark.pure
def test_a_rowwise_batch_refuses_a_changed_type_with_what_to_do():
    # Large samples are written into the slot as they arrive (rowwise.py): sample 0 fixes the dtype.
    samples = [{"image": np.zeros((256, 256), np.float64 if i == 2 else np.float32), "label": i} for i in range(4)]
    batch = RowwiseBatch(samples[0], [10, 11, 12, 13])
    with pytest.raises(RowwiseTypeMismatch, match=r"field sample\['image'\]: dataset index 12 \(position 2 in "
                                                     r"the batch\) has an array .*float64.* give every sample the "
                                                     r"same dtype"):
        batch.write(L.slot_destination(np.zeros(batch.nbytes, np.uint8)), iter(samples[1:]))
    assert issubclass(RowwiseTypeMismatch, CollateError)


def _plan_and_write(samples):
    plan = C.plan_stack(samples)
    slot = np.zeros(plan.layout.nbytes + L.ALIGN, np.uint8)
    C.write(plan, L.slot_destination(slot))
    return plan, slot


# ---------------------------------------------------------------- side by side with torch
_TORCH_SHARED = ["bool", "uint8", "int8", "int16", "int32", "int64", "uint16", "uint32", "uint64",
                 "float16", "float32", "float64", "complex64", "complex128"]


@pytest.mark.pure
@pytest.mark.torch
@needs_torch
def test_promote_types_is_torchs_for_every_pair_of_shared_dtypes():
    import torch
    for a, b in itertools.product(_TORCH_SHARED, repeat=2):
        try:
            want = np.dtype(str(torch.promote_types(getattr(torch, a), getattr(torch, b))).removeprefix("torch."))
        except RuntimeError:
            want = None
        assert promote_types(np.dtype(a), np.dtype(b)) == want, (a, b)


@pytest.mark.pure
@pytest.mark.torch
@needs_torch
@pytest.mark.filterwarnings("ignore:Creating a tensor from a list of numpy.ndarrays:UserWarning")
@pytest.mark.parametrize("values", [v for v, _ in NUMBER_CASES] + [[np.int8(1), 2**40], [np.uint8(3), np.int8(-1)]],
                         ids=[str(v) for v, _ in NUMBER_CASES] + ["int8 then 2**40", "uint8 then int8"])
def test_default_collate_of_numbers_matches_torchs(values):
    from torch.utils.data import default_collate as torch_collate
    want = torch_collate(values)
    got = default_collate(values)
    assert got.dtype == want.numpy().dtype and got.tolist() == want.tolist()


_REFERENCE: dict = {}


def _torch_batches(make):
    from torch.utils.data import DataLoader as TorchLoader
    if make not in _REFERENCE:
        _REFERENCE[make] = list(TorchLoader(Samples(make), batch_size=4, num_workers=0))
    return _REFERENCE[make]


def assert_same_batch(got, want, output, path="batch"):
    """``got`` (shmload's) has ``want``'s (torch's) structure, types, dtypes and values."""
    import torch
    if isinstance(want, torch.Tensor):
        assert isinstance(got, torch.Tensor if output == "torch" else np.ndarray), path
        dtype = got.dtype if output == "torch" else torch.from_numpy(np.empty(0, got.dtype)).dtype
        assert dtype == want.dtype and tuple(got.shape) == tuple(want.shape), (path, got.dtype, want.dtype)
        np.testing.assert_array_equal(np.asarray(got), want.numpy(), err_msg=path)
        return
    assert type(got) is type(want), (path, type(got), type(want))
    if isinstance(want, Mapping):
        assert list(got) == list(want), path
        assert getattr(got, "default_factory", None) is getattr(want, "default_factory", None), path
        for key in want:
            assert_same_batch(got[key], want[key], output, f"{path}[{key!r}]")
    elif isinstance(want, (list, tuple)):
        assert len(got) == len(want) and getattr(got, "__dict__", None) == getattr(want, "__dict__", None), path
        for i, (g, w) in enumerate(zip(got, want)):
            assert_same_batch(g, w, output, f"{path}[{i}]")
    else:
        assert got == want, path


@pytest.mark.torch
@needs_torch
@pytest.mark.parametrize("output", ["numpy", "torch"])
@pytest.mark.parametrize("num_workers", [0, 2])
@pytest.mark.parametrize("make", [plain_containers, container_subclasses, mixed_numbers, mixed_arrays, mixed_tensors],
                         ids=lambda f: f.__name__)
def test_batches_match_torchs_dataloader(make, num_workers, output):
    want = _torch_batches(make)
    got = _batches(make, num_workers, output)
    assert len(got) == len(want)
    for g, w in zip(got, want):
        assert_same_batch(g, w, output)
