"""The loader's settings, validated once and frozen, so no stage takes a long argument list."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable


@dataclass(frozen=True)
class LoaderConfig:
    dataset: Any
    auto_batch: bool  # False with batch_size=None: one sample per step, nothing stacked
    collate_fn: Callable | None  # None: the default collate, written straight into the slot
    num_workers: int
    prefetch_factor: int | None  # None: 2, deeper for small batches (dispatch.prefetch_depth)
    persistent_workers: bool
    timeout: float
    worker_init_fn: Callable | None
    in_order: bool
    seed: int
    context: Any  # a multiprocessing context
    output: str  # "numpy" | "torch"
    slot_bytes: int | None
    max_shm_bytes: int | None
    max_worker_restarts: int = 0
    rank: int = 0  # this process's rank in a distributed job, mixed into the batch seeds (seeding.py)
    iterable: bool = False  # the dataset is read as a stream (iterable.py)
    batch_size: int | None = None  # for an iterable source's draws (a sampler batches a map-style one)
    drop_last: bool = False
    pinner: Any = None  # pin_memory=True with CUDA: page-locks the ring's segments (pinning.py)
