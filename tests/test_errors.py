"""Mistakes in what the user's code gives the loader reach the main process as clear
errors, at the right batch, and nothing hangs: a dataset's exceptions (those that cannot
be printed too), samples that do not batch, ``__getitems__`` results of the wrong length
or rows, a sampler's bad indices or a len() that lies, and worker processes asked for
off Linux. With and without workers, checked by regex on the message.

Two groups test internals on purpose: the index check (``shmload._loading.fetch``,
``check_indices``) and how a worker's exception is captured for the main process
(``RemoteError`` of ``shmload.errors``)."""

from __future__ import annotations

import pickle
import re
import traceback

import numpy as np
import pytest

import shmload
from shmload import Batched, CollateError, DataLoader, DeferredArray, ShmloadError, WorkerError
from shmload._loading.fetch import check_indices
from shmload.errors import RemoteError

from .helpers import (
    TIMEOUT,
    FailingDataset,
    ImageDataset,
    NeedsTwoArgsError,
    RangeDataset,
    StopIterationDataset,
    TwoArgsFailingDataset,
    rows_of,
)


# ---------------------------------------------------------------- a dataset's exceptions
def test_worker_exception_is_raised_at_its_batch_with_type_worker_indices_and_traceback(start_method):
    loader = DataLoader(FailingDataset(12, bad={5}), batch_size=4, num_workers=2,
                        multiprocessing_context=start_method)
    it = iter(loader)
    assert next(it).tolist() == [0, 1, 2, 3]
    with pytest.raises(ValueError) as info:
        next(it)
    text = str(info.value)
    assert "Caught ValueError in DataLoader worker process" in text
    assert "while loading batch 1 (dataset indices [4, 5, 6, 7])" in text
    assert "Traceback (most recent call last)" in text and "bad sample 5" in text
    assert "helpers.py" in text  # the worker's own frames
    assert next(it).tolist() == [8, 9, 10, 11]  # the iterator stays usable
    with pytest.raises(StopIteration):
        next(it)


def test_key_error_message_stays_readable():
    loader = DataLoader(FailingDataset(4, bad={2}, exc_type=KeyError), batch_size=2, num_workers=1)
    it = iter(loader)
    next(it)
    with pytest.raises(KeyError, match=r"Caught KeyError .*\nOriginal Traceback"):
        next(it)


def test_exception_that_cannot_be_rebuilt_becomes_worker_error():
    loader = DataLoader(TwoArgsFailingDataset(6), batch_size=2, num_workers=1)
    with pytest.raises(WorkerError, match=r"Caught NeedsTwoArgsError .*dataset indices \[2, 3\]") as info:
        list(loader)
    assert isinstance(info.value, RuntimeError) and not isinstance(info.value, NeedsTwoArgsError)


@pytest.mark.parametrize("workers", [0, 1])
def test_stop_iteration_in_the_dataset_is_an_error_not_a_silent_end_of_epoch(workers):
    loader = DataLoader(StopIterationDataset(8), batch_size=2, num_workers=workers)
    it = iter(loader)
    assert next(it).tolist() == [0, 1]
    with pytest.raises(RuntimeError, match=r"StopIteration .*batch 1 .*dataset indices \[2, 3\]"):
        next(it)


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


@pytest.mark.pure
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


@pytest.mark.pure
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


@pytest.mark.pure
def test_capture_keeps_a_traceback_text_it_is_given():
    error = RemoteError.capture(_raised(UnprintableError()), "Traceback (most recent call last):\n  given\n")
    assert error.traceback == "Traceback (most recent call last):\n  given\n"
    assert error.message.startswith("<exception str() failed: RuntimeError: __str__ is broken")


@pytest.mark.pure
def test_a_rebuilt_unprintable_exception_is_its_type_and_prints_the_workers_report():
    error = RemoteError.capture(_raised(UnprintableAndUnreprableError("x")))
    rebuilt = error.rebuild("in DataLoader worker process 1 while loading batch 3 (dataset indices [6, 7])")
    assert isinstance(rebuilt, UnprintableAndUnreprableError)
    assert str(rebuilt).startswith("Caught UnprintableAndUnreprableError in DataLoader worker process 1 while loading "
                                   "batch 3 (dataset indices [6, 7]).\nOriginal Traceback (most recent call last)")
    assert repr(rebuilt).startswith("UnprintableAndUnreprableError('Caught UnprintableAndUnreprableError in")
    assert type(rebuilt).__module__ == __name__ and type(rebuilt).__qualname__ == "UnprintableAndUnreprableError"
    assert "".join(traceback.format_exception(rebuilt)).count("Caught UnprintableAndUnreprableError") == 1


# ---------------------------------------------------------------- samples that do not batch
def test_mismatched_samples_name_field_and_index_from_a_worker():
    class Mixed(ImageDataset):
        def __getitem__(self, i):
            sample = super().__getitem__(i)
            if i == 6:
                sample["image"] = sample["image"][:, :4]
            return sample

    loader = DataLoader(Mixed(8), batch_size=4, num_workers=1)
    with pytest.raises(CollateError, match=r"field sample\['image'\]: dataset index 6 \(position 2 in the "
                                           r"batch\) has an array of shape \(3, 4, 8\)"):
        list(loader)


def test_unpicklable_value_in_a_batch_is_reported_not_hung():
    class Lambdas(RangeDataset):
        def __getitem__(self, i):
            return lambda: i

    with pytest.raises(WorkerError, match="cannot be pickled to the main process"):
        list(DataLoader(Lambdas(4), batch_size=2, num_workers=1))


def test_a_python_int_beyond_int64_is_named():
    class Huge(RangeDataset):
        def __getitem__(self, i):
            return {"id": 2**70 if i == 1 else i}

    with pytest.raises(CollateError, match=r"field sample\['id'\]: the Python int 1180591620717411303424 does not "
                                           r"fit in int64"):
        list(DataLoader(Huge(4), batch_size=2, num_workers=1))


@pytest.mark.parametrize("workers", [0, 2])
def test_a_sample_of_none_is_named(workers):
    loader = DataLoader(NoneAtDataset(12, at=7), batch_size=4, num_workers=workers, timeout=30)
    with pytest.raises(CollateError, match=r"cannot batch dataset index 7 \(position 3 in the batch\): the dataset "
                                           r"returned None for it \(a missing return in __getitem__\?\)"):
        rows_of(loader)


@pytest.mark.parametrize("workers", [0, 2])
def test_a_first_sample_of_none_is_named(workers):
    loader = DataLoader(NoneAtDataset(12, at=4), batch_size=4, num_workers=workers, timeout=30)
    it = iter(loader)
    assert next(it).tolist() == [0, 1, 2, 3]
    with pytest.raises(CollateError, match=r"dataset index 4 \(position 0 in the batch\): the dataset returned None"):
        next(it)


class NoneAtDataset(RangeDataset):
    def __init__(self, n, at):
        super().__init__(n)
        self.at = at

    def __getitem__(self, i):
        return None if i == self.at else i


def test_non_contiguous_samples_are_batched_as_np_stack_would():
    loader = DataLoader(StridedDataset(8), batch_size=4, num_workers=2, timeout=30)
    for k, batch in enumerate(loader):
        want = np.stack([StridedDataset(8)[i] for i in range(4 * k, 4 * k + 4)])
        assert batch.flags.c_contiguous and np.array_equal(batch, want)


class StridedDataset(RangeDataset):
    def __getitem__(self, i):
        base = np.arange(64, dtype=np.float32).reshape(8, 8) + i
        return base[::2, ::3].T  # a non-contiguous view


# ---------------------------------------------------------------- __getitems__ and Batched
def test_bad_getitems_result_is_named():
    class Short(RangeDataset):
        def __getitems__(self, indices):
            return [0]

    with pytest.raises(shmload.ShmloadError, match=r"Short.__getitems__\(\[0, 1\]\) returned 1 samples, expected "
                                                  r"a sequence of 2"):
        list(DataLoader(Short(4), batch_size=2, num_workers=1))


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


@pytest.mark.pure
def test_a_batched_result_is_checked_before_a_collate_fn_sees_its_samples():
    # with a collate_fn the loader hands over Batched.samples(): size rows, the extra one dropped silently
    loader = DataLoader(BatchedRows(4, bad={0}), batch_size=2, collate_fn=lambda samples: len(samples))
    with pytest.raises(ShmloadError, match=r"whose batch\['x'\] has 3 rows"):
        list(loader)


@pytest.mark.pure
def test_a_batched_result_with_a_0d_array_is_refused():
    class Scalar(RangeDataset):
        def __getitems__(self, indices):
            return Batched((np.arange(len(indices)), np.float32(1.0)), len(indices))

    with pytest.raises(ShmloadError, match=r"Scalar.__getitems__\(\[0, 1\]\) returned a Batched of 2 samples whose "
                                           r"batch\[1\] has no rows \(shape \(\)\), expected 2 rows"):
        list(DataLoader(Scalar(4), batch_size=2))


@pytest.mark.pure
def test_a_right_batched_result_with_non_array_leaves_is_delivered_as_it_is():
    class Named(RangeDataset):
        def __getitems__(self, indices):
            return Batched({"x": np.array(indices), "name": [f"s{i}" for i in indices], "tag": "batch"}, len(indices))

    assert [(b["x"].tolist(), b["name"], b["tag"]) for b in DataLoader(Named(4), batch_size=2)] == [
        ([0, 1], ["s0", "s1"], "batch"), ([2, 3], ["s2", "s3"], "batch")]


# ---------------------------------------------------------------- samplers and lengths
@pytest.mark.parametrize("workers", [0, 2])
@pytest.mark.parametrize("bad", [-1, 12])
def test_a_sampler_index_out_of_range_is_named_with_the_length(workers, bad):
    sampler = [[0, 1], [2, bad], [4, 5]]
    loader = DataLoader(LenientDataset(12), batch_sampler=sampler, num_workers=workers, timeout=30)
    it = iter(loader)
    assert next(it).tolist() == [0, 1]
    with pytest.raises(IndexError, match=rf"the sampler gave dataset index {bad} \(at position 1 of the batch "
                                         rf"\[2, {bad}\]\), but len\(dataset\) is 12: expected 0 <= index < 12"):
        next(it)
    assert next(it).tolist() == [4, 5]  # the iterator stays usable


class LenientDataset(RangeDataset):
    """Backed by a list: a negative index would silently wrap around."""

    def __getitem__(self, i):
        return list(range(self.n))[i]


class _Scanned(list):
    """Indices that count how often they are scanned."""

    scans = 0

    def __iter__(self):
        type(self).scans += 1
        return super().__iter__()


@pytest.mark.pure
@pytest.mark.parametrize("bound, scans", [(None, 2), (12, 0)])
def test_a_bound_within_len_spares_the_index_scan(bound, scans):
    _Scanned.scans = 0
    check_indices(LenientDataset(12), _Scanned([0, 11]), bound)
    assert _Scanned.scans == scans  # min() and max(), unless the bound proves them in range


@pytest.mark.pure
@pytest.mark.parametrize("bad, bound", [(-1, 2**64), (12, 13)])  # a negative index bounds as a huge one (wire.py)
def test_a_bound_beyond_len_falls_back_to_the_check_that_names_the_index(bad, bound):
    with pytest.raises(IndexError, match=rf"the sampler gave dataset index {bad} \(at position 1 of the batch "
                                         rf"\[2, {bad}\]\), but len\(dataset\) is 12"):
        check_indices(LenientDataset(12), [2, bad], bound)


class _Rows:
    """Sample i: ``size`` bytes of value i."""

    def __init__(self, n: int, size: int):
        self.n, self.size = n, size

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> np.ndarray:
        return np.full(self.size, i, np.uint8)


@pytest.mark.parametrize("size, caller", [(8, "fetch"), (64 * 1024, "load_rowwise")])  # small rows, or row by row
def test_a_workers_index_check_is_given_the_bound_of_its_raw_indices(monkeypatch, size, caller):
    def spy(dataset, indices, bound=None):  # forked into the worker with the patch
        if 7 in indices:
            raise RuntimeError(f"checked {list(indices)} with bound {bound}")
        check_indices(dataset, indices, bound)

    monkeypatch.setattr(shmload._loading.fetch, "check_indices", spy)
    monkeypatch.setattr(shmload._loading.rowwise, "check_indices", spy)
    loader = DataLoader(_Rows(12, size), batch_sampler=[[0, 1], [6, 7]], num_workers=1, timeout=30,
                        multiprocessing_context="fork")  # one worker: its plan for [0, 1] is cached for [6, 7]
    it = iter(loader)
    assert next(it)[:, 0].tolist() == [0, 1]
    with pytest.raises(RuntimeError, match=rf"(?s)in {caller}\n.*checked \[6, 7\] with bound 8"):
        next(it)


@pytest.mark.parametrize("workers", [0, 2])
def test_a_len_that_lies_fails_at_the_missing_index(workers):
    loader = DataLoader(LyingLengthDataset(), batch_size=4, num_workers=workers, timeout=30)
    with pytest.raises(IndexError, match=r"(?s)dataset indices \[8, 9, 10, 11\].*IndexError: only 10 samples, "
                                         r"asked for 10" if workers else r"only 10 samples, asked for 10"):
        rows_of(loader)


class LyingLengthDataset:
    def __len__(self):
        return 12

    def __getitem__(self, i):
        if i >= 10:
            raise IndexError(f"only 10 samples, asked for {i}")
        return i


@pytest.mark.parametrize("num_workers", [0, 2])
def test_a_sampler_of_single_indices_passed_as_batch_sampler_is_torchs_type_error(num_workers):
    from shmload import SequentialSampler
    loader = DataLoader(RangeDataset(8), batch_sampler=SequentialSampler(range(8)), num_workers=num_workers,
                        timeout=20)
    with loader, pytest.raises(TypeError, match=r"^'int' object is not iterable: the batch sampler yielded 0 for "
                                                r"batch 0, .*goes in sampler= \(with batch_size=\)"):
        next(iter(loader))


# ---------------------------------------------------------------- platforms
@pytest.mark.pure
@pytest.mark.parametrize("platform", ["darwin", "win32", "freebsd14"])
def test_worker_processes_are_refused_off_linux_with_what_to_do(monkeypatch, platform):
    monkeypatch.setattr("sys.platform", platform)
    with pytest.raises(shmload.ShmloadError, match=rf"num_workers=2: shmload's worker processes run on Linux only "
                                                   rf".*this is '{platform}'\. Use num_workers=0 here"):
        DataLoader(RangeDataset(8), batch_size=4, num_workers=2)
    loader = DataLoader(RangeDataset(8), batch_size=4)  # in-process loading works anywhere
    assert [b.tolist() for b in loader] == [[0, 1, 2, 3], [4, 5, 6, 7]]
    loader.num_workers = 2  # a setting changed later is refused at the next iter()
    with pytest.raises(shmload.ShmloadError, match="run on Linux only"):
        iter(loader)
