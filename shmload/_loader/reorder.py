"""Reorder: hand results to the consumer in sampler order, whatever order workers finish in.

Pure data structure. Every sequence number must be announced with :meth:`expect` when its
task is dispatched (in increasing order, gaps allowed), and must then be :meth:`put`
exactly once. A
result for a number that was never expected, or that arrives twice, is a bug somewhere
upstream and raises instead of being silently dropped or duplicated.
"""

from __future__ import annotations

from collections import deque
from typing import Any

from ..errors import ShmloadError


class ReorderError(ShmloadError, RuntimeError):
    """A sequence number arrived that was not expected, or arrived twice."""


class ReorderBuffer:
    def __init__(self, in_order: bool = True):
        self.in_order = in_order
        self._next_expected = 0  # the next seq expect() may announce
        self._waiting: set[int] = set()  # expected, not yet put
        self._ready: dict[int, Any] = {}
        self._order: deque[int] = deque()  # delivery order: by seq, or by arrival

    def expect(self, seq: int) -> None:
        """Announce ``seq``. Numbers increase; a resumed epoch may skip some (batches
        delivered before the save)."""
        if seq < self._next_expected:
            raise ReorderError(f"expected seq {self._next_expected} or later to be dispatched next, got {seq}")
        self._next_expected = seq + 1
        self._waiting.add(seq)
        if self.in_order:
            self._order.append(seq)

    def put(self, seq: int, item: Any) -> None:
        if seq not in self._waiting:
            state = "twice" if seq in self._ready or seq < self._next_expected else "before it was dispatched"
            raise ReorderError(f"result for seq {seq} arrived {state}")
        self._waiting.discard(seq)
        self._ready[seq] = item
        if not self.in_order:
            self._order.append(seq)

    def pop(self) -> tuple[int, Any] | None:
        """The next (seq, item) to deliver, or None if it has not arrived yet."""
        if not self._order or self._order[0] not in self._ready:
            return None
        seq = self._order.popleft()
        return seq, self._ready.pop(seq)

    @property
    def head(self) -> int | None:
        """The seq that must be delivered next (in order), or None."""
        return self._order[0] if self.in_order and self._order else None

    def __len__(self) -> int:
        """How many results are expected or ready but not yet delivered."""
        return len(self._waiting) + len(self._ready)

    @property
    def missing(self) -> set[int]:
        return set(self._waiting)
