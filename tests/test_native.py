"""The compiled core (shmload/_core/_native.c) against pure Python: the same batches,
bit for bit, and the same errors, word for word (NOTE at the top of _native.c). Each
case runs the default collate twice, once with the compiled core and once without
(``collate.native`` set to None), through both the first plan of a structure and the
cached plan of a later batch; hypothesis draws the structures. Then the compiled
functions' own promises: they decline what they do not handle, never write past the
destination, and hold no reference after they return. Tests of internals, in one
process (pure)."""

from __future__ import annotations

import gc
import os
import subprocess
import sys
from collections import OrderedDict, namedtuple

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import shmload
from shmload._batching import collate
from shmload._batching.collate import StackPlans, build_local
from shmload._core import native as native_mod

from .helpers import assert_holds_nothing

pytestmark = [pytest.mark.timeout(120)]
pure = pytest.mark.pure  # (all but the one that starts an interpreter)
needs_core = pytest.mark.skipif(native_mod.native is None, reason=f"no compiled core: {native_mod.DESCRIPTION}")
core = native_mod.native

Point = namedtuple("Point", "x y")


class _Tens(namedtuple("_Tens", "x y")):
    """Python reads a sample's fields by iterating it, as torch's zip(*batch) does."""

    def __iter__(self):
        return iter((self.x * 10, self.y))


class _OneSided:
    """A key equal to another only when asked from the later sample's side: Python
    compares the first sample's keys with each sample's, a dict lookup the other way."""

    def __init__(self, name, late):
        self.name, self.late = name, late

    def __hash__(self):
        return hash(self.name)

    def __eq__(self, other):
        return self is other or (self.late and isinstance(other, _OneSided) and other.name == self.name)

    def __repr__(self):
        return f"Key({self.name!r})"


# ---------------------------------------------------------------- running both ways
def _outcome(fn):
    try:
        return ("ok", fn())
    except Exception as exc:  # the error itself is what is compared
        return ("error", type(exc), str(exc))


def _flatten(batch):
    """A batch as comparable leaves: arrays as (dtype, shape, bytes), containers by type."""
    if isinstance(batch, np.ndarray):
        return ("array", batch.dtype.str, batch.shape, batch.tobytes())
    if isinstance(batch, dict):
        return (type(batch), tuple((k, _flatten(v)) for k, v in batch.items()))
    if isinstance(batch, (list, tuple)):
        return (type(batch), tuple(_flatten(v) for v in batch))
    return ("object", type(batch), repr(batch))


def _collates(batches):
    """Each batch through the default collate, and through one StackPlans (so a later
    batch of the same size meets the cached plan), built into fresh arrays."""
    plans = StackPlans()
    out = []
    for batch in batches:
        out.append(_outcome(lambda: _flatten(shmload.default_collate(batch))))
        out.append(_outcome(lambda: _flatten(build_local(plans.plan(batch, list(range(len(batch))))))))
    return out


def both_ways(monkeypatch, batches):
    compiled = _collates(batches)
    with monkeypatch.context() as m:
        m.setattr(collate, "native", None)
        python = _collates(batches)
    return compiled, python


def _same_both_ways(monkeypatch, batches):
    compiled, python = both_ways(monkeypatch, batches)
    assert compiled == python
    return compiled


# ---------------------------------------------------------------- chosen cases
def _rows(n, dtype=np.float32, shape=(4,)):
    return [np.arange(np.prod(shape), dtype=dtype).reshape(shape) + i for i in range(n)]


CASES = {
    "tuple of array and int": lambda: [[(r, i) for i, r in enumerate(_rows(6))]] * 2,
    "dict of arrays, floats, bools, strings": lambda: [[{"a": r, "f": i / 3, "b": i % 2 == 0, "s": f"s{i}"}
                                                        for i, r in enumerate(_rows(5, np.int16, (2, 3)))]] * 2,
    "nested list and namedtuple": lambda: [[[Point(r, i), [r * 2, float(i)]] for i, r in enumerate(_rows(4))]] * 2,
    "0-d arrays and empty arrays": lambda: [[(np.float64(i) * np.ones(()), np.zeros((0, 3)), i)
                                             for i in range(5)]] * 2,
    "a shape that differs in a later batch": lambda: [[(r,) for r in _rows(4)], [(r,) for r in _rows(4, shape=(5,))]],
    "a shape that differs inside a batch": lambda: [[(r,) for r in _rows(3)] + [(np.zeros(5, np.float32),)]] * 2,
    "a dtype that differs (promoted)": lambda: [[(r,) for r in _rows(3)] + [(np.zeros(4, np.float64),)]] * 2,
    "an int out of int64": lambda: [[(i,) for i in range(3)], [(0,), (2**70,), (1,)]],
    "an int among floats": lambda: [[(float(i),) for i in range(3)], [(0.5,), (2,), (1.5,)]],
    "a non-contiguous row": lambda: [[(r,) for r in _rows(3)], [(r,) for r in _rows(2)] + [(np.arange(8.0, dtype=np.float32)[::2],)]],
    "a big-endian array": lambda: [[(r.astype(">f4"),) for r in _rows(3)]] * 2,
    "a missing key": lambda: [[{"a": 1, "b": 2}] * 3, [{"a": 1, "b": 2}, {"a": 1, "c": 2}, {"a": 1, "b": 2}]],
    "an OrderedDict": lambda: [[OrderedDict(a=r) for r in _rows(3)]] * 2,
    "a tuple of another length": lambda: [[(1, 2)] * 3, [(1, 2), (1, 2, 3), (1, 2)]],
    "None where an array was": lambda: [[(r,) for r in _rows(3)], [(None,), (None,), (None,)]],
    "an array subclass": lambda: [[(r,) for r in _rows(3)], [(np.ma.masked_array(r),) for r in _rows(3)]],
    "a big batch of big rows": lambda: [[(r,) for r in _rows(64, np.uint8, (256, 256))]] * 2,
    "object arrays": lambda: [[(np.array([None, 1], dtype=object),) for _ in range(3)]] * 2,
    "a namedtuple that overrides __iter__": lambda: [[_Tens(i, float(i)) for i in range(3)]] * 2,
    "dict keys that compare equal from one side only": lambda: [[{_OneSided("a", False): 1.0},
                                                                {_OneSided("a", True): 2.0}]] * 2,
}


@pure
@pytest.mark.parametrize("case", sorted(CASES))
def test_the_same_batches_and_errors_both_ways(monkeypatch, case):
    outcomes = _same_both_ways(monkeypatch, CASES[case]())
    assert outcomes  # (and the case means something: the list below checks which raise)
    if case in ("a shape that differs inside a batch", "an int out of int64", "a tuple of another length",
                "a missing key", "object arrays", "dict keys that compare equal from one side only"):
        assert any(o[0] == "error" for o in outcomes), outcomes
    else:
        assert all(o[0] == "ok" for o in outcomes), [o for o in outcomes if o[0] != "ok"]


@pure
@needs_core
def test_the_compiled_core_takes_the_common_structures():
    """Declining everything would pass the tests above: the common cases must be taken."""
    rows = _rows(8)
    kinds = [("array", (4,), np.dtype(np.float32)), ("scalar", int)]
    from shmload._batching.layout import Leaf, Seq

    node = Seq("list", tuple, (Leaf(0), Leaf(1)))
    columns = [None, None]
    assert core.transpose(node, [(r, i) for i, r in enumerate(rows)], kinds, columns) is True
    assert columns[0] == rows and columns[1] == list(range(8))
    out = np.empty((8, 4), np.float32)
    assert core.copy_rows(out, rows) is True and np.array_equal(out, np.stack(rows))
    labels = np.empty(8, np.int64)
    assert core.fill_numbers(labels, list(range(8))) is True and labels.tolist() == list(range(8))


# ---------------------------------------------------------------- drawn cases
_DTYPES = [np.bool_, np.int8, np.uint8, np.int16, np.int32, np.int64, np.uint64, np.float16, np.float32,
           np.float64, np.complex64]


@st.composite
def leaves(draw):
    kind = draw(st.sampled_from(["array", "int", "float", "bool", "str", "none"]))
    if kind == "array":
        dtype = draw(st.sampled_from(_DTYPES))
        shape = tuple(draw(st.lists(st.integers(0, 4), max_size=3)))
        return ("array", np.dtype(dtype), shape)
    return (kind,)


def structures():
    return st.recursive(leaves(), lambda inner: st.one_of(
        st.tuples(st.just("tuple"), st.lists(inner, min_size=1, max_size=3)),
        st.tuples(st.just("list"), st.lists(inner, min_size=1, max_size=3)),
        st.tuples(st.just("dict"), st.dictionaries(st.sampled_from("abcd"), inner, min_size=1, max_size=3))),
        max_leaves=5)


def _value(spec, seed, bad):
    """A sample's value for ``spec``; ``bad`` (0: none) changes it as a dataset's bug would."""
    tag = spec[0]
    if tag == "array":
        dtype, shape = spec[1], spec[2]
        if bad == 1:
            shape = shape + (1,)
        elif bad == 2:
            dtype = np.dtype(np.float64) if dtype != np.float64 else np.dtype(np.int32)
        a = (np.arange(int(np.prod(shape)) or 0) * 7 + seed).astype(dtype).reshape(shape)
        if bad == 3 and a.ndim and a.shape[0] > 1:
            a = np.repeat(a, 2, axis=0)[::2]  # the same values, not C-contiguous
        return a
    if tag == "int":
        return [seed, 2**65, 1.5, "x"][bad] if bad < 4 else seed
    if tag == "float":
        return [seed / 7, -0.0, 3, float("nan")][bad] if bad < 4 else seed / 7
    if tag == "bool":
        return [seed % 2 == 0, 1, True, None][bad] if bad < 4 else True
    if tag == "str":
        return [f"s{seed}", b"b", 3, "t"][bad] if bad < 4 else "s"
    if tag == "none":
        return [None, 0, None, "x"][bad] if bad < 4 else None
    children = spec[1]
    if tag == "dict":
        d = {k: _value(v, seed, 0) for k, v in children.items()}
        if bad == 1:
            d["z"] = 0
        return d
    items = [_value(v, seed, 0) for v in children]
    if bad == 1:
        items.append(0)
    return tuple(items) if tag == "tuple" else items


def _bad_sample(spec, seed, bad):
    """A sample with one leaf (the first one found) made bad."""
    tag = spec[0]
    if tag in ("tuple", "list"):
        children = spec[1]
        items = [_bad_sample(children[0], seed, bad)] + [_value(v, seed, 0) for v in children[1:]]
        return tuple(items) if tag == "tuple" else items
    if tag == "dict":
        keys = list(spec[1])
        return {k: (_bad_sample(v, seed, bad) if k == keys[0] else _value(v, seed, 0)) for k, v in spec[1].items()}
    return _value(spec, seed, bad)


@pure
# (.ci/valgrind-native draws fewer: under valgrind each costs some fifty times as much)
@settings(max_examples=int(os.environ.get("SHMLOAD_DRAWN_EXAMPLES", "150")), deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(spec=structures(), n=st.integers(1, 6), bad_at=st.integers(-1, 5), bad=st.integers(0, 4))
def test_drawn_structures_give_the_same_batches_and_errors_both_ways(monkeypatch, spec, n, bad_at, bad):
    good = [_value(spec, seed, 0) for seed in range(n)]
    later = [(_bad_sample(spec, seed, bad) if seed == bad_at else _value(spec, seed + 10, 0)) for seed in range(n)]
    _same_both_ways(monkeypatch, [good, later, good])


# ---------------------------------------------------------------- the compiled functions' own promises
@pure
@needs_core
def test_copy_rows_declines_what_does_not_fill_the_destination_exactly():
    rows = _rows(4)
    sentinel = np.full((4, 4), -1, np.float32)
    for out, given_rows in [
        (np.empty((5, 4), np.float32), rows),  # more rows in the destination
        (np.empty((3, 4), np.float32), rows),  # fewer
        (np.empty((4, 5), np.float32), rows),  # another row shape
        (np.empty((4, 4), np.float64), rows),  # another dtype
        (np.empty((4, 8), np.float32)[:, ::2], rows),  # a destination not C-contiguous
        (np.empty((4, 4), np.float32), rows[:3] + [np.arange(8, dtype=np.float32)[::2]]),  # a row not contiguous
        (np.empty((4, 4), np.float32), rows[:3] + [rows[0].view(np.int32)]),  # a row of another dtype
        (np.empty((4, 4), np.float32), rows[:3] + [list(rows[0])]),  # a row that is no ndarray
    ]:
        before = out.copy() if out.flags.c_contiguous else None
        assert core.copy_rows(out, given_rows) is False
        if before is not None:
            assert out.tobytes() == before.tobytes()  # nothing written when declining
    read_only = sentinel.copy()
    read_only.flags.writeable = False
    assert core.copy_rows(read_only, rows) is False


@pure
@needs_core
def test_fill_numbers_declines_other_types_and_ints_out_of_range():
    out = np.zeros(3, np.int64)
    assert core.fill_numbers(out, [1, 2**63, 3]) is False and out.tolist() == [0, 0, 0]
    assert core.fill_numbers(out, [1, True, 3]) is False  # a bool is no int here, as type() says
    assert core.fill_numbers(out, [1, 2]) is False  # a length that does not fill it
    assert core.fill_numbers(np.zeros(3, np.int32), [1, 2, 3]) is False  # only int64, float64, bool
    assert core.fill_numbers(out, [-(2**63), 0, 2**63 - 1]) is True
    assert out.tolist() == [-(2**63), 0, 2**63 - 1]
    floats = np.zeros(2)
    assert core.fill_numbers(floats, [-0.0, float("nan")]) is True
    assert np.signbit(floats[0]) and np.isnan(floats[1])


@pure
@needs_core
def test_the_compiled_functions_hold_no_references():
    from shmload._batching.layout import Leaf, Map, Seq

    rows = _rows(16)
    samples = [{"x": r, "y": (i, "label")} for i, r in enumerate(rows)]
    node = Map(None, ("x", "y"), (Leaf(0), Seq("list", tuple, (Leaf(1), Leaf(2)))))
    kinds = [("array", (4,), np.dtype(np.float32)), ("scalar", int), ("object", True)]
    out, labels = np.empty((16, 4), np.float32), np.empty(16, np.int64)

    def run():
        columns = [None, None, None]
        assert core.transpose(node, samples, kinds, columns)
        assert core.copy_rows(out, columns[0]) and core.fill_numbers(labels, columns[1])
        assert not core.transpose(node, samples[:3] + [{"x": rows[0]}], kinds, [None, None, None])

    run()
    gc.collect()
    counts = [sys.getrefcount(o) for o in [*rows, *samples, node, kinds, out, labels, "label"]]
    objects = len(gc.get_objects())
    for _ in range(2000):
        run()
    gc.collect()
    assert [sys.getrefcount(o) for o in [*rows, *samples, node, kinds, out, labels, "label"]] == counts
    assert len(gc.get_objects()) - objects < 50  # no tracked object left behind per call


@pure
def test_samples_changed_while_they_are_checked_give_what_python_gives(monkeypatch):
    """Python code can run in the middle of the check (an object leaf's class, a key's
    __eq__, another thread) and change the samples: the compiled core reads snapshots,
    as Python's zip() does, so it neither crashes nor sees anything Python does not."""

    def mutating_leaf_batches():
        samples = [["a", 5], ["b", 6]]

        class Lazy:
            @property
            def __class__(self):  # read by the object-leaf check: empties the samples then
                for s in samples:
                    s.clear()
                return Lazy
        for s in samples:
            s[0] = Lazy()
        return [samples]

    outcomes = [_outcome(lambda: _flatten(shmload.default_collate(mutating_leaf_batches()[0])))]
    with monkeypatch.context() as m:
        m.setattr(collate, "native", None)
        python = [_outcome(lambda: _flatten(shmload.default_collate(mutating_leaf_batches()[0])))]
    assert [o[0] for o in outcomes] == [o[0] for o in python] == ["ok"]

    def emptied_by_a_key(native_on):
        batch, armed = [], [False]

        class Key:
            def __init__(self, name):
                self.name = name

            def __hash__(self):
                return hash(self.name)

            def __eq__(self, other):
                if self is not other and armed[0]:
                    batch.clear()  # the caller's own list of samples
                return isinstance(other, Key) and other.name == self.name
        plans = StackPlans()
        batch[:] = [{Key("a"): 1.0} for _ in range(4)]
        plans.plan(batch, [0, 1, 2, 3])
        batch[:] = [{Key("a"): float(i)} for i in range(4)]
        armed[0] = True
        return _outcome(lambda: _flatten(build_local(plans.plan(batch, [0, 1, 2, 3]))))

    compiled = emptied_by_a_key(True)
    with monkeypatch.context() as m:
        m.setattr(collate, "native", None)
        assert emptied_by_a_key(False) == compiled


@pure
@needs_core
@settings(max_examples=int(os.environ.get("SHMLOAD_DRAWN_EXAMPLES", "150")), deadline=None)
@given(values=st.lists(st.integers(-(2 ** 63), 2 ** 63 - 1), max_size=300), offset=st.integers(0, 7))
def test_a_tasks_indices_decode_alike_both_ways(values, offset):
    """wire.py's raw int64 indices, at any alignment in the record: the compiled decoding
    gives the Python one's list and bound, or declines (only for a bound of 2**64)."""
    from shmload._transport import wire

    raw = memoryview(bytes(offset) + np.array(values, np.int64).tobytes())[offset:]
    expected = wire._int64_indices(raw)
    got = core.int64_indices(raw)
    if got is None:
        assert -1 in values  # (read as uint64: 2**64 - 1)
    else:
        assert got == expected and all(type(i) is int for i in got[0]) and type(got[1]) in (int, type(None))


@pure
def test_a_task_decodes_alike_with_and_without_the_compiled_decoding(monkeypatch):
    """decode_to_worker with the compiled function, and without it (pure Python, or a
    compiled core built before the function existed): the same task."""
    from shmload._transport import wire
    from shmload._transport.messages import SlotRef, Task

    loads = ([3, -1, 2], list(range(256)), [2 ** 63 - 1, 0])
    records = [b"".join(map(bytes, wire.encode_task(Task(1, 0, 5, load, SlotRef(0, 64, 4096))))) for load in loads]
    compiled = [wire.decode_to_worker(r) for r in records]
    monkeypatch.setattr(wire, "_int64_indices_c", None)
    assert [wire.decode_to_worker(r) for r in records] == compiled
    assert [t.load for t in compiled] == list(loads) and [t.bound for t in compiled] == [2 ** 64, 256, 2 ** 63]


@pure
@needs_core
def test_a_tasks_indices_decline_a_partial_int64_and_hold_no_references():
    from shmload._transport import wire

    assert core.int64_indices(b"1234567") is None
    with pytest.raises(ValueError, match="multiple of element size"):
        wire._int64_indices(memoryview(b"1234567"))  # (what decode_to_worker then raises either way)
    with pytest.raises(TypeError):
        core.int64_indices([1, 2])
    raw = np.arange(1000, 1256, dtype=np.int64).tobytes()
    declined = np.array([5, -1, 3], np.int64).tobytes()  # (a bound of 2**64)
    assert core.int64_indices(raw) == (list(range(1000, 1256)), 1256) and core.int64_indices(declined) is None

    def run():
        core.int64_indices(raw)
        core.int64_indices(declined)
        core.int64_indices(b"1234567")

    assert_holds_nothing(run, [raw, declined], 2000)


@needs_core
@pure
def test_copy_rows_declines_structured_dtypes_whose_padding_concatenate_leaves_alone():
    dtype = np.dtype({"names": ["a", "b"], "formats": ["u1", "<i4"], "offsets": [0, 4], "itemsize": 8})
    rows = [np.zeros(2, dtype) for _ in range(3)]
    out = np.full((3, 2), 0, dtype)
    assert core.copy_rows(out, rows) is False
    assert core.copy_rows(np.empty((3, 4), np.float32), [np.ones(4, np.float32)] * 3) is True  # (plain: taken)


@needs_core
@pure
def test_copy_rows_declines_a_row_inside_its_own_destination():
    out = np.zeros((3, 4), np.float32)
    assert core.copy_rows(out, [out[0], np.ones(4, np.float32), np.ones(4, np.float32)]) is False


# ---------------------------------------------------------------- which path, and forcing pure Python
@pure
def test_the_api_says_which_path_is_in_use():
    assert shmload.compiled_core() is (native_mod.native is not None)
    loader = shmload.DataLoader(np.arange(8.0), batch_size=4)
    list(loader)
    assert loader.stats().core == ("compiled" if shmload.compiled_core() else "python")
    assert f"{loader.stats().core} core" in str(loader.stats()).splitlines()[0]


def test_shmload_pure_python_forces_the_python_path():
    code = "import shmload; print(shmload.compiled_core())"
    env = dict(os.environ, SHMLOAD_PURE_PYTHON="1")
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=60)
    assert out.stdout.strip() == "False", out.stderr
