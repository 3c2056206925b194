"""Resume: what the consumer has been given this epoch, and the loader's state for an
exact resume (``DataLoader.state_dict()``).

Why saving a position is enough for bit-identical batches: a map-style batch is fixed by
the sampler's order for the epoch (fixed by the sampler's own state at the epoch's
start, which is saved) and by its position, which fixes its seeds (``seeding.py``), for
any ``num_workers``. So the state is (epoch, sampler state at the epoch's start, batches
delivered); a resumed epoch re-creates the order, skips the delivered batches without
loading them, and loads the rest at their old positions. The sampler's state is taken at
the *start* of the epoch, not at the save: by then the loader has already pulled the
batches it prefetches, so the sampler is ahead of the consumer.

An iterable source cannot be re-ordered, only continued: its state is each worker
stream's position (draws delivered and the source's own ``state_dict()`` after the last
one), the streams that ended, and whose turn is next (``schedule.RoundRobinSchedule``).

Both are plain dicts of ints, lists and the samplers' (or sources') own states:
JSON-serializable when those are. The format is documented in docs/api.md.
"""

from __future__ import annotations

from typing import Any

from .messages import Restore, StreamPoint

FORMAT = 1
KEY = "shmload_loader_state"  # the format version's key, which marks a dict as ours


class _Progress:
    """An epoch's record, kept by the loader after its iterator is gone (a ``for`` loop
    left with ``break`` drops the iterator, and with it the workers, but the loader must
    still be able to say where the consumer stopped)."""

    epoch = 0
    finished = False  # the epoch ran to its end (StopIteration)


class BatchProgress(_Progress):
    """The positions of a map-style epoch delivered so far: all below ``next_batch``, and
    ``beyond`` (delivered out of order, ``in_order=False``); and the sampler's state at
    the epoch's start."""

    def __init__(self, start: int = 0, beyond: frozenset[int] = frozenset(), sampler_state: Any = None):
        self.sampler_state = sampler_state
        self.next_batch = start
        self.beyond = set(beyond)
        self._settle()

    def record(self, seq: int, stream: Any) -> None:
        """The batch at position ``seq`` was delivered (or raised at its position)."""
        self.delivered(seq)

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
        self.delivered(worker, point.draws, point.state)

    def delivered(self, worker: int, draws: int, state: Any) -> None:
        self.draws[worker] = draws
        self.states[worker] = state
        self.next_worker = (worker + 1) % len(self.draws)

    def end(self, worker: int) -> None:
        self.ended.add(worker)
        self.next_worker = (worker + 1) % len(self.draws)


def map_state(epoch: int, seed: int, sampler_state: Any, progress: BatchProgress | None, batching: dict) -> dict:
    return {KEY: FORMAT, "kind": "map", "epoch": epoch, "seed": seed, "batching": batching,
            "next_batch": progress.next_batch if progress else 0,
            "delivered_beyond": sorted(progress.beyond) if progress else [],
            "sampler": sampler_state}


def stream_state(epoch: int, seed: int, streams: int, progress: StreamProgress | None, batching: dict) -> dict:
    if progress is None:
        progress = StreamProgress(streams)
    return {KEY: FORMAT, "kind": "iterable", "epoch": epoch, "seed": seed, "batching": batching, "streams": [
        {"draws": progress.draws[w], "state": progress.states[w], "ended": w in progress.ended}
        for w in range(streams)], "next_worker": progress.next_worker}


def restores(state: dict) -> dict[int, Restore]:
    """Where each stream of a saved iterable epoch starts again."""
    return {w: Restore(s["draws"], s["state"]) for w, s in enumerate(state["streams"]) if s["draws"]}


def check(state: Any, kind: str) -> dict:
    """``state`` if it is a loader state of this ``kind`` and format, else a clear error."""
    if not isinstance(state, dict) or KEY not in state:
        raise ValueError(f"load_state_dict expected a dict from DataLoader.state_dict(), but got "
                         f"{type(state).__name__} {_short(state)}")
    if state[KEY] != FORMAT:
        raise ValueError(f"load_state_dict: the state has format {state[KEY]!r}; this version of shmload "
                         f"reads format {FORMAT}")
    if state.get("kind") != kind:
        raise ValueError(f"load_state_dict: the state was saved by a loader over a{'n' if state.get('kind') == 'iterable' else ''} "
                         f"{state.get('kind')} dataset, but this loader's dataset is {kind}")
    needed = ("epoch", "seed", "batching", "next_batch", "delivered_beyond", "sampler") if kind == "map" else \
        ("epoch", "seed", "batching", "streams", "next_worker")
    missing = [k for k in needed if k not in state]
    if missing:
        raise ValueError(f"load_state_dict: the state has no {', '.join(missing)}")
    return state


def _short(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 80 else text[:77] + "..."
