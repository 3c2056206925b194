"""Batch lifetime: the views handed to the user, and noticing when they are gone.

Every array of a yielded batch is a view of one *owner* ndarray covering the slot.
numpy collapses chains of views to the first array whose base is not an ndarray, so
every view's ``.base`` is the owner (the owner's own base is the mmap, or for a pinned
segment a window object that keeps the page-locked region alive: pinning.py), and
so is the base of anything derived from a view by slicing, reshaping or
``torch.from_numpy``. The owner therefore dies exactly when the last reference to the
batch's data does, and a weak reference to it reports the slot as free.

Why not a finalizer on a memoryview of the slot: ``np.frombuffer`` takes its own export
of a buffer, so such a finalizer fires while views still live.

The weakref callback only appends to a deque: it may run at any moment (inside garbage
collection, in another thread, in the middle of the loader's own code), so the
iterator drains the deque in its own code before it reuses any slot. The callback is
the deque's own ``append`` (C), not a Python function: Python runs a signal's handler
at the first bytecode of a Python callback, and drops whatever it raises there
("Exception ignored in"), so a preemption handler's SystemExit landing as the `for`
loop dropped the previous batch was lost (NOTE [ An interrupt during a finalizer ],
_signals.py). With no bytecode in the callback, the handler runs in the user's code.
"""

from __future__ import annotations

import sys
import weakref
from collections import deque
from typing import Any

import numpy as np

from .._batching import layout as _layout
from .._transport.ring import Slot, SlotState
from ..errors import TensorTypeError


class ReleaseQueue:
    """Slots whose batches the user has dropped. Filled by weakref callbacks only."""

    def __init__(self) -> None:
        # the watches of dropped batches, appended by C; empty at most next() calls, which
        # look at it before calling drain()
        self.dead: deque[weakref.ref] = deque()
        self._watched: dict[int, Slot] = {}  # id(watch) -> its slot (the slot holds the watch)

    def watch(self, owner: np.ndarray, slot: Slot) -> None:
        slot.watch = watch = weakref.ref(owner, self.dead.append)
        self._watched[id(watch)] = slot

    def drain(self) -> list[Slot]:
        out = []
        while self.dead:
            out.append(self._watched.pop(id(self.dead.popleft())))
        return out


def to_torch(array: np.ndarray) -> Any:
    try:
        return sys.modules["torch"].from_numpy(array)
    except TypeError as exc:
        raise TensorTypeError(f"output='torch' cannot hold an array of dtype {array.dtype} and shape {array.shape} "
                           f"({exc}); convert it in the dataset, or use output='numpy'") from None


def deliver(slot: Slot | None, layout: _layout.Layout, releases: ReleaseQueue, output: str) -> Any:
    """The user's batch: views into ``slot``; the slot is HELD until they are all gone."""
    if slot is None:  # no array bytes: only Python objects, or arrays of size zero
        make = (lambda spec: to_torch(np.empty(spec.shape, spec.dtype))) if output == "torch" else \
            (lambda spec: np.empty(spec.shape, spec.dtype))
        return _layout.build(layout, make)
    owner = slot.segment.window(slot.offset, slot.capacity)
    slot.state = SlotState.HELD
    releases.watch(owner, slot)
    return _layout.views_in(layout, owner, to_torch if output == "torch" else None)
