"""``pin_memory=True``: page-locking the ring for the accelerator, once per segment.

torch's loader pins by copying: its pin-memory thread copies every batch into a fresh
page-locked buffer, so ``batch.to("cuda", non_blocking=True)`` can be a true
asynchronous copy. shmload's batches already live in ring slots that are reused for the
whole run, so the ring itself is page-locked instead: each segment is registered with
CUDA (``cudaHostRegister``, through ``torch.cuda.cudart()``, as torch's own
``torch.cuda._pin_memory_utils`` does) once, when the main process maps it, and the
batches are pinned with no copy at all. Workers never touch CUDA: only the main process,
which copies to the device, needs the registration.

NOTE [ Unregister before unmap ]
A registered range must be unregistered while it is still mapped: unmapping it first
leaves the driver holding the pages (and a later registration of the same addresses
fails). But a segment's mapping must outlive the loader's hold on it while the user
still holds batches in it (see shm.py), and a registered mapping cannot be watched the
usual way, by the buffer exports numpy takes of the mmap: ``mmap.close()`` refuses while
exports live, and a finalizer on the mmap runs only after it is unmapped. So a pinned
segment hands out its arrays through a :class:`PinnedRegion` instead: every slot's owner
array (lifetime.py) has as its base a small window object that holds the region, the
region holds the mmap, and the region's finalizer unregisters and then unmaps. It runs
when the segment is closed and the last batch in it is dropped, whichever comes last.

Without CUDA (no accelerator, or another kind), torch's warning, and the same batches in
pageable memory. With ``num_workers=0`` there is no ring: each array of a batch is copied
into page-locked memory, as torch's loader does.
"""

from __future__ import annotations

import os
import weakref
from typing import Any, Protocol

import numpy as np

from .._core._torch import loaded_torch
from ..errors import PinningError

# torch's own words, which scripts filter warnings by
NO_ACCELERATOR = ("'pin_memory' argument is set as true but no accelerator is found, then device pinned memory "
                  "won't be used.")


class Pinner(Protocol):
    """What pins memory for one accelerator. The CUDA one below; tests use a fake."""

    def register(self, address: int, nbytes: int) -> None: ...

    def unregister(self, address: int) -> None: ...

    def copy(self, array: np.ndarray) -> np.ndarray: ...


class CudaPinner:
    """Page-locks host memory for CUDA through the runtime that torch loaded."""

    def __init__(self, torch: Any):
        self._torch = torch
        self._cudart = torch.cuda.cudart()

    def _error(self, code: int) -> str:
        describe = getattr(self._cudart, "cudaGetErrorString", None)
        try:
            return f"cudaError {code}: {describe(code)}" if describe else f"cudaError {code}"
        except Exception:
            return f"cudaError {code}"

    def register(self, address: int, nbytes: int) -> None:
        code = int(self._cudart.cudaHostRegister(address, nbytes, 1))  # 1: cudaHostRegisterPortable
        if code != 0:
            raise PinningError(
                f"pin_memory=True: CUDA could not page-lock {nbytes} bytes of the loader's shared memory "
                f"({self._error(code)}). Page-locked memory is limited by the machine's RAM; make the ring "
                "smaller (prefetch_factor, num_workers, batch_size, max_shm_bytes) or pass pin_memory=False.")

    def unregister(self, address: int) -> None:
        self._cudart.cudaHostUnregister(address)  # its result is not actionable: the mapping goes next

    def copy(self, array: np.ndarray) -> np.ndarray:
        try:
            return self._torch.from_numpy(array).pin_memory().numpy()
        except TypeError:  # a dtype torch cannot hold: such a batch cannot go to the device anyway
            return array


def choose(pin_memory: bool) -> tuple[Pinner | None, str | None]:
    """(the pinner for this process's accelerator, or None; the warning to give, if any).

    Only an accelerator torch already knows about counts: torch is not imported for it."""
    if not pin_memory:
        return None, None
    torch = loaded_torch()
    accelerator = getattr(torch, "accelerator", None)
    if accelerator is None or not accelerator.is_available():
        return None, NO_ACCELERATOR
    device = accelerator.current_accelerator()
    if getattr(device, "type", None) != "cuda":
        return None, (f"pin_memory=True: shmload page-locks its shared-memory ring for CUDA only, not for "
                      f"{device}, so batches are in pageable memory and a .to(device, non_blocking=True) copy "
                      "is not asynchronous. The batches are the same.")
    return CudaPinner(torch), None


def _release(pinner: Pinner, address: int, mm: Any, pid: int) -> None:
    try:
        if os.getpid() == pid:  # a forked child's copy was never registered by it, and has no CUDA
            pinner.unregister(address)  # NOTE [ Unregister before unmap ]
    finally:
        mm.close()


class PinnedRegion:
    """A mapping page-locked for as long as the segment or any batch in it lives."""

    def __init__(self, mm: Any, pinner: Pinner):
        probe = np.frombuffer(mm, dtype=np.uint8)
        self.address, self.size = probe.ctypes.data, probe.size
        del probe  # no buffer export of the mmap stays: the region alone decides when it goes
        pinner.register(self.address, self.size)
        self._finalizer = weakref.finalize(self, _release, pinner, self.address, mm, os.getpid())
        self._finalizer.atexit = False  # at exit the process's end frees it; CUDA may be gone by then

    def window(self, offset: int, count: int) -> np.ndarray:
        """A uint8 array over ``count`` bytes at ``offset`` whose base holds the region."""
        if offset < 0 or count < 0 or offset + count > self.size:
            raise ValueError(f"window [{offset}, {offset + count}) outside a region of {self.size} bytes")
        return np.asarray(_Window(self, self.address + offset, count))


class _Window:
    """The base of one owner array: keeps the region alive, describes its bytes to numpy."""

    __slots__ = ("region", "__array_interface__")

    def __init__(self, region: PinnedRegion, address: int, count: int):
        self.region = region
        self.__array_interface__ = {"version": 3, "shape": (count,), "typestr": "|u1", "data": (address, False)}
