"""A worker's stream over an iterable source (sources.py), one batch per draw.

The main process decides whose batch comes next (``schedule.RoundRobinSchedule``); this
module is the worker's side: one :class:`Stream` per worker, which turns a
:class:`~shmload._transport.messages.Draw` into the samples of one batch, shuffled
through a buffer and resumable exactly; and :func:`stream_parts`, by which a source
reading part files takes this reader's share.
"""

from __future__ import annotations

import contextvars
import copy
import itertools
import numbers
from collections import deque
from typing import Any, Callable, Iterator, NamedTuple, Sequence

from .._transport.messages import Draw, StreamPoint
from . import shuffle as _shuffle
from .shuffle import ShuffleBuffer, StreamShuffle


class StreamPlace(NamedTuple):
    """Which stream a draw is of: the epoch, the loader's seed and rank, worker ``worker``
    of ``workers`` (0 of 1 with ``num_workers=0``), and the loader's shuffling."""

    epoch: int
    seed: int
    rank: int
    worker: int
    workers: int
    shuffle: StreamShuffle | None = None


_reading: contextvars.ContextVar[StreamPlace | None] = contextvars.ContextVar("shmload_stream", default=None)


def stream_parts(parts: Sequence[Any], *, rank: int | None = None, world_size: int | None = None) -> list[Any]:
    """The parts (shards, part files) of a stream this reader reads this epoch, for a
    source to call in its ``__iter__``: every ``readers``-th part from its own, where
    ``reader = rank * num_workers + worker id`` and ``readers = world_size *
    num_workers``, so the readers of all ranks read each part once. ``rank`` and
    ``world_size`` default to the loader's (torch.distributed's or torchrun's
    environment; one process with ``distributed=False``). With a loader that shuffles
    (``shuffle_buffer`` above 1) the parts are first put in the epoch's order: a
    permutation seeded by the loader's seed if one was given, else 0, and the epoch, so
    the same in every worker and on every rank. Outside a loader's reading: the rank's
    share of ``parts``, in order (all of them by default)."""
    place = _reading.get()
    shuffle = place.shuffle if place is not None else None
    found_size, found_rank = (shuffle.world_size, shuffle.world_rank) if shuffle is not None else (1, 0)
    size = found_size if world_size is None else world_size
    rank = found_rank if rank is None else rank
    if not 0 <= rank < size:
        raise ValueError(f"stream_parts: rank {rank} is not in [0, {size - 1}] (world size {size})")
    workers, worker = (place.workers, place.worker) if place is not None else (1, 0)
    return _shuffle.share_of_parts(parts, rank * workers + worker, size * workers, shuffle,
                                   place.epoch if place is not None else 0)


class _Snapshot(NamedTuple):
    """A shuffled stream at a draw boundary: draws made, the buffer's steps and reads,
    the source's length if it ended, and the source's ``state_dict()`` then (None at the
    start: read from the beginning). NOTE [ A shuffle buffer that resumes exactly ]."""

    draws: int
    emitted: int
    read: int
    end: int | None
    state: Any

    def saved(self, buffer: int, at: int) -> dict:
        """The position saved with a draw after which the buffer had made ``at`` steps:
        resumed, the stream checks it made as many when it replayed that far."""
        return {"buffer": buffer, "draws": self.draws, "emitted": self.emitted, "read": self.read, "end": self.end,
                "source": self.state, "at": at}


_SNAPSHOT_KEYS = ("buffer", "draws", "emitted", "read", "end", "source")  # and "at", where saved


def loaded_snapshot(state: Any, buffer: int, draws: int | None = None) -> _Snapshot:
    """A shuffled stream's saved position (``draws``: the stream's draws delivered, which
    it cannot be after), checked: ``ValueError`` naming what is wrong."""
    if not isinstance(state, dict) or any(k not in state for k in _SNAPSHOT_KEYS):
        raise ValueError(f"a shuffled stream's state should be a dict with {', '.join(_SNAPSHOT_KEYS)}, but got "
                         f"{state!r:.200}: was it saved by a loader without shuffle_buffer?")
    if state["buffer"] != buffer:
        raise ValueError(f"the stream's state was saved with shuffle_buffer={state['buffer']}, but this loader has "
                         f"shuffle_buffer={buffer}: resume with the same buffer")
    for key in ("draws", "emitted", "read", "end", "at"):
        if key not in state:  # ("at": absent from positions saved before it was; then not checked)
            continue
        value = state[key]
        if not (value is None and key == "end") and (
                isinstance(value, bool) or not isinstance(value, numbers.Integral) or value < 0):
            raise ValueError(f"the stream's state has {key}={value!r}, expected a non-negative int"
                             + (" or None" if key == "end" else ""))
    if draws is not None and state["draws"] > draws:
        raise ValueError(f"the stream's state is at draw {state['draws']}, after the {draws} draws it says were "
                         "delivered")
    if state.get("at") is not None and state["at"] < state["emitted"]:
        raise ValueError(f"the stream's state has at={state['at']}, before the {state['emitted']} steps of its "
                         "source's state")
    if state["read"] and state["end"] is None and state["source"] is None:
        raise ValueError("the stream's state has read samples but no state of the source to continue from")
    _shuffle.check_position(buffer, state["emitted"], state["read"], state["end"])
    return _Snapshot(state["draws"], state["emitted"], state["read"], state["end"], state["source"])


class Stream:
    """One worker's stream over its copy of the source, for one epoch at a time.

    ``seed(number)`` seeds the global RNGs for draw ``number``; the stream calls it for
    the draws it skips, so a skipped draw consumes the same randomness as when it was
    first made (a worker restarted without the source's state re-reads up to where its
    predecessor was). A shuffled stream reads through a :class:`~shmload._ordering.shuffle.ShuffleBuffer`
    and saves its position as NOTE [ A shuffle buffer that resumes exactly ] says."""

    def __init__(self, source: Any):
        self.source = source
        reset = getattr(source, "reset_state", None)
        if callable(reset):  # tensorpack's DataFlow: once per process, before iterating
            reset()
        self._epoch_key: Any = None
        self._it: Iterator[Any] | None = None
        self._draws = 0  # draws made this epoch
        self._ended = False
        self._buffer: ShuffleBuffer | None = None  # a shuffled stream's
        # a shuffled stream's states at draw boundaries, oldest first, from the newest one
        # read before the oldest sample in the buffer (the one a point saves)
        self._snapshots: deque[_Snapshot] = deque()
        self._shuffled = False  # the epoch's stream reads through a buffer
        self._replayed_to: tuple[int, int] | None = None  # (draws, steps) a resumed replay must reach alike
        self._replay_error: str | None = None  # the replay did not: every later draw of the epoch raises it

    @property
    def draws(self) -> int:
        return self._draws

    def state(self) -> Any:
        """The source's ``state_dict()`` now, or None if it has none."""
        state_dict = getattr(self.source, "state_dict", None)
        return state_dict() if callable(state_dict) else None

    def point(self, failed: bool = False) -> StreamPoint:
        """Where the stream is after a draw: the draws made and the source's state (for a
        shuffled stream, the snapshot to resume from). After a draw that raised
        (``failed``), a state that cannot be had either is None."""
        if self._shuffled:
            return self._shuffled_point(failed)
        try:
            return StreamPoint(self._draws, self.state())
        except Exception:
            if not failed:
                raise
            return StreamPoint(self._draws, None)

    # A shuffled stream keeps the source's state from a draw boundary only once at least
    # _SPACING of its buffer's size was read since the last one kept: a resume then reads
    # again at most that much more than the fewest possible, and the states kept (copies)
    # are about _SPACING_PARTS * ln N, not one per draw (92,000 for unbatched draws
    # through a buffer of 10,000). The start of the stream is always one of them.
    _SPACING_PARTS = 16

    def _shuffled_point(self, failed: bool) -> StreamPoint:
        buf = self._buffer
        if buf is None or not callable(getattr(self.source, "state_dict", None)):
            # (did not start; or a source without a state: read again from the start)
            return StreamPoint(self._draws, None)
        last = self._snapshots[-1]
        spaced = buf.read - last.read >= max(1, buf.size // self._SPACING_PARTS)
        if spaced or (buf.end is not None and last.end is None):
            try:
                # (a copy: the snapshot is kept, and a source may change the dict it returned)
                state = copy.deepcopy(self.state())
            except Exception:
                if not failed:
                    raise
                return StreamPoint(self._draws, None)
            if state is None:  # (a state_dict() that says nothing: as a source without one)
                return StreamPoint(self._draws, None)
            self._snapshots.append(_Snapshot(self._draws, buf.emitted, buf.read, buf.end, state))
        oldest = buf.oldest()
        while len(self._snapshots) > 1 and self._snapshots[1].read <= oldest:
            self._snapshots.popleft()
        return StreamPoint(self._draws, self._snapshots[0].saved(buf.size, buf.emitted))

    def draw(self, epoch_key: Any, draw: Draw, seed: Callable[[int], None], place: StreamPlace | None = None) -> Any:
        """The samples of ``draw`` (a list, or one sample when unbatched), or None if the
        stream has ended. ``epoch_key`` changes with every epoch: a new key starts a new
        iteration of the source (where ``draw.restore`` says); ``place`` says which
        stream this is (for the shuffle buffer and :func:`stream_parts`)."""
        token = _reading.set(place)
        try:
            return self._draw(epoch_key, draw, seed, place)
        finally:
            _reading.reset(token)

    def _draw(self, epoch_key: Any, draw: Draw, seed: Callable[[int], None], place: StreamPlace | None) -> Any:
        if epoch_key != self._epoch_key:
            self._begin(epoch_key, draw.restore, place)
        while self._draws < draw.number and not self._ended:  # catch up: see StreamPoint
            seed(self._draws)
            try:
                self._take(draw)
            except Exception:
                pass  # reported when the draw was first made
            self._verify_replay(draw)
        self._verify_replay(draw)
        if self._ended:  # (also if it ended while catching up: a stream read again may be shorter)
            self._draws = max(self._draws, draw.number) + 1
            return None
        if self._draws != draw.number:
            raise RuntimeError(f"{draw.describe()} came after draw {self._draws - 1}: draws go in order")
        if self._buffer is not None and self._buffer.gone:
            raise RuntimeError(
                f"{draw.describe()}: the iterable source {type(self.source).__name__} did not read the same samples "
                f"again after load_state_dict(): {self._buffer.gone} sample(s) of the shuffle buffer saved with the "
                "state are missing. A shuffled stream resumes exactly only if the source reads the same from a "
                "loaded state")
        seed(draw.number)
        return self._take(draw)

    def _verify_replay(self, draw: Draw) -> None:
        """A resumed shuffled stream, having replayed up to the draws its saved position
        was taken after, must have made as many steps as then: else the source read
        differently (an error it raised then and not now, another length), and every
        later batch would be shifted without a word."""
        if self._replay_error is not None:  # (every later draw of the epoch would be shifted too)
            raise RuntimeError(f"{draw.describe()}: {self._replay_error}")
        if self._replayed_to is None or self._buffer is None:
            return
        draws, steps = self._replayed_to
        if self._draws < draws and not self._ended:
            return
        self._replayed_to = None
        made = self._buffer.emitted
        if self._draws != draws or made != steps:
            self._replay_error = (
                f"the iterable source {type(self.source).__name__} did not read the same samples again after "
                f"load_state_dict(): replaying its stream to draw {draws} took {made} samples through the shuffle "
                f"buffer where the saved run took {steps}" + (" (the stream ended sooner)" if self._draws != draws
                                                             else "")
                + ". A shuffled stream resumes exactly only if the source reads the same, errors included")
            raise RuntimeError(f"{draw.describe()}: {self._replay_error}")

    def _begin(self, epoch_key: Any, restore: StreamPoint | None, place: StreamPlace | None) -> None:
        """Start the epoch's iteration. If the source cannot start (its ``iter()`` or
        ``load_state_dict()`` raises), the error is this draw's and the stream is ended:
        never read on from the previous epoch's iterator."""
        self._epoch_key = epoch_key
        self._it = self._buffer = None
        self._snapshots.clear()
        self._ended = True
        self._draws = 0
        self._replayed_to = self._replay_error = None
        shuffle = place.shuffle if place is not None else None
        self._shuffled = shuffle is not None and shuffle.shuffles  # (a buffer of one is the stream's own order)
        if self._shuffled:
            assert place is not None and shuffle is not None  # (narrowed by the line above)
            self._begin_shuffled(restore, place, shuffle.buffer)
        else:
            if restore is not None and restore.state is not None:
                self.source.load_state_dict(restore.state)
                self._draws = restore.draws
            self._it = iter(self.source)
        self._ended = False

    def _begin_shuffled(self, restore: StreamPoint | None, place: StreamPlace, size: int) -> None:
        snap = _Snapshot(0, 0, 0, None, None)  # the start of the stream
        if restore is not None and restore.state is not None:
            snap = loaded_snapshot(restore.state, size, restore.draws)
        key = _shuffle.stream_key(place.seed, place.epoch, place.rank, place.worker)
        if snap.end is not None:  # the source was read to its end: the buffer drains, touching nothing
            it: Iterator[Any] = iter(())
        else:
            if snap.read:
                self.source.load_state_dict(snap.state)
            it = iter(self.source)
        self._buffer = ShuffleBuffer.resumed(it, size, key, snap.emitted, snap.read, snap.end)  # (empty at the start)
        self._draws = snap.draws
        self._snapshots.append(snap)
        self._it = self._buffer
        if restore is not None and restore.state is not None and restore.state.get("at") is not None:
            # (only once the stream started: a start that raised is that draw's error, and no replay)
            self._replayed_to = (restore.draws, restore.state["at"])

    def _take(self, draw: Draw) -> Any:
        self._draws += 1
        it = self._it
        if self._ended or it is None:  # (None only while ended: begin() sets it before it un-ends)
            return None
        try:
            if draw.size is None:
                return next(it)
            # next() draw.size times, in C. Not islice(): it calls iter() on what it is
            # given, and a source that is its own iterator may start over in __iter__.
            samples = list(map(next, itertools.repeat(it, draw.size)))
        except StopIteration:
            self._ended = True
            return None
        # (an exception from the source propagates: it is this draw's error, and the next
        # draw asks the iterator again; a generator that raised is finished, so it ends)
        if len(samples) < draw.size:
            self._ended = True  # stopped early: the source is exhausted
            if not samples or draw.drop_last:
                return None
        return samples
