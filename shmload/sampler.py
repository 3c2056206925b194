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
"""

from __future__ import annotations

import itertools
import types
from typing import Any, Iterator, Sized

import numpy as np

from . import seeding
from ._checks import check_int


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


class SequentialSampler:
    """Indices ``0, 1, ..., len(data_source) - 1``.

    The order is the same every epoch, but the sampler counts epochs like the others
    (``epoch``, ``set_epoch``, advanced by each ``iter()``): a loader's own sampler carries
    the epoch number that seeds the batches' augmentations (``DataLoader._upcoming_epoch``),
    which trainers set with ``loader.sampler.set_epoch(n)``.
    """

    __class_getitem__ = classmethod(types.GenericAlias)  # Sampler[int] in annotations, as torch's

    # ``_order()`` returns the epoch's indices as one array, which BatchSampler slices.
    # Looked up in the class's own __dict__: a subclass may change __iter__.
    _array_order = True

    def __init__(self, data_source: Sized):
        self.data_source = data_source
        self.epoch = 0

    def set_epoch(self, epoch: int) -> None:
        check_int("epoch", epoch, 0)
        self.epoch = int(epoch)

    def state_dict(self) -> dict:
        return {"length": len(self.data_source), "epoch": self.epoch}

    def load_state_dict(self, state: dict) -> None:
        check_state(self, state, ("length",))
        self.set_epoch(state.get("epoch", 0))  # (states saved before it counted epochs have none)

    def _order(self) -> np.ndarray:
        self.epoch += 1
        return np.arange(len(self.data_source))

    def __iter__(self) -> Iterator[int]:
        self.epoch += 1
        return iter(range(len(self.data_source)))

    def __len__(self) -> int:
        return len(self.data_source)


class RandomSampler:
    """A permutation of ``range(len(data_source))``, fixed by ``seed`` and the epoch.

    Each ``iter()`` uses the current epoch and then advances it, so successive epochs are
    shuffled differently; ``set_epoch(n)`` chooses the epoch of the next ``iter()``.
    """

    __class_getitem__ = classmethod(types.GenericAlias)  # Sampler[int] in annotations, as torch's

    _array_order = True  # see SequentialSampler

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

    def state_dict(self) -> dict:
        return {"seed": self.seed, "epoch": self.epoch, "length": len(self.data_source)}

    def load_state_dict(self, state: dict) -> None:
        check_state(self, state, ("seed", "epoch", "length"))
        check_int("seed", state["seed"], 0)
        self.seed = int(state["seed"])
        self.set_epoch(state["epoch"])

    def __iter__(self) -> Iterator[int]:
        return iter(self._order().tolist())

    def __len__(self) -> int:
        return len(self.data_source)


class BatchSampler:
    """Groups the indices of ``sampler`` into lists of ``batch_size``.

    The last, shorter batch is kept unless ``drop_last``.
    """

    __class_getitem__ = classmethod(types.GenericAlias)  # Sampler[int] in annotations, as torch's

    def __init__(self, sampler: Any, batch_size: int, drop_last: bool):
        check_int("batch_size", batch_size, 1)
        self.batch_size = int(batch_size)
        if not isinstance(drop_last, bool):
            raise ValueError(f"drop_last should be a boolean value, but got drop_last={drop_last!r}")
        self.sampler = sampler
        self.drop_last = drop_last

    def __iter__(self) -> Iterator[list[int]]:
        return self.batches_from(0)

    def batches_from(self, first: int) -> Iterator[list[int]]:
        """The batches of one epoch (one ``iter()`` of the sampler), from batch ``first``
        on: a resumed epoch skips the batches delivered before the save."""
        if type(self.sampler).__dict__.get("_array_order"):
            # our own samplers (not subclasses, whose __iter__ may differ): slice one index
            # array instead of a Python loop per index
            indices = self.sampler._order()
            stop = len(indices) - len(indices) % self.batch_size if self.drop_last else len(indices)
            for start in range(first * self.batch_size, stop, self.batch_size):
                yield indices[start:start + self.batch_size].tolist()
            return
        yield from itertools.islice(self._batches(), first, None)

    def _batches(self) -> Iterator[list[int]]:
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

