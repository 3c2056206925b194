"""Schedule: what the next task loads, in which position, and (for streams) on which worker.

Pure, like the samplers. The epoch asks :meth:`peek` for the next task, and
:meth:`commit` once it was sent; a task that could not be sent yet is asked for again.

:class:`SamplerSchedule` numbers the batches of a map-style dataset's sampler. A resumed
epoch starts at the position it was saved at, and skips the positions already delivered
out of order (``in_order=False``), so every batch keeps its position, and with it its
seeds: the batches are bit-identical to an uninterrupted epoch's.

:class:`RoundRobinSchedule` serves iterable sources, where every worker reads its own
stream. The delivery order is a fixed rotation over the workers: one batch from worker
0, one from worker 1, ..., and a worker whose stream has ended drops out of the
rotation. Why this order is the same in every run, however the workers' timing varies:
tasks go to the workers in rotation order and are delivered in task order (the reorder
buffer), and removing a worker from a rotation leaves the others' relative order as it
was, so it does not matter how many tasks an ended worker was sent before its end was
known: those come back empty (``messages.Exhausted``) and are skipped.
"""

from __future__ import annotations

from typing import Any, Iterator, NamedTuple, Protocol

import numpy as np

from .._transport.messages import Draw, Indices, StreamPoint


class Planned(NamedTuple):
    seq: int  # the batch's position in the epoch (delivery order, and its seeds for map-style)
    load: Any  # dataset indices, or a messages.Draw
    worker: int | None  # the worker it must go to (a stream's), or None: any


class Schedule(Protocol):
    """What an epoch (``epoch.py``) needs of its schedule: the contract both kinds keep."""

    def peek(self) -> Planned | None:
        """The next task to send (the same one until :meth:`commit`), None at the end."""

    def commit(self) -> None:
        """The task :meth:`peek` gave was sent: the next ``peek`` gives the one after it."""

    def ended(self, worker: int) -> None:
        """``worker``'s stream has ended: plan no more of its draws (map-style: no-op)."""


def batch_indices(indices: Any, seq: int) -> Any:
    """One batch of a batch sampler as the workers take it: a list or an array as it is,
    any other iterable of indices (a set, a tuple, a generator) as a list, as torch
    accepts them. Checked here, in the main process: a single index (a sampler passed as
    ``batch_sampler``, a common slip) is torch's TypeError, before any worker sees it."""
    kind = type(indices)
    if kind is list or kind is Indices or kind is np.ndarray:
        return indices
    if isinstance(indices, (str, bytes)) or not hasattr(indices, "__iter__"):
        raise TypeError(
            f"'{kind.__name__}' object is not iterable: the batch sampler yielded {indices!r} for batch {seq}, "
            "where a batch sampler yields a list of dataset indices per batch. A sampler of single indices "
            "goes in sampler= (with batch_size=), not in batch_sampler=.")
    return list(indices)


class SamplerSchedule:
    """The batches of a sampler, numbered from ``start``; positions in ``skip`` (delivered
    before a save) are passed over."""

    def __init__(self, batches: Iterator[Any], start: int = 0, skip: frozenset[int] = frozenset(),
                 batched: bool = True):
        self._batches = batches
        self._batched = batched  # False: single indices (batch_size=None), taken as they are
        self._seq = start
        self._skip = skip
        self._next: Planned | None = None
        self.done = False

    def peek(self) -> Planned | None:
        """The next task, or None once the sampler is exhausted."""
        while self._next is None and not self.done:
            try:
                indices = next(self._batches)
            except StopIteration:
                self.done = True
                break
            seq, self._seq = self._seq, self._seq + 1
            if seq not in self._skip:
                self._next = Planned(seq, batch_indices(indices, seq) if self._batched else indices, None)
        return self._next

    def commit(self) -> None:
        self._next = None

    def ended(self, worker: int) -> None:
        raise AssertionError("a map-style epoch has no streams to end")


class RoundRobinSchedule:
    """Draws from ``streams`` worker streams in rotation, starting with ``first``.

    ``draws[w]`` is the draw worker ``w`` makes next, ``ended`` the streams that ended,
    and ``restores[w]`` where stream ``w`` must start (see ``messages.StreamPoint``); all
    three describe a resumed epoch, and are empty for a fresh one."""

    def __init__(self, streams: int, size: int | None, drop_last: bool, draws: list[int] | None = None,
                 ended: set[int] | frozenset[int] = frozenset(), first: int = 0,
                 restores: dict[int, StreamPoint] | None = None):
        self.size, self.drop_last = size, drop_last
        self.draws = list(draws) if draws is not None else [0] * streams
        self.active = [w not in ended for w in range(streams)]
        self._turn = first % streams
        self._seq = 0
        self._restores = dict(restores or {})

    @property
    def done(self) -> bool:
        return not any(self.active)

    def peek(self) -> Planned | None:
        """The next draw, or None once every stream has ended."""
        if self.done:
            return None
        n = len(self.active)
        while not self.active[self._turn]:
            self._turn = (self._turn + 1) % n
        w = self._turn
        draw = Draw(w, self.draws[w], self.size, self.drop_last, self._restores.get(w))
        return Planned(self._seq, draw, w)

    def commit(self) -> None:
        w = self._turn
        self._restores.pop(w, None)
        self.draws[w] += 1
        self._seq += 1
        self._turn = (w + 1) % len(self.active)

    def ended(self, worker: int) -> None:
        """Worker ``worker``'s stream ended: no more draws from it this epoch."""
        self.active[worker] = False
