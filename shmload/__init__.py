"""shmload: a shared-memory multiprocess data loader.

Workers load and collate batches straight into preallocated shared-memory slots; the
main process yields numpy views into them, with no pickling of array data.

This module re-exports the public names. The code sits in private packages by layer,
each importing only those below it (docs/architecture.md, "The layers";
tests/test_layers.py): ``_core`` (checks, the platform and its interrupt window, sizes),
then the profiler's counters, ``_batching`` (a batch's layout and its writes into a
slot), ``_transport`` (segments, the ring, the control block, sockets), ``_ordering``
(samplers, seeds, shuffles, streams), ``_loading`` (what a worker runs), ``_session``
(workers, slots and tasks of one session) and ``_loader`` (``DataLoader`` and its
epochs). The public subpackages, ``datasets``, ``transforms``, ``records``,
``integrations`` and ``tools``, sit on top.
"""

from ._batching.collate import default_collate
from ._batching.deferred import Batched, DeferredArray
from ._core.native import compiled_core
from ._loader.loader import DataLoader
from ._loading.worker import WorkerInfo, get_worker_info
from ._ordering.distributed import DistributedSampler
from ._ordering.sampler import BatchSampler, RandomSampler, SequentialSampler
from ._ordering.sharding import DistributedWarning
from ._ordering.sources import GeneratorSource
from ._ordering.stream import stream_parts
from ._version import __version__ as __version__
from .errors import (
                     CollateError,
                     ImageDecodeError,
                     LoaderTimeoutError,
                     OptionalDependencyError,
                     PinningError,
                     RingFullError,
                     SharedMemoryError,
                     ShmloadError,
                     ShmloadWarning,
                     WorkerDiedError,
                     WorkerError,
                     WorkerStartupError,
)
from .profiler.stats import LoaderStats

__all__ = [  # (__version__ is public too, as every package's)
    "BatchSampler",
    "Batched",
    "CollateError",
    "DataLoader",
    "DeferredArray",
    "DistributedSampler",
    "DistributedWarning",
    "GeneratorSource",
    "ImageDecodeError",
    "LoaderStats",
    "LoaderTimeoutError",
    "OptionalDependencyError",
    "PinningError",
    "RandomSampler",
    "RingFullError",
    "SequentialSampler",
    "SharedMemoryError",
    "ShmloadError",
    "ShmloadWarning",
    "WorkerDiedError",
    "WorkerError",
    "WorkerInfo",
    "WorkerStartupError",
    "compiled_core",
    "default_collate",
    "get_worker_info",
    "stream_parts",
]
