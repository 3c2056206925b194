"""Collate: turn the samples of one batch into a plan that can be written anywhere.

``default_collate`` is the public, in-memory version (fresh numpy arrays), for custom
collate functions to build on. Inside a worker the same plan is written straight into a
ring slot instead (see :mod:`shmload.worker`), so the default path copies each byte once.
"""

from __future__ import annotations

from typing import Any, Callable, Sequence

from . import layout as _layout
from .deferred import Batched


def default_collate(batch: Sequence[Any]) -> Any:
    """Collate a list of samples into a batch of numpy arrays.

    The batch has torch's ``default_collate`` structure (layout.py, NOTE [ Batch
    containers ]): a tuple sample gives a list, a namedtuple, list or mapping its own kind.
    Arrays, numpy scalars and torch tensors of equal shape are stacked to ``[B, ...]``,
    numbers of different types promoted as torch promotes them (NOTE [ Mixed numeric
    types ]); Python bool/int/float become a 1-D array of length B; any other leaf (str,
    bytes, None, objects) becomes a sequence of length B.

    Raises :class:`shmload.CollateError` naming the field and the position when samples
    do not match.
    """
    return _layout.build_local(_layout.plan_stack(batch))


def make_plan(samples: Any, indices: Any, collate_fn: Callable | None, auto_batch: bool) -> _layout.Plan:
    """The plan for one batch, however it was asked to be collated.

    ``auto_batch`` is False when ``batch_size=None``: ``samples`` is then one sample.
    """
    if type(samples) is Batched:  # from a __getitems__: collated already (see deferred.py)
        if collate_fn is None:  # (tuples as lists: the batch a __getitem__ path would give)
            return _layout.plan_convert(samples.batch, indices, tuple_as_list=True)
        samples = samples.samples()
    if collate_fn is not None:
        return _layout.plan_convert(collate_fn(samples), indices if auto_batch else [indices])
    if auto_batch:
        return _layout.plan_stack(samples, indices)
    return _layout.plan_convert(samples, [indices], tuple_as_list=True)  # torch's default_convert
