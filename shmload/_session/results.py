"""What a session hands its epoch for each batch: loaded, failed, or (a stream) ended."""

from __future__ import annotations

from typing import Any, NamedTuple

from .._transport.messages import StreamPoint
from .._transport.ring import Slot


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
