"""Batch layout and default collate, tested as internals (``shmload._batching.layout``
and ``collate``): pure, no processes."""

import collections
import collections.abc
from typing import NamedTuple

import numpy as np
import pytest

from shmload import CollateError, default_collate
from shmload._batching import collate as C
from shmload._batching import layout as L

from .helpers import Pair

pytestmark = pytest.mark.pure


def test_arrays_are_stacked_and_scalars_become_1d_arrays():
    samples = [(np.full((2, 3), i, np.float32), i, float(i) / 2, bool(i % 2)) for i in range(4)]
    images, ints, floats, flags = default_collate(samples)
    assert images.shape == (4, 2, 3) and images.dtype == np.float32
    assert images[:, 0, 0].tolist() == [0, 1, 2, 3]
    assert ints.dtype == np.int64 and ints.tolist() == [0, 1, 2, 3]
    assert floats.dtype == np.float64 and floats.tolist() == [0, 0.5, 1, 1.5]
    assert flags.dtype == np.bool_ and flags.tolist() == [False, True, False, True]


def test_structure_mirrors_the_sample():
    samples = [{"pair": Pair(np.zeros(2) + i, i), "tags": [i, "t"], "name": f"n{i}", "none": None}
               for i in range(3)]
    batch = default_collate(samples)
    assert list(batch) == ["pair", "tags", "name", "none"]
    assert isinstance(batch["pair"], Pair)
    assert batch["pair"].image.shape == (3, 2)
    assert batch["pair"].label.tolist() == [0, 1, 2]
    assert isinstance(batch["tags"], list) and batch["tags"][0].tolist() == [0, 1, 2]
    assert batch["tags"][1] == ("t", "t", "t")  # as torch's default_collate: a field of a list sample is zipped
    assert batch["name"] == ["n0", "n1", "n2"]
    assert batch["none"] == [None, None, None]


def test_numpy_scalars_keep_their_dtype():
    batch = default_collate([np.int16(i) for i in range(3)])
    assert batch.dtype == np.int16 and batch.tolist() == [0, 1, 2]


def test_ordered_dict_type_is_kept():
    batch = default_collate([collections.OrderedDict(a=1, b=2)] * 2)
    assert type(batch) is collections.OrderedDict and batch["b"].tolist() == [2, 2]


def plan_and_write(samples, indices=None):
    """What a worker does with a batch: plan it, then write it into a slot. Some checks of
    the fast path happen in the write (see layout._transpose), so errors are checked here."""
    plan = C.plan_stack(samples, indices)
    slot = np.zeros(plan.layout.nbytes + L.ALIGN, np.uint8)
    C.write(plan, L.slot_destination(slot))
    return plan, slot


def test_shape_mismatch_names_field_index_and_expectation():
    samples = [{"image": np.zeros((3, 4))}, {"image": np.zeros((3, 5))}]
    plan_error = r"field sample\['image'\]: dataset index 11 \(position 1 in the batch\) has an array of shape " \
                 r"\(3, 5\).*expected an array of shape \(3, 4\) and dtype float64 like dataset index 10"
    with pytest.raises(CollateError, match=plan_error):
        plan_and_write(samples, [10, 11])
    with pytest.raises(CollateError, match=r"field sample\['image'\]: position 1 in the batch has an array of "
                                           r"shape \(3, 5\).*like position 0 in the batch"):
        default_collate(samples)


def test_dtypes_that_differ_are_promoted_as_torch_stack_promotes():
    batch = default_collate([np.zeros(2, np.int32), np.ones(2, np.int64)])
    assert batch.dtype == np.int64 and batch.tolist() == [[0, 0], [1, 1]]


def test_structure_mismatches_are_named():
    with pytest.raises(CollateError, match=r"field sample: position 1 in the batch has a list of length 3, expected a list of length 2"):
        default_collate([[1, 2], [1, 2, 3]])
    with pytest.raises(CollateError, match=r"keys \['a', 'c'\], expected a mapping with keys \['a', 'b'\]"):
        default_collate([{"a": 1, "b": 2}, {"a": 1, "c": 2}])
    with pytest.raises(CollateError, match=r"sample.label: .* has a str, expected a Python int"):
        default_collate([Pair(np.zeros(1), 1), Pair(np.zeros(1), "1.5")])


def test_object_arrays_are_refused():
    with pytest.raises(CollateError, match="dtype object"):
        default_collate([np.array([None, 1], dtype=object)] * 2)


def test_empty_batch_is_refused():
    with pytest.raises(CollateError, match="empty batch"):
        default_collate([])


def test_slot_layout_is_aligned_and_packed():
    plan = C.plan_stack([(np.zeros(3, np.uint8), np.zeros(5, np.float64))] * 2)
    specs = [leaf for leaf in plan.layout.leaves if type(leaf) is L.ArraySpec]
    assert [s.offset % L.ALIGN for s in specs] == [0, 0]
    assert specs[0].offset == 0 and specs[1].offset == 64
    assert plan.layout.nbytes == 64 + 2 * 5 * 8


def test_write_into_a_buffer_then_build_views_round_trips():
    samples = [{"x": np.arange(6, dtype=np.int32).reshape(2, 3) + i, "y": i, "s": str(i)} for i in range(4)]
    plan = C.plan_stack(samples)
    slot = np.zeros(plan.layout.nbytes + 100, np.uint8)
    C.write(plan, L.slot_destination(slot))
    batch = L.build(plan.layout, L.slot_destination(slot))
    expected = default_collate(samples)
    np.testing.assert_array_equal(batch["x"], expected["x"])
    np.testing.assert_array_equal(batch["y"], expected["y"])
    assert batch["s"] == ["0", "1", "2", "3"]
    assert np.shares_memory(batch["x"], slot)  # views, not copies


def test_convert_mode_keeps_arrays_and_passes_other_leaves_through():
    plan = C.plan_convert({"a": np.ones((2, 2)), "n": 3, "f": 1.5})
    batch = C.build_local(plan)
    assert batch["n"] == 3 and type(batch["n"]) is int and batch["f"] == 1.5
    assert batch["a"].shape == (2, 2)


def test_zero_size_arrays_are_fine():
    batch = default_collate([(np.zeros((0, 3)), np.zeros(2))] * 2)
    assert batch[0].shape == (2, 0, 3) and batch[1].shape == (2, 2)


# The fast path (columns checked whole) must agree with the sample-by-sample reference.
class _Point(NamedTuple):
    x: np.ndarray
    tag: str


class _MyTuple(tuple):
    pass


def _batches_for_fast_path():
    rng = np.random.default_rng(0)
    arr = lambda *shape: rng.random(shape, dtype=np.float32)  # noqa: E731
    return {
        "tuple of array and int": [(arr(3, 2), i) for i in range(5)],
        "dict nested": [{"a": arr(4), "b": {"c": i % 2 == 0, "d": [float(i), "s"]}} for i in range(4)],
        "namedtuple": [_Point(arr(2), f"t{i}") for i in range(3)],
        "0-d arrays": [np.array(i, dtype=np.int16) for i in range(6)],
        "numpy scalars (slow path)": [np.float32(i) for i in range(4)],
        "tuple subclass (slow path)": [_MyTuple((arr(2), i)) for i in range(3)],
        "zero-size arrays": [arr(0, 3) for _ in range(3)],
        "list samples": [[arr(2, 2), i, None] for i in range(4)],
        "dict key order differs": [{"a": 1, "b": 2.0}, {"b": 3.0, "a": 4}],
        "non-contiguous arrays": [arr(4, 6)[:, ::2] for _ in range(3)],
    }


@pytest.mark.parametrize("name", list(_batches_for_fast_path()))
def test_fast_path_plans_and_writes_exactly_what_the_reference_does(name):
    samples = _batches_for_fast_path()[name]
    fast, slow = C.plan_stack(samples), C._plan_stack_slowly(samples, None)
    assert fast.layout == slow.layout
    outputs = []
    for plan in (fast, slow):
        buf = np.full(plan.layout.nbytes + 64, 7, np.uint8)
        C.write(plan, L.slot_destination(buf))
        outputs.append(buf)
    np.testing.assert_array_equal(outputs[0], outputs[1])
    expected = C.build_local(slow)
    got = L.build(fast.layout, L.slot_destination(outputs[0]))
    assert repr(got) == repr(expected)


@pytest.mark.parametrize("bad, pattern", [
    ([(np.zeros(3), 1), (np.zeros(4), 2)], r"field sample\[0\]: dataset index 1 .*shape \(4,\)"),
    ([(np.zeros(3, np.uint64), 1), (np.zeros(3, np.int64), 2)], r"field sample\[0\]: dataset index 1 .*dtype int64"),
    ([(np.zeros(3), 1), (np.zeros(3), "2.5")], r"field sample\[1\]: dataset index 1 \(position 1 in the batch\) has a str"),
    ([(np.zeros(3), 1), [np.zeros(3), 2]], r"field sample: dataset index 1 \(position 1 in the batch\) has a list of length 2, expected a tuple"),
    ([{"a": 1}, {"b": 1}], r"field sample: dataset index 1 \(position 1 in the batch\) has a dict with keys \['b'\]"),
    ([(np.zeros(3), 1), (np.zeros(3), None)], r"field sample\[1\]: dataset index 1 \(position 1 in the batch\) has a NoneType"),
    # left to the write's concatenate by the fast path: same first dimension, other differences
    ([np.zeros(3), np.zeros((3, 1))], r"field sample: dataset index 1 .*shape \(3, 1\).*expected .*shape \(3,\)"),
    ([np.zeros(3, "<f4"), np.zeros(3, ">f4")], r"field sample: dataset index 1 .*dtype >f4"),
    ([np.zeros((2, 3)), np.zeros((2, 4))], r"field sample: dataset index 1 .*shape \(2, 4\)"),
    # left to the write's conversion: an int outside int64
    ([(np.zeros(3), 1), (np.zeros(3), 2**63)], r"field sample\[1\]: the Python int 9223372036854775808 does not fit"),
    ([(np.zeros(3), -2**63 - 1), (np.zeros(3), 1)], r"field sample\[1\]: the Python int -9223372036854775809 does"),
])
def test_mismatches_get_the_reference_error_whichever_path_runs(bad, pattern):
    with pytest.raises(CollateError, match=pattern):
        plan_and_write(bad, [0, 1])
    with pytest.raises(CollateError, match=pattern.split(":")[0]):  # no indices: positions only
        default_collate(bad)


def test_a_write_failing_for_another_reason_keeps_its_own_error():
    plan = C.plan_stack([np.zeros(3), np.zeros(3)])
    with pytest.raises(ValueError, match="could not broadcast|output array|shape"):
        C.write(plan, lambda spec: np.zeros(5))  # a destination of the wrong size


def test_common_batches_take_the_fast_path_and_unusual_ones_the_reference(monkeypatch):
    calls = []
    slow = C._plan_stack_slowly
    monkeypatch.setattr(C, "_plan_stack_slowly", lambda s, i: calls.append(1) or slow(s, i))
    took_slow_path = {}
    for name, samples in _batches_for_fast_path().items():
        calls.clear()
        C.plan_stack(samples)
        took_slow_path[name] = bool(calls)
    assert [n for n, slow_ in took_slow_path.items() if slow_] == ["numpy scalars (slow path)",
                                                                  "tuple subclass (slow path)"]


# ---------------------------------------------------------------- a worker's kept slot views
class _Ref(NamedTuple):  # what SlotViews reads of a messages.SlotRef
    segment: int
    offset: int
    capacity: int


def _tiny_batch(start):
    return [(np.arange(4, dtype=np.float32) + i, i) for i in range(start, start + 8)]


def test_slot_views_are_kept_for_a_recurring_layout_and_write_the_same_bytes():
    plans = C.StackPlans()
    plan = plans.plan(_tiny_batch(0), None)
    mapping = np.zeros(4 * 4096, np.uint8)
    views, ref = L.SlotViews(), _Ref(0, 4096, 4096)
    first = views.destination(ref, mapping, plan.layout, recur=True)
    arrays = [first(spec) for spec in plan.layout.leaves]
    again = views.destination(ref, mapping, plan.layout, recur=True)
    assert all(a is b for a, b in zip(arrays, (again(spec) for spec in plan.layout.leaves)))
    for start in (0, 8, 16):  # later batches of the structure, through the kept views
        plan = plans.plan(_tiny_batch(start), None)
        C.write(plan, views.destination(ref, mapping, plan.layout, plans.holds(plan.layout)))
        batch = L.build(plan.layout, L.slot_destination(mapping[4096:8192]))
        assert batch[0].tolist() == [[i + j for j in range(4)] for i in range(start, start + 8)]
        assert batch[1].tolist() == list(range(start, start + 8))
    assert not mapping[:4096].any() and not mapping[8192:].any()  # nothing outside the slot


def test_slot_views_of_another_layout_or_slot_are_made_afresh():
    plans = C.StackPlans()
    plan = plans.plan(_tiny_batch(0), None)
    mapping = np.zeros(3 * 4096, np.uint8)
    views = L.SlotViews()
    a = views.destination(_Ref(0, 0, 4096), mapping, plan.layout, True)(plan.layout.leaves[0])
    b = views.destination(_Ref(0, 4096, 4096), mapping, plan.layout, True)(plan.layout.leaves[0])
    assert a is not b and b.ctypes.data - a.ctypes.data == 4096
    other = C.plan_stack([(np.zeros(6, np.float64), i) for i in range(8)], None)
    c = views.destination(_Ref(0, 0, 4096), mapping, other.layout, True)(other.layout.leaves[0])
    assert c.dtype == np.float64 and c.shape == (8, 6)
    fresh = views.destination(_Ref(0, 0, 4096), mapping, plan.layout, False)  # not kept: made each time
    assert fresh(plan.layout.leaves[0]) is not fresh(plan.layout.leaves[0])


def test_forgetting_a_segment_lets_its_mapping_close():
    import mmap
    plans = C.StackPlans()
    plan = plans.plan(_tiny_batch(0), None)
    views = L.SlotViews()
    mm = [mmap.mmap(-1, 8192) for _ in range(2)]
    arrays = [np.frombuffer(m, np.uint8) for m in mm]
    for seg in (0, 1):
        views.destination(_Ref(seg, 0, 4096), arrays[seg], plan.layout, True)
    del arrays
    with pytest.raises(BufferError):  # the kept views export the mapping
        mm[0].close()
    views.forget(0)
    mm[0].close()
    with pytest.raises(BufferError):
        mm[1].close()
    views.forget()
    mm[1].close()


def test_slot_views_keep_at_most_SLOTS_slots():
    plans = C.StackPlans()
    plan = plans.plan(_tiny_batch(0), None)
    views = L.SlotViews()
    views.SLOTS = 3
    mapping = np.zeros(5 * 4096, np.uint8)
    spec = plan.layout.leaves[0]
    made = [views.destination(_Ref(0, k * 4096, 4096), mapping, plan.layout, True) for k in range(5)]
    assert [m(spec) is m(spec) for m in made] == [True, True, True, False, False]  # the last two: fresh each time
    again = views.destination(_Ref(0, 0, 4096), mapping, plan.layout, True)
    assert again(spec) is made[0](spec)  # a kept slot still reuses its views


def _same_batch(a, b):
    """Equal containers (type included) holding arrays of equal shape, dtype, address and
    base, and equal other values."""
    assert type(a) is type(b)
    if isinstance(a, np.ndarray):
        assert (a.shape, a.dtype, a.ctypes.data, a.strides, a.base is None) == \
            (b.shape, b.dtype, b.ctypes.data, b.strides, b.base is None)
        assert a.base is b.base and a.flags.writeable == b.flags.writeable
    elif isinstance(a, collections.abc.Mapping):
        assert list(a) == list(b)
        for k in a:
            _same_batch(a[k], b[k])
    elif isinstance(a, (list, tuple)):
        assert len(a) == len(b)
        for x, y in zip(a, b):
            _same_batch(x, y)
    else:
        assert a == b


@pytest.mark.parametrize("name", list(_batches_for_fast_path()) + ["defaultdict", "tuple of one array", "UserDict"])
def test_views_from_a_recipe_are_the_views_build_makes(name):
    rng = np.random.default_rng(1)
    extra = {
        "defaultdict": [collections.defaultdict(int, a=rng.random(3), b=i) for i in range(3)],
        "tuple of one array": [(rng.random((2, 2)),) for _ in range(4)],
        "UserDict": [collections.UserDict(x=np.arange(3) + i) for i in range(2)],
    }
    samples = extra[name] if name in extra else _batches_for_fast_path()[name]
    layout = C.plan_stack(samples).layout
    owner = np.frombuffer(bytearray(layout.nbytes + 64), np.uint8)
    for _ in range(2):  # the recipe made, then reused
        _same_batch(L.views_in(layout, owner), L.build(layout, L.slot_destination(owner)))
    wrapped = L.views_in(layout, owner, wrap=lambda a: ("wrapped", a.shape))
    expected = L.build(layout, lambda spec: ("wrapped", L.slot_destination(owner)(spec).shape))
    assert wrapped == expected


def test_recipes_are_kept_per_layout_object_and_bounded():
    owner = np.zeros(4096, np.uint8)
    for n in range(L.RECIPES_KEPT * 2):  # layouts made and dropped: ids may be reused by the next
        layout = C.plan_stack([np.arange(n + 1, dtype=np.int32)] * 2).layout
        assert L.views_in(layout, owner)[1].tolist() == [0] * (n + 1)
        assert len(L._recipes) <= L.RECIPES_KEPT
