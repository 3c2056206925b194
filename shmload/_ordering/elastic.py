"""Elastic: one global sequence of samples for any world size (pure: no processes).

NOTE [ The global sequence ]
An elastic epoch is one sequence of sample positions, the same for every world size and
``num_workers``: position ``p`` holds ``order[p % n]``, ``order`` being the epoch's
order of the ``n`` samples (a permutation fixed by the seed and the epoch, or
``0..n-1``). It is cut into *global batches* of ``G`` positions, and with ``W`` ranks of
``b = G // W`` samples a batch, rank ``r`` loads the contiguous slice ``[r*b, (r+1)*b)``
of each: global batch ``k`` is rank 0's ``k``-th batch, then rank 1's, and so on. So the
concatenated global batch is the same for any ``W`` that divides ``G``.

The grid of global batches starts at ``origin`` (0, unless an epoch was resumed with
another global batch size: :func:`origin`): batch ``k`` covers positions
``[origin + k*G, origin + (k+1)*G)``. The last one, when ``n - origin`` is not a multiple
of ``G``, is padded with positions past ``n``, which wrap to the head of the order (as
torch's ``DistributedSampler`` pads), or dropped with ``drop_last``. Both rules depend on
``G`` and ``n`` alone, never on ``W``.

Augmentations follow the positions: each sample is seeded for itself by (seed, epoch,
position) (``seeding.seed_sample``), so a sample is augmented alike whichever rank,
worker or split span loads it. A batch's first position travels with its indices
(``messages.Indices.position``) to whoever loads it.

The state is the global position: how many positions of the epoch were consumed by all
ranks together, the same number on every rank of a job that steps in lockstep (as DDP
does). A resume on any world size continues from it; with another ``G`` the grid moves
to start there (``origin = position % G``), so every sample of the epoch is still
delivered once (padding and ``drop_last`` aside, which then apply to the new grid).
"""

from __future__ import annotations

from typing import Any, NamedTuple

import numpy as np

from .sampler import Order, OrderLike


class Grid(NamedTuple):
    """The global batches of one elastic epoch, and one rank's slice of each."""

    n: int  # samples in the dataset
    global_batch: int  # G
    batch: int  # b, the rank's batch: G // world size
    rank: int
    origin: int  # the first position of global batch 0 (NOTE [ The global sequence ])
    drop_last: bool

    @property
    def batches(self) -> int:
        """Global batches in the epoch (those before a resumed position included)."""
        left = max(0, self.n - self.origin)
        return left // self.global_batch if self.drop_last else -(-left // self.global_batch)

    def first_position(self, k: int) -> int:
        """The global position of the rank's ``k``-th batch's first sample."""
        return self.origin + k * self.global_batch + self.rank * self.batch


def is_elastic(sampler_state: Any) -> bool:
    """Is this the state of an elastic sampler (``DistributedSampler(elastic=True)``)?"""
    return isinstance(sampler_state, dict) and sampler_state.get("elastic") is True


def origin(position: int, global_batch: int) -> int:
    """Where the grid of global batches starts for an epoch resumed at ``position`` (0
    for a fresh epoch): its batches then meet ``position`` at a boundary."""
    return position % global_batch


def batch_sizes(world: int, batch_size: int | None, global_batch_size: int | None) -> tuple[int | None, int | None]:
    """(b, G) from what was given: either, or both if they agree; None, None if neither
    (the loader tells the sampler its batch size later). A ValueError names the problem."""
    if global_batch_size is not None:
        if global_batch_size % world:
            raise ValueError(f"global_batch_size={global_batch_size} is not divisible by the world size {world}: "
                             f"each of the {world} ranks loads an equal slice of every global batch. Choose a "
                             f"global batch size that is a multiple of every world size the job may run with")
        per_rank = global_batch_size // world
        if batch_size is not None and batch_size != per_rank:
            raise ValueError(f"batch_size={batch_size} with {world} ranks is a global batch of {batch_size * world}, "
                             f"but global_batch_size={global_batch_size}: batch_size should be "
                             f"global_batch_size // world size = {per_rank}")
        return per_rank, global_batch_size
    if batch_size is not None:
        return batch_size, batch_size * world
    return None, None


class RankShare:
    """Rank ``grid.rank``'s share of an elastic epoch's order: its slice of each global
    batch, end to end (what an elastic ``DistributedSampler`` iterates). Like an
    ``Order``: ``len()``, slicing, ``tolist()``, ``numpy.asarray()``. A slice that is one
    batch (what ``BatchSampler`` takes) is an ``Order`` whose ``start`` is the batch's
    global position (:meth:`position_of`)."""

    def __init__(self, whole: OrderLike, grid: Grid):
        # the epoch's order as an Order, which wraps positions past n to the head (padding)
        self.whole = whole if isinstance(whole, Order) else Order(len(whole), _indexer(whole))
        self.grid = grid
        self.length = grid.batches * grid.batch

    def __len__(self) -> int:
        return self.length

    def _block(self, start: int, stop: int) -> Order:
        """Positions ``start`` to ``stop - 1`` of this share, within one batch."""
        k, i = divmod(start, self.grid.batch)
        first = self.grid.first_position(k) + i
        return Order(self.whole.n, self.whole.index, first, 1, stop - start)

    def __getitem__(self, key: slice) -> Any:
        if not isinstance(key, slice):
            raise TypeError(f"a rank's share takes a slice, not {type(key).__name__}")
        r = range(self.length)[key]
        if r.step != 1:
            raise ValueError("a rank's share is sliced with step 1")
        if not r or r.start // self.grid.batch == (r.stop - 1) // self.grid.batch:
            return self._block(r.start, r.start + len(r))
        return _Joined(self._blocks(r.start, r.stop))

    def _blocks(self, start: int, stop: int) -> list[Order]:
        b, out, s = self.grid.batch, [], start
        while s < stop:
            end = min(stop, (s // b + 1) * b)
            out.append(self._block(s, end))
            s = end
        return out

    def position_of(self, batch: Any) -> int | None:
        """The global position of a one-batch slice's first sample."""
        return batch.start if isinstance(batch, Order) else None

    def tolist(self) -> list[int]:
        return self[0:self.length].tolist() if self.length else []

    def __array__(self, dtype: Any = None, copy: Any = None) -> np.ndarray:
        values = np.asarray(self[0:self.length]) if self.length else np.arange(0)
        return values if dtype is None else values.astype(dtype)

    def __repr__(self) -> str:
        return f"RankShare({self.grid}, length={self.length})"


class _Joined:
    """Consecutive blocks of a share, as one slice (a walk over the share, not a batch)."""

    def __init__(self, blocks: list[Order]):
        self.blocks = blocks

    def __len__(self) -> int:
        return sum(map(len, self.blocks))

    def tolist(self) -> list[int]:
        return [i for block in self.blocks for i in block.tolist()]

    def __array__(self, dtype: Any = None, copy: Any = None) -> np.ndarray:
        values = np.concatenate([np.asarray(block) for block in self.blocks])
        return values if dtype is None else values.astype(dtype)


def _indexer(order: np.ndarray) -> Any:
    table = np.asarray(order, dtype=np.int64)
    return table.__getitem__
