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

import numbers
from typing import Any, Callable, NamedTuple

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
    """``state`` if it is a loader state of this ``kind`` and format, and of the shape
    ``map_state``/``stream_state`` make (NOTE [ Checking a loaded state ]), else a
    ValueError naming every problem."""
    if not isinstance(state, dict) or KEY not in state:
        raise ValueError(f"load_state_dict expected a dict from DataLoader.state_dict(), but got "
                         f"{type(state).__name__} {_short(state)}")
    if state[KEY] != FORMAT:
        raise ValueError(f"load_state_dict: the state has format {state[KEY]!r}; this version of shmload "
                         f"reads format {FORMAT}")
    if state.get("kind") != kind:
        raise ValueError(f"load_state_dict: the state was saved by a loader over a{'n' if state.get('kind') == 'iterable' else ''} "
                         f"{state.get('kind')} dataset, but this loader's dataset is {kind}")
    problems = _problems(state, _MAP if kind == "map" else _ITERABLE, "state")
    if not problems and kind == "iterable" and state["next_worker"] >= len(state["streams"]):
        problems.append(f"state['next_worker'] is {state['next_worker']}, expected an int below "
                        f"len(state['streams']), {len(state['streams'])} (the worker whose turn is next)")
    if len(problems) == 1:
        raise ValueError(f"load_state_dict: {problems[0]}")
    if problems:
        raise ValueError(f"load_state_dict: {len(problems)} problems with the state: {'; '.join(problems)}")
    return state


# NOTE [ Checking a loaded state ]. A state comes back from a checkpoint file: perhaps
# written by hand, edited, cut short, or made by another version. Everything the loader
# reads from it is checked here, once, before anything is changed, so a malformed state
# is one ValueError naming each problem by its key path (``state['batching']['drop_last']``)
# and what was expected, never a KeyError or TypeError from deep inside the loader, and
# never half loaded. The shapes below are what map_state() and stream_state() write; the
# sampler's (or source's) own state is its business (its load_state_dict checks it).
# ``batching`` allows no other keys: the loader compares it whole with its own.

class _Expect(NamedTuple):
    """A leaf: ``what`` was expected, ``ok`` tells (None: anything is accepted)."""

    what: str
    ok: Callable[[Any], bool] | None


class _Dict(NamedTuple):
    """A dict with these keys, each of its shape; ``closed``: no other keys."""

    what: str
    keys: dict
    closed: bool = False


class _List(NamedTuple):
    """A list (a tuple is taken too), each item of the shape ``item``."""

    what: str
    item: Any
    non_empty: bool = False


def _count(value: Any) -> bool:
    return isinstance(value, numbers.Integral) and not isinstance(value, bool) and value >= 0


_COUNT = "a non-negative int"
_BATCHING = _Dict("a dict with 'batch_size' and 'drop_last', as the saving loader had them", {
    "batch_size": _Expect("a positive int or None, the batch_size of the loader that saved it",
                          lambda v: v is None or (_count(v) and v > 0)),
    "drop_last": _Expect("a bool, the drop_last of the loader that saved it", lambda v: isinstance(v, bool))},
    closed=True)
_COMMON = {
    "epoch": _Expect(f"{_COUNT}, the epoch the next iter() runs", _count),
    "seed": _Expect(f"{_COUNT}, the loader's seed", _count),
    "batching": _BATCHING}
_MAP = _Dict("a loader state", {
    **_COMMON,
    "next_batch": _Expect(f"{_COUNT}, the position of the first batch not delivered", _count),
    "delivered_beyond": _List("a list of non-negative ints, the positions delivered after next_batch",
                              _Expect(_COUNT, _count)),
    "sampler": _Expect("the sampler's state_dict(), or None", None)})
_ITERABLE = _Dict("a loader state", {
    **_COMMON,
    "streams": _List("a non-empty list of dicts with 'draws', 'state' and 'ended', one per worker's stream",
                     _Dict("a dict with 'draws', 'state' and 'ended'", {
                         "draws": _Expect(f"{_COUNT}, the stream's draws delivered", _count),
                         "state": _Expect("the source's state_dict() after them, or None", None),
                         "ended": _Expect("a bool, whether the stream's end was delivered",
                                          lambda v: isinstance(v, bool))}),
                     non_empty=True),
    "next_worker": _Expect(f"{_COUNT}, the worker whose turn is next", _count)})


def _problems(value: Any, shape: Any, path: str) -> list[str]:
    """What is wrong with ``value`` at ``path`` against ``shape``, one sentence each."""
    if type(shape) is _Expect:
        return [] if shape.ok is None or shape.ok(value) else [f"{path} is {_described(value)}, expected {shape.what}"]
    if type(shape) is _List:
        if not isinstance(value, (list, tuple)) or (shape.non_empty and not value):
            return [f"{path} is {_described(value)}, expected {shape.what}"]
        bad = [found for i, item in enumerate(value) if (found := _problems(item, shape.item, f"{path}[{i}]"))]
        if len(bad) > 1:  # the first wrong item says what is wrong: not a line for each of a million
            bad[0][-1] += f" (and {len(bad) - 1} more wrong items in {path})"
        return bad[0] if bad else []
    if not isinstance(value, dict):
        return [f"{path} is {_described(value)}, expected {shape.what}"]
    problems = []
    missing = [k for k in shape.keys if k not in value]
    if missing:
        owner = "the state" if path == "state" else path
        expected = ", ".join(f"{path}[{k!r}] ({shape.keys[k].what})" for k in missing)
        problems.append(f"{owner} has no {', '.join(missing)}: expected {expected}")
    if shape.closed:
        wanted = " and ".join(repr(k) for k in shape.keys)
        problems += [f"{path} has an unexpected key {k!r}: expected only {wanted}"
                     for k in value if k not in shape.keys]
    for key, inner in shape.keys.items():
        if key in value:
            problems += _problems(value[key], inner, f"{path}[{key!r}]")
    return problems


def _described(value: Any) -> str:
    if value is None:
        return "None"
    name = type(value).__name__
    return f"{_short(value)} ({'an' if name[0] in 'aeiouAEIOU' else 'a'} {name})"


def _short(value: Any) -> str:
    try:
        text = repr(value)
    except Exception:  # a value of the user's, in a state they made
        text = f"<a {type(value).__name__} whose repr() failed>"
    return text if len(text) <= 80 else text[:77] + "..."
