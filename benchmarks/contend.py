"""A competing CPU-bound process, for measuring a loader on a machine whose cores are
shared (issue 35): ``with contender(0.5): ...`` runs, for the block's duration, one
process that takes about half of one core.

The process is a busy loop with a duty cycle: busy ``share`` x 10 ms (spinning on the
wall clock), then asleep (1 - ``share``) x 10 ms. It is started before the block and
stopped after it, always: also when the block raises or is interrupted (Ctrl-C). It
ignores SIGINT (the parent stops it, after the loaders have stopped) and exits by itself
within one period if its parent is gone (killed), so it never outlives the benchmark.
It inherits the parent's CPU affinity: under ``taskset -c 0,1`` it competes for those
two cores, as the workers do. It takes ``share`` of a core when one is free, less when
it must queue for one (descheduled, its busy phase ends on time with less done: about
0.35 of a core for 0.5 next to two busy workers on two cores); :class:`Contender`
reports what it took.
"""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
import time
from typing import Iterator

import psutil

PERIOD = 0.010  # seconds: one busy + idle cycle

BUSY_LOOP = """
import os, signal, sys, time
signal.signal(signal.SIGINT, signal.SIG_IGN)
share, parent, period = float(sys.argv[1]), int(sys.argv[2]), float(sys.argv[3])
busy, idle = share * period, (1 - share) * period
while os.getppid() == parent:
    end = time.perf_counter() + busy
    while time.perf_counter() < end:
        pass
    if idle > 0:
        time.sleep(idle)
"""


class Contender:
    """The running process, and what it took: ``cores`` (CPU seconds over wall seconds,
    read when it stops; None while it runs or with no process)."""

    def __init__(self, share: float):
        self.share = share
        self.cores: float | None = None
        self.proc: subprocess.Popen | None = None
        self._started = 0.0

    def start(self) -> None:
        self.proc = subprocess.Popen([sys.executable, "-c", BUSY_LOOP, str(self.share), str(os.getpid()),
                                      str(PERIOD)])
        self._started = time.perf_counter()

    def stop(self) -> None:
        proc, self.proc = self.proc, None
        if proc is None:
            return
        try:
            t = psutil.Process(proc.pid).cpu_times()
            self.cores = (t.user + t.system) / max(time.perf_counter() - self._started, 1e-9)
        except psutil.Error:
            pass
        proc.terminate()
        try:
            proc.wait(timeout=5)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


@contextlib.contextmanager
def contender(share: float) -> Iterator[Contender]:
    """One competing process taking about ``share`` (0 to 1) of a core while the block
    runs; ``share`` 0: none (a quiet run)."""
    if not 0 <= share <= 1:
        raise ValueError(f"the contender's share of a core must be within 0 and 1, got {share}")
    c = Contender(share)
    try:
        if share > 0:
            c.start()
        yield c
    finally:
        c.stop()
