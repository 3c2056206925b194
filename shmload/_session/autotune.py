"""num_workers="auto": how many workers to run, decided from what the last window
measured (pure: no clock, no process; ``scaling.py`` measures and applies).

NOTE [ How the worker count is chosen ]
The count changes only between *windows* of at least :data:`MIN_WINDOW` seconds and
:data:`MIN_BATCHES` delivered batches (or :data:`SHORT_WINDOW` and :data:`MANY_BATCHES`:
fast batches measure well sooner, and the first epoch should not run long on one
worker), each measured with the count fixed. From a window:

* the consumer's *wait*: its time in ``next()`` over its whole time (the data stall);
* the workers' *busy*: their seconds loading, over the active workers' time;
* the cores left *free*: the usable cores less what every process used (``/proc/stat``);
* the batches delivered per second (the *rate*).

It **adds** workers while the consumer waits (``wait >= WAIT_GROW``), the workers are busy
(``busy >= BUSY_GROW``: idle workers with a waiting consumer mean the main process is the
limit, which more workers would only slow), a core is free and memory allows: as many as
keep up with the consumer (the busy seconds per batch over the consumer's own), at most
the free cores, at most the cap. It **stops** one when the rest would carry the load at
most :data:`BUSY_SHRINK` busy and the consumer does not wait, or when the machine's cores
are saturated while the consumer does not wait (workers then take CPU the consumer needs).

Every change is a *probe*: the next window's rate is compared with the window before it.
An addition that did not raise the rate by :data:`GAIN`, or a stop that lowered it by
:data:`LOSS`, is undone, and that direction is barred from the count for a while: 8
windows, doubling with each undone probe up to :data:`MAX_BAR` windows. This is the
hysteresis: a count is left only on evidence, and a count found worse is not tried again
at once (no flapping between two counts whose rates differ by noise).
"""

from __future__ import annotations

import math
from typing import Callable, NamedTuple

MIN_WINDOW = 0.25  # seconds between decisions, at least
MIN_BATCHES = 4  # batches delivered between decisions, at least (unless MAX_WINDOW passed)
SHORT_WINDOW, MANY_BATCHES = 0.1, 16  # ...or this many in this long: fast batches decide sooner
MAX_WINDOW = 3.0  # a window this long decides with any batch delivered
WAIT_GROW = 0.10  # the consumer waits this share of its time or more: data-bound
WAIT_SHRINK = 0.05  # below this the consumer is not held back by loading
BUSY_GROW = 0.70  # workers busy this share of their time or more are the limit
BUSY_SHRINK = 0.75  # one fewer worker would be busy at most this share: stop one
FREE_CORE = 0.5  # a core counts as free when this much of one is unused
SATURATED = 0.15  # cores left free below this: the machine is saturated
GAIN = 0.05  # an addition must raise the rate this much to stay
LOSS = 0.05  # a stop may lower the rate this much and stay
FIRST_BAR, MAX_BAR = 8, 64  # windows a direction is barred after an undone probe


class Window(NamedTuple):
    """What one window measured, the count fixed throughout."""

    seconds: float
    batches: int  # delivered to the consumer
    stall: float  # the consumer's seconds inside next()
    step: float  # the consumer's own seconds between next() calls
    busy: float  # the workers' seconds loading
    free_cores: float | None  # None: unknown
    # how many more workers memory allows (None: not limited), asked only when one might be
    # added: reading a process's memory costs more than the rest of a decision
    room_for: Callable[[], int | None] | None = None

    @property
    def rate(self) -> float:
        return self.batches / self.seconds if self.seconds > 0 else 0.0

    @property
    def wait(self) -> float:
        spent = self.stall + self.step
        return self.stall / spent if spent > 0 else 0.0


class Probe(NamedTuple):
    before: int  # the count before the change
    rate: float  # the rate measured with it
    grew: bool


def enough(seconds: float, batches: int) -> bool:
    """Is a window of ``seconds`` and ``batches`` long enough to decide on?"""
    return ((seconds >= MIN_WINDOW and batches >= MIN_BATCHES) or (seconds >= SHORT_WINDOW and batches >= MANY_BATCHES)
            or (seconds >= MAX_WINDOW and batches > 0))


class Policy:
    """The count for the next window, from each window in turn (:meth:`decide`)."""

    def __init__(self, cap: int, count: int):
        if cap < 1:
            raise ValueError(f"the cap of workers must be at least 1, not {cap}")
        self.cap = cap
        self.count = min(max(1, count), cap)
        self.probe: Probe | None = None
        self.bar_above: tuple[int, int] | None = None  # (count not to exceed, windows left)
        self.bar_below: tuple[int, int] | None = None  # (count not to go under, windows left)
        self.strikes = 0  # undone probes in a row: how long the next bar lasts

    def decide(self, w: Window) -> int:
        """The count to run the next window with (:attr:`count` is updated)."""
        if self.probe is not None:
            return self._judge(self.probe, w)
        self._age_bars()
        wanted = self._wanted(w)
        if wanted != self.count:
            self.probe = Probe(self.count, w.rate, wanted > self.count)
            self.count = wanted
        return self.count

    def _judge(self, p: Probe, w: Window) -> int:
        """Keep a change the window shows helped (or did not hurt), undo one that did not."""
        self.probe = None
        worse = w.rate < p.rate * (1 + GAIN) if p.grew else w.rate < p.rate * (1 - LOSS)
        if not worse:
            self.strikes = 0
            return self.count
        bar = min(MAX_BAR, FIRST_BAR << self.strikes)
        self.strikes += 1
        if p.grew:
            self.bar_above = (p.before, bar)
        else:
            self.bar_below = (p.before, bar)
        self.count = p.before
        return self.count

    def _age_bars(self) -> None:
        if self.bar_above is not None:
            self.bar_above = (self.bar_above[0], self.bar_above[1] - 1) if self.bar_above[1] > 1 else None
        if self.bar_below is not None:
            self.bar_below = (self.bar_below[0], self.bar_below[1] - 1) if self.bar_below[1] > 1 else None

    def _wanted(self, w: Window) -> int:
        n = self.count
        ceiling = min(self.cap, self.bar_above[0]) if self.bar_above else self.cap
        floor = max(1, self.bar_below[0]) if self.bar_below else 1
        busy = w.busy / (n * w.seconds) if w.seconds > 0 else 0.0
        free = w.free_cores
        if w.wait >= WAIT_GROW and busy >= BUSY_GROW and n < ceiling and (free is None or free >= FREE_CORE):
            add = _keeping_up(w, n) - n
            if free is not None:
                add = min(add, max(1, math.floor(free + 1 - FREE_CORE)))
            room = w.room_for() if w.room_for is not None and add > 0 else None
            if room is not None:
                add = min(add, room)
            return min(ceiling, n + add) if add > 0 else n
        if n > floor and w.wait < WAIT_SHRINK:
            if busy * n <= (n - 1) * BUSY_SHRINK or (free is not None and free < SATURATED):
                return n - 1
        return n


def _keeping_up(w: Window, n: int) -> int:
    """Workers that would keep up with the consumer: the busy seconds per batch over the
    consumer's own seconds per batch (at least one more than ``n``, as the consumer waits)."""
    if w.batches == 0:
        return n + 1
    step = w.step / w.batches
    per_batch = w.busy / w.batches
    if step <= 0:
        return 1 << 20  # a consumer that does nothing: as many as there is room for
    return max(n + 1, math.ceil(per_batch / step))
