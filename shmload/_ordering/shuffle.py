"""Shuffling a stream: a seeded shuffle buffer per worker stream, and a shared shuffle of
the parts (shards, part files) a stream is made of. Pure: no processes, no global state
(the stream that drives a buffer is stream.py's ``Stream``).

NOTE [ A shuffle buffer that resumes exactly ]
A buffer of N samples (tf.data's ``shuffle(N)``): the first N samples of the stream fill
it; then each step reads the next sample, emits a randomly picked slot's sample and puts
the new one in its place; once the source ends, each step emits a picked slot's sample
and moves the last slot into the hole, until the buffer is empty. Its content is
therefore a function of the stream and of the picks alone, and the picks are a function
of the step: pick ``t`` is ``u_t mod L`` (L the samples held then), where ``u_t`` is the
t-th 64-bit output of a generator keyed by (seed, epoch, rank, worker stream), made
4,096 at a time from a ``SeedSequence`` of the key and the block number (so any step's
pick is computed without drawing the ones before it; the modulo's bias is below 2**-32
for any buffer that fits in memory). No global RNG is touched.

So a position in a shuffled stream is a few numbers, never the buffer's samples: the
steps made (``emitted``), the samples read (``read``), the source's length once known
(``end``). Which source position sits in which slot after ``emitted`` steps
(:func:`arrangement`) follows from the picks: while the source has not ended, slot j
holds the sample read at the last step ``t < emitted`` that picked j (source position
N + t), or its first sample (position j) if no step picked it yet; found from the last
steps backwards, a block of picks at a time, until every slot was seen (about N·ln N
steps back); the draining steps after the source ended (at most N) are replayed.

To resume, the stream (stream.py) keeps the source's ``state_dict()`` from draw
boundaries (one each N/16 samples read: ``Stream._SPACING_PARTS``), and saves the newest
one from before the oldest sample still in the buffer:
every sample in the buffer was read after it. A resumed stream loads that state, makes a
buffer of placeholders at the arrangement of that moment (:meth:`ShuffleBuffer.resumed`),
and replays the draws since, reading the source again (each draw seeded as it was, so a
source that draws from numpy's or Python's global RNG reads the same samples): the
placeholders leave the buffer as those draws' samples, which are not delivered again,
and the buffer holds exactly what it held when the state was saved. The price is
reading again the samples since that state, about N·ln(N) plus a batch and at most N/16
more (docs/performance.md has figures); the saved state is a few ints and one state of
the source.
"""

from __future__ import annotations

from typing import Any, Iterator, NamedTuple, Sequence

import numpy as np

BLOCK = 4096  # picks made at once, each block from its own SeedSequence (see the NOTE)
_TAG_BUFFER = 0x53484246  # "SHBF": keeps these generators apart from every other seeded one
_TAG_PARTS = 0x53485054  # "SHPT"


class StreamShuffle(NamedTuple):
    """How a loader shuffles its streams (``DataLoader(shuffle_buffer=...)``), and who
    reads which parts: the same in every worker."""

    buffer: int  # samples per worker stream; 0 or 1: the stream's own order, read without a buffer
    parts_seed: int  # the same on every rank: the loader's seed if one was given, else 0 (as sharding.py)
    world_size: int = 1  # the ranks reading the source, for stream_parts()
    world_rank: int = 0

    @property
    def shuffles(self) -> bool:
        """Does it change the order? (A buffer of one emits what it was just given.)"""
        return self.buffer > 1


def block_picks(key: tuple[int, ...], block: int) -> np.ndarray:
    """The 64-bit outputs ``u_t`` for steps ``block * BLOCK`` to ``(block + 1) * BLOCK - 1``."""
    seq = np.random.SeedSequence([_TAG_BUFFER, *key, block])
    return np.random.PCG64(seq).random_raw(BLOCK)


def arrangement(size: int, key: tuple[int, ...], emitted: int, read: int, end: int | None) -> list[int]:
    """The source position of the sample in each slot of a buffer of ``size`` after
    ``emitted`` steps with ``read`` samples read (``end``: the source's length, if it
    ended). Pure; ``ValueError`` for numbers no buffer can reach."""
    check_position(size, emitted, read, end)
    if emitted == 0:  # still filling (a fill the source interrupted with an exception)
        return list(range(read))
    full, refills = _phases(size, emitted, end)
    positions = _refilled(size, key, refills) if refills else list(range(full))
    picks: dict[int, list[int]] = {}
    for t in range(refills, emitted):  # draining: the moves of ShuffleBuffer._drain
        block = t // BLOCK
        if block not in picks:
            picks[block] = block_picks(key, block).tolist()
        j = picks[block][t % BLOCK] % len(positions)
        last = positions.pop()
        if j < len(positions):
            positions[j] = last
    return positions


def check_position(size: int, emitted: int, read: int, end: int | None) -> None:
    """``ValueError`` unless a buffer of ``size`` can be at ``emitted`` steps with ``read``
    samples read (``end``: the source's length, if it ended). Pure."""
    if end is not None and end != read:
        raise ValueError(f"a shuffle buffer whose source ended after {end} samples has read {end}, not {read}")
    if emitted == 0:
        if read > size:
            raise ValueError(f"a shuffle buffer of {size} that emitted nothing cannot have read {read} samples")
        return
    full, refills = _phases(size, emitted, end)
    if read != full + refills or (end is not None and emitted > end):
        raise ValueError(f"a shuffle buffer of {size} after {emitted} steps has read {full + refills} samples, "
                         f"not {read}" + ("" if end is None else f" (source of {end} samples)"))


def _phases(size: int, emitted: int, end: int | None) -> tuple[int, int]:
    """(samples the first fill holds, steps of the ``emitted`` that read a sample): the
    steps after those drained the buffer (the source had ended)."""
    full = size if end is None else min(size, end)
    return full, (emitted if end is None else min(emitted, max(end - size, 0)))


def _refilled(size: int, key: tuple[int, ...], steps: int) -> list[int]:
    """The arrangement after ``steps`` steps that each read a sample (the NOTE above)."""
    last = np.full(size, -1, np.int64)
    unseen = size
    block = (steps - 1) // BLOCK
    while block >= 0 and unseen:
        lo, hi = block * BLOCK, min((block + 1) * BLOCK, steps)
        slots = (block_picks(key, block)[:hi - lo] % np.uint64(size)).astype(np.int64)
        latest = np.full(size, -1, np.int64)
        np.maximum.at(latest, slots, np.arange(lo, hi, dtype=np.int64))
        new = (last < 0) & (latest >= 0)
        last[new] = latest[new]
        unseen -= int(new.sum())
        block -= 1
    return np.where(last >= 0, last + size, np.arange(size)).tolist()


class _Gone:
    """A slot's sample that was read before the state a stream resumed from: it leaves the
    buffer while the resumed stream replays the draws after that state."""

    __slots__ = ()

    def __repr__(self) -> str:
        return "<a sample emitted before the resumed position>"


GONE = _Gone()


class ShuffleBuffer:
    """An iterator over ``source`` (an iterator) in the order of a buffer of ``size``
    samples (the NOTE above). It holds references to the samples, never copies.

    An exception from the source propagates and changes nothing: the next ``next()``
    asks the source again (a generator that raised is finished, so the buffer drains)."""

    __slots__ = ("size", "key", "_source", "_slots", "_positions", "read", "emitted", "end", "_block", "_picks",
                 "_oldest", "gone")

    def __init__(self, source: Iterator[Any], size: int, key: tuple[int, ...]):
        if size < 1:
            raise ValueError(f"a shuffle buffer holds at least one sample, not {size}")
        self.size, self.key, self._source = size, key, source
        self._slots: list[Any] = []
        self._positions: list[int] = []  # each slot's source position
        self.read = 0  # samples read from the source
        self.emitted = 0  # steps made: samples emitted
        self.end: int | None = None  # the source's length, once it ended
        self._block = -1
        self._picks: list[int] = []  # block_picks(key, _block)
        self._oldest: int | None = 0  # min(_positions), or None if it must be computed again
        self.gone = 0  # placeholders still in the buffer (resumed)

    @classmethod
    def resumed(cls, source: Iterator[Any], size: int, key: tuple[int, ...], emitted: int, read: int,
                end: int | None) -> ShuffleBuffer:
        """The buffer as it was after ``emitted`` steps and ``read`` samples (``end``: the
        source's length if it had ended), with placeholders for its samples: ``source``
        continues at sample ``read``."""
        buf = cls(source, size, key)
        buf._positions = arrangement(size, key, emitted, read, end)
        buf._slots = [GONE] * len(buf._positions)
        buf.gone = len(buf._slots)
        buf.read, buf.emitted, buf.end = read, emitted, end
        buf._oldest = None
        return buf

    def __iter__(self) -> ShuffleBuffer:
        return self

    def __next__(self) -> Any:
        slots = self._slots
        while self.end is None and len(slots) < self.size:  # the first fill (or one an exception cut short)
            sample = self._read()
            if self.end is None:
                slots.append(sample)
                self._positions.append(self.read - 1)
        if self.end is None:
            sample = self._read()
            if self.end is None:
                j = self._pick(len(slots))
                out = slots[j]
                slots[j] = sample
                self._replaced(j, self.read - 1)
                return self._emit(out)
        if not slots:
            raise StopIteration
        return self._emit(self._drain())

    def _read(self) -> Any:
        try:
            sample = next(self._source)
        except StopIteration:
            self.end = self.read
            return None
        self.read += 1
        return sample

    def _pick(self, held: int) -> int:
        t = self.emitted
        block = t // BLOCK
        if block != self._block:
            self._block, self._picks = block, block_picks(self.key, block).tolist()
        return self._picks[t - block * BLOCK] % held

    def _replaced(self, j: int, position: int) -> None:
        if self._positions[j] == self._oldest:
            self._oldest = None  # the oldest left: found again when asked for (about every N steps)
        self._positions[j] = position

    def _drain(self) -> Any:
        slots, positions = self._slots, self._positions
        j = self._pick(len(slots))
        out = slots[j]
        if positions[j] == self._oldest:
            self._oldest = None
        last, last_position = slots.pop(), positions.pop()
        if j < len(slots):
            slots[j], positions[j] = last, last_position
        return out

    def _emit(self, out: Any) -> Any:
        self.emitted += 1
        if out is GONE:
            self.gone -= 1
        return out

    def oldest(self) -> int:
        """The source position of the oldest sample held (``read`` if none)."""
        if not self._positions:
            return self.read
        if self._oldest is None:
            self._oldest = min(self._positions)
        return self._oldest


def stream_key(seed: int, epoch: int, rank: int, worker: int) -> tuple[int, int, int, int]:
    """What a worker stream's buffer is keyed by: its randomness comes from this alone."""
    return (seed, epoch, rank, worker)


def parts_order(parts: int, seed: int, epoch: int) -> np.ndarray:
    """The epoch's permutation of ``parts`` parts: the same in every worker and on every
    rank given the same (shared) seed."""
    return np.random.default_rng([_TAG_PARTS, seed, epoch]).permutation(parts)


def share_of_parts(parts: Sequence[Any], reader: int, readers: int, shuffle: StreamShuffle | None,
                   epoch: int) -> list[Any]:
    """Reader ``reader`` of ``readers``'s parts: every ``readers``-th part from its own,
    of the parts in the epoch's shuffled order when ``shuffle`` shuffles, else in the
    order given. Pure."""
    parts = list(parts)
    if shuffle is not None and shuffle.shuffles:
        parts = [parts[i] for i in parts_order(len(parts), shuffle.parts_seed, epoch).tolist()]
    return parts[reader::readers]
