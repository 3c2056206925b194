"""Samplers: which dataset indices make up each batch, in which order.

They run in the main process only, and are pure: no processes, no shared memory.
The semantics follow ``torch.utils.data`` (``SequentialSampler``, ``RandomSampler``,
``BatchSampler``), except that :class:`RandomSampler` draws its order from a seed and an
epoch instead of a global generator, so an epoch's order can be reproduced exactly.
"""

from __future__ import annotations

from typing import Any, Iterator, Sized

import numpy as np

from . import seeding
from ._checks import check_int


class SequentialSampler:
    """Indices ``0, 1, ..., len(data_source) - 1``."""

    def __init__(self, data_source: Sized):
        self.data_source = data_source

    def _order(self) -> np.ndarray:
        return np.arange(len(self.data_source))

    def __iter__(self) -> Iterator[int]:
        return iter(range(len(self.data_source)))

    def __len__(self) -> int:
        return len(self.data_source)


class RandomSampler:
    """A permutation of ``range(len(data_source))``, fixed by ``seed`` and the epoch.

    Each ``iter()`` uses the current epoch and then advances it, so successive epochs are
    shuffled differently; ``set_epoch(n)`` chooses the epoch of the next ``iter()``.
    """

    def __init__(self, data_source: Sized, seed: int = 0):
        check_int("seed", seed, 0)
        self.data_source = data_source
        self.seed = int(seed)
        self.epoch = 0

    def set_epoch(self, epoch: int) -> None:
        check_int("epoch", epoch, 0)
        self.epoch = int(epoch)

    def _order(self) -> np.ndarray:
        order = seeding.permutation(self.seed, self.epoch, len(self.data_source))
        self.epoch += 1
        return order

    def __iter__(self) -> Iterator[int]:
        return iter(self._order().tolist())

    def __len__(self) -> int:
        return len(self.data_source)


class BatchSampler:
    """Groups the indices of ``sampler`` into lists of ``batch_size``.

    The last, shorter batch is kept unless ``drop_last``.
    """

    def __init__(self, sampler: Any, batch_size: int, drop_last: bool):
        check_int("batch_size", batch_size, 1)
        self.batch_size = int(batch_size)
        if not isinstance(drop_last, bool):
            raise ValueError(f"drop_last should be a boolean value, but got drop_last={drop_last!r}")
        self.sampler = sampler
        self.drop_last = drop_last

    def __iter__(self) -> Iterator[list[int]]:
        if type(self.sampler) in (SequentialSampler, RandomSampler):
            # our own samplers (not subclasses, whose __iter__ may differ): slice one index
            # array instead of a Python loop per index
            indices = self.sampler._order()
            stop = len(indices) - len(indices) % self.batch_size if self.drop_last else len(indices)
            for start in range(0, stop, self.batch_size):
                yield indices[start:start + self.batch_size].tolist()
            return
        batch: list[int] = []
        for index in self.sampler:
            batch.append(index)
            if len(batch) == self.batch_size:
                yield batch
                batch = []
        if batch and not self.drop_last:
            yield batch

    def __len__(self) -> int:
        n = len(self.sampler)
        return n // self.batch_size if self.drop_last else -(-n // self.batch_size)
