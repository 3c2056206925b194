"""What a session hands its epoch for each batch: loaded, failed, or (a stream) ended."""

from __future__ import annotations

from typing import Any, NamedTuple

from .._transport.messages import StreamPoint
from .._transport.ring import Slot
from ..errors import WorkerError, describe_load


class Loaded(NamedTuple):
    seq: int
    slot: Slot | None  # None: the batch holds no array bytes
    layout: Any
    stream: tuple[int, StreamPoint] | None = None  # a draw's worker and its stream's position after it


class LoadFailed(NamedTuple):
    seq: int
    error: BaseException
    stream: tuple[int, StreamPoint] | None = None


class Ended(NamedTuple):
    """A draw found ``worker``'s stream ended: no batch at this position."""

    seq: int
    worker: int


def failed_where(wid: int, seq: int, load: Any) -> str:
    """Where a batch's error happened, in the words of torch's (scripts match them)."""
    return f"in DataLoader worker process {wid} while loading batch {seq} ({describe_load(load)})"


def unpicklable(wid: int, seq: int, exc: BaseException) -> WorkerError:
    """A batch whose layout (its non-array values) the main process could not unpickle."""
    return WorkerError(f"batch {seq} from DataLoader worker process {wid} could not be unpickled in the main process "
                       f"({type(exc).__name__}: {exc}): its non-array values must be importable here too")
