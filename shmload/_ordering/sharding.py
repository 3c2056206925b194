"""Sharding under a trainer: which share of the dataset this rank reads when nobody said.

Lightning, accelerate and the HF Trainer give torch's DataLoader a distributed sampler by
rebuilding it; they cannot rebuild ours, so without this module every rank of a DDP job
would silently train on the whole dataset. The rule, decided afresh at every ``iter()``
(and by ``len()``, ``state_dict()`` and ``load_state_dict()``, so they agree with what is
delivered; those three may shard, only ``iter()`` undoes a shard):

- ``torch.distributed`` initialized with a world size above 1, and the loader built its
  sampler itself (``shuffle=``, the default): the loader reads this rank's share, exactly
  as ``shmload.DistributedSampler`` would (the same partition and padding); it says so
  once, with a :class:`DistributedWarning`, unless ``distributed=True`` asked for it.
- The user passed a sampler or batch sampler that is not distributed (see
  :func:`looks_distributed`): a :class:`DistributedWarning` once, naming the fix; the
  sampler is used as given.
- ``distributed=False``: every rank reads everything, silently.

Only an initialized process group counts, not torchrun's ``RANK``/``WORLD_SIZE``
environment: a script may start under torchrun and still mean each process to read all.

The share's order must be the same permutation on every rank, or the shares would
overlap: it is seeded by the loader's ``seed=`` (or ``generator=``) when one was given,
else by 0 (torch's ``DistributedSampler`` default), never by a seed drawn per process.

:func:`share` is the partition itself (torch's), on an epoch's order that may be far too
large to build (NOTE [ Orders are computed a slice at a time ] in sampler.py).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, NamedTuple

import numpy as np

from .._core._torch import loaded_torch
from ..errors import ShmloadWarning

if TYPE_CHECKING:
    from .sampler import OrderLike


class DistributedWarning(ShmloadWarning):
    """The loader is in a distributed job: it shards by itself, or it cannot (a sampler of
    yours that is not distributed)."""


def torch_world() -> tuple[int, int] | None:
    """(world size, rank) of an initialized ``torch.distributed`` process group, else None.
    Never imports torch: a job that uses it has imported it already."""
    torch = loaded_torch()
    dist = getattr(torch, "distributed", None) if torch is not None else None
    if dist is None or not dist.is_available() or not dist.is_initialized():
        return None
    return dist.get_world_size(), dist.get_rank()


def looks_distributed(obj: Any) -> bool:
    """Whether a sampler (or batch sampler, or the sampler inside one) picks a rank's share:
    shmload's and torch's ``DistributedSampler`` and the wrappers of Lightning and
    accelerate all carry ``num_replicas`` (or ``num_processes``) and ``rank`` (or
    ``process_index``)."""
    for o in (obj, getattr(obj, "sampler", None), getattr(obj, "batch_sampler", None)):
        if o is None:
            continue
        if (hasattr(o, "num_replicas") and hasattr(o, "rank")) or \
                (hasattr(o, "num_processes") and hasattr(o, "process_index")):
            return True
    return False


class Decision(NamedTuple):
    shard: tuple[int, int] | None  # (world size, rank) to shard the loader's own sampler by
    warn: str | None  # a message to give once


def decide(mode: bool | None, own_sampler: bool, order: Any, world: tuple[int, int] | None) -> Decision:
    """What the loader does at ``iter()``: ``mode`` is its ``distributed=`` keyword,
    ``own_sampler`` whether it built its sampler itself, ``order`` the user's sampler or
    batch sampler otherwise, ``world`` from :func:`torch_world`. Pure."""
    if mode is False or world is None or world[0] <= 1:
        return Decision(None, None)
    size, rank = world
    if own_sampler:
        note = None if mode else (
            f"shmload.DataLoader: torch.distributed is initialized with {size} processes, so this loader reads "
            f"only rank {rank}'s share of the dataset (as shmload.DistributedSampler would: 1/{size} of the "
            "samples, padded to equal counts). Pass distributed=True to say you expect this (no message), or "
            "distributed=False to have every rank read everything")
        return Decision((size, rank), note)
    if looks_distributed(order):
        return Decision(None, None)
    return Decision(None, (
        f"shmload.DataLoader: torch.distributed is initialized with {size} processes, but the sampler "
        f"{type(order).__name__} you gave is not distributed, so every rank reads the whole dataset. Give "
        "shmload.DistributedSampler(dataset) (or torch's) as sampler=, or pass distributed=False if every rank "
        "should read everything"))


def share(order: OrderLike, total: int, rank: int, size: int) -> OrderLike:
    """Rank ``rank``'s share of an epoch's whole ``order`` among ``size`` ranks, as torch's
    ``DistributedSampler`` partitions: the order padded to ``total`` by repeating its head
    (or cut to ``total``, with ``drop_last``), then every ``size``-th position from
    ``rank``. An array gives an array; a ``sampler.Order`` gives an Order, and nothing is
    computed until its batches are (a share of 2**40 samples costs no memory). Pure."""
    if isinstance(order, np.ndarray):
        if total > len(order):  # a tiny dataset, many ranks: the head repeated as often as needed
            order = np.resize(order, total)
        return order[rank:total:size]
    return order.strided(rank, size, len(range(rank, total, size)))
