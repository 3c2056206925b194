"""shmload with its default path: default collate into the ring, numpy views out."""

from __future__ import annotations

from typing import Any

import shmload

from . import Harness, Options


def make(name: str, dataset: Any, batches: list[list[int]], options: Options) -> Harness:
    loader = shmload.DataLoader(dataset, batch_size=len(batches[0]), num_workers=options.workers,
                                persistent_workers=True, prefetch_factor=options.prefetch_factor,
                                multiprocessing_context=options.start_method, seed=0)
    return Harness(lambda: iter(loader), loader.close,
                   f"shmload {shmload.__version__}, persistent workers, prefetch_factor={options.prefetch_factor}")
