"""pin_memory=True: each ring segment page-locked once, unregistered before it is
unmapped, batches pinned with no copy (pinning.py). The segments and the page-locking
are reached in ``shmload._transport`` (``pinning``, ``shm``), on purpose.

Without a GPU the page-locking itself is a fake that checks the rules the CUDA one must
keep: a range is registered once, while mapped, and unregistered while still mapped,
when neither the loader nor any batch holds it any more. The CUDA tests at the end run
only where CUDA is available."""

from __future__ import annotations

import gc
import importlib.util
import os
import sys
import types
import warnings

import numpy as np
import pytest

from shmload import DataLoader, ShmloadWarning
from shmload._transport import pinning, shm

from .helpers import ImageDataset, RangeDataset


class GrowingDataset:
    """Every sample of batch b (of 4) holds (b % 5 + 1) * scale ints: later batches are larger."""

    def __init__(self, n, scale=1000):
        self.n, self.scale = n, scale

    def __len__(self):
        return self.n

    def __getitem__(self, i):
        return np.full((i // 4 % 5 + 1) * self.scale, i, np.int64)


def _mapped(address: int) -> bool:
    with open("/proc/self/maps") as maps:
        for line in maps:
            start, end = (int(x, 16) for x in line.split()[0].split("-"))
            if start <= address < end:
                return True
    return False


class FakePinner:
    """Keeps the books a CUDA driver keeps, and fails on any breach of the rules."""

    def __init__(self):
        self.registered: dict[int, int] = {}  # address -> bytes
        self.history: list[tuple[str, int]] = []
        self.copies: set[int] = set()  # data addresses of the arrays copy() made

    def register(self, address, nbytes):
        assert _mapped(address), "registered a range that is not mapped"
        assert address not in self.registered, "registered the same range twice"
        self.registered[address] = nbytes
        self.history.append(("register", address))

    def unregister(self, address):
        assert address in self.registered, "unregistered a range that was not registered"
        assert _mapped(address), "unregistered after unmapping"  # NOTE [ Unregister before unmap ]
        del self.registered[address]
        self.history.append(("unregister", address))

    def copy(self, array):
        out = np.array(array, copy=True)
        self.copies.add(out.ctypes.data)
        return out

    def holds(self, array: np.ndarray) -> bool:
        """Whether ``array``'s bytes lie inside one registered range."""
        start = array.ctypes.data
        return any(a <= start and start + array.nbytes <= a + n for a, n in self.registered.items())


@pytest.fixture
def fake(monkeypatch):
    pinner = FakePinner()
    monkeypatch.setattr(pinning, "choose", lambda pin: (pinner, None) if pin else (None, None))
    return pinner


# ------------------------------------------------------------ one segment

@pytest.mark.pure
def test_a_pinned_segment_is_registered_once_and_released_on_close():
    pinner = FakePinner()
    seg = shm.Segment(0, 1 << 16, pinner=pinner)
    address = np.frombuffer(seg.mmap, np.uint8).ctypes.data
    assert seg.pinned and pinner.registered == {address: 1 << 16}
    window = seg.window(4096, 100)
    other = shm.AttachedSegment(os.dup(seg.fd), seg.size)  # a worker's mapping
    other.array[4096:4100] = [1, 2, 3, 4]
    assert window[:4].tolist() == [1, 2, 3, 4] and window.ctypes.data == address + 4096
    other.close()
    del window
    seg.close()
    assert pinner.history == [("register", address), ("unregister", address)]
    assert not _mapped(address)


@pytest.mark.pure
def test_a_batch_held_past_close_keeps_the_segment_pinned_until_it_goes():
    pinner = FakePinner()
    seg = shm.Segment(0, 1 << 16, pinner=pinner)
    address = np.frombuffer(seg.mmap, np.uint8).ctypes.data
    view = seg.window(0, 1 << 16)[8:16].reshape(2, 4)  # what a user keeps of a batch
    view[:] = 5
    seg.close()
    gc.collect()
    assert pinner.registered and view.sum() == 40  # still mapped, still pinned
    del view
    assert pinner.history == [("register", address), ("unregister", address)] and not _mapped(address)


@pytest.mark.pure
def test_a_refused_registration_leaves_nothing_open():
    class Refusing(FakePinner):
        def register(self, address, nbytes):
            raise pinning.PinningError("refused")

    with pytest.raises(pinning.PinningError, match="refused"):
        shm.Segment(0, 1 << 16, pinner=Refusing())


@pytest.mark.pure
def test_windows_outside_the_region_are_refused():
    seg = shm.Segment(0, 1 << 12, pinner=FakePinner())
    try:
        with pytest.raises(ValueError, match=r"window \[4000, 4200\) outside a region of 4096 bytes"):
            seg.window(4000, 200)
    finally:
        seg.close()


# ------------------------------------------------------------ choosing, and the CUDA runtime's calls

class FakeCudart:
    def __init__(self, code=0):
        self.code, self.calls = code, []

    def cudaHostRegister(self, address, nbytes, flags):
        self.calls.append(("register", address, nbytes, flags))
        return self.code

    def cudaHostUnregister(self, address):
        self.calls.append(("unregister", address))
        return 0

    def cudaGetErrorString(self, code):
        return "out of memory"


def _fake_torch(monkeypatch, kind, cudart=None):
    torch = types.SimpleNamespace(
        accelerator=types.SimpleNamespace(is_available=lambda: kind is not None, current_accelerator=lambda: kind and
                                          types.SimpleNamespace(type=kind)),
        cuda=types.SimpleNamespace(cudart=lambda: cudart))
    monkeypatch.setitem(sys.modules, "torch", torch)
    return torch


@pytest.mark.pure
def test_choose_pins_for_cuda_only(monkeypatch):
    assert pinning.choose(False) == (None, None)
    _fake_torch(monkeypatch, None)
    assert pinning.choose(True) == (None, pinning.NO_ACCELERATOR)
    _fake_torch(monkeypatch, "mps")
    pinner, note = pinning.choose(True)
    assert pinner is None and note.startswith("pin_memory=True: shmload page-locks its shared-memory ring for CUDA only")
    cudart = FakeCudart()
    _fake_torch(monkeypatch, "cuda", cudart)
    pinner, note = pinning.choose(True)
    assert isinstance(pinner, pinning.CudaPinner) and note is None
    pinner.register(4096, 8192)
    pinner.unregister(4096)
    assert cudart.calls == [("register", 4096, 8192, 1), ("unregister", 4096)]  # 1: cudaHostRegisterPortable


@pytest.mark.pure
def test_a_cuda_refusal_is_a_clear_error(monkeypatch):
    _fake_torch(monkeypatch, "cuda", FakeCudart(code=2))
    pinner, _ = pinning.choose(True)
    with pytest.raises(pinning.PinningError, match=r"could not page-lock 8192 bytes .*cudaError 2: out of memory\)"
                                                   r".*pin_memory=False"):
        pinner.register(4096, 8192)


# ------------------------------------------------------------ through the loader

@pytest.mark.parametrize("num_workers", [0, 2])
def test_pinned_batches_are_the_same_batches(fake, num_workers):
    plain = [b.tolist() for b in DataLoader(GrowingDataset(24), batch_size=4)]
    loader = DataLoader(GrowingDataset(24), batch_size=4, num_workers=num_workers, pin_memory=True, timeout=30)
    seen = []
    with warnings.catch_warnings():
        warnings.simplefilter("error", ShmloadWarning)  # pinning is on: no warning
        for batch in loader:
            # with workers the batch is in a registered slot (no copy); without, a pinned copy
            assert fake.holds(batch) if num_workers else batch.ctypes.data in fake.copies
            seen.append(batch.tolist())
    assert seen == plain
    del batch  # the last batch: its slot stays pinned while the user holds it
    loader.close()
    gc.collect()
    assert fake.registered == {}


def test_every_segment_of_a_growing_ring_is_registered_once_and_released(fake):
    loader = DataLoader(GrowingDataset(40, scale=20_000), batch_size=4, num_workers=2, pin_memory=True,
                        timeout=30)
    kept = None
    for i, batch in enumerate(loader):
        assert fake.holds(batch)
        if i == 3:
            kept = batch  # a user keeps one batch past the end
    del batch
    loader.close()
    gc.collect()
    registers = [a for what, a in fake.history if what == "register"]
    assert len(registers) >= 2  # the ring grew: a new segment, registered when it was mapped
    assert fake.holds(kept) and len(fake.registered) == 1  # only the kept batch's segment
    expected = np.stack([np.full(4 * 20_000, i, np.int64) for i in range(12, 16)])
    assert np.array_equal(kept, expected)
    del kept
    assert fake.registered == {}
    assert [w for w, _ in fake.history].count("register") == [w for w, _ in fake.history].count("unregister")


def test_pinned_dict_batches_with_workers(fake):
    loader = DataLoader(ImageDataset(16), batch_size=4, num_workers=2, pin_memory=True, timeout=30)
    for i, batch in enumerate(loader):
        assert fake.holds(batch["image"]) and fake.holds(batch["label"])
        assert batch["label"].tolist() == list(range(4 * i, 4 * i + 4))
    del batch
    loader.close()
    gc.collect()
    assert fake.registered == {}


def test_without_pin_memory_nothing_is_registered(fake):
    loader = DataLoader(RangeDataset(8), batch_size=4, num_workers=1, timeout=30)
    assert [b.tolist() for b in loader] == [[0, 1, 2, 3], [4, 5, 6, 7]]
    loader.close()
    assert fake.history == [] and fake.copies == set()


# ------------------------------------------------------------ CUDA itself

def _cuda() -> bool:
    if importlib.util.find_spec("torch") is None:
        return False
    import torch
    return torch.cuda.is_available()


needs_cuda = pytest.mark.skipif(not _cuda(), reason="needs CUDA (no GPU here)")


@pytest.mark.torch
@needs_cuda
@pytest.mark.parametrize("num_workers", [0, 2])
def test_cuda_batches_are_pinned_and_copy_asynchronously(num_workers):
    import torch
    loader = DataLoader(ImageDataset(32, shape=(3, 64, 64)), batch_size=8, num_workers=num_workers,
                        pin_memory=True, output="torch", timeout=60)
    stream = torch.cuda.Stream()
    for i, batch in enumerate(loader):
        assert batch["image"].is_pinned() and batch["label"].is_pinned()
        with torch.cuda.stream(stream):
            on_gpu = batch["image"].to("cuda", non_blocking=True)
        stream.synchronize()
        assert torch.equal(on_gpu.cpu(), batch["image"])
        assert batch["label"].tolist() == list(range(8 * i, 8 * i + 8))
    loader.close()


@pytest.mark.torch
@needs_cuda
def test_cuda_nothing_stays_registered_after_close():
    import torch
    loader = DataLoader(ImageDataset(16, shape=(3, 64, 64)), batch_size=4, num_workers=2, pin_memory=True,
                        output="torch", timeout=60)
    batch = next(iter(loader))
    address = batch["image"].data_ptr()
    assert batch["image"].is_pinned()
    del batch
    loader.close()
    gc.collect()
    # unregistering again fails (cudaErrorHostMemoryNotRegistered) when nothing is registered there
    assert int(torch.cuda.cudart().cudaHostUnregister(address)) != 0


def test_a_forked_child_dropping_its_copy_does_not_unregister_the_parents_pinning():
    pinner = FakePinner()
    seg = shm.Segment(0, 1 << 16, pinner=pinner)
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: drops the segment, reports what its (copied) fake saw
        try:
            seg.close()
            gc.collect()
            os.write(write, b"kept" if pinner.registered else b"unregistered")
        finally:
            os._exit(0)
    os.close(write)
    try:
        assert os.read(read, 32) == b"kept"
    finally:
        os.close(read)
        os.waitpid(pid, 0)
    assert pinner.registered
    seg.close()
    assert pinner.registered == {}
