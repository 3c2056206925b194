"""Behaviours of torch's DataLoader that code written for it relies on (issue 17): type
parameters, torch's warnings in torch's words, torch's argument rules, pin_memory. The
side-by-side checks against torch itself are marked ``torch``."""

from __future__ import annotations

import importlib.util
import os
import re
import warnings

import numpy as np
import pytest

from shmload import BatchSampler, DataLoader, DistributedSampler, RandomSampler, SequentialSampler

from .helpers import RangeDataset, WorkerStreams

needs_torch = pytest.mark.skipif(importlib.util.find_spec("torch") is None, reason="torch is not installed")
TOO_MANY = ("This DataLoader will create 2 worker processes in total. Our suggested max number of worker in current "
            "system is 1, which is smaller than what this DataLoader is going to create. Please be aware that "
            "excessive worker creation might get DataLoader running slow or even freeze, lower the worker number to "
            "avoid potential slowness/freeze if necessary.")


@pytest.mark.pure
def test_the_loader_and_samplers_take_type_parameters_as_torchs_do():
    def batches() -> DataLoader[dict]:
        return DataLoader(RangeDataset(4))
    assert DataLoader[dict].__origin__ is DataLoader and len(list(batches())) == 4
    for sampler in (SequentialSampler, RandomSampler, BatchSampler, DistributedSampler):
        assert sampler[int].__origin__ is sampler


def _said(action, about: str, how: str = "always") -> tuple:
    """What ``action()`` returned, and the warnings it gave whose message has ``about``."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter(how)
        result = action()
    return result, [w for w in caught if about in str(w.message)]


def test_more_workers_than_cores_is_torchs_warning_at_construction_and_when_workers_start(monkeypatch):
    """torch's check_worker_number_rationality: at construction, and at every iter() that
    starts workers (a persistent loader's first only), in torch's words; attributed to the
    loader's own lines as torch's are to its own (NOTE [ torch's excessive-worker warning ])."""
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: {0})
    loader, said = _said(lambda: DataLoader(RangeDataset(8), batch_size=4, num_workers=2, timeout=30), "in total")
    assert [str(w.message) for w in said] == [TOO_MANY]
    assert said[0].category is UserWarning and said[0].filename.endswith(os.path.join("shmload", "_loader", "loader.py"))
    for _ in range(2):  # every iter() starts workers
        assert [str(w.message) for w in _said(lambda: list(loader), "in total")[1]] == [TOO_MANY]
    persistent, said = _said(lambda: DataLoader(RangeDataset(8), batch_size=4, num_workers=2, timeout=30,
                                                persistent_workers=True), "in total")
    assert len(said) == 1
    with persistent:
        assert [len(_said(lambda: list(persistent), "in total")[1]) for _ in range(3)] == [1, 0, 0]
    for fits in (dict(num_workers=1), dict(num_workers=0), dict(num_workers=0, persistent_workers=True)):
        quiet, said = _said(lambda: DataLoader(RangeDataset(8), batch_size=4, timeout=30, **fits), "in total")
        assert not said and not _said(lambda: list(quiet), "in total")[1]
    # Python's default filter: once per place (construction, iter()), however many loaders, as torch's
    def three():
        for _ in range(3):
            list(DataLoader(RangeDataset(8), batch_size=4, num_workers=2, timeout=30))
    assert len(_said(three, "in total", how="default")[1]) == 2


@pytest.mark.pure
def test_the_excessive_worker_warning_without_a_cpu_affinity_is_torchs(monkeypatch):
    monkeypatch.delattr(os, "sched_getaffinity")
    monkeypatch.setattr(os, "cpu_count", lambda: 1)
    _, said = _said(lambda: DataLoader(RangeDataset(8), num_workers=2), "in total")
    assert [str(w.message) for w in said] == [TOO_MANY.replace("system is 1,", "system is 1 (`cpuset` is not taken "
                                                                                "into account),")]
    monkeypatch.setattr(os, "cpu_count", lambda: None)
    _, said = _said(lambda: DataLoader(RangeDataset(8), num_workers=2), "in total")
    assert [str(w.message) for w in said] == [
        "This DataLoader will create 2 worker processes in total. DataLoader is not able to compute a suggested max "
        "number of worker in current system. Please be aware that excessive worker creation might get DataLoader "
        "running slow or even freeze, lower the worker number to avoid potential slowness/freeze if necessary."]


@pytest.mark.pure
def test_a_negative_num_workers_reads_as_ours_and_as_torchs():
    for match in (r"^num_workers should be a non-negative integer, but got num_workers=-1",
                  r"num_workers option should be non-negative"):  # torch's regex, in its own tests
        with pytest.raises(ValueError, match=match):
            DataLoader(RangeDataset(4), num_workers=-1)


class _Counting:
    """torch's test's CountingIterableDataset: 0..n-1 in every worker, and len() ``said``
    (n unless given)."""

    def __init__(self, n, said=None):
        self.n, self.said = n, n if said is None else said

    def __iter__(self):
        return iter(range(self.n))

    def __len__(self):
        return self.said


MORE_THAN_LEN = (r"Length of IterableDataset .* was reported to be 20\(when accessing len\(dataloader\)\), but "
                 r"{} samples have been fetched\. {}")
WORKER_HINT = (r"For multiprocessing data-loading, this could be caused by not properly configuring the "
               r"IterableDataset replica at each worker\. Please see "
               r"https://pytorch\.org/docs/stable/data\.html#torch\.utils\.data\.IterableDataset for examples\.")


@pytest.mark.parametrize("workers", [0, 2])
def test_a_stream_longer_than_its_len_warns_at_every_batch_past_it_as_torch(workers):
    """torch's own test: nothing before len(loader) is asked, nothing up to the length,
    then a warning at every next() (NOTE [ torch's length warning ])."""
    source = _Counting(20) if workers else _Counting(30, said=20)  # (each of 2 workers yields 20)
    loader = DataLoader(source, batch_size=None, num_workers=workers, timeout=30)
    it = iter(loader)
    assert not _said(lambda: [next(it) for _ in range(30 if workers == 0 else 40)], "Length of")[1]
    assert len(loader) == 20
    it = iter(loader)
    assert not _said(lambda: [next(it) for _ in range(20)], "Length of")[1]
    for k in range(21, 24):
        _, said = _said(lambda: next(it), "Length of")
        assert [re.fullmatch(MORE_THAN_LEN.format(k, WORKER_HINT if workers else ""), str(w.message)) is not None
                for w in said] == [True]
        assert said[0].filename == __file__  # the line that called next(), as torch's
    it = None  # (its finalizer stops the workers)


@pytest.mark.pure
def test_a_stream_longer_than_its_len_is_torchs_warning_once_len_was_asked():
    """torch's figures, quirk included: the batches yielded against len(dataset)."""
    class Lying(WorkerStreams):
        def __len__(self):
            return 2

    loader = DataLoader(Lying([6]), batch_size=2)
    assert len(list(loader)) == 3  # len() not asked: nothing said
    assert len(loader) == 1
    with pytest.warns(UserWarning, match=r"Length of IterableDataset .* was reported to be 2\(when accessing "
                                         r"len\(dataloader\)\), but 3 samples have been fetched"):
        assert len(list(loader)) == 3


def test_bool_like_settings_are_taken_for_their_truth_as_torch_takes_them():
    loader = DataLoader(RangeDataset(8), batch_size=2, num_workers=1, persistent_workers=1, in_order=0, timeout=30)
    with loader:
        assert sorted(int(i) for _ in range(2) for b in loader for i in b) == sorted(list(range(8)) * 2)


def test_a_whole_time_out_reads_as_torchs_message():
    from .helpers import SlowDataset
    loader = DataLoader(SlowDataset(4, delay=5), batch_size=2, num_workers=1, timeout=1)
    with pytest.raises(RuntimeError, match=r"^DataLoader timed out after 1 seconds"):
        next(iter(loader))


@pytest.mark.pure
def test_pin_memory_without_an_accelerator_is_torchs_warning_and_the_same_batches():
    plain = [b.tolist() for b in DataLoader(RangeDataset(6), batch_size=2)]
    loader = DataLoader(RangeDataset(6), batch_size=2, pin_memory=True)
    assert loader.pin_memory is True
    with pytest.warns(UserWarning, match=r"'pin_memory' argument is set as true but no accelerator is found, then "
                                         r"device pinned memory won't be used\."):
        assert [b.tolist() for b in loader] == plain


@pytest.mark.pure
@pytest.mark.torch
@needs_torch
def test_torch_gives_the_same_warnings_in_the_same_words(monkeypatch):
    """Side by side: the messages scripts filter on are torch's own."""
    import torch

    def messages(make):
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            list(make())
        return sorted(str(w.message) for w in caught if "pin_memory" in str(w.message))
    ours = messages(lambda: DataLoader(RangeDataset(4), batch_size=2, pin_memory=True))
    theirs = messages(lambda: torch.utils.data.DataLoader(np.arange(4), batch_size=2, pin_memory=True))
    assert ours == theirs and ours


class _SameInEveryWorker:
    """An IterableDataset not sharded by worker: each worker yields 0..4 (torch's warning
    case), and len() says 3."""

    def __iter__(self):
        return iter(range(5))

    def __len__(self):
        return 3


@pytest.mark.torch
@needs_torch
@pytest.mark.parametrize("kw", [dict(batch_size=None), dict(batch_size=1), dict(batch_size=2, num_workers=2),
                                dict(batch_size=None, num_workers=2), dict(batch_size=1, num_workers=1)])
def test_the_length_warning_is_torchs_side_by_side(kw):
    """The same warnings, word for word, at the same batches, before and after len()."""
    import torch

    class Source(_SameInEveryWorker, torch.utils.data.IterableDataset):
        def __repr__(self):
            return "Source()"

    def warned(loader):
        def epoch():
            said = []
            with warnings.catch_warnings(record=True) as caught:
                warnings.simplefilter("always")
                for _ in loader:
                    said.append([str(w.message) for w in caught if "Length of" in str(w.message)])
                    caught.clear()
            return said
        before = epoch()
        len(loader)
        return before, epoch(), epoch()
    ours = warned(DataLoader(Source(), timeout=30, **kw))
    theirs = warned(torch.utils.data.DataLoader(Source(), **kw))
    assert ours == theirs and any(ours[1]) and not any(ours[0])


@pytest.mark.torch
@needs_torch
@pytest.mark.parametrize("persistent", [False, True])
def test_the_excessive_worker_warning_is_torchs_side_by_side(monkeypatch, persistent):
    import torch
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: {0})

    def said(make):
        counts = []
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            loader = make(np.arange(8), batch_size=4, num_workers=2, persistent_workers=persistent)
            counts.append(len(caught))
            for _ in range(3):
                list(loader)
                counts.append(len(caught))
        return counts, {str(w.message) for w in caught}
    ours, theirs = said(DataLoader), said(torch.utils.data.DataLoader)
    assert ours == theirs and ours[1] == {TOO_MANY}


class _LenNotInt:
    """A map-style dataset whose __len__ returns a float."""

    def __len__(self):
        return 4.0

    def __getitem__(self, i):
        return np.float32(i)


@pytest.mark.parametrize("kw", [dict(), dict(shuffle=True), dict(num_workers=1)])
def test_a_len_that_is_no_int_raises_once_at_iter_as_torch(kw):
    """torch's iter() raises it (with workers; with shuffle=True already its constructor),
    not every next() after it."""
    loader = DataLoader(_LenNotInt(), batch_size=2, timeout=30, **kw)
    with pytest.raises(TypeError, match=r"^'float' object cannot be interpreted as an integer$"):
        iter(loader)
    # a sampler of yours does not ask the dataset's len(), nor does torch's loader then
    assert [b.tolist() for b in DataLoader(_LenNotInt(), batch_size=2, sampler=[0, 1, 2, 3], timeout=30,
                                           num_workers=kw.get("num_workers", 0))] == [[0, 1], [2, 3]]


class _Dates:
    def __len__(self):
        return 4

    def __getitem__(self, i):
        return {"when": np.datetime64("2020-01-01") + i, "x": np.float32(i)}


@pytest.mark.torch
@needs_torch
@pytest.mark.parametrize("workers", [0, 1])
def test_an_array_torch_has_no_tensor_for_is_a_type_error_as_in_torch(workers):
    import torch

    from shmload import CollateError
    with pytest.raises(TypeError, match=r"default_collate: batch must contain tensors"):
        next(iter(torch.utils.data.DataLoader(_Dates(), batch_size=2)))
    with DataLoader(_Dates(), batch_size=2, num_workers=workers, output="torch", timeout=30) as loader:
        with pytest.raises(TypeError, match=r"^output='torch' cannot hold an array of dtype datetime64\[D\] and shape "
                                            r"\(2,\) \(can't convert np\.ndarray of type numpy\.datetime64") as error:
            next(iter(loader))
    assert isinstance(error.value, CollateError)  # (a ValueError too, as before)
