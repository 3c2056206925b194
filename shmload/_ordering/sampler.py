"""Samplers: which dataset indices make up each batch, in which order.

They run in the main process only, and are pure: no processes, no shared memory.
The semantics follow ``torch.utils.data`` (``SequentialSampler``, ``RandomSampler``,
``BatchSampler``), except that :class:`RandomSampler` draws its order from a seed and an
epoch instead of a global generator, so an epoch's order can be reproduced exactly.

Every sampler here has ``state_dict()``/``load_state_dict()`` (what the loader's exact
resume needs, see ``resume.py``): the state *between* epochs, which fixes the order of
the next ``iter()``. It is small and JSON-serializable, and records ``len(data_source)``
so that loading it over a dataset of another size fails instead of resuming a
different order.

An epoch's order is computed a slice at a time (NOTE [ Orders are computed a slice at a
time ]): a dataset of 2**40 samples, or an "endless" one whose ``len()`` is
``sys.maxsize``, costs no memory beyond its batches.
"""

from __future__ import annotations

import itertools
import numbers
import types
from typing import Any, Callable, Iterator, Sized, Union, overload

import numpy as np

from .._core._checks import check_int
from .._transport.messages import Indices
from . import seeding

# NOTE [ Orders are computed a slice at a time ]
# An epoch's order (a sampler's ``_order()``) is what BatchSampler slices into batches and
# sharding.share() into a rank's share. Built whole, it is 8 bytes a sample before the
# first batch: 8 TiB (a MemoryError) for 2**40 samples, and numpy's arange(sys.maxsize)
# is even empty, so an "endless" dataset (``len() == sys.maxsize``) gave no batch at all
# while len(loader) said 2**61. So an order is an ``Order``, which computes only the
# positions asked for, or, only where the table exists anyway, an array: the exact
# shuffle up to seeding.EXACT_SHUFFLE_LIMIT (shuffled()), a PartShuffleSampler's order.
# Consumers use what both have: len(), slicing, ``.tolist()`` of a slice (a batch), and
# as_indices() for a walk; never the whole order at once.
_CHUNK = 4096  # indices computed at a time by as_indices()


class Order:
    """An epoch's order over ``range(n)``, computed when a slice of it is asked for:
    position ``p`` (of ``length``) holds ``index((start + step * p) % n)``, where
    ``index`` is a bijection of ``range(n)`` evaluated on an array of positions (a
    :class:`seeding.RangeShuffle`), or None: the identity, ``0, 1, ..., n - 1``.

    Like an index array: ``len()``, slicing (another Order, no work), ``order[i]``,
    ``tolist()`` and ``numpy.asarray()`` (which compute it: slice first)."""

    def __init__(self, n: int, index: Callable[[np.ndarray], np.ndarray] | None = None,
                 start: int = 0, step: int = 1, length: int | None = None):
        self.n, self.index = int(n), index
        self.start, self.step = start, step
        self.length = self.n if length is None else length

    def strided(self, start: int, step: int, length: int) -> Order:
        """``length`` positions from ``start`` by ``step`` of this whole order repeated end
        to end (the padding of ``numpy.resize``; for sharding.share)."""
        if (self.start, self.step, self.length) != (0, 1, self.n):
            raise ValueError("Order.strided() takes a whole order, not a slice of one")
        return Order(self.n, self.index, start, step, length)

    def __len__(self) -> int:
        return self.length

    @overload
    def __getitem__(self, key: slice) -> Order: ...
    @overload
    def __getitem__(self, key: int) -> int: ...

    def __getitem__(self, key: slice | int) -> Order | int:
        if isinstance(key, slice):
            r = range(self.length)[key]
            return Order(self.n, self.index, self.start + self.step * r.start, self.step * r.step, len(r))
        if isinstance(key, numbers.Integral):
            p = range(self.length)[key]  # IndexError past the end, as an array's
            return Order(self.n, self.index, self.start + self.step * p, 1, 1).tolist()[0]
        raise TypeError(f"an Order takes a slice or an integer, not {type(key).__name__}")

    def __iter__(self) -> Iterator[int]:
        return as_indices(self)

    def tolist(self) -> list[int]:
        positions = self._in_range()
        if positions is not None and self.index is None:
            return list(positions)  # a sequential batch: no numpy needed
        return self._values().tolist()

    def __array__(self, dtype: Any = None, copy: Any = None) -> np.ndarray:
        values = self._values()
        return values if dtype is None else values.astype(dtype)

    def _values(self) -> np.ndarray:
        positions = self._positions()
        return positions if self.index is None else self.index(positions)

    def _in_range(self) -> range | None:
        """The positions as a range, if none of them is past the end (no wrapping)."""
        k, first, n = self.length, self.start, self.n
        step = self.step if k > 1 else 1
        last = first + step * (k - 1)
        return range(first, last + step, step) if not k or (0 <= first < n and 0 <= last < n) else None

    def _positions(self) -> np.ndarray:
        k, in_range = self.length, self._in_range()
        # the positions themselves when they do not wrap (all in [0, n): int64 cannot
        # overflow), else the steps 0..k-1 to wrap below
        r = in_range if in_range is not None else range(k)
        steps = np.arange(r.start, r.stop, r.step, dtype=np.int64)
        if len(steps) != k:  # numpy's arange gives [] for lengths near 2**63
            raise MemoryError(f"an order of {k} indices does not fit in memory: take it a slice at a time")
        if in_range is not None:
            return steps
        return ((self.start + self.step * steps.astype(object)) % self.n).astype(np.int64)  # wraps to the start

    def __repr__(self) -> str:
        return (f"Order(n={self.n}, {'shuffled' if self.index is not None else 'sequential'}, start={self.start}, "
                f"step={self.step}, length={self.length})")


OrderLike = Union[np.ndarray, Order]  # what _order() returns (NOTE [ Orders are computed a slice at a time ])


def shuffled(seed: int, epoch: int, n: int) -> OrderLike:
    """The shuffled order of ``range(n)`` for this epoch: the exact permutation
    (``seeding.permutation``) up to ``seeding.EXACT_SHUFFLE_LIMIT`` samples, a keyed
    bijection computed a slice at a time above (NOTE [ Shuffling a huge range ])."""
    if n <= seeding.EXACT_SHUFFLE_LIMIT:
        return seeding.permutation(seed, epoch, n)
    return Order(n, seeding.RangeShuffle(seed, epoch, n))


def _indices_from(order: OrderLike, start: int, stop: int, size: int) -> Iterator[Any]:
    """The batches of ``size`` of ``order[start:stop]``, as :class:`Indices` (a list where
    the order is not int64). Computed about ``_CHUNK`` indices at a time, whole batches,
    then sliced: one order slice and one array per chunk instead of per batch (5 us of
    the main process a batch of 256, docs/performance.md)."""
    chunk = size * max(1, _CHUNK // size)
    for first in range(start, stop, chunk):
        values = np.asarray(order[first:min(first + chunk, stop)])
        if values.dtype != np.int64:
            for at in range(0, len(values), size):
                yield values[at:at + size].tolist()
            continue
        for at in range(0, len(values), size):
            yield Indices(values[at:at + size])


def as_indices(order: OrderLike) -> Iterator[int]:
    """The indices of an order as Python ints, computed ``_CHUNK`` at a time."""
    for start in range(0, len(order), _CHUNK):
        yield from order[start:start + _CHUNK].tolist()


def check_state(sampler: Any, state: Any, keys: tuple[str, ...]) -> dict:
    """``state`` as saved by ``sampler``'s class over a data source of the same length."""
    name = type(sampler).__name__
    if not isinstance(state, dict) or not set(keys) <= set(state):
        raise ValueError(f"{name}.load_state_dict expected a dict with keys {list(keys)} (from "
                         f"{name}.state_dict()), but got {state!r}")
    n = len(sampler.data_source)
    if state["length"] != n:
        raise ValueError(f"{name}.load_state_dict: the state was saved over a dataset of {state['length']} "
                         f"samples, but this one has {n}")
    return state


class EpochSampler:
    """What the samplers here share (:class:`SequentialSampler`, :class:`RandomSampler`,
    ``distributed.DistributedSampler``): they count epochs. Each ``iter()`` uses the
    current epoch and then advances it, so successive epochs differ where the order
    depends on the epoch; ``set_epoch(n)`` chooses the epoch of the next ``iter()``.
    ``state_dict()`` is the state between epochs, which fixes the next ``iter()``'s order.

    A subclass states what differs: its order (``_epoch_order``), the keys of its state
    (``_state_keys``), and what loading checks or takes besides the epoch (``_load``).
    """

    def __class_getitem__(cls, item: Any) -> types.GenericAlias:  # Sampler[int] in annotations, as torch's
        return types.GenericAlias(cls, item)

    # ``_order()`` returns the epoch's order (an Order or an array), which BatchSampler
    # slices (NOTE [ Orders are computed a slice at a time ]) for the classes that set
    # ``_array_order`` themselves (BatchSampler.batches_from says why not their subclasses).

    # state_dict()'s keys, in this order: "length" is len(data_source) (which check_state
    # compares), the others are attributes. load_state_dict() needs all but _optional_keys.
    _state_keys: tuple[str, ...] = ("length", "epoch")
    _optional_keys: tuple[str, ...] = ()

    def __init__(self, data_source: Sized):
        self.data_source = data_source
        self.epoch = 0

    def set_epoch(self, epoch: int) -> None:
        check_int("epoch", epoch, 0)
        self.epoch = int(epoch)

    def _epoch_order(self, n: int) -> OrderLike:
        """The order of epoch ``self.epoch`` over a data source of ``n`` samples."""
        raise NotImplementedError

    def _order(self) -> OrderLike:
        order = self._epoch_order(len(self.data_source))
        self.epoch += 1
        return order

    def __iter__(self) -> Iterator[int]:
        return as_indices(self._order())  # (the order is drawn, and the epoch advanced, at iter())

    def __len__(self) -> int:
        return len(self.data_source)

    def state_dict(self) -> dict:
        return {key: len(self.data_source) if key == "length" else getattr(self, key) for key in self._state_keys}

    def load_state_dict(self, state: dict) -> None:
        required = tuple(key for key in self._state_keys if key not in self._optional_keys)
        self._load(check_state(self, state, required))

    def _load(self, state: dict) -> None:
        """Take ``state``, of the right keys and length: a subclass checks or takes its own
        keys, then calls this."""
        self.set_epoch(state.get("epoch", 0))  # (0 only where _optional_keys has it)


class SeededSampler(EpochSampler):
    """An :class:`EpochSampler` whose order is fixed by ``seed`` and the epoch; its state
    holds the seed."""

    _state_keys: tuple[str, ...] = ("seed", "epoch", "length")

    def __init__(self, data_source: Sized, seed: int = 0):
        check_int("seed", seed, 0)
        super().__init__(data_source)
        self.seed = int(seed)

    def _load(self, state: dict) -> None:
        check_int("seed", state["seed"], 0)
        self.seed = int(state["seed"])
        super()._load(state)


class SequentialSampler(EpochSampler):
    """Indices ``0, 1, ..., len(data_source) - 1``.

    The order is the same every epoch, but the sampler counts epochs like the others
    (:class:`EpochSampler`): a loader's own sampler carries the epoch number that seeds
    the batches' augmentations (``DataLoader._upcoming_epoch``), which trainers set with
    ``loader.sampler.set_epoch(n)``.
    """

    _array_order = True  # (see EpochSampler)
    _optional_keys = ("epoch",)  # states saved before it counted epochs have none: epoch 0

    def _epoch_order(self, n: int) -> Order:
        return Order(n)

    def __iter__(self) -> Iterator[int]:
        return iter(range(len(self._order())))  # a plain range, as torch's: no chunks to compute


class RandomSampler(SeededSampler):
    """A permutation of ``range(len(data_source))``, fixed by ``seed`` and the epoch, so
    successive epochs are shuffled differently (the epochs: :class:`EpochSampler`)."""

    _array_order = True  # (see EpochSampler)

    def _epoch_order(self, n: int) -> OrderLike:
        return shuffled(self.seed, self.epoch, n)


class BatchSampler:
    """Groups the indices of ``sampler`` into lists of ``batch_size``.

    The last, shorter batch is kept unless ``drop_last``.
    """

    def __class_getitem__(cls, item: Any) -> types.GenericAlias:  # Sampler[int] in annotations, as torch's
        return types.GenericAlias(cls, item)

    def __init__(self, sampler: Any, batch_size: int, drop_last: bool):
        check_int("batch_size", batch_size, 1)
        self.batch_size = int(batch_size)
        if not isinstance(drop_last, bool):
            raise ValueError(f"drop_last should be a boolean value, but got drop_last={drop_last!r}")
        self.sampler = sampler
        self.drop_last = drop_last

    def __iter__(self) -> Iterator[list[int]]:
        return self.batches_from(0)

    def batches_from(self, first: int, as_indices: bool = False) -> Iterator[Any]:
        """The batches of one epoch (one ``iter()`` of the sampler), from batch ``first``
        on: a resumed epoch skips the batches delivered before the save. ``as_indices``
        (the loader's own use): our samplers' batches as :class:`~shmload._transport.messages.Indices`,
        which reach the dataset as the same lists without the main process building them."""
        if type(self.sampler).__dict__.get("_array_order"):
            # our own samplers (not subclasses, whose __iter__ may differ): slice the epoch's
            # order instead of a Python loop per index, computing only the batches taken
            indices = self.sampler._order()
            stop = len(indices) - len(indices) % self.batch_size if self.drop_last else len(indices)
            position_of = getattr(indices, "position_of", None)  # an elastic share's (elastic.py)
            if as_indices and position_of is None:
                yield from _indices_from(indices, first * self.batch_size, stop, self.batch_size)
                return
            for start in range(first * self.batch_size, stop, self.batch_size):
                batch = indices[start:start + self.batch_size]
                if as_indices and position_of is not None:  # (elastic: the position must reach the loading)
                    yield Indices(np.asarray(batch, dtype=np.int64), position_of(batch))
                    continue
                yield batch.tolist()
            return
        yield from itertools.islice(self._batches(), first, None)

    def _batches(self) -> Iterator[list[int]]:
        """Any other sampler's: each batch taken by ``islice`` in C, not by a Python loop
        per index (2-3x faster: 21 -> 12 us of the main process per batch of 256 from
        torch's DistributedSampler, docs/performance.md). The sampler is advanced exactly
        as far as a loop would: a batch's indices are drawn when the batch is asked for."""
        indices = iter(self.sampler)
        while batch := list(itertools.islice(indices, self.batch_size)):
            if len(batch) < self.batch_size and self.drop_last:
                return
            yield batch

    def __len__(self) -> int:
        n = len(self.sampler)
        return n // self.batch_size if self.drop_last else -(-n // self.batch_size)



def orders(dataset: Any, iterable: bool, shuffle: Any, sampler: Any, batch_sampler: Any, batch_size: int | None,
           drop_last: bool, seed: int) -> tuple[Any, Any, Any]:
    """A loader's (sampler, batch_sampler, order source), as torch's DataLoader makes its
    samplers: a Sequential- or RandomSampler if none was given, and a BatchSampler over it
    for ``batch_size``. The order source is what fixes the epoch's order, whose state
    resume saves (resume.py): the user's batch sampler or sampler, never our BatchSampler
    (it has no state of its own), and nothing for an iterable source (it orders itself)."""
    order_source = batch_sampler if batch_sampler is not None else sampler
    if type(order_source) is BatchSampler:
        order_source = order_source.sampler
    if iterable:
        return sampler, batch_sampler, None
    if sampler is None:
        sampler = RandomSampler(dataset, seed) if shuffle else SequentialSampler(dataset)
    if order_source is None:
        order_source = sampler
    if batch_size is not None and batch_sampler is None:
        batch_sampler = BatchSampler(sampler, batch_size, drop_last)
    return sampler, batch_sampler, order_source
