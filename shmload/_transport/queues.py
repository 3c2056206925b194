"""The control queues: process-shared POSIX semaphores (through ``ctypes``) and the two
ends of one single-producer single-consumer queue of variable-size records, in Python
and, where the compiled core is in use, in C (``_core/_queue.c``: the same bytes).

The protocol, and why it is safe without atomics in Python, is control.py's: NOTE [ How
a record becomes visible ], NOTE [ A doorbell rung only for a sleeper ] and NOTE [ Deaths
and the queues ]. This module is the mechanism; control.py lays the queues out in the
segment and gives each side its ends.
"""

from __future__ import annotations

import ctypes
import os
import struct
import time
from collections import deque
from typing import Any

from .._core.native import native

# ---------------------------------------------------------------- the semaphores, through ctypes
_libc = ctypes.CDLL(None, use_errno=True)  # waits that block: the GIL is released
_libc_fast = ctypes.PyDLL(None, use_errno=True)  # post/trywait never block: keep the GIL (~0.26 us a call)


class _Timespec(ctypes.Structure):
    _fields_ = [("tv_sec", ctypes.c_long), ("tv_nsec", ctypes.c_long)]


def _fn(lib: Any, name: str, *args: Any) -> Any:
    fn = getattr(lib, name, None)
    if fn is not None:
        fn.argtypes, fn.restype = list(args), ctypes.c_int
    return fn


_sem_init = _fn(_libc, "sem_init", ctypes.c_void_p, ctypes.c_int, ctypes.c_uint)
sem_post = _fn(_libc_fast, "sem_post", ctypes.c_void_p)
sem_trywait = _fn(_libc_fast, "sem_trywait", ctypes.c_void_p)
_sem_getvalue = _fn(_libc_fast, "sem_getvalue", ctypes.c_void_p, ctypes.c_void_p)  # (an int's address)
# sem_clockwait (glibc 2.30) waits on CLOCK_MONOTONIC; sem_timedwait on the wall clock,
# which a clock change could stretch (the waits are short and retried either way).
_sem_clockwait = _fn(_libc, "sem_clockwait", ctypes.c_void_p, ctypes.c_int, ctypes.POINTER(_Timespec))
_sem_timedwait = _fn(_libc, "sem_timedwait", ctypes.c_void_p, ctypes.POINTER(_Timespec))

SEM_SLOT = 64  # bytes per semaphore (sizeof(sem_t) is 32 on 64-bit Linux), one cache line each


def _checked(result: int, call: str) -> None:
    if result != 0:
        err = ctypes.get_errno()
        raise OSError(err, f"{call}: {os.strerror(err)}")


class Semaphore:
    """A process-shared POSIX semaphore at address ``addr`` of a shared mapping."""

    __slots__ = ("addr",)

    def __init__(self, addr: int):
        self.addr = addr

    def init(self, value: int = 0) -> None:
        _checked(_sem_init(self.addr, 1, value), "sem_init")

    def trywait(self) -> bool:
        return sem_trywait(self.addr) == 0

    def wait(self, timeout: float) -> bool:
        """Take a token, sleeping up to ``timeout`` seconds; False if none came (or a
        signal interrupted the sleep: the caller's loop checks and waits again)."""
        if _sem_clockwait is not None:
            deadline = time.monotonic() + timeout
            ts = _Timespec(int(deadline), int((deadline % 1) * 1e9))
            return _sem_clockwait(self.addr, time.CLOCK_MONOTONIC, ctypes.byref(ts)) == 0
        deadline = time.time() + timeout
        ts = _Timespec(int(deadline), int((deadline % 1) * 1e9))
        return _sem_timedwait(self.addr, ctypes.byref(ts)) == 0


# ---------------------------------------------------------------- one queue
_LEN = struct.Struct("<I")
_WRAP = 0xFFFFFFFF  # "the next record starts at offset 0"
RING_HEADER = 2 * SEM_SLOT  # items, free


def _padded(n: int) -> int:
    return (n + 7) & ~7


class Queue:
    __slots__ = ("mm", "base", "capacity", "items", "free")

    def __init__(self, mm: Any, base: int, capacity: int, address: int):
        self.mm, self.base, self.capacity = mm, base, capacity
        self.items = Semaphore(address + self.items_at)
        self.free = Semaphore(address + self.free_at)

    @property
    def items_at(self) -> int:  # (offsets in the mapping: the compiled ends take these, not addresses)
        return self.base

    @property
    def free_at(self) -> int:
        return self.base + SEM_SLOT

    def compiled(self, end: Any) -> Any:
        """A compiled end of this queue (``_queue.c``'s QueueWriter or QueueReader)."""
        return end(self.mm, self.data, self.capacity, self.items_at, self.free_at)

    @property
    def data(self) -> int:
        return self.base + RING_HEADER

    @property
    def max_record(self) -> int:
        """The largest payload :meth:`Producer.put` takes; larger ones go by the socket."""
        return self.capacity // 4 - _LEN.size


class Producer:
    """The writing end of one queue. Only one process, one thread at a time, writes."""

    __slots__ = ("q", "_pos", "_used", "_sizes", "max_record", "_data", "_cap", "_mm", "_post", "_items",
                 "_trywait", "_free", "_value")

    def __init__(self, q: Queue):
        self.q = q
        self.max_record = q.max_record
        self._data, self._cap, self._mm = q.data, q.capacity, q.mm
        self._post, self._items = sem_post, q.items.addr
        self._trywait, self._free = sem_trywait, q.free.addr
        self._value = ctypes.c_int()  # (pending()'s)
        self.reset()

    def reset(self) -> None:
        self._pos = 0  # where the next record goes (offset in the data area)
        self._used = 0  # bytes of records not yet freed by the consumer
        self._sizes: deque[int] = deque()  # bytes each unfreed record spans, oldest first

    def put(self, payload: bytes | bytearray | memoryview, *more: bytes) -> bool:
        """Publish one record (``payload`` followed by ``more``); False if the queue has no
        room for it now. Records over :attr:`max_record` bytes are the caller's to send
        another way."""
        n = len(payload) + sum(map(len, more)) if more else len(payload)
        need = _LEN.size + _padded(n)
        pos, cap = self._pos, self._cap
        span = need if pos + need <= cap else cap - pos + need  # a record never wraps: it skips the end
        while self._used + span > cap:
            if self._trywait(self._free) != 0:
                return False
            self._used -= self._sizes.popleft()
        mm, data = self._mm, self._data
        if span != need:
            _LEN.pack_into(mm, data + pos, _WRAP)
            pos = 0
        _LEN.pack_into(mm, data + pos, n)
        start = data + pos + _LEN.size
        end = start + len(payload)
        mm[start:end] = payload
        for part in more:
            mm[end:end + len(part)] = part
            end += len(part)
        self._pos = (pos + need) % cap
        self._used += span
        self._sizes.append(span)
        _checked(self._post(self._items), "sem_post")  # NOTE [ How a record becomes visible ]
        return True

    def pending(self) -> int:
        """Records published and not yet taken: the count of ``items``, read after this
        end's own posts, so the record just put counts (NOTE [ A doorbell rung only for a
        sleeper ], control.py)."""
        value = self._value
        _checked(_sem_getvalue(self._items, ctypes.addressof(value)), "sem_getvalue")
        return value.value

    def wait_for_room(self, timeout: float) -> None:
        """Sleep until the consumer frees a record (or ``timeout`` passes), keeping its token."""
        if self.q.free.wait(timeout):
            self._used -= self._sizes.popleft()

    def close(self) -> None:
        pass  # (the compiled end lets go of the mapping here)


class _CompiledProducer(Producer):
    """A :class:`Producer` whose records are written by the compiled core (``_queue.c``:
    the same bytes, a tenth of the time)."""

    __slots__ = ("_end",)

    def __init__(self, q: Queue, writer: Any):
        self._end = q.compiled(writer)
        super().__init__(q)

    def reset(self) -> None:
        self._end.reset()

    def put(self, payload: bytes | bytearray | memoryview, *more: bytes) -> bool:
        return self._end.put(payload, *more)

    def pending(self) -> int:
        return self._end.pending()

    def wait_for_room(self, timeout: float) -> None:
        if self.q.free.wait(timeout):
            self._end.freed()

    def close(self) -> None:
        self._end.close()


class Consumer:
    """The reading end of one queue."""

    __slots__ = ("q", "_pos", "_data", "_cap", "_mm", "_trywait", "_items", "_post", "_free")

    def __init__(self, q: Queue):
        self.q = q
        self._data, self._cap, self._mm = q.data, q.capacity, q.mm
        self._trywait, self._items = sem_trywait, q.items.addr
        self._post, self._free = sem_post, q.free.addr
        self.reset()

    def reset(self) -> None:
        self._pos = 0

    def take(self) -> bytes | None:
        """The next record, or None if none is published."""
        if self._trywait(self._items) != 0:
            return None
        return self._read()

    def wait(self, timeout: float) -> bytes | None:
        """The next record, sleeping up to ``timeout`` seconds for one."""
        if self._trywait(self._items) != 0 and not self.q.items.wait(timeout):
            return None
        return self._read()

    def _read(self) -> bytes:
        mm, data, pos = self._mm, self._data, self._pos
        (n,) = _LEN.unpack_from(mm, data + pos)
        if n == _WRAP:
            pos = 0
            (n,) = _LEN.unpack_from(mm, data)
        if n > self._cap - pos - _LEN.size:  # (a corrupt length: never read past the queue)
            raise ValueError(f"a control record of {n} bytes at offset {pos} overruns its queue of {self._cap} bytes")
        start = data + pos + _LEN.size
        record = mm[start:start + n]  # a copy: the bytes are the producer's again after the post below
        self._pos = (pos + _LEN.size + _padded(n)) % self._cap
        self._post(self._free)
        return record

    def close(self) -> None:
        pass


class _CompiledConsumer(Consumer):
    """A :class:`Consumer` whose records are read by the compiled core (``_queue.c``)."""

    __slots__ = ("_end",)

    def __init__(self, q: Queue, reader: Any):
        self._end = q.compiled(reader)
        super().__init__(q)

    def reset(self) -> None:
        self._end.reset()

    def take(self) -> bytes | None:
        return self._end.take()

    def wait(self, timeout: float) -> bytes | None:
        record = self._end.take()
        if record is None and self.q.items.wait(timeout):
            record = self._end.read()
        return record

    def close(self) -> None:
        self._end.close()


def producer_of(q: Queue) -> Producer:
    """The writing end of ``q``: compiled where the compiled core is in use (native.py)."""
    writer = getattr(native, "QueueWriter", None)  # (None: pure Python, or a core built before it)
    return Producer(q) if writer is None else _CompiledProducer(q, writer)


def consumer_of(q: Queue) -> Consumer:
    reader = getattr(native, "QueueReader", None)
    return Consumer(q) if reader is None else _CompiledConsumer(q, reader)
