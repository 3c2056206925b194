"""Hardening (issue 18): a ``__getitems__`` whose ``Batched`` holds the wrong number of
rows, a dataset error that cannot be printed, malformed loader states, and the error
hierarchy of a shortage of shared memory."""

from __future__ import annotations

import copy
import pickle
import re
import traceback

import numpy as np
import pytest

import shmload
from shmload import Batched, DataLoader, DeferredArray, ShmloadError
from shmload.errors import RemoteError

from .helpers import RangeDataset, StatefulWorkerStreams

TIMEOUT = 30  # seconds, for loaders with workers: a hang fails the test instead of the run


# ---------------------------------------------------------------- __getitems__ and Batched
class Rows(DeferredArray):
    """A deferred [n, 2] int64 array, row r holding the index it stands for."""

    def __init__(self, indices):
        self.indices = list(indices)
        self.shape, self.dtype = (len(self.indices), 2), np.dtype(np.int64)

    def write_into(self, out):
        out[...] = np.repeat(np.array(self.indices, np.int64)[:, None], 2, axis=1)


class BatchedRows(RangeDataset):
    """``__getitems__`` returns ``Batched(..., len(indices))``; for the indices in ``bad``
    the arrays of field ``field`` hold ``extra`` rows more (fewer when negative)."""

    def __init__(self, n, bad=(), field="x", extra=1, deferred=False):
        super().__init__(n)
        self.bad, self.field, self.extra, self.deferred = set(bad), field, extra, deferred

    def __getitems__(self, indices):
        wrong = bool(self.bad & set(indices))
        rows = list(indices) + ([indices[-1]] * self.extra if wrong and self.extra > 0 else [])
        if wrong and self.extra < 0:
            rows = rows[:self.extra]
        x = np.array(rows, np.int64)
        ys = list(indices) if not (wrong and self.field == "y") else rows
        y = Rows(ys) if self.deferred else np.array(ys, np.int64)
        return Batched({"x": x if self.field == "x" else np.array(indices, np.int64), "y": y}, len(indices))


@pytest.mark.parametrize("workers", [0, 2])
def test_a_batched_result_with_more_rows_than_indices_is_refused_as_a_wrong_length_list_is(workers):
    loader = DataLoader(BatchedRows(8, bad={2}), batch_size=2, num_workers=workers,
                        timeout=TIMEOUT if workers else 0)
    with loader:
        it = iter(loader)
        assert next(it)["x"].tolist() == [0, 1]
        with pytest.raises(ShmloadError, match=r"BatchedRows.__getitems__\(\[2, 3\]\) returned a Batched of 2 samples "
                                                r"whose batch\['x'\] has 3 rows \(shape \(3,\)\), expected 2 rows "
                                                r"\(one per index\)"):
            next(it)
        assert [b["x"].tolist() for b in it] == [[4, 5], [6, 7]]  # the iterator goes on
        del it


@pytest.mark.parametrize("workers", [0, 2])
@pytest.mark.parametrize("field,extra,deferred,rows,shape", [
    ("y", 2, False, 4, r"\(4,\)"),      # another field than the first
    ("y", 1, True, 3, r"\(3, 2\)"),     # a DeferredArray leaf: its declared shape
    ("x", -1, False, 1, r"\(1,\)"),     # fewer rows
])
def test_every_array_of_a_batched_result_must_have_one_row_per_index(workers, field, extra, deferred, rows, shape):
    loader = DataLoader(BatchedRows(4, bad={0}, field=field, extra=extra, deferred=deferred), batch_size=2,
                        num_workers=workers, timeout=TIMEOUT if workers else 0)
    with loader:
        it = iter(loader)
        with pytest.raises(ShmloadError, match=rf"returned a Batched of 2 samples whose batch\['{field}'\] has {rows} "
                                                rf"rows \(shape {shape}\), expected 2 rows \(one per index\)"):
            next(it)
        assert next(it)["y"].tolist() == ([[2, 2], [3, 3]] if deferred else [2, 3])
        del it


def test_a_batched_result_is_checked_before_a_collate_fn_sees_its_samples():
    # with a collate_fn the loader hands over Batched.samples(): size rows, the extra one dropped silently
    loader = DataLoader(BatchedRows(4, bad={0}), batch_size=2, collate_fn=lambda samples: len(samples))
    with pytest.raises(ShmloadError, match=r"whose batch\['x'\] has 3 rows"):
        list(loader)


def test_a_batched_result_with_a_0d_array_is_refused():
    class Scalar(RangeDataset):
        def __getitems__(self, indices):
            return Batched((np.arange(len(indices)), np.float32(1.0)), len(indices))

    with pytest.raises(ShmloadError, match=r"Scalar.__getitems__\(\[0, 1\]\) returned a Batched of 2 samples whose "
                                           r"batch\[1\] has no rows \(shape \(\)\), expected 2 rows"):
        list(DataLoader(Scalar(4), batch_size=2))


def test_a_right_batched_result_with_non_array_leaves_is_delivered_as_it_is():
    class Named(RangeDataset):
        def __getitems__(self, indices):
            return Batched({"x": np.array(indices), "name": [f"s{i}" for i in indices], "tag": "batch"}, len(indices))

    assert [(b["x"].tolist(), b["name"], b["tag"]) for b in DataLoader(Named(4), batch_size=2)] == [
        ([0, 1], ["s0", "s1"], "batch"), ([2, 3], ["s2", "s3"], "batch")]


# ---------------------------------------------------------------- exceptions that cannot be printed
class UnprintableError(Exception):
    """An exception whose str() raises (a bug in a user's __str__, a missing attribute)."""

    def __str__(self):
        raise RuntimeError("__str__ is broken")


class UnprintableAndUnreprableError(UnprintableError):
    def __repr__(self):
        raise RuntimeError("__repr__ is broken too")


class UnprintableDataset(RangeDataset):
    def __init__(self, n, bad, exc_type):
        super().__init__(n)
        self.bad, self.exc_type = set(bad), exc_type

    def __getitem__(self, i):
        if i in self.bad:
            raise self.exc_type(f"sample {i}")
        return i


@pytest.mark.parametrize("exc_type", [UnprintableError, UnprintableAndUnreprableError])
def test_an_exception_that_cannot_be_printed_is_raised_at_its_position_and_the_epoch_goes_on(exc_type):
    loader = DataLoader(UnprintableDataset(8, {5}, exc_type), batch_size=2, num_workers=2, timeout=TIMEOUT)
    name = exc_type.__name__
    with loader:
        it = iter(loader)
        assert [next(it).tolist(), next(it).tolist()] == [[0, 1], [2, 3]]
        with pytest.raises(exc_type, match=rf"(?s)^Caught {name} in DataLoader worker process \d while loading "
                                           rf"batch 2 \(dataset indices \[4, 5\]\)\.\nOriginal Traceback.*raise "
                                           rf"self\.exc_type\(f\"sample \{{i\}}\"\).*{name}: <exception str\(\) "
                                           rf"failed>"):
            next(it)
        assert next(it).tolist() == [6, 7]  # the worker lives: no WorkerDiedError
        with pytest.raises(StopIteration):
            next(it)
        del it


def test_an_unprintable_exception_of_a_local_class_is_a_worker_error_naming_it():
    class LocalUnprintable(UnprintableError):  # cannot be pickled by reference
        pass

    loader = DataLoader(UnprintableDataset(6, {2}, LocalUnprintable), batch_size=2, num_workers=2, timeout=TIMEOUT)
    with loader:
        it = iter(loader)
        assert next(it).tolist() == [0, 1]
        with pytest.raises(shmload.WorkerError, match=r"^Caught test_an_unprintable_exception_of_a_local_class_is_a_"
                                                      r"worker_error_naming_it.<locals>.LocalUnprintable in DataLoader "
                                                      r"worker process \d while loading batch 1"):
            next(it)
        assert next(it).tolist() == [4, 5]
        del it


def test_without_workers_the_unprintable_exception_itself_propagates_as_in_torch():
    loader = DataLoader(UnprintableDataset(6, {2}, UnprintableAndUnreprableError), batch_size=2)
    it = iter(loader)
    assert next(it).tolist() == [0, 1]
    with pytest.raises(UnprintableAndUnreprableError) as info:
        next(it)
    assert type(info.value) is UnprintableAndUnreprableError and info.value.args == ("sample 2",)
    assert next(it).tolist() == [4, 5]


def unprintable_init(worker_id):
    raise UnprintableError("init")


def test_an_unprintable_exception_in_worker_init_fn_is_a_start_up_error_with_its_traceback():
    loader = DataLoader(RangeDataset(4), batch_size=2, num_workers=1, worker_init_fn=unprintable_init,
                        timeout=TIMEOUT)
    with loader, pytest.raises(shmload.WorkerStartupError, match=r"(?s)UnprintableError.*in unprintable_init"):
        list(loader)


class UnpicklableTypeMeta(type):
    """Makes a class that pickle refuses: its module claims to be one that does not exist."""

    def __new__(mcs, name, bases, ns):
        ns["__module__"] = "no_such_module_anywhere"
        return super().__new__(mcs, name, bases, ns)


class _NotesRaise(Exception):
    """traceback.format_exception() itself raises for it (Python 3.11)."""

    @property
    def __notes__(self):
        raise RuntimeError("__notes__ is broken")


def _raised(exc):
    try:
        raise exc
    except BaseException as caught:
        return caught


class _StrSubclass(str):
    pass


class _ReturnsStrSubclass(Exception):
    def __str__(self):
        return _StrSubclass("a str of a local subclass")


@pytest.mark.parametrize("exc,type_name,message", [
    (UnprintableError("x"), "UnprintableError", r"<exception str\(\) failed: RuntimeError: __str__ is broken; "
                                                r"its repr: UnprintableError\('x'\)>"),
    (UnprintableAndUnreprableError("x"), "UnprintableAndUnreprableError",
     r"<exception str\(\) failed: RuntimeError: __str__ is broken; repr\(\) failed too>"),
    (UnpicklableTypeMeta("Odd", (ValueError,), {})("odd"), "Odd", r"^odd$"),
    (_NotesRaise("notes"), "_NotesRaise", r"^notes$"),
    (_ReturnsStrSubclass(), "_ReturnsStrSubclass", r"^a str of a local subclass$"),
])
def test_capture_never_raises_and_what_it_captures_always_pickles(exc, type_name, message):
    error = RemoteError.capture(_raised(exc))  # the traceback formatted inside, guarded
    assert error.type_name == type_name and re.search(message, error.message)
    assert all(type(text) is str for text in (error.type_name, error.message, error.traceback))
    assert error.traceback.startswith("Traceback (most recent call last)") and "in _raised" in error.traceback
    assert pickle.loads(pickle.dumps(error)) == error
    rebuilt = error.rebuild("in DataLoader worker process 0 while loading batch 0 (dataset indices [0])")
    assert str(rebuilt).startswith(f"Caught {type_name} in DataLoader worker process 0") and repr(rebuilt)


def test_capture_keeps_a_traceback_text_it_is_given():
    error = RemoteError.capture(_raised(UnprintableError()), "Traceback (most recent call last):\n  given\n")
    assert error.traceback == "Traceback (most recent call last):\n  given\n"
    assert error.message.startswith("<exception str() failed: RuntimeError: __str__ is broken")


def test_a_rebuilt_unprintable_exception_is_its_type_and_prints_the_workers_report():
    error = RemoteError.capture(_raised(UnprintableAndUnreprableError("x")))
    rebuilt = error.rebuild("in DataLoader worker process 1 while loading batch 3 (dataset indices [6, 7])")
    assert isinstance(rebuilt, UnprintableAndUnreprableError)
    assert str(rebuilt).startswith("Caught UnprintableAndUnreprableError in DataLoader worker process 1 while loading "
                                   "batch 3 (dataset indices [6, 7]).\nOriginal Traceback (most recent call last)")
    assert repr(rebuilt).startswith("UnprintableAndUnreprableError('Caught UnprintableAndUnreprableError in")
    assert type(rebuilt).__module__ == __name__ and type(rebuilt).__qualname__ == "UnprintableAndUnreprableError"
    assert "".join(traceback.format_exception(rebuilt)).count("Caught UnprintableAndUnreprableError") == 1


# ---------------------------------------------------------------- malformed loader states
def _map_state():
    loader = DataLoader(RangeDataset(20), batch_size=4, shuffle=True, seed=3)
    it = iter(loader)
    next(it)
    return loader.state_dict()


def _iterable_state():
    loader = DataLoader(StatefulWorkerStreams([10]), batch_size=2, seed=3)
    it = iter(loader)
    next(it)
    return loader.state_dict()


_DELETE = object()


def _changed(state, path, value):
    state = copy.deepcopy(state)
    *parents, last = path
    node = state
    for key in parents:
        node = node[key]
    if value is _DELETE:
        del node[last]
    else:
        node[last] = value
    return state


def _both(path, value, message):
    return [pytest.param(kind, path, value, message, id=f"{kind}-{'.'.join(map(str, path))}-"
                         f"{'deleted' if value is _DELETE else repr(value)}") for kind in ("map", "iterable")]


MALFORMED = [
    *_both(("batching", "drop_last"), _DELETE, r"^load_state_dict: state\['batching'\] has no drop_last: expected "
                                               r"state\['batching'\]\['drop_last'\] \(a bool"),
    *_both(("batching", "batch_size"), _DELETE, r"state\['batching'\] has no batch_size: expected "
                                                r"state\['batching'\]\['batch_size'\] \(a positive int or None"),
    *_both(("batching", "drop_last"), "no", r"^load_state_dict: state\['batching'\]\['drop_last'\] is 'no' \(a str\), "
                                            r"expected a bool"),
    *_both(("batching", "drop_last"), 0, r"state\['batching'\]\['drop_last'\] is 0 \(an int\), expected a bool"),
    *_both(("batching", "batch_size"), "4", r"state\['batching'\]\['batch_size'\] is '4' \(a str\), expected a "
                                            r"positive int or None"),
    *_both(("batching", "batch_size"), 0, r"state\['batching'\]\['batch_size'\] is 0 \(an int\), expected a positive "
                                          r"int or None"),
    *_both(("batching", "shuffle"), True, r"state\['batching'\] has an unexpected key 'shuffle': expected only "
                                          r"'batch_size' and 'drop_last'"),
    *_both(("batching",), [4, False], r"state\['batching'\] is \[4, False\] \(a list\), expected a dict with "
                                      r"'batch_size' and 'drop_last'"),
    *_both(("batching",), _DELETE, r"^load_state_dict: the state has no batching: expected state\['batching'\] "
                                   r"\(a dict with 'batch_size' and 'drop_last'"),
    *_both(("epoch",), "0", r"state\['epoch'\] is '0' \(a str\), expected a non-negative int"),
    *_both(("epoch",), -1, r"state\['epoch'\] is -1 \(an int\), expected a non-negative int"),
    *_both(("epoch",), True, r"state\['epoch'\] is True \(a bool\), expected a non-negative int"),
    *_both(("seed",), 1.5, r"state\['seed'\] is 1.5 \(a float\), expected a non-negative int"),
    *_both(("seed",), None, r"state\['seed'\] is None, expected a non-negative int"),
    pytest.param("map", ("next_batch",), None, r"state\['next_batch'\] is None, expected a "
                                               r"non-negative int", id="map-next_batch-None"),
    pytest.param("map", ("next_batch",), _DELETE, r"the state has no next_batch: expected state\['next_batch'\] "
                                                  r"\(a non-negative int", id="map-next_batch-deleted"),
    pytest.param("map", ("delivered_beyond",), 3, r"state\['delivered_beyond'\] is 3 \(an int\), expected a list of "
                                                  r"non-negative ints", id="map-delivered_beyond-3"),
    pytest.param("map", ("delivered_beyond",), [4, "5"], r"state\['delivered_beyond'\]\[1\] is '5' \(a str\), "
                                                         r"expected a non-negative int",
                 id="map-delivered_beyond-item"),
    pytest.param("map", ("delivered_beyond",), [4, -5, 6, "7", None],
                 r"^load_state_dict: state\['delivered_beyond'\]\[1\] is -5 \(an int\), expected a non-negative "
                 r"int \(and 2 more wrong items in state\['delivered_beyond'\]\)$", id="map-delivered_beyond-items"),
    pytest.param("map", ("sampler",), _DELETE, r"the state has no sampler: expected state\['sampler'\] \(the "
                                               r"sampler's state_dict\(\), or None", id="map-sampler-deleted"),
    pytest.param("iterable", ("streams",), _DELETE, r"the state has no streams: expected state\['streams'\] \(a "
                                                    r"non-empty list", id="iterable-streams-deleted"),
    pytest.param("iterable", ("streams",), {}, r"state\['streams'\] is \{\} \(a dict\), expected a non-empty list",
                 id="iterable-streams-dict"),
    pytest.param("iterable", ("streams",), [], r"state\['streams'\] is \[\] \(a list\), expected a non-empty list",
                 id="iterable-streams-empty"),
    pytest.param("iterable", ("streams", 0), 5, r"state\['streams'\]\[0\] is 5 \(an int\), expected a dict with "
                                                r"'draws', 'state' and 'ended'", id="iterable-stream-int"),
    pytest.param("iterable", ("streams", 0, "ended"), _DELETE, r"state\['streams'\]\[0\] has no ended: expected "
                                                               r"state\['streams'\]\[0\]\['ended'\] \(a bool",
                 id="iterable-stream-ended-deleted"),
    pytest.param("iterable", ("streams", 0, "draws"), -2, r"state\['streams'\]\[0\]\['draws'\] is -2 \(an int\), "
                                                          r"expected a non-negative int", id="iterable-stream-draws"),
    pytest.param("iterable", ("streams", 0, "state"), _DELETE, r"state\['streams'\]\[0\] has no state: expected "
                                                               r"state\['streams'\]\[0\]\['state'\]",
                 id="iterable-stream-state-deleted"),
    pytest.param("iterable", ("next_worker",), _DELETE, r"the state has no next_worker: expected "
                                                        r"state\['next_worker'\] \(a non-negative int",
                 id="iterable-next_worker-deleted"),
    pytest.param("iterable", ("next_worker",), 1, r"state\['next_worker'\] is 1, expected an int below "
                                                  r"len\(state\['streams'\]\), 1", id="iterable-next_worker-range"),
]


@pytest.mark.parametrize("kind,path,value,message", MALFORMED)
def test_a_malformed_state_is_a_value_error_naming_the_key_path_and_what_was_expected(kind, path, value, message):
    state = _map_state() if kind == "map" else _iterable_state()
    loader = DataLoader(RangeDataset(20), batch_size=4, shuffle=True, seed=5) if kind == "map" else \
        DataLoader(StatefulWorkerStreams([10]), batch_size=2, seed=5)
    loader.load_state_dict(copy.deepcopy(state))  # the state as saved loads
    fresh = DataLoader(RangeDataset(20), batch_size=4, shuffle=True, seed=5) if kind == "map" else \
        DataLoader(StatefulWorkerStreams([10]), batch_size=2, seed=5)
    with pytest.raises(ValueError, match=message):
        fresh.load_state_dict(_changed(state, path, value))
    assert fresh.seed == 5 and fresh._resume is None  # refused before anything changed


def test_every_problem_of_a_state_is_named_in_one_error():
    state = _changed(_changed(_map_state(), ("batching", "drop_last"), _DELETE), ("epoch",), "1")
    with pytest.raises(ValueError, match=r"^load_state_dict: 2 problems with the state: state\['epoch'\] is '1' \(a "
                                         r"str\), expected a non-negative int, the epoch the next iter\(\) runs; "
                                         r"state\['batching'\] has no drop_last: expected "
                                         r"state\['batching'\]\['drop_last'\] \(a bool"):
        DataLoader(RangeDataset(20), batch_size=4, shuffle=True).load_state_dict(state)


def test_a_state_that_went_through_json_still_loads():
    import json

    state = json.loads(json.dumps(_map_state()))
    loader = DataLoader(RangeDataset(20), batch_size=4, shuffle=True)
    loader.load_state_dict(state)
    assert len(list(loader)) == 4


# ---------------------------------------------------------------- the error hierarchy
def test_every_shortage_of_shared_memory_is_a_shared_memory_error():
    assert issubclass(shmload.RingFullError, shmload.SharedMemoryError)
    for name in ("SharedMemoryError", "RingFullError"):
        cls = getattr(shmload, name)
        assert issubclass(cls, shmload.ShmloadError) and issubclass(cls, MemoryError)
