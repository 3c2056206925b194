"""An elastic loader's state (NOTE [ The global sequence ], elastic.py): the global
position a state holds, how this world counts it, and the checks of a loaded one. The
state's format is resume.py's; this is what differs when it is elastic."""

from __future__ import annotations

from typing import Any

from .._ordering.elastic import is_elastic, origin


def elastic_at(sampler_state: dict, next_batch: int) -> dict:
    """An elastic sampler's state at the epoch's start, moved to the global position after
    ``next_batch`` batches (of every rank: the state is the same on each)."""
    g = sampler_state["global_batch_size"]
    return dict(sampler_state, position=origin(sampler_state["position"], g) + next_batch * g)


def elastic_resume(state: dict, sampler: Any) -> dict:
    """A loaded elastic ``state`` as this world counts it, once ``sampler`` (this rank's,
    of any world) holds its global position: the same position, this world's global
    batch size and first batch. Again whenever the world changes before the epoch begins
    (a state loaded before ``init_process_group()``)."""
    return dict(state, sampler=sampler.state_dict(), next_batch=sampler.resumed_batch(), delivered_beyond=[])


def check_elastic(state: dict, elastic: bool) -> bool:
    """Whether ``state`` (checked) is an elastic loader's; a ValueError if this loader is
    elastic and the state is not, or the reverse: a global position and a rank's own
    position mean different things."""
    saved = is_elastic(state["sampler"])
    if saved and not elastic:
        raise ValueError(
            f"load_state_dict: the state was saved by an elastic loader (global position "
            f"{state['sampler'].get('position')} of epoch {state['epoch']}), but this loader is not elastic: pass "
            "elastic=True to resume it (on any world size)")
    if elastic and not saved:
        sampler = state["sampler"]
        who = (f"rank {sampler.get('rank')} of {sampler.get('num_replicas')} processes"
               if isinstance(sampler, dict) and "num_replicas" in sampler else "a loader that is not elastic")
        raise ValueError(
            f"load_state_dict: the state was saved by {who}, but this loader is elastic (elastic=True): an elastic "
            "loader resumes from an elastic state only, whose position is global. Resume without elastic=True, or "
            "start elastic loading at an epoch's start")
    return saved
