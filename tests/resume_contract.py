"""The exact-resume contract, as one reusable check (used by tests/test_resume.py and
by tests of datasets and examples that promise resume).

``assert_resumes_exactly(make_loader, ...)``: an uninterrupted run of ``epochs`` epochs
is the reference; then, for each save point and each pair of worker counts (saved
with, resumed with), a run is stopped there, ``state_dict()`` goes through JSON, a new
loader (with a different seed, which the state must override) loads it, and what it
yields must equal the reference's rest bit for bit (dtype, shape and bytes of every
array). With ``in_order=False`` the promise is weaker: each remaining batch of the epoch
exactly once, in any order.
"""

from __future__ import annotations

import itertools
import json
from typing import Any, Callable

import numpy as np


def flatten(batch: Any) -> list:
    """A batch as a list of (dtype, shape, bytes) / plain values: comparable with ==, and
    holding nothing of the ring."""
    if isinstance(batch, dict):
        return [(k, flatten(v)) for k, v in sorted(batch.items())]
    if isinstance(batch, (list, tuple)):
        return [flatten(v) for v in batch]
    if hasattr(batch, "numpy") and not isinstance(batch, np.ndarray):
        batch = batch.numpy()
    if isinstance(batch, np.ndarray):
        return [str(batch.dtype), batch.shape, batch.tobytes()]
    return [batch]


def run(loader: Any, epochs: int, stop_after: int | None = None) -> tuple[list, Any]:
    """The batches of ``epochs`` epochs, flattened; stopped after ``stop_after`` batches
    (then also returns ``state_dict()`` at that point, through JSON)."""
    out = []
    for _ in range(epochs):
        for batch in loader:
            out.append(flatten(batch))
            del batch
            if stop_after is not None and len(out) == stop_after:
                state = json.loads(json.dumps(loader.state_dict()))
                loader.close()
                return out, state
    return out, None


def assert_resumes_exactly(make_loader: Callable[..., Any], stops: list[int], epochs: int = 2,
                           workers: tuple[int, ...] = (0, 1, 2), pairs: list[tuple[int, int]] | None = None,
                           in_order: bool = True, reference_workers: int = 0) -> None:
    """``make_loader(num_workers=..., seed=...)`` builds a fresh loader (with fresh
    sampler). ``stops``: after how many batches (counted over all epochs) to save. The
    reference runs with ``reference_workers`` (an iterable source's batches depend on
    how many workers read it)."""
    reference, _ = run(make_loader(num_workers=reference_workers, seed=11), epochs)
    assert len(reference) > max(stops), "the save points must lie inside the run"
    pairs = pairs if pairs is not None else list(itertools.product(workers, workers))
    for stop in stops:
        for saved_with, resumed_with in pairs:
            head, state = run(make_loader(num_workers=saved_with, seed=11), epochs, stop)
            assert head == reference[:stop] or not in_order, \
                f"the first {stop} batches differ (num_workers={saved_with})"
            loader = make_loader(num_workers=resumed_with, seed=12345)  # the state's seed must win
            loader.load_state_dict(state)
            epochs_left = epochs - state["epoch"]
            tail, _ = run(loader, epochs_left)
            expected = reference[stop:]
            where = f"resumed after {stop} batches, saved with num_workers={saved_with}, resumed with {resumed_with}"
            if in_order:
                assert len(tail) == len(expected), f"{where}: {len(tail)} batches, expected {len(expected)}"
                for k, (got, want) in enumerate(zip(tail, expected)):
                    assert got == want, f"{where}: batch {stop + k} differs"
            else:  # one epoch: what came before and after the save is the epoch, each batch once
                assert epochs == 1
                assert sorted(map(repr, head + tail)) == sorted(map(repr, reference)), \
                    f"{where}: the remaining batches are not each delivered exactly once"
