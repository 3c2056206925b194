"""torch.utils.data.DataLoader as users run it: numpy samples, default collate."""

from __future__ import annotations

from typing import Any

import torch
import torch.utils.data

from . import Harness, Options


def make(name: str, dataset: Any, batches: list[list[int]], options: Options) -> Harness:
    loader = torch.utils.data.DataLoader(dataset, batch_size=len(batches[0]), num_workers=options.workers,
                                         persistent_workers=True, prefetch_factor=options.prefetch_factor,
                                         multiprocessing_context=options.start_method)

    def close() -> None:
        iterator = getattr(loader, "_iterator", None)  # the persistent workers live here
        if iterator is not None:
            iterator._shutdown_workers()
        loader._iterator = None
    return Harness(lambda: iter(loader), close,
                   f"torch {torch.__version__}, persistent workers, prefetch_factor={options.prefetch_factor}, "
                   f"sharing strategy {torch.multiprocessing.get_sharing_strategy()!r}")
