"""What a batch is waiting for, and the ring described, for time-out and error messages."""

from __future__ import annotations

from typing import Any

from .._core._units import binary_size
from .._transport.ring import Ring, SlotState
from ..errors import describe_load, starting_steps
from .allocation import SlotAllocator
from .config import LoaderConfig
from .dispatch import Dispatcher


def why_waiting(seq: int, iteration: int, allocator: SlotAllocator, dispatcher: Dispatcher, workers: Any, ring: Ring,
                cfg: LoaderConfig) -> str:
    """What batch ``seq`` of ``iteration`` is waiting for: a slot, a worker loading it
    (or still starting), or a free slot to be dispatched at all."""
    wait = allocator.waiting_for(iteration, seq)
    if wait is not None:
        return (f"worker {wait.worker} has loaded it and is waiting for a ring slot of "
                f"{binary_size(wait.need.nbytes)} ({describe_ring(ring, cfg.shm_backend)})")
    for h in workers:
        for entry in dispatcher.held_by(h.id):
            if entry.task.iteration == iteration and entry.task.seq == seq:
                what = describe_load(entry.task.load)
                if entry.task.span is not None:  # one of the workers loading a split batch
                    sp = entry.task.span
                    what += f" (rows {sp.start} to {sp.stop - 1} of the batch's {sp.rows}, a part of it)"
                if not h.ready:  # it has the task, but has not even begun to run
                    return (f"worker {h.id} (pid {h.pid}) has not finished starting: it is still in "
                            f"{starting_steps(cfg.context.get_start_method(), cfg.worker_init_fn)} "
                            f"(it was given {what}). A worker_init_fn that blocks, or a dataset slow to unpickle "
                            "under spawn or forkserver, does this")
                return f"worker {h.id} (pid {h.pid}) is loading {what}"
    held = len(ring.slots_in(SlotState.HELD))
    return f"it is not dispatched yet: no ring slot is free (the consumer holds {held} batches)"


def describe_ring(ring: Ring, backend: str) -> str:
    """The ring's slots, size, backend and bound, in words."""
    if not ring.slot_bytes:
        return f"ring not sized yet (sized from the first batch; {backend} segments)"
    return (f"ring {ring.num_slots} slots x {binary_size(ring.slot_bytes)} = {binary_size(ring.nbytes)} of shared "
            f"memory ({backend} segments, bound {binary_size(ring.max_bytes)})")
