"""The two loaders with no library: the single-process loop, and a pickling process pool."""

from __future__ import annotations

import multiprocessing
from typing import Any

from ..workloads import load_batch
from . import Harness, Options

_dataset: Any = None  # the pool workers' copy, set by the initializer


def _init(dataset: Any) -> None:
    global _dataset
    _dataset = dataset


def _load(indices: list[int]):
    return load_batch(_dataset, indices)


def make(name: str, dataset: Any, batches: list[list[int]], options: Options) -> Harness:
    if name == "single":
        return Harness(lambda: (load_batch(dataset, b) for b in batches), lambda: None,
                       "the main process loads and np.stack-s every batch itself")
    pool = multiprocessing.get_context(options.start_method).Pool(
        options.workers, initializer=_init, initargs=(dataset,))

    def close() -> None:
        pool.close()
        pool.join()
    # imap queues the whole epoch's tasks at once: its prefetch is unbounded, unlike the others'.
    return Harness(lambda: pool.imap(_load, batches, chunksize=1), close,
                   f"multiprocessing.Pool({options.workers}).imap(chunksize=1); batches pickled through pipes; "
                   "prefetch unbounded (imap queues the whole epoch)")
