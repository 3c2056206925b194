"""Channel: the main process's end of one worker's socket, which never blocks; and
:class:`Inbox`, the worker's reading end, which takes every queued message in one read.

Why: both sides write to each other. If the main process blocked sending a large task
while the worker blocked sending a large result (a batch with many strings), neither
would ever read again. So the main process queues what it sends in an outbox and writes
only what the socket accepts now (``MSG_DONTWAIT``); the rest goes when the socket is
writable again, which :meth:`Supervisor.poll` waits for alongside incoming data. It reads
whatever has arrived into a buffer and cuts it into frames.

The framing is ``multiprocessing.connection.Connection``'s (a 4-byte big-endian length,
then the pickle), so the worker sends with a plain blocking ``Connection``; a file
descriptor follows its :class:`Attach` message as one byte with ``SCM_RIGHTS``. Both
ends cut frames from their buffers with :func:`_frame`.
"""

from __future__ import annotations

import array
import errno
import os
import pickle
import socket
import struct
from collections import deque
from typing import Any

from .._core import _platform, _signals

_HEADER = struct.Struct("!i")
_HUGE = struct.Struct("!Q")
_READ_SIZE = 1 << 20


def _frame(buf: bytearray) -> tuple[int, int] | None:
    """Where the first complete frame's pickle lies in ``buf`` (start, end), or None if it
    has not fully arrived."""
    if len(buf) < _HEADER.size:
        return None
    (size,) = _HEADER.unpack_from(buf)
    start = _HEADER.size
    if size == -1:  # Connection's header for frames of 2 GiB or more
        if len(buf) < _HEADER.size + _HUGE.size:
            return None
        (size,) = _HUGE.unpack_from(buf, _HEADER.size)
        start += _HUGE.size
    return (start, start + size) if len(buf) >= start + size else None


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
    def send(self, msg: Any, fd: int | None = None, flush: bool = True) -> None:
        """Queue ``msg`` and, after it, a duplicate of ``fd`` (the caller may close its own
        while the message still waits in the outbox). With ``flush=False`` it waits in the
        outbox for the next :meth:`flush`: messages queued together leave in one write."""
        if self.broken:
            return
        data = pickle.dumps(msg, pickle.HIGHEST_PROTOCOL)  # messages are plain data: no reducers needed
        frame = _HEADER.pack(len(data)) + data
        if fd is None and self._out and self._out[-1][1] is None and not flush:
            self._out[-1][0] = memoryview(bytes(self._out[-1][0]) + frame)  # one write for the lot
        else:
            self._out.append([memoryview(frame), None if fd is None else os.dup(fd)])
        if flush:
            self.flush()

    def send_fd(self, fd: int) -> None:
        """Send a duplicate of ``fd`` alone (its marker byte with ``SCM_RIGHTS``), for the
        message that announces it in the worker's task queue (control.py)."""
        if self.broken:
            return
        self._out.append([memoryview(b""), os.dup(fd)])
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
        while (bounds := _frame(self._in)) is not None:
            start, end = bounds
            frames.append(bytes(self._in[start:end]))
            del self._in[:end]
        return frames

    def close(self) -> None:
        with _signals.signals_deferred():  # the outbox's descriptors all closed, or none
            self._drop_outbox()
            self.sock.close()


class Inbox:
    """The worker's reading end: every message waiting on the socket in one ``recvmsg``.

    Why not ``Connection.recv``: it costs a poll and two reads per message (header, then
    body), and with several tasks queued (small batches, see ``dispatch.py``) those system
    calls were a tenth of a worker's time per batch. Here one read takes everything
    queued, and the messages are cut from the buffer.

    File descriptors: on a Unix stream socket, Linux ends a read at the byte that carries
    descriptors (``SCM_RIGHTS``) and hands them over with it, so descriptors arrive in the
    order they were sent, each with its one marker byte after its :class:`Attach` frame;
    :meth:`take_fd` pops the next. The socket stays blocking (its flag is shared with the
    worker's sending ``Connection``); reads use ``MSG_DONTWAIT`` after a ``poll``.
    """

    _ANC_SIZE = socket.CMSG_SPACE(16 * array.array("i").itemsize)

    def __init__(self, fd: int):
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM, fileno=os.dup(fd))
        self._buf = bytearray()
        self._fds: deque[int] = deque()

    def read(self) -> None:
        """Read what has arrived (call after poll says the socket is readable). Raises
        EOFError once the main process's end is closed."""
        try:
            data, ancdata, flags, _addr = self.sock.recvmsg(_READ_SIZE, self._ANC_SIZE, socket.MSG_DONTWAIT)
        except (BlockingIOError, InterruptedError):
            return
        except OSError as exc:
            raise EOFError from exc
        for level, kind, payload in ancdata:
            if level == socket.SOL_SOCKET and kind == socket.SCM_RIGHTS:
                fds = array.array("i")
                fds.frombytes(payload[:len(payload) - len(payload) % fds.itemsize])
                self._fds.extend(fds)
        if flags & socket.MSG_CTRUNC:
            # The kernel dropped a descriptor it could not install (this process is at its
            # descriptor limit): the Attach it belongs to would wait for it for ever.
            raise _platform.too_many_files(OSError(errno.EMFILE, "a segment's descriptor could not be received"))
        if not data:
            raise EOFError("the main process closed the socket")
        self._buf += data

    def next_message(self) -> Any:
        """The next complete message, or None if it has not fully arrived."""
        bounds = _frame(self._buf)
        if bounds is None:
            return None
        start, end = bounds
        msg = pickle.loads(self._buf[start:end])  # a copy: a view would pin the buffer's size
        del self._buf[:end]
        return msg

    def take_fd(self) -> int | None:
        """The descriptor that follows the :class:`Attach` just read, or None if it has not
        arrived yet."""
        if not self._buf or not self._fds:
            return None
        del self._buf[:1]  # its marker byte
        return self._fds.popleft()

    def close(self) -> None:
        while self._fds:
            os.close(self._fds.popleft())
        self.sock.close()
