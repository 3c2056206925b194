"""Behaviours of torch's DataLoader that code written for it relies on (issue 17): type
parameters, torch's warnings in torch's words, torch's argument rules, pin_memory. The
side-by-side checks against torch itself are marked ``torch``."""

from __future__ import annotations

import importlib.util
import warnings

import numpy as np
import pytest

from shmload import BatchSampler, DataLoader, DistributedSampler, RandomSampler, SequentialSampler, _platform

from .helpers import RangeDataset, WorkerStreams

needs_torch = pytest.mark.skipif(importlib.util.find_spec("torch") is None, reason="torch is not installed")
TOO_MANY = r"This DataLoader will create 2 worker processes in total\. Our suggested max number of worker in current " \
           r"system is 1, which is smaller than what this DataLoader is going to create\."


def test_the_loader_and_samplers_take_type_parameters_as_torchs_do():
    def batches() -> DataLoader[dict]:
        return DataLoader(RangeDataset(4))
    assert DataLoader[dict].__origin__ is DataLoader and len(list(batches())) == 4
    for sampler in (SequentialSampler, RandomSampler, BatchSampler, DistributedSampler):
        assert sampler[int].__origin__ is sampler


def test_more_workers_than_cores_is_torchs_warning_once_per_loader(monkeypatch):
    monkeypatch.setattr(_platform, "usable_cores", lambda: 1)
    loader = DataLoader(RangeDataset(8), batch_size=4, num_workers=2, timeout=30)
    with pytest.warns(UserWarning, match=TOO_MANY):
        assert len(list(loader)) == 2
    with warnings.catch_warnings(record=True) as again:
        warnings.simplefilter("always")
        assert len(list(loader)) == 2
    assert not [w for w in again if "worker processes in total" in str(w.message)]


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


def test_pin_memory_without_an_accelerator_is_torchs_warning_and_the_same_batches():
    plain = [b.tolist() for b in DataLoader(RangeDataset(6), batch_size=2)]
    loader = DataLoader(RangeDataset(6), batch_size=2, pin_memory=True)
    assert loader.pin_memory is True
    with pytest.warns(UserWarning, match=r"'pin_memory' argument is set as true but no accelerator is found, then "
                                         r"device pinned memory won't be used\."):
        assert [b.tolist() for b in loader] == plain


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
    """An IterableDataset not sharded by worker: each of 2 workers yields 0..4 (torch's
    warning case)."""

    def __iter__(self):
        return iter(range(5))

    def __len__(self):
        return 5


@pytest.mark.torch
@needs_torch
def test_the_length_warning_has_torchs_figures_side_by_side():
    import torch

    class Source(_SameInEveryWorker, torch.utils.data.IterableDataset):
        def __repr__(self):
            return "Source()"

    def warned(make):
        loader = make(Source())
        len(loader)
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            list(loader)
        return [str(w.message).split(" For multiprocessing")[0] for w in caught if "Length of" in str(w.message)]
    ours = warned(lambda ds: DataLoader(ds, batch_size=2, num_workers=2, timeout=30))
    theirs = warned(lambda ds: torch.utils.data.DataLoader(ds, batch_size=2, num_workers=2))
    assert ours == theirs and ours[0].startswith("Length of IterableDataset Source() was reported to be 5(when")
