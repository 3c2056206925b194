"""Supervisor: start the worker processes, talk to them, notice when they die, stop them.

Knows nothing about batches. Shutdown escalates in a fixed order: ask (a Shutdown
message, then closing our end of the socket, which a worker sees as end-of-file), wait
``JOIN_TIMEOUT`` seconds, SIGTERM, wait, SIGKILL. A worker stuck in a slow
``__getitem__`` is therefore stopped within about two seconds, never waited on forever.
"""

from __future__ import annotations

import os
import pickle
import signal
import time
from multiprocessing import connection, reduction
from typing import Any

from . import _platform
from .errors import WorkerStartupError
from .messages import Shutdown
from .worker import UserCode, WorkerArgs, worker_main

JOIN_TIMEOUT = 1.0
TERM_TIMEOUT = 1.0


class WorkerHandle:
    __slots__ = ("id", "process", "conn", "pid", "ready", "exited", "exitcode")

    def __init__(self, wid: int, process: Any, conn: Any):
        self.id = wid
        self.process = process
        self.conn = conn
        self.pid = process.pid
        self.ready = False
        self.exited = False
        self.exitcode: int | None = None

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


def _pickled_user_code(user: UserCode, method: str) -> bytes:
    """Pickle the user's objects once, in the main process, naming any that cannot be."""
    try:
        return bytes(reduction.ForkingPickler.dumps(user))
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


class Supervisor:
    def __init__(self, ctx: Any, num_workers: int, seed: int, auto_batch: bool, user: UserCode):
        _platform.check_supported()
        self.ctx = ctx
        method = ctx.get_start_method()
        payload = user if method == "fork" else _pickled_user_code(user, method)
        self.workers: list[WorkerHandle] = []
        try:
            for wid in range(num_workers):
                self.workers.append(self._start(wid, WorkerArgs(wid, num_workers, seed, auto_batch, payload, None)))
        except BaseException:
            self.shutdown()
            raise

    def _start(self, wid: int, args: WorkerArgs) -> WorkerHandle:
        ours, theirs = self.ctx.Pipe(duplex=True)
        _platform.register_parent_only(ours.fileno())
        process = self.ctx.Process(target=worker_main, args=(args._replace(conn=theirs),),
                                   name=f"shmload-worker-{wid}", daemon=True)
        try:
            process.start()
        except BaseException:
            _platform.unregister_parent_only(ours.fileno())
            ours.close()
            raise
        finally:
            theirs.close()  # only the worker may hold its end, or EOF would never come
        return WorkerHandle(wid, process, ours)

    # ------------------------------------------------------------ talking
    def send(self, wid: int, msg: Any, fd: int | None = None) -> None:
        handle = self.workers[wid]
        try:
            handle.conn.send(msg)
            if fd is not None:
                reduction.send_handle(handle.conn, fd, handle.pid)
        except OSError:
            pass  # the worker died: poll() reports it through its sentinel, with what it held

    def live(self) -> list[WorkerHandle]:
        return [h for h in self.workers if not h.exited]

    def poll(self, timeout: float) -> tuple[list[tuple[int, Any]], list[WorkerHandle]]:
        """Messages that arrived within ``timeout`` seconds, and workers that have died.

        A dead worker's last messages are read before its death is reported."""
        live = self.live()
        by_obj: dict[Any, WorkerHandle] = {}
        for h in live:
            by_obj[h.conn] = h
            by_obj[h.process.sentinel] = h
        ready = connection.wait(list(by_obj), timeout)
        messages, dead = [], []
        for h in {id(by_obj[obj]): by_obj[obj] for obj in ready}.values():
            try:
                while h.conn.poll(0):
                    messages.append((h.id, h.conn.recv()))
            except (EOFError, OSError):
                pass
            if not h.process.is_alive():
                h.exited = True
                dead.append(h)
        return messages, dead

    # ------------------------------------------------------------ stopping
    def shutdown(self) -> None:
        for h in self.workers:
            if h.conn is None:
                continue
            try:
                h.conn.send(Shutdown())
            except OSError:
                pass
            _platform.unregister_parent_only(h.conn.fileno())
            h.conn.close()
            h.conn = None
        deadline = time.monotonic() + JOIN_TIMEOUT
        for h in self.workers:
            h.process.join(max(0.0, deadline - time.monotonic()))
        for escalate in ("terminate", "kill"):
            stuck = [h for h in self.workers if h.process.is_alive()]
            for h in stuck:
                getattr(h.process, escalate)()
            deadline = time.monotonic() + TERM_TIMEOUT
            for h in stuck:
                h.process.join(max(0.0, deadline - time.monotonic()))
        for h in self.workers:
            h.exited = True
            if h.process.exitcode is not None and h.exitcode is None:
                h.exitcode = h.process.exitcode
                h.process.close()

    @property
    def pids(self) -> list[int]:
        return [h.pid for h in self.workers]


def owned_here(pid: int) -> bool:
    """False in a forked child that inherited a copy of the main process's objects."""
    return os.getpid() == pid
