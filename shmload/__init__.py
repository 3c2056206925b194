"""shmload: a shared-memory multiprocess data loader.

Workers load and collate batches straight into preallocated shared-memory slots; the
main process yields numpy views into them, with no pickling of array data.
"""

from ._version import __version__ as __version__
from .collate import default_collate
from .deferred import Batched, DeferredArray
from .distributed import DistributedSampler
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
from .iterable import GeneratorSource, stream_parts
from .loader import DataLoader
from .profiler.stats import LoaderStats, MainStats, RingStats, WorkerStats
from .sampler import BatchSampler, RandomSampler, SequentialSampler
from .sharding import DistributedWarning
from .worker import WorkerInfo, get_worker_info

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
    "MainStats",
    "OptionalDependencyError",
    "PinningError",
    "RandomSampler",
    "RingFullError",
    "RingStats",
    "SequentialSampler",
    "SharedMemoryError",
    "ShmloadError",
    "ShmloadWarning",
    "WorkerDiedError",
    "WorkerError",
    "WorkerInfo",
    "WorkerStats",
    "WorkerStartupError",
    "default_collate",
    "get_worker_info",
    "stream_parts",
]
