"""Supervisor: start the worker processes, talk to them, notice when they die, stop them.

Knows nothing about batches. Shutdown escalates in a fixed order: ask (a Shutdown
message, then closing our end of the socket, which a worker sees as end-of-file), wait
``JOIN_TIMEOUT`` seconds, SIGTERM, wait, SIGKILL. A worker stuck in a slow
``__getitem__`` is therefore stopped within about two seconds, never waited on forever.
"""

from __future__ import annotations

import errno
import io
import multiprocessing
import multiprocessing.forkserver
import os
import selectors
import signal
import socket
import time
from multiprocessing import connection, reduction
from typing import Any

from . import _platform
from .channel import Channel
from .errors import ShmloadError, WorkerStartupError
from .messages import Shutdown
from .worker import UserCode, WorkerArgs, worker_main

JOIN_TIMEOUT = 1.0
TERM_TIMEOUT = 1.0


class WorkerHandle:
    __slots__ = ("id", "process", "channel", "pid", "ready", "exited", "exitcode", "events", "reaped", "death_fd")

    def __init__(self, wid: int, process: Any, channel: Channel):
        self.id = wid
        self.process = process
        self.channel = channel
        self.pid = process.pid
        self.ready = False
        self.exited = False
        self.exitcode: int | None = None
        self.events = 0  # what the selector waits for on the channel (0: not registered)
        self.reaped = False  # joined and its Process closed, by shutdown()
        self.death_fd = -1  # readable once the process has exited (_platform.death_watch)

    def forget_death_fd(self) -> None:
        if self.death_fd >= 0 and self.death_fd != self.process.sentinel:
            os.close(self.death_fd)  # a pidfd of our own (the sentinel is multiprocessing's)
        self.death_fd = -1

    def exit_description(self) -> str:
        code = self.exitcode if self.exitcode is not None else self.process.exitcode
        if code is None:
            return "is still running"
        if code < 0:
            try:
                name = signal.Signals(-code).name
            except ValueError:
                name = f"signal {-code}"
            return f"was killed by {name}"
        return f"exited with exit code {code}"


class _NotingPickler(reduction.ForkingPickler):
    """multiprocessing's pickler, noting whether a reducer registered with it ran
    (``ForkingPickler.register``: torch's tensors and storages, sockets, connections,
    shared ctypes). Those may hand over something only one process can take (a
    descriptor, a reference count); whatever else it pickles can be sent to any number."""

    def __init__(self, *args: Any):
        super().__init__(*args)
        self.registered_reducer_ran = False
        for cls, reduce in self._extra_reducers.items():
            self.dispatch_table[cls] = self._noting(reduce)

    def _noting(self, reduce: Any) -> Any:
        def noted(obj: Any) -> Any:
            self.registered_reducer_ran = True
            return reduce(obj)
        return noted


def _pickled_user_code(user: UserCode, method: str) -> tuple[bytes, bool]:
    """The user's objects pickled, and whether these bytes may go to other workers too;
    any object that cannot be pickled is named."""
    try:
        buf = io.BytesIO()
        pickler = _NotingPickler(buf)
        pickler.dump(user)
        return buf.getvalue(), not pickler.registered_reducer_ran
    except Exception as exc:
        for field, value in zip(user._fields, user):
            try:
                reduction.ForkingPickler.dumps(value)
            except Exception as field_exc:
                raise WorkerStartupError(
                    f"the {field} ({type(value).__name__}) cannot be pickled, which the {method!r} start "
                    f"method needs to send it to the worker processes: {field_exc}. Make it picklable "
                    "(for example, open files lazily in __getitem__ instead of __init__), or use "
                    "multiprocessing_context='fork'."
                ) from field_exc
        raise WorkerStartupError(f"the loader's objects cannot be pickled for {method!r}: {exc}") from exc


class _PerWorker:
    """The user's objects as sent to worker processes under spawn and forkserver: pickled
    while each worker's ``Process`` is being pickled (at each start and restart), the way
    torch's DataLoader sends its dataset; the worker receives plain ``bytes`` and unpickles
    them inside its own error handling (``worker.py``), so a failure there is still a
    ``WorkerStartupError`` with the worker's traceback, and an object that cannot be
    pickled is named before the first worker starts.

    Not one pickle for all workers: torch's tensor reductions hand each storage over as a
    descriptor that one process can take, once, so a second worker sent the same bytes
    failed at start-up with ``EOFError``. Pickled inside the ``Process``'s own pickling, a
    descriptor travels with that process's start (``duplicate_for_child``), not through a
    ``resource_sharer`` thread that keeps it until someone asks. When no such reducer ran
    (no tensors: numpy arrays, paths, ...) the first pickle is kept and sent to every
    worker, so a large dataset is not pickled once per worker."""

    __slots__ = ("user", "method", "reusable")

    def __init__(self, user: UserCode, method: str):
        self.user, self.method = user, method
        self.reusable: bytes | None = None

    def __reduce__(self) -> tuple[Any, ...]:
        data = self.reusable
        if data is None:
            data, reusable = _pickled_user_code(self.user, self.method)
            if reusable:
                self.reusable = data
        return bytes, (data,)  # bytes(data) is data: no copy in the worker


class Supervisor:
    def __init__(self, ctx: Any, num_workers: int, seed: int, rank: int, auto_batch: bool, user: UserCode):
        _platform.check_supported(num_workers)
        if multiprocessing.current_process().daemon:
            raise ShmloadError(
                "this loader cannot start worker processes: it runs inside a daemonic process (for example "
                "a worker of another loader), which may not have children. Use num_workers=0 for a loader "
                "created inside a dataset.")
        self.ctx = ctx
        self._selector = selectors.PollSelector()  # poll(2): no kernel object a fork could share
        self._deferred: set[WorkerHandle] = set()  # channels with messages waiting for flush()
        method = ctx.get_start_method()
        payload = user if method == "fork" else _PerWorker(user, method)
        self._args = WorkerArgs(0, num_workers, seed, rank, auto_batch, payload, None)
        self.workers: list[WorkerHandle] = []
        if method == "forkserver":
            # started outside start_window(), or the server (shared with the user's own
            # processes) would inherit SIGINT ignored and hand that to all its children
            multiprocessing.forkserver.ensure_running()
        try:
            for wid in range(num_workers):
                # a started process is in the list before a Ctrl-C can land (NOTE [ Ctrl-C waits for a window ])
                with _platform.start_window():
                    self.workers.append(self._start(wid, self._args._replace(worker_id=wid)))
        except BaseException:
            self.shutdown()
            raise

    def _start(self, wid: int, args: WorkerArgs) -> WorkerHandle:
        try:
            return self._start_process(wid, args)
        except OSError as exc:
            if exc.errno in (errno.EMFILE, errno.ENFILE):
                raise _platform.too_many_files(exc) from None
            raise

    def _start_process(self, wid: int, args: WorkerArgs) -> WorkerHandle:
        ours, theirs = socket.socketpair()
        theirs_conn = connection.Connection(theirs.detach())
        _platform.register_parent_only(ours.fileno())
        process = self.ctx.Process(target=worker_main, args=(args._replace(conn=theirs_conn),),
                                   name=f"shmload-worker-{wid}", daemon=True)
        try:
            process.start()
        except BaseException:
            _platform.unregister_parent_only(ours.fileno())
            ours.close()
            raise
        finally:
            theirs_conn.close()  # only the worker may hold its end, or EOF would never come
        _platform.register_parent_only_process(process)
        handle = WorkerHandle(wid, process, Channel(ours))
        self._watch(handle, selectors.EVENT_READ)
        handle.death_fd = _platform.death_watch(process)
        self._selector.register(handle.death_fd, selectors.EVENT_READ, handle)
        return handle

    def _watch(self, h: WorkerHandle, events: int) -> None:
        if events == h.events:
            return
        fd = h.channel.fileno()
        if not events:
            self._selector.unregister(fd)
        elif not h.events:
            self._selector.register(fd, events, h)
        else:
            self._selector.modify(fd, events, h)
        h.events = events

    # ------------------------------------------------------------ talking
    def send(self, wid: int, msg: Any, fd: int | None = None, defer: bool = False) -> None:
        """Queue ``msg`` (and ``fd``) for worker ``wid``; never blocks. A deferred message
        leaves at the next :meth:`flush` (or :meth:`poll`), with the others queued for the
        same worker in one write: one system call and one wake-up of the worker for
        several tasks, instead of one each."""
        h = self.workers[wid]
        if h.exited or h.channel.eof:
            return  # poll() reports the death, with what the worker held
        h.channel.send(msg, fd, flush=not defer)
        if defer:
            self._deferred.add(h)
        else:
            self._watch(h, selectors.EVENT_READ | (selectors.EVENT_WRITE if h.channel.backlogged else 0))

    def flush(self) -> None:
        """Write the deferred messages."""
        while self._deferred:
            h = self._deferred.pop()
            if h.exited or h.channel is None or h.channel.eof:
                continue
            h.channel.flush()
            self._watch(h, selectors.EVENT_READ | (selectors.EVENT_WRITE if h.channel.backlogged else 0))

    def restart(self, wid: int) -> WorkerHandle:
        """Start a replacement for worker ``wid``, which has died: same id, new process and
        socket. The caller re-sends what the dead one held."""
        old = self.workers[wid]
        if not old.exited:
            self._retire(old)
        self._close_channel(old)
        old.process.join(JOIN_TIMEOUT)  # it has exited (death_fd): this only reaps it, so no zombie stays
        old.exitcode = old.process.exitcode
        old.forget_death_fd()
        old.process.close()
        with _platform.start_window():  # NOTE [ Ctrl-C waits for a window ] (_platform.py)
            self.workers[wid] = self._start(wid, self._args._replace(worker_id=wid))
        return self.workers[wid]

    def _close_channel(self, h: WorkerHandle) -> None:
        if h.channel is not None:
            _platform.unregister_parent_only(h.channel.fileno())
            h.channel.close()  # end-of-file for a worker still waiting for messages
            h.channel = None

    def live(self) -> list[WorkerHandle]:
        return [h for h in self.workers if not h.exited]

    def poll(self, timeout: float) -> tuple[list[tuple[int, bytes]], list[WorkerHandle]]:
        """Frames that arrived within ``timeout`` seconds, and workers that have died.

        A dead worker's last messages are read before its death is reported."""
        self.flush()
        frames, dead = [], []
        with _platform.interruptible():  # the one wait of next(): nothing is half done here
            ready = self._selector.select(timeout)
        for key, mask in ready:
            h = key.data
            if h.exited:
                continue
            if key.fd == h.death_fd:
                frames.extend((h.id, f) for f in h.channel.receive())
                self._retire(h)
                dead.append(h)
                continue
            if mask & selectors.EVENT_WRITE:
                h.channel.flush()
            if mask & selectors.EVENT_READ:
                frames.extend((h.id, f) for f in h.channel.receive())
            if h.channel.eof:
                self._watch(h, 0)  # closed: wait for the death, which follows at once
            else:
                self._watch(h, selectors.EVENT_READ | (selectors.EVENT_WRITE if h.channel.backlogged else 0))
        return frames, dead

    def _retire(self, h: WorkerHandle) -> None:
        """Stop watching a worker that exited."""
        h.exited = True
        self._watch(h, 0)
        try:
            self._selector.unregister(h.death_fd)
        except (KeyError, ValueError):
            pass

    # ------------------------------------------------------------ stopping
    def shutdown(self) -> None:
        """Stop every worker. Idempotent, so that a shutdown interrupted by a Ctrl-C is
        finished by the next call (session.py, NOTE [ A close() that did not finish ])."""
        for h in self.workers:
            if h.channel is None:
                continue
            try:
                h.channel.send(Shutdown())
            finally:
                if not h.exited:
                    self._retire(h)
                self._close_channel(h)
        self._reap(JOIN_TIMEOUT)
        for escalate in ("terminate", "kill"):
            stuck = [h for h in self.workers if not h.reaped]
            if not stuck:
                break
            for h in stuck:
                getattr(h.process, escalate)()
            self._reap(TERM_TIMEOUT)
        self._selector.close()

    def _reap(self, timeout: float) -> None:
        """Wait up to ``timeout`` seconds for the workers to exit, and reap those that did.
        The wait is open to a Ctrl-C; reaping is not: a KeyboardInterrupt between waitpid()
        and multiprocessing's note of it would leave a process that multiprocessing
        believes alive for ever (NOTE [ Ctrl-C waits for a window ], _platform.py)."""
        deadline = time.monotonic() + timeout
        while True:
            running = [h for h in self.workers if not h.reaped]
            for h in running:
                with _platform.sigint_deferred():
                    code = h.process.exitcode  # waitpid(WNOHANG)
                    if code is not None:
                        if h.exitcode is None:
                            h.exitcode = code
                        h.reaped = True
                        h.forget_death_fd()
                        h.process.close()
            running = [h for h in running if not h.reaped]
            left = deadline - time.monotonic()
            if not running or left <= 0:
                return
            connection.wait([h.death_fd for h in running], left)

    @property
    def pids(self) -> list[int]:
        return [h.pid for h in self.workers]


def owned_here(pid: int) -> bool:
    """False in a forked child that inherited a copy of the main process's objects."""
    return os.getpid() == pid
