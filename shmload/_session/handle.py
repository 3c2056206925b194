"""A worker as the main process sees it: its process, its socket, whether it said it was
ready, and how it ended (for error messages: "was killed by SIGKILL")."""

from __future__ import annotations

import os
import signal
from typing import Any

from .._core import _signals
from .._transport.channel import Channel


class WorkerHandle:
    """One worker process, from its start to its reaping (supervisor.py)."""

    __slots__ = ("id", "process", "channel", "pid", "ready", "exited", "exitcode", "events", "reaped", "death_fd",
                 "stopped")

    def __init__(self, wid: int, process: Any, channel: Channel):
        self.id = wid
        self.process = process
        self.channel: Channel | None = channel  # None once closed (after it is no longer watched)
        self.pid = process.pid
        self.ready = False
        self.exited = False
        self.exitcode: int | None = None
        self.events = 0  # what the selector waits for on the channel (0: not registered)
        self.reaped = False  # joined and its Process closed, by shutdown()
        self.death_fd = -1  # readable once the process has exited (_platform.death_watch)
        self.stopped = False  # asked to exit while the session runs on (num_workers="auto": scaling.py)

    def reap_if_exited(self) -> bool:
        """Reap the process if it has exited (waitpid(WNOHANG)); whether it is reaped. Not
        open to an interrupt: one between waitpid() and multiprocessing's note of it would
        leave a process that multiprocessing believes alive for ever (NOTE [ Interrupts
        wait for a window ], _signals.py)."""
        with _signals.signals_deferred():
            code = self.process.exitcode
            if code is not None and not self.reaped:
                if self.exitcode is None:
                    self.exitcode = code
                self.reaped = True
                self.forget_death_fd()
                self.process.close()
        return self.reaped

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
