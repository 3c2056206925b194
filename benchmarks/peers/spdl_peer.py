"""SPDL's thread-based pipeline with the same Python batch function.

One pipeline per epoch (source: the epoch's index lists; one ``pipe`` stage running
``load_batch`` on ``workers`` threads; a sink of ``workers * prefetch_factor``). The
threads share the main process's GIL: they run in parallel only where numpy and Pillow
release it (large copies, decoding, resizing).
"""

from __future__ import annotations

import functools
from typing import Any

import spdl.pipeline

from ..workloads import load_batch
from . import Harness, Options


def make(name: str, dataset: Any, batches: list[list[int]], options: Options) -> Harness:
    load = functools.partial(load_batch, dataset)
    current: list[Any] = []

    def epoch():
        pipeline = (spdl.pipeline.PipelineBuilder()
                    .add_source(batches)
                    .pipe(load, concurrency=options.workers)
                    .add_sink(options.workers * options.prefetch_factor)
                    .build(num_threads=options.workers))
        current.append(pipeline)
        with pipeline.auto_stop():
            yield from pipeline.get_iterator(timeout=120)
        current.remove(pipeline)

    def close() -> None:
        for pipeline in current:
            pipeline.stop(timeout=10)
    return Harness(epoch, close, f"spdl {getattr(spdl, '__version__', '?')} PipelineBuilder, "
                   f"{options.workers} threads, pipe concurrency {options.workers}, completion order",
                   ordered=False)
