"""Progress: what the consumer has been given in one epoch, the record from which
``DataLoader.state_dict()`` is made (``resume.py``). Both epoch iterators record each
batch as they deliver it (or raise its error at its position)."""

from __future__ import annotations

from typing import Any

from .._transport.messages import StreamPoint


class _Progress:
    """An epoch's record, kept by the loader after its iterator is gone (a ``for`` loop
    left with ``break`` drops the iterator, and with it the workers, but the loader must
    still be able to say where the consumer stopped)."""

    epoch = 0
    finished = False  # the epoch ran to its end (StopIteration)
    # The batch recorded last is kept for the next next(), not handed over yet: an
    # interrupt was handed on as the next() that loaded it ended (NOTE [ An interrupt
    # during next() ], epoch.py). A state saved meanwhile counts it as not delivered.
    held = False

    @property
    def saveable(self) -> bool:
        """Does a state saved now describe this epoch (not the start of the next)?"""
        return not self.finished or self.held


class BatchProgress(_Progress):
    """The positions of a map-style epoch delivered so far: all below ``next_batch``, and
    ``beyond`` (delivered out of order, ``in_order=False``); and the sampler's state at
    the epoch's start."""

    def __init__(self, start: int = 0, beyond: frozenset[int] = frozenset(), sampler_state: Any = None):
        self.sampler_state = sampler_state
        self.next_batch = start
        self.beyond = set(beyond)
        self._settle()

    last = -1  # the position recorded last

    def record(self, seq: int, stream: Any) -> None:
        """The batch at position ``seq`` was delivered (or raised at its position)."""
        self.last = seq
        self.delivered(seq)

    def saved(self) -> tuple[int, list[int]]:
        """(next batch, positions delivered beyond it) as a saved state says them: without
        a held batch."""
        s = self.last
        if not self.held or s < 0:
            return self.next_batch, sorted(self.beyond)
        if s >= self.next_batch:
            return self.next_batch, sorted(self.beyond - {s})
        return s, sorted(self.beyond.union(range(s + 1, self.next_batch)))

    def delivered(self, seq: int) -> None:
        if seq == self.next_batch:
            self.next_batch += 1
            if self.beyond:
                self._settle()
        else:
            self.beyond.add(seq)

    def _settle(self) -> None:
        while self.next_batch in self.beyond:
            self.beyond.discard(self.next_batch)
            self.next_batch += 1


class StreamProgress(_Progress):
    """The draws of each worker's stream delivered so far, the source's state after the
    last one, the streams whose end was delivered, and whose turn comes next."""

    def __init__(self, streams: int):
        self.draws = [0] * streams
        self.states: list[Any] = [None] * streams
        self.ended: set[int] = set()
        self.next_worker = 0

    @classmethod
    def resumed(cls, state: dict) -> StreamProgress:
        """The progress a saved iterable epoch had (``stream_state``'s inverse)."""
        progress = cls(len(state["streams"]))
        for w, s in enumerate(state["streams"]):
            progress.draws[w], progress.states[w] = s["draws"], s["state"]
            if s["ended"]:
                progress.ended.add(w)
        progress.next_worker = state["next_worker"]
        return progress

    def record(self, seq: int, stream: tuple[int, StreamPoint]) -> None:
        """A draw was delivered (or raised at its position): ``stream`` is its worker and
        the stream's position after it."""
        worker, point = stream
        self._undo = (worker, self.draws[worker], self.states[worker], self.next_worker)
        self.delivered(worker, point.draws, point.state)

    _undo: tuple[int, int, Any, int] | None = None  # the stream's record before the last draw

    def saved(self) -> tuple[list[int], list[Any], int]:
        """(draws, states, next worker) as a saved state says them: without a held draw."""
        draws, states, next_worker = list(self.draws), list(self.states), self.next_worker
        if self.held and self._undo is not None:
            worker, draws[worker], states[worker], next_worker = self._undo
        return draws, states, next_worker

    def delivered(self, worker: int, draws: int, state: Any) -> None:
        self.draws[worker] = draws
        self.states[worker] = state
        self.next_worker = (worker + 1) % len(self.draws)

    def end(self, worker: int) -> None:
        self.ended.add(worker)
        self.next_worker = (worker + 1) % len(self.draws)
