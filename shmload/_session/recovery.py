"""Worker deaths: a replacement that picks up the dead worker's tasks, or the error.

A dead worker is reported as :class:`~shmload.WorkerDiedError` (``errors.death_error``),
unless the loader still has restarts left (``max_worker_restarts``): then a replacement
with the same id is started and sent the dead one's tasks again, unchanged, in order:
same batch positions, hence the same seeds, and the same slots (nothing else can write
them: their only writer is dead). The epoch then yields exactly what it would have
without the fault. A worker that dies before it reported ready is never restarted,
since its replacement would most likely die the same way.

A worker reading an iterable source takes up its stream where the dead one left it:
from the source's ``state_dict()`` after the dead worker's last finished draw, if the
source has one (:meth:`Recovery.stream_point`); else it re-reads the stream from the
start and skips the draws made (the same batches again if the stream is deterministic).
"""

from __future__ import annotations

import warnings
from typing import Any, Callable

from .._batching.layout import LayoutCache
from .._transport.messages import Draw, StreamPoint
from .._transport.ring import Slot
from ..errors import ShmloadWarning, restart_message
from .allocation import SlotAllocator
from .dispatch import Dispatcher
from .spans import SplitBatches
from .supervisor import Supervisor


class RestartBudget:
    """The worker restarts one loader has used, shared by its sessions: the bound
    ``max_worker_restarts`` is per loader, not per epoch."""

    def __init__(self) -> None:
        self.used = 0


class Recovery:
    """A session's restarts of dead workers, and where each worker's stream stands."""

    def __init__(self, limit: int, budget: RestartBudget, dispatcher: Dispatcher, allocator: SlotAllocator,
                 layouts: LayoutCache, splits: SplitBatches, give_back: Callable[[Slot | None], None]):
        self.limit, self.budget = limit, budget
        self._dispatcher, self._allocator, self._layouts, self._splits = dispatcher, allocator, layouts, splits
        self._give_back = give_back
        # Each worker's stream position after its last finished draw of this iteration.
        self._stream_points: dict[int, StreamPoint] = {}
        # A restarted worker that held no draw: where its stream starts, for its next draw.
        self.pending: dict[int, StreamPoint] = {}

    def begin_iteration(self) -> None:
        self._stream_points.clear()
        self.pending.clear()

    def finished_draw(self, wid: int, point: StreamPoint) -> None:
        """Worker ``wid``'s stream stands at ``point`` after a finished draw."""
        self._stream_points[wid] = point

    def replaces(self, h: Any) -> bool:
        """Whether dead worker ``h`` is replaced (it was ready, and restarts are left)."""
        return bool(h.ready) and self.budget.used < self.limit

    def restart(self, h: Any, supervisor: Supervisor, iteration: int, attach: Callable[[int], None]) -> None:
        """Replace dead worker ``h``, ``attach`` the replacement to the session's shared
        memory, and send it what ``h`` held of ``iteration``; an earlier iteration's
        tasks are dropped."""
        self.budget.used += 1
        held = self._dispatcher.held_by(h.id)
        self._allocator.forget(h.id)
        self._layouts.forget(h.id)
        new = supervisor.restart(h.id)
        attach(h.id)
        restore = self.stream_point(h.id)
        if restore is not None:
            self.pending[h.id] = restore  # for its first draw, held or yet to come
        for entry in held:
            task = entry.task
            if task.iteration != iteration:  # an abandoned epoch's batch: drop it
                key = (task.iteration, task.seq)
                self._dispatcher.complete(h.id, key)
                if key in self._splits:  # the batch's slot goes back with its last span
                    self._splits.dropped(h.id, key)
                else:
                    self._give_back(entry.slot)
                continue
            task = task._replace(load=self.restored(h.id, task.load))
            supervisor.send(h.id, task._replace(slot=entry.slot.ref if entry.slot is not None else None))
        seqs = [e.task.seq for e in held if e.task.iteration == iteration]
        warnings.warn(restart_message(h, new.pid, self.budget.used, self.limit, seqs), ShmloadWarning, stacklevel=2)

    def restored(self, wid: int, load: Any) -> Any:
        """``load``, or if it is the first draw sent to a restarted worker ``wid``, that draw
        with where the stream starts."""
        if type(load) is Draw and wid in self.pending:
            return load._replace(restore=self.pending.pop(wid))
        return load

    def stream_point(self, wid: int) -> StreamPoint | None:
        """Where worker ``wid``'s replacement takes up an iterable source's stream; None:
        from the start, skipping the draws made (the module's docstring)."""
        point = self._stream_points.get(wid)
        return point if point is not None and point.state is not None else None
