"""shmload with its default path: default collate into the ring, numpy views out.
``shmload-posix`` is the same with the POSIX backend's segments (``shm_backend="posix"``)
in place of the default memfd ones.

It runs with its own default ``prefetch_factor=None``: depth 2 per worker, as the peers
are given, for every workload with batches of 512 KiB or more; deeper for ``tiny`` (see
``shmload._session.dispatch.prefetch_depth``), which is what a user of shmload gets.
"""

from __future__ import annotations

from typing import Any

import shmload

from . import Harness, Options


def make(name: str, dataset: Any, batches: list[list[int]], options: Options) -> Harness:
    backend = "posix" if name == "shmload-posix" else None
    loader = shmload.DataLoader(dataset, batch_size=len(batches[0]), num_workers=options.workers,
                                persistent_workers=True, multiprocessing_context=options.start_method, seed=0,
                                shm_backend=backend)
    return Harness(lambda: iter(loader), loader.close,
                   f"shmload {shmload.__version__} ({backend or 'memfd'} segments), persistent workers, "
                   "prefetch_factor=None (its default: "
                   f"{options.prefetch_factor} for large batches, deeper for small ones)")
