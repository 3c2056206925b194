"""shmload with its default path: default collate into the ring, numpy views out.

It runs with its own default ``prefetch_factor=None``: depth 2 per worker, as the peers
are given, for every workload with batches of 512 KiB or more; deeper for ``tiny`` (see
``shmload.dispatch.prefetch_depth``), which is what a user of shmload gets.
"""

from __future__ import annotations

from typing import Any

import shmload

from . import Harness, Options


def make(name: str, dataset: Any, batches: list[list[int]], options: Options) -> Harness:
    loader = shmload.DataLoader(dataset, batch_size=len(batches[0]), num_workers=options.workers,
                                persistent_workers=True, multiprocessing_context=options.start_method, seed=0)
    return Harness(lambda: iter(loader), loader.close,
                   f"shmload {shmload.__version__}, persistent workers, prefetch_factor=None (its default: "
                   f"{options.prefetch_factor} for large batches, deeper for small ones)")
