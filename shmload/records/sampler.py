"""Locality-aware shuffling: a random order that reads a few parts at a time.

A fully random order over a million samples in 500 parts touches every part all the
time: on a network or cloud file system, or a page cache smaller than the dataset, each
read is a seek to a cold place. :class:`PartShuffleSampler` shuffles the *parts*, takes
them ``window`` at a time, and shuffles the samples within each window (OneFlow's
shuffle buffer over part files, FFCV's quasi-random order): at any moment the loader
reads from ``window`` parts, and over an epoch every sample comes once. Seeded and
reproducible like every sampler here (seed, epoch), with ``state_dict`` for exact resume.
"""

from __future__ import annotations

from typing import Any, Iterator

import numpy as np

from .._core._checks import check_int
from .._ordering.sampler import check_state

_STREAM = 1  # the SeedSequence stream of this sampler (seeding.SAMPLER_STREAM is 0)


class PartShuffleSampler:
    """Shuffle the parts of ``dataset`` (a :class:`RecordDataset`, or anything with
    ``part_of()`` giving each sample's part), then the samples within each ``window`` of
    consecutive parts. ``window=1`` reads one part at a time; a window as large as the
    number of parts is a full shuffle."""

    _array_order = True  # BatchSampler slices _order() (see shmload._ordering.sampler)

    def __init__(self, dataset: Any, window: int = 4, seed: int = 0):
        check_int("window", window, 1)
        check_int("seed", seed, 0)
        self.data_source = dataset
        self.window, self.seed, self.epoch = int(window), int(seed), 0
        self._parts = np.asarray(dataset.part_of(), dtype=np.int64)

    def set_epoch(self, epoch: int) -> None:
        check_int("epoch", epoch, 0)
        self.epoch = int(epoch)

    def _order(self) -> np.ndarray:
        rng = np.random.default_rng(np.random.SeedSequence(self.seed, spawn_key=(self.epoch, _STREAM)))
        self.epoch += 1
        n_parts = int(self._parts.max()) + 1 if len(self._parts) else 0
        turn = np.empty(n_parts, np.int64)
        turn[rng.permutation(n_parts)] = np.arange(n_parts)  # when each part comes
        window_of = turn[self._parts] // self.window
        return np.lexsort((rng.random(len(self._parts)), window_of))  # by window, random within

    def __iter__(self) -> Iterator[int]:
        return iter(self._order().tolist())

    def __len__(self) -> int:
        return len(self._parts)

    def state_dict(self) -> dict:
        return {"seed": self.seed, "epoch": self.epoch, "window": self.window, "length": len(self._parts)}

    def load_state_dict(self, state: dict) -> None:
        check_state(self, state, ("seed", "epoch", "window", "length"))
        if state["window"] != self.window:
            raise ValueError(f"PartShuffleSampler.load_state_dict: the state was saved with window={state['window']}, "
                             f"but this sampler has window={self.window}")
        check_int("seed", state["seed"], 0)
        self.seed = int(state["seed"])
        self.set_epoch(state["epoch"])
