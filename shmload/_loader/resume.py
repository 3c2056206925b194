"""Resume: the loader's state for an exact resume (``DataLoader.state_dict()``), the
checks a loaded one must pass, and the plan of a resumed epoch. What the consumer has
been given in an epoch is recorded by ``progress.py``.

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

import copy
import numbers
from typing import Any, Callable, Iterator, NamedTuple

from .._ordering.schedule import RoundRobinSchedule, SamplerSchedule
from .._ordering.shuffle import StreamShuffle
from .._ordering.stream import loaded_snapshot
from .._transport.messages import StreamPoint
from .progress import BatchProgress, StreamProgress

FORMAT = 1
KEY = "shmload_loader_state"  # the format version's key, which marks a dict as ours


def map_state(epoch: int, seed: int, sampler_state: Any, progress: BatchProgress | None, batching: dict) -> dict:
    next_batch, beyond = progress.saved() if progress else (0, [])
    return {KEY: FORMAT, "kind": "map", "epoch": epoch, "seed": seed, "batching": batching,
            "next_batch": next_batch, "delivered_beyond": beyond, "sampler": sampler_state}


def stream_state(epoch: int, seed: int, streams: int, progress: StreamProgress | None, batching: dict,
                 shuffle: StreamShuffle) -> dict:
    """``shuffle``: the loader's shuffling, whose buffer, parts seed and readers' world a
    shuffled position means something under (absent from states saved before them)."""
    if progress is None:
        progress = StreamProgress(streams)
    draws, states, next_worker = progress.saved()
    return {KEY: FORMAT, "kind": "iterable", "epoch": epoch, "seed": seed, "batching": batching, "streams": [
        {"draws": draws[w], "state": states[w], "ended": w in progress.ended}
        for w in range(streams)], "next_worker": next_worker, "shuffle_buffer": shuffle.buffer,
        "parts_seed": shuffle.parts_seed, "world": [shuffle.world_size, shuffle.world_rank]}


def restores(state: dict) -> dict[int, StreamPoint]:
    """Where each stream of a saved iterable epoch starts again."""
    return {w: StreamPoint(s["draws"], s["state"]) for w, s in enumerate(state["streams"]) if s["draws"]}


# ---------------------------------------------------------------- loading a state
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
        article = "an" if state.get("kind") == "iterable" else "a"
        raise ValueError(f"load_state_dict: the state was saved by a loader over {article} "
                         f"{state.get('kind')} dataset, but this loader's dataset is {kind}")
    problems = _problems(state, _MAP if kind == "map" else _ITERABLE, "state")
    if kind == "iterable":  # (keys absent from states saved before they existed)
        problems += _problems({k: state[k] for k in _SHUFFLING.keys if k in state}, _SHUFFLING, "state")
    if not problems and kind == "iterable" and state["next_worker"] >= len(state["streams"]):
        problems.append(f"state['next_worker'] is {state['next_worker']}, expected an int below "
                        f"len(state['streams']), {len(state['streams'])} (the worker whose turn is next)")
    if len(problems) == 1:
        raise ValueError(f"load_state_dict: {problems[0]}")
    if problems:
        raise ValueError(f"load_state_dict: {len(problems)} problems with the state: {'; '.join(problems)}")
    return state


# ---------------------------------------------------------------- saving: the sampler's state
class Unsaveable(NamedTuple):
    """What the loader keeps instead of a state when the order's source has none."""

    reason: str


def capture(source: Any, kind: str = "sampler") -> Any:
    """The state of the sampler (or batch sampler) that fixes the epoch's order: a copy,
    since the sampler may go on changing the dict it returned."""
    try:
        check_resumable(source, kind)
    except TypeError as exc:
        return Unsaveable(str(exc))
    return copy.deepcopy(source.state_dict())


# NOTE [ Saving without the sampler's state ]
# A sampler (or iterable source) without state_dict() cannot be restored, only re-read.
# state_dict() does not raise for it: trainers call state_dict() at every checkpoint of
# any loader that has the method (Lightning does), and a checkpoint must not crash a
# training that torch's loader would not crash (torch's DistributedSampler has no state).
# The state then holds the position alone (the sampler's part is None), and a resume
# re-reads the order (or each worker's stream, from its start) and skips what was
# delivered, as torchdata's StatefulDataLoader does: the same batches if the order is
# the same then (torch's DistributedSampler after the same set_epoch; a stream that reads
# the same), other ones if not (an unseeded random sampler). One ShmloadWarning says so.
def fast_forward_note(reason: str, kind: str) -> str:
    again = ("re-reads each worker's stream from its start and skips the draws delivered" if kind != "sampler" else
             "iterates the sampler again and skips the batches delivered")
    return (f"DataLoader.state_dict(): {reason}. The state holds the position alone: a resume {again}, which gives "
            "the same batches only if the order is the same then (torch's DistributedSampler after the same "
            "set_epoch: yes; a sampler or stream drawing from an unseeded generator: no)")


def check_resumable(source: Any, kind: str = "sampler") -> None:
    missing = [m for m in ("state_dict", "load_state_dict") if not callable(getattr(source, m, None))]
    if not missing:
        return
    if kind == "sampler":
        raise TypeError(
            f"the sampler {type(source).__name__} has no {' or '.join(missing)}, which restoring the epoch's "
            "order needs. Give it both (state_dict() returning what fixes the order of its next iter(), such as "
            "its seed and epoch), or use shmload's SequentialSampler, RandomSampler or DistributedSampler, which "
            "have them")
    raise TypeError(
        f"the iterable source {type(source).__name__} has no {' or '.join(missing)}, which restoring a position "
        "in the middle of an epoch needs. Give it both: state_dict() returning where its iteration is, "
        "load_state_dict(state) making the next iter() continue from there. Saving between epochs needs neither")


def check_unchanged(source: Any, resume: dict, state: Any) -> None:
    """A position in the middle of an epoch means something only in the saved order: the
    sampler must not have been moved (by a ``set_epoch`` of another epoch, say) since its
    state was loaded."""
    if resume["sampler"] is None:
        return  # saved without the sampler's state: nothing to compare (NOTE [ Saving without the sampler's state ])
    try:
        same = bool(state == resume["sampler"])
    except Exception:  # states that do not compare (arrays): nothing to check with
        return
    if not same:
        raise ValueError(
            f"the sampler {type(source).__name__} changed after load_state_dict(): its state is {state!r}, "
            f"but the saved position (batch {resume['next_batch']} of epoch {resume['epoch']}) belongs to the "
            f"saved state {resume['sampler']!r}. Do not move the sampler (set_epoch of another epoch) between "
            "load_state_dict() and the resumed epoch's first batch")


def check_streams(num_workers: int, resume: dict) -> None:
    """An iterable state resumes only with as many worker streams as saved it (the resume
    then waits for a retry with the right ``num_workers``)."""
    saved, streams = len(resume["streams"]), max(1, num_workers)
    if saved != streams:
        raise ValueError(
            f"the loaded state is of an iterable source read by {saved} stream(s) (num_workers="
            f"{saved if saved > 1 else '0 or 1'}), but this loader has num_workers={num_workers}: each "
            "worker reads its own shard of the stream, so resume with the same number of workers")

def check_shuffling(state: dict, shuffle: StreamShuffle) -> None:
    """A position in the middle of an epoch means the same samples only behind the same
    shuffle buffer (0 and 1 both mean none), and among readers of the same world (the
    parts ``stream_parts()`` gives each depend on it); each stream's saved position is
    checked now (NOTE [ Checking a loaded state ]). Between epochs nothing is read yet,
    and the buffer may change."""
    if not any(s["draws"] for s in state["streams"]):
        return
    saved = state.get("shuffle_buffer", 0)
    if (saved if saved > 1 else 0) != (shuffle.buffer if shuffle.shuffles else 0):
        raise ValueError(f"load_state_dict: the state was saved in the middle of an epoch by a loader with "
                         f"shuffle_buffer={saved}, but this one has shuffle_buffer={shuffle.buffer}: the saved "
                         "position counts the samples of that buffer's order")
    world = state.get("world")
    if world is not None and list(world) != [shuffle.world_size, shuffle.world_rank]:
        raise ValueError(f"load_state_dict: the state was saved in the middle of an epoch by rank {world[1]} of "
                         f"{world[0]} processes, but this loader is rank {shuffle.world_rank} of "
                         f"{shuffle.world_size}: each reader's share of the stream depends on them. Resume in the "
                         "same kind of job")
    if shuffle.shuffles:
        for w, stream in enumerate(state["streams"]):
            if stream["state"] is not None:
                try:
                    loaded_snapshot(stream["state"], shuffle.buffer, stream["draws"])
                except ValueError as exc:
                    raise ValueError(f"load_state_dict: state['streams'][{w}]['state']: {exc}") from None


def check_batching(saved: dict, ours: dict) -> None:
    """A position counts batches: it means something only under the same grouping."""
    if saved != ours:
        raise ValueError(f"load_state_dict: the state was saved by a loader with batch_size="
                         f"{saved['batch_size']}, drop_last={saved['drop_last']}, but this one has batch_size="
                         f"{ours['batch_size']}, drop_last={ours['drop_last']}: the saved position counts batches "
                         "of the saved size")


def check_same_sharding(saved: Any, shard: tuple[int, int] | None) -> None:
    """A state saved by a rank that sharded by itself loads only into a loader that
    shards alike (``DistributedSampler`` checks the rank and world size). ``shard`` is
    the loader's own (world size, rank), None if it reads everything."""
    if not isinstance(saved, dict):
        return
    if "num_replicas" in saved and shard is None:
        raise ValueError(
            f"load_state_dict: the state was saved by rank {saved.get('rank')} of {saved['num_replicas']} "
            "processes, where this loader read only its rank's share, but torch.distributed is not initialized "
            "here (or distributed=False): initialize the process group before load_state_dict(), with the same "
            "world size")
    if "num_replicas" not in saved and shard is not None:
        raise ValueError(
            f"load_state_dict: the state was saved by a loader reading the whole dataset, but this one reads "
            f"rank {shard[1]}'s share of {shard[0]} processes (torch.distributed is initialized): a "
            "position means nothing in another order. Resume in the same kind of job, or pass distributed=False")


# ---------------------------------------------------------------- a resumed epoch's plan
def plan_sampler_epoch(source: Any, batches_from: Callable[[int], Iterator[Any]], batched: bool,
                       resume: dict | None) -> tuple[SamplerSchedule, BatchProgress]:
    """The epoch's batches from the position a loaded state says (``resume``; None: from
    the start). ``source`` fixes the order (its state is saved); ``batches_from(start)``
    iterates the batches from position ``start``. The order is drawn now, right after
    the source's state is taken, so the state is the one it was drawn from; and before
    the first batch is pulled, since the loader pulls batches ahead of the consumer."""
    sampler_state = capture(source)
    if resume is not None and (resume["next_batch"] or resume["delivered_beyond"]):
        check_unchanged(source, resume, sampler_state)
    start = resume["next_batch"] if resume is not None else 0
    skip = frozenset(resume["delivered_beyond"]) if resume is not None else frozenset()
    schedule = SamplerSchedule(batches_from(start), start, skip, batched=batched)
    schedule.peek()  # draws the order (samplers and batch samplers are lazy generators)
    return schedule, BatchProgress(start, skip, sampler_state)


def plan_stream_epoch(num_workers: int, batch_size: int | None, drop_last: bool,
                      resume: dict | None) -> tuple[RoundRobinSchedule, StreamProgress]:
    """An iterable source's epoch: each worker's stream from where a loaded state says."""
    streams = max(1, num_workers)
    if resume is None:
        return RoundRobinSchedule(streams, batch_size, drop_last), StreamProgress(streams)
    check_streams(num_workers, resume)
    progress = StreamProgress.resumed(resume)
    schedule = RoundRobinSchedule(streams, batch_size, drop_last, draws=progress.draws, ended=progress.ended,
                                  first=progress.next_worker, restores=restores(resume))
    return schedule, progress


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
    return isinstance(value, numbers.Integral) and not isinstance(value, bool) and int(value) >= 0


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
_SHUFFLING = _Dict("the shuffling of the loader that saved it", {
    "shuffle_buffer": _Expect(f"{_COUNT}, the shuffle_buffer of the loader that saved it", _count),
    "parts_seed": _Expect(f"{_COUNT}, the seed of the order of a stream's parts", _count),
    "world": _Expect("[world size, rank], two non-negative ints with the rank below the size",
                     lambda v: isinstance(v, (list, tuple)) and len(v) == 2 and all(map(_count, v)) and v[1] < v[0])})
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
