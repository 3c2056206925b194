"""What every worker maps besides its control block: the profiler's board (one row of
counters per worker, counters.py) and the ring's segments. A worker is told of each
segment as the ring makes or retires it, and a replacement for a dead worker of all
of them at once."""

from __future__ import annotations

from typing import Any, Iterable

from .._transport.messages import Attach, AttachBoard, Detach
from .._transport.shm import Segment
from ..profiler import counters


class WorkerMappings:
    """The board's segment, and the messages that hand segments to workers."""

    def __init__(self, num_workers: int, backend: str):
        self._num_workers, self._backend = num_workers, backend
        self._segment: Segment | None = None
        self.board: Any = None  # counters.board(): a row per worker; None once closed

    def open_board(self) -> None:
        """Make the board: ~256 KiB of shared memory per worker."""
        self._segment = Segment(-1, counters.board_bytes(self._num_workers), backend=self._backend)
        self.board = counters.board(self._segment.mmap, self._num_workers)

    def send_board(self, supervisor: Any, wid: int) -> None:
        seg = self._segment
        assert seg is not None, "the board is made before any worker is told of it"
        supervisor.send(wid, AttachBoard(seg.size, self._num_workers, wid), fd=seg.fd)

    def attach(self, supervisor: Any, seg: Segment, workers: Iterable[int]) -> None:
        for wid in workers:
            supervisor.send(wid, Attach(seg.id, seg.size), fd=seg.fd)

    def detach(self, supervisor: Any, seg: Segment, workers: Iterable[int]) -> None:
        for wid in workers:
            supervisor.send(wid, Detach(seg.id))

    def attach_all(self, supervisor: Any, wid: int, segments: Iterable[Segment]) -> None:
        """A replacement worker: the board (it carries on the dead worker's row) and every segment."""
        self.send_board(supervisor, wid)
        for seg in segments:
            self.attach(supervisor, seg, (wid,))

    def close(self) -> None:
        self.board = None
        if self._segment is not None:
            self._segment.close()  # (idempotent, as ring.close() and supervisor.shutdown() are)
