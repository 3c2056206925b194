"""The loaders compared, one module each, behind one small interface.

``make(dataset, batches, options) -> Harness``: ``batches`` is the epoch's list of index
lists (the same for every loader), ``Harness.epoch()`` returns an iterable over one epoch
of ``(images, labels)`` batches, ``close()`` stops the loader's workers. ``unavailable()``
returns why a peer cannot run here (its package is not installed), or None.
"""

from __future__ import annotations

import importlib
from typing import Any, Callable, Iterable, NamedTuple


class Options(NamedTuple):
    workers: int
    start_method: str
    prefetch_factor: int = 2


class Harness(NamedTuple):
    epoch: Callable[[], Iterable[Any]]
    close: Callable[[], None]
    description: str
    ordered: bool = True    # batches come in sampler order
    exact: bool = True      # every sample exactly once per epoch


class Peer(NamedTuple):
    module: str
    requires: tuple[str, ...]   # importable modules it needs
    summary: str


PEERS: dict[str, Peer] = {
    "single": Peer("baseline", (), "single-process loop, np.stack collate"),
    "shmload": Peer("shmload_peer", ("shmload",), "shmload.DataLoader, default collate"),
    "shmload-posix": Peer("shmload_peer", ("shmload", "posix_ipc"),
                          "shmload.DataLoader, default collate, shm_backend='posix' (/dev/shm)"),
    "torch": Peer("torch_peer", ("torch",), "torch.utils.data.DataLoader, default collate"),
    "tp-runner": Peer("tensorpack_peer", ("tensorpack", "zmq"), "tensorpack MultiProcessRunnerZMQ + BatchData"),
    "tp-map": Peer("tensorpack_peer", ("tensorpack", "zmq"), "tensorpack MultiProcessMapDataZMQ + BatchData"),
    "mp-pool": Peer("baseline", (), "multiprocessing.Pool.imap, pickled numpy batches"),
    "zmq-pool": Peer("zmq_peer", ("zmq",), "ZMQ PUSH/PULL process pool, pickle protocol 5 with out-of-band buffers"),
    "spdl": Peer("spdl_peer", ("spdl.pipeline",), "SPDL PipelineBuilder, thread pool"),
}


def unavailable(name: str) -> str | None:
    for module in PEERS[name].requires:
        try:
            importlib.import_module(module)
        except Exception as exc:  # an ImportError, or a broken install that fails on import
            return f"cannot import {module}: {type(exc).__name__}: {exc}".splitlines()[0][:200]
    return None


def make(name: str, dataset: Any, batches: list[list[int]], options: Options) -> Harness:
    module = importlib.import_module(f"{__name__}.{PEERS[name].module}")
    return module.make(name, dataset, batches, options)
