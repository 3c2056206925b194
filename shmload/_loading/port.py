"""Port: a worker's end of its control path. Tasks come through its queue in the control
segment (``control.py``, records decoded by ``wire.py``), results go through the other;
the socket brings the control segment itself (first), the descriptors that follow an
``Attach`` or ``AttachBoard``, and any message too large for a queue, announced there.

Every wait is in slices of ``WATCHDOG_INTERVAL`` seconds, after each of which the worker
checks that its parent is still the process that started it (:class:`ParentGone`).
"""

from __future__ import annotations

import os
import pickle
import select
from collections import deque
from typing import Any, Callable

from .._transport import wire
from .._transport.channel import Inbox
from .._transport.control import WorkerEnd
from .._transport.messages import AttachControl
from .._transport.shm import AttachedSegment

WATCHDOG_INTERVAL = 0.5


class ParentGone(Exception):
    """The main process is gone: nothing left to report to."""


class Port:
    def __init__(self, conn: Any):
        self.conn = conn  # the worker's sending Connection on its socket
        self.parent = os.getppid()
        self.inbox = Inbox(conn.fileno())
        # One poll object for the worker's life: Connection.poll() builds a selector per
        # call, ~10 us a batch (docs/performance.md).
        self.poller = select.poll()
        self.poller.register(self.inbox.sock.fileno(), select.POLLIN)
        self.unread: deque[Any] = deque()  # the rest of a record that bundled several messages (wire.py)
        self.control_segment: AttachedSegment | None = None  # the control segment, and this worker's queues in it
        self.end: WorkerEnd | None = None

    def attach_control(self) -> None:
        """Map the control segment, the first message on the socket; from then on every
        message comes through the task queue (control.py)."""
        msg = self.next_from(self.inbox.next_message)
        if type(msg) is not AttachControl:
            raise TypeError(f"worker expected the control segment first, got {msg!r}")
        self.control_segment = AttachedSegment(self.recv_fd(), msg.size)
        self.end = WorkerEnd(self.control_segment.mmap, msg.area)

    def recv(self) -> Any:
        """The next message from the task queue, sleeping until there is one (a large one
        is announced there and read from the socket)."""
        if not self.unread:
            end = self.end
            assert end is not None, "recv() before attach_control()"
            tasks = end.tasks
            record = tasks.take()
            while record is None:
                record = tasks.wait(WATCHDOG_INTERVAL)
                if record is None and os.getppid() != self.parent:
                    raise ParentGone()
            self.unread.extend(wire.unbundle(record))
        msg = wire.decode_to_worker(self.unread.popleft())
        if msg is wire.NOTICE:
            return self.next_from(self.inbox.next_message)
        return msg

    def recv_fd(self) -> int:
        return self.next_from(self.inbox.take_fd)

    def next_from(self, take: Callable[[], Any]) -> Any:
        """``take()``'s first result that is not None, reading the socket until then."""
        while (item := take()) is None:
            self.wait_readable()
        return item

    def wait_readable(self) -> None:
        while not self.poller.poll(WATCHDOG_INTERVAL * 1000):
            if os.getppid() != self.parent:
                raise ParentGone()
        self.inbox.read()

    def send(self, msg: Any) -> None:
        """Publish ``msg`` in the completion queue, waiting for room if it is full; a
        message too large for it is announced there and sent by the socket."""
        end = self.end
        if end is None:  # (the control segment could not be mapped: only the socket is left)
            self.send_frame(msg)
            return
        head, body = wire.encode_to_main(msg)
        if len(head) + len(body) > end.completions.max_record:
            self.publish(end, wire.NOTICE, b"")  # first, so the main process reads while this sends
            self.send_frame(msg)
            return
        self.publish(end, head, body)

    def send_frame(self, msg: Any) -> None:
        self.conn.send_bytes(pickle.dumps(msg, pickle.HIGHEST_PROTOCOL))  # plain data: no reducers needed

    def publish(self, end: WorkerEnd, head: bytes, body: bytes) -> None:
        while not end.publish(head, body):
            end.completions.wait_for_room(WATCHDOG_INTERVAL)
            if os.getppid() != self.parent:
                raise ParentGone()

    def close(self) -> None:
        if self.end is not None:
            self.end.close()
            self.end = None
        if self.control_segment is not None:
            close_mapping(self.control_segment)
        self.inbox.close()
        try:
            self.conn.close()
        except OSError:
            pass


def close_mapping(seg: AttachedSegment) -> None:
    try:
        seg.close()
    except BufferError:
        pass  # a view still exported: the mapping goes with the process
