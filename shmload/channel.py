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
import pickle
import socket
import struct
from collections import deque
from multiprocessing import reduction
from typing import Any

_HEADER = struct.Struct("!i")


class Channel:
    def __init__(self, sock: socket.socket):
        sock.setblocking(False)
        self.sock = sock
        self._out: deque[list] = deque()  # [bytes still to send, fd to send after them or None]
        self._in = bytearray()
        self.eof = False

    def fileno(self) -> int:
        return self.sock.fileno()

    # ------------------------------------------------------------ sending
    def send(self, msg: Any, fd: int | None = None) -> None:
        data = bytes(reduction.ForkingPickler.dumps(msg))
        self._out.append([memoryview(_HEADER.pack(len(data)) + data), fd])
        self.flush()

    @property
    def backlogged(self) -> bool:
        return bool(self._out)

    def flush(self) -> None:
        """Write what the socket takes now. Raises OSError (e.g. EPIPE) if the worker is gone."""
        while self._out:
            item = self._out[0]
            try:
                if len(item[0]):
                    item[0] = item[0][self.sock.send(item[0]):]
                    continue
                if item[1] is not None:
                    fds = array.array("i", [item[1]])
                    self.sock.sendmsg([b"\x01"], [(socket.SOL_SOCKET, socket.SCM_RIGHTS, fds)])
            except (BlockingIOError, InterruptedError):
                return
            self._out.popleft()

    # ------------------------------------------------------------ receiving
    def receive(self) -> list[bytes]:
        """Every complete frame that has arrived (pickled messages, not yet loaded)."""
        while True:
            try:
                chunk = self.sock.recv(1 << 20)
            except (BlockingIOError, InterruptedError):
                break
            except OSError:
                chunk = b""
            if not chunk:
                self.eof = True
                break
            self._in += chunk
        frames = []
        while len(self._in) >= _HEADER.size:
            (size,) = _HEADER.unpack_from(self._in)
            if len(self._in) < _HEADER.size + size:
                break
            frames.append(bytes(self._in[_HEADER.size:_HEADER.size + size]))
            del self._in[:_HEADER.size + size]
        return frames

    def close(self) -> None:
        self.sock.close()


def load(frame: bytes) -> Any:
    return pickle.loads(frame)
