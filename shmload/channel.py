"""Channel: the main process's end of one worker's socket. It never blocks.

Why: both sides write to each other. If the main process blocked sending a large task
while the worker blocked sending a large result (a batch with many strings), neither
would ever read again. So the main process queues what it sends in an outbox and writes
only what the socket accepts now (``MSG_DONTWAIT``); the rest goes when the socket is
writable again, which :meth:`Supervisor.poll` waits for alongside incoming data. It reads
whatever has arrived into a buffer and cuts it into frames.

The framing is ``multiprocessing.connection.Connection``'s (a 4-byte big-endian length,
then the pickle), so the worker keeps using a plain blocking ``Connection``; a file
descriptor follows its :class:`Attach` message as one byte with ``SCM_RIGHTS``, as
``multiprocessing.reduction.recv_handle`` expects.
"""

from __future__ import annotations

import array
import os
import pickle
import socket
import struct
from collections import deque
from typing import Any

_HEADER = struct.Struct("!i")
_HUGE = struct.Struct("!Q")
_READ_SIZE = 1 << 20


class Channel:
    def __init__(self, sock: socket.socket):
        sock.setblocking(False)
        self.sock = sock
        self._out: deque[list] = deque()  # [bytes still to send, fd to send after them or None]
        self._in = bytearray()
        self.eof = False  # the worker closed its end
        self.broken = False  # a send failed: the worker is gone

    def fileno(self) -> int:
        return self.sock.fileno()

    # ------------------------------------------------------------ sending
    def send(self, msg: Any, fd: int | None = None) -> None:
        """Queue ``msg`` and, after it, a duplicate of ``fd`` (the caller may close its own
        while the message still waits in the outbox)."""
        if self.broken:
            return
        data = pickle.dumps(msg, pickle.HIGHEST_PROTOCOL)  # messages are plain data: no reducers needed
        self._out.append([memoryview(_HEADER.pack(len(data)) + data), None if fd is None else os.dup(fd)])
        self.flush()

    @property
    def backlogged(self) -> bool:
        return bool(self._out)

    def flush(self) -> None:
        """Write what the socket takes now. A socket error means the worker is gone: the
        outbox is dropped and the process sentinel reports the death."""
        while self._out:
            item = self._out[0]
            try:
                if len(item[0]):
                    item[0] = item[0][self.sock.send(item[0], socket.MSG_NOSIGNAL):]
                    continue
                if item[1] is not None:
                    fds = array.array("i", [item[1]])
                    self.sock.sendmsg([b"\x01"], [(socket.SOL_SOCKET, socket.SCM_RIGHTS, fds)], socket.MSG_NOSIGNAL)
            except (BlockingIOError, InterruptedError):
                return
            except OSError:
                self.broken = True
                self._drop_outbox()
                return
            self._drop_first()

    def _drop_first(self) -> None:
        item = self._out.popleft()
        if item[1] is not None:
            os.close(item[1])

    def _drop_outbox(self) -> None:
        while self._out:
            self._drop_first()

    # ------------------------------------------------------------ receiving
    def receive(self) -> list[bytes]:
        """Every complete frame that has arrived (pickled messages, not yet loaded)."""
        while True:
            try:
                chunk = self.sock.recv(_READ_SIZE)
            except (BlockingIOError, InterruptedError):
                break
            except OSError:
                chunk = b""
            if not chunk:
                self.eof = True
                break
            self._in += chunk
            if len(chunk) < _READ_SIZE:
                break  # drained, most likely; the selector is level-triggered, so more is never lost
        frames = []
        while len(self._in) >= _HEADER.size:
            (size,) = _HEADER.unpack_from(self._in)
            start = _HEADER.size
            if size == -1:  # Connection's header for frames of 2 GiB or more
                if len(self._in) < _HEADER.size + _HUGE.size:
                    break
                (size,) = _HUGE.unpack_from(self._in, _HEADER.size)
                start += _HUGE.size
            if len(self._in) < start + size:
                break
            frames.append(bytes(self._in[start:start + size]))
            del self._in[:start + size]
        return frames

    def close(self) -> None:
        self._drop_outbox()
        self.sock.close()
