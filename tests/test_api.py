"""The public API: names, torch-compatible arguments and their errors."""

import inspect
import multiprocessing
import re

import numpy as np
import pytest

import shmload
from shmload import DataLoader, RandomSampler, SequentialSampler

from .helpers import ImageDataset, RangeDataset

TORCH_KEYWORDS = ["dataset", "batch_size", "shuffle", "sampler", "batch_sampler", "num_workers", "collate_fn",
                  "pin_memory", "drop_last", "timeout", "worker_init_fn", "multiprocessing_context", "generator",
                  "prefetch_factor", "persistent_workers", "pin_memory_device", "in_order"]


@pytest.mark.pure
def test_public_exports_do_not_drift():
    assert sorted(shmload.__all__) == sorted([
        "BatchSampler", "CollateError", "DataLoader", "LoaderTimeoutError", "OptionalDependencyError",
        "RandomSampler", "RingFullError", "SequentialSampler", "SharedMemoryError", "ShmloadError", "ShmloadWarning",
        "WorkerDiedError", "WorkerError", "WorkerInfo", "WorkerStartupError", "default_collate",
        "get_worker_info", "LoaderStats", "Batched", "DeferredArray",
        "ImageDecodeError", "DistributedSampler", "DistributedWarning", "GeneratorSource", "stream_parts",
        "PinningError", "compiled_core"])
    for name in shmload.__all__:
        assert hasattr(shmload, name)
    # and nothing else public in the namespace: only the exports, the version and subpackages
    import types
    extra = {n for n, v in vars(shmload).items() if not n.startswith("_") and not isinstance(v, types.ModuleType)}
    assert extra == set(shmload.__all__), f"public but not in __all__: {sorted(extra - set(shmload.__all__))}"


def _shmloads_own(base: type) -> dict[str, type]:
    """Every subclass of ``base`` that a module of the package defines, by qualified name
    (every module imported first, the optional integrations included)."""
    import importlib
    import pkgutil

    for info in pkgutil.walk_packages(shmload.__path__, "shmload."):
        if info.name != "shmload.__main__":
            importlib.import_module(info.name)
    found, todo = {}, [base]
    while todo:
        for cls in todo.pop().__subclasses__():
            todo.append(cls)
            if cls.__module__.startswith("shmload."):
                found[f"{cls.__module__}.{cls.__qualname__}"] = cls
    return found


@pytest.mark.pure
def test_error_hierarchy():
    # errors.py's promise: everything shmload raises of its own is a ShmloadError, and
    # every warning of its own a ShmloadWarning; public ones keep the builtin bases
    # that code written for torch (or for files and values) catches
    errors = _shmloads_own(Exception)
    assert len(errors) >= 20, sorted(errors)
    internal = {"shmload._loading.port.ParentGone"}  # a worker's signal to itself to exit: never leaves the worker
    for name, cls in errors.items():
        if name in internal:
            continue
        if issubclass(cls, Warning):
            assert issubclass(cls, shmload.ShmloadWarning), name
        else:
            assert issubclass(cls, shmload.ShmloadError), name
    assert issubclass(shmload.WorkerError, RuntimeError)
    assert issubclass(shmload.LoaderTimeoutError, TimeoutError) and issubclass(shmload.LoaderTimeoutError, RuntimeError)
    from shmload.records import RecordCorruptError, RecordFormatError
    assert issubclass(RecordFormatError, ValueError) and issubclass(RecordCorruptError, OSError)
    assert issubclass(shmload.PinningError, shmload.ShmloadError)


@pytest.mark.pure
def test_every_shortage_of_shared_memory_is_a_shared_memory_error():
    assert issubclass(shmload.RingFullError, shmload.SharedMemoryError)
    for name in ("SharedMemoryError", "RingFullError"):
        cls = getattr(shmload, name)
        assert issubclass(cls, shmload.ShmloadError) and issubclass(cls, MemoryError)


@pytest.mark.pure
def test_signature_keeps_torch_positional_order():
    params = list(inspect.signature(DataLoader).parameters)
    assert params[:13] == TORCH_KEYWORDS[:13]
    assert set(TORCH_KEYWORDS) <= set(params)
    assert {"seed", "output", "slot_bytes", "max_shm_bytes"} <= set(params)


@pytest.mark.pure
def test_positional_arguments_work_like_torch():
    loader = DataLoader(RangeDataset(6), 3, False)
    assert [b.tolist() for b in loader] == [[0, 1, 2], [3, 4, 5]]


@pytest.mark.pure
def test_attributes_tools_read_to_rebuild_loaders():
    ds = RangeDataset(10)
    loader = DataLoader(ds, batch_size=4, shuffle=True, num_workers=2, drop_last=True, seed=3)
    assert loader.dataset is ds and loader.batch_size == 4 and loader.num_workers == 2 and loader.drop_last
    assert isinstance(loader.sampler, RandomSampler) and loader.batch_sampler.sampler is loader.sampler
    assert loader.collate_fn is shmload.default_collate and loader.prefetch_factor is None  # automatic; passed back it means the same
    assert loader.multiprocessing_context.get_start_method() == "fork"
    assert len(loader) == 2
    with pytest.raises(ValueError, match="batch_size attribute should not be set after DataLoader is initialized"):
        loader.batch_size = 8


@pytest.mark.pure
def test_unknown_keyword_is_a_type_error():
    with pytest.raises(TypeError, match="unexpected keyword argument 'num_wokers'"):
        DataLoader(RangeDataset(3), num_wokers=2)


@pytest.mark.pure
@pytest.mark.parametrize("kwargs,match", [
    (dict(multiprocessing_context="spawn"), r"multiprocessing_context can only be used with multi-process loading "
                                            r"\(num_workers > 0\), but got num_workers=0"),
    (dict(batch_size=2, drop_last=1), r"drop_last should be a boolean value, but got drop_last=1"),
    (dict(num_workers=-1), "num_workers should be a non-negative integer"),
    (dict(timeout=-1), "timeout option should be non-negative"),
    (dict(prefetch_factor=0), "prefetch_factor should be a positive integer or None"),
    (dict(shuffle=True, sampler=[0, 1]), "sampler option is mutually exclusive with shuffle"),
    (dict(batch_sampler=[[0]], batch_size=2), "batch_sampler option is mutually exclusive with batch_size"),
    (dict(batch_sampler=[[0]], drop_last=True), "batch_sampler option is mutually exclusive"),
    (dict(batch_size=None, drop_last=True), "batch_size=None option disables auto-batching"),
    (dict(batch_size=0), "batch_size should be a positive integer"),
    (dict(output="jax"), "output should be 'numpy' or 'torch'"),
    (dict(seed=-3), "seed should be a non-negative integer"),
    (dict(slot_bytes=0), "slot_bytes should be a positive integer or None"),
    (dict(multiprocessing_context="threads", num_workers=1), "'threads' is not a start method"),
    (dict(max_worker_restarts=-1), "max_worker_restarts should be a non-negative integer"),
    (dict(batch_size=-2), "batch_size should be a positive integer"),
    (dict(prefetch_factor=-1), "prefetch_factor should be a positive integer or None"),
])
def test_bad_arguments_are_refused_with_a_clear_message(kwargs, match):
    with pytest.raises(ValueError, match=match):
        DataLoader(RangeDataset(3), **kwargs)


@pytest.mark.pure
def test_defaults_that_torch_refuses_without_workers_are_accepted():
    loader = DataLoader(RangeDataset(4), batch_size=2, prefetch_factor=4, persistent_workers=True, pin_memory=False)
    assert [b.tolist() for b in loader] == [[0, 1], [2, 3]]


@pytest.mark.pure
def test_a_generator_object_is_refused_with_the_fix():
    with pytest.raises(TypeError, match=r"the dataset is an iterator \(generator\), which can be read once.*"
                                        r"Pass a function that makes it"):
        DataLoader((i for i in range(3)))


class _SizedOnly:
    def __len__(self):
        return 3


@pytest.mark.pure
@pytest.mark.parametrize("dataset,missing", [(object(), "__getitem__ or __len__"), (_SizedOnly(), "__getitem__")])
def test_a_dataset_that_is_neither_map_style_nor_iterable_is_refused(dataset, missing):
    with pytest.raises(TypeError, match=r"should be a map-style dataset \(with __getitem__ and __len__\), an "
                                        rf"iterable source \(with __iter__\).*has no {missing}$"):
        DataLoader(dataset)


def test_multiprocessing_context_object_is_accepted():
    ctx = multiprocessing.get_context("fork")
    loader = DataLoader(RangeDataset(4), batch_size=2, num_workers=1, multiprocessing_context=ctx)
    assert loader.multiprocessing_context is ctx and [b.tolist() for b in loader] == [[0, 1], [2, 3]]


@pytest.mark.pure
def test_set_epoch_is_forwarded_to_a_user_sampler():
    class EpochSampler(SequentialSampler):
        epochs = []

        def set_epoch(self, epoch):
            self.epochs.append(epoch)

    sampler = EpochSampler(range(4))
    loader = DataLoader(RangeDataset(4), sampler=sampler)
    loader.set_epoch(7)
    assert sampler.epochs == [7]
    with pytest.raises(ValueError, match="epoch should be a non-negative integer"):
        loader.set_epoch(-1)


def test_repr_shows_the_ring_memory():
    loader = DataLoader(ImageDataset(16, shape=(1 << 16,)), batch_size=4, num_workers=2, persistent_workers=True)
    assert "no workers running" in repr(loader)
    with loader:
        it = iter(loader)
        next(it)
        match = re.search(r"ring (\d) slots x 260.0 KiB = ([\d.]+) (KiB|MiB) of shared memory \((memfd|posix) segments, "
                          r"bound [\d.]+ [GM]iB\)", repr(loader))
        assert match and float(match[2]) * (1024 if match[3] == "MiB" else 1) == pytest.approx(260 * int(match[1]),
                                                                                             abs=6)
        del it


def test_num_workers_zero_matches_workers_exactly():
    ds = ImageDataset(20)
    a = [(b["image"].copy(), b["label"].copy(), b["name"]) for b in DataLoader(ds, batch_size=6, num_workers=0)]
    b = [(b["image"].copy(), b["label"].copy(), b["name"]) for b in DataLoader(ds, batch_size=6, num_workers=2)]
    assert len(a) == len(b) == 4
    for (x0, y0, n0), (x1, y1, n1) in zip(a, b):
        assert np.array_equal(x0, x1) and x0.dtype == x1.dtype and np.array_equal(y0, y1) and n0 == n1
