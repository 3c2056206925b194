"""The interrupt window: Ctrl-C and a preemption handler's ``SystemExit`` wait while
shmload's own state is half changed (NOTE [ Interrupts wait for a window ] below), and
the windows finalizers and worker start-up use."""

from __future__ import annotations

import _signal
import contextlib
import os
import signal
import threading
import time
from typing import Any, Callable, Iterator

# NOTE [ Interrupts wait for a window ]
# Python runs a signal's handler between any two bytecodes of the main thread, and a
# handler may raise: KeyboardInterrupt for Ctrl-C, SystemExit from a preemption handler
# (`signal.signal(SIGTERM, lambda *_: sys.exit(1))`, as cluster schedulers' jobs do), or
# anything else. Some of the loader's steps must not be cut in two: a shared-memory name
# lives between shm_open and shm_unlink (cut there, it stays in /dev/shm for ever); a
# descriptor or a started process is on its way into the object that will own it; a
# message is half sent, a result read but not yet filed, a slot taken but not yet given
# to a task, a descriptor closed but not yet forgotten (cut there, the iterator loses a
# batch, waits for ever for one, or a second close() closes a reused descriptor). Such
# steps run as a *window*: between defer_signals() and resume_signals() in the main
# thread, the handlers of every signal that has a Python handler only note the signal,
# and resume_signals() hands the signals on in the order they came, so that whatever a
# handler raises is raised where the caller has made its state whole again. Only blocking
# waits with nothing half done are left open to them (interruptible()), so a signal is
# never held for longer than the loader's own bookkeeping takes.
#
# How: a window wraps each Python handler it finds installed (default_int_handler, the
# user's SIGTERM handler...) in a gate of its own (_Gated), and leaves it installed;
# outside windows the gate calls the wrapped handler at once, so the only visible change
# is what signal.getsignal() returns. A handler installed later is wrapped in turn by a later
# window: SIGINT's, SIGTERM's and those of signals once seen with a Python handler are
# looked at by every window (a handler installed anew before each call, as the SIGALRM
# time-out idiom does, is wrapped at once), every other signal's at most every
# SCAN_INTERVAL (a look at all 60 costs ~2 us, too much for every next()).
# SIG_DFL and SIG_IGN run no Python code, so there is nothing to defer.
#
# Why not pthread_sigmask alone: blocked in the main thread, a signal sent to the
# process goes to any other thread (the user's, torch's), and Python still runs the
# handler in the main thread, in the middle of the window. The mask is added where a
# signal's default action would be the harm (shm.py's name window: a SIGTERM left to
# kill the process there leaves the name) and in start_window().
#
# The gate also marks what a handler raised (raised_by_signal()), so the epoch can tell
# an interrupt (nothing taken: the same batch comes next) from the dataset's own error
# (raised at its batch's position).
_MAIN_THREAD = threading.main_thread().ident
# signal.getsignal() converts its result to an enum member, which costs microseconds in
# next()'s path; the C function it wraps returns the handler itself.
_getsignal = getattr(_signal, "getsignal", signal.getsignal)
_SIGINT = int(signal.SIGINT)
_EVERY_WINDOW = (_SIGINT, int(signal.SIGTERM))  # Ctrl-C, and what schedulers send to preempt
_CATCHABLE = tuple(sorted(int(s) for s in signal.valid_signals() if s not in (signal.SIGKILL, signal.SIGSTOP)))
SCAN_INTERVAL = 0.1  # seconds: how late a window may notice a new handler of another signal
_SIGNALED = "_shmload_signal"  # the attribute raised_by_signal() reads


class _Gate:
    depth = 0  # open windows in the main thread
    pending: list = []  # (gate, signal, frame) of the signals that came during the windows, in order
    next_scan = 0.0  # (time.monotonic) when to look at every signal's handler again
    watched: tuple[int, ...] = _EVERY_WINDOW  # signals whose handler every window looks at
    sealed = 0  # open finalizer windows: their waits stay closed (finalizer_window())


class _Gated:
    """A handler of the user's (or Python's default_int_handler), installed in its place:
    it defers the signal inside a window and calls the handler outside. One per handler,
    so that a handler the user saved from ``signal.signal()`` and puts back later (a
    handler installed for a while and then restored) brings back the handler it wrapped."""

    __slots__ = ("handler",)

    def __init__(self, handler: Callable[[int, Any], Any]):
        self.handler = handler

    def __call__(self, signum: int, frame: Any) -> None:
        if _Gate.depth:
            if all(p[1] != signum for p in _Gate.pending):  # (the kernel too keeps one of each)
                _Gate.pending.append((self, signum, frame))
        else:
            self.hand_on(signum, frame)

    def hand_on(self, signum: int, frame: Any) -> None:
        try:
            self.handler(signum, frame)
        except BaseException as exc:
            try:
                setattr(exc, _SIGNALED, signum)
            except AttributeError:  # (an exception class whose __setattr__ refuses it)
                pass
            raise

    def __repr__(self) -> str:
        return f"<shmload's gate for {self.handler!r}>"


def raised_by_signal(exc: BaseException) -> bool:
    """Was ``exc`` raised by a signal's handler (through a window's gate), or is it a
    KeyboardInterrupt? Either is an interrupt, not an error of the code it cut."""
    return isinstance(exc, KeyboardInterrupt) or getattr(exc, _SIGNALED, None) is not None


def _wrap(signums: tuple[int, ...]) -> None:
    for signum in signums:
        current = _getsignal(signum)
        if type(current) is _Gated or not callable(current):
            continue
        try:
            signal.signal(signum, _Gated(current))
        except (ValueError, OSError):  # not the main interpreter; a signal Python may not handle
            continue


def defer_signals() -> int:
    """Open a window. Returns what :func:`resume_signals` must be given: the depth of
    windows before this one, or -1 where there is nothing to defer (another thread)."""
    if threading.get_ident() != _MAIN_THREAD:
        return -1
    before = _Gate.depth
    if before == 0:
        now = time.monotonic()
        if now >= _Gate.next_scan:
            _Gate.next_scan = now + SCAN_INTERVAL
            _scan()  # (wraps the watched signals too)
        else:
            _wrap(_Gate.watched)
    _Gate.depth = before + 1
    return before


def _scan() -> None:
    """Look at every signal's handler; one found with a Python handler is watched from
    then on."""
    found = tuple(signum for signum in _CATCHABLE if callable(_getsignal(signum)))
    _Gate.watched = tuple(dict.fromkeys(_Gate.watched + found))
    _wrap(_Gate.watched)


def _deliver_pending() -> None:
    """Hand on the signals that came during the windows (depth is 0), in order. If a
    handler raises, the signals after it stay pending, handed on as the next window
    closes (or a wait opens); a handler's exception is not lost for another's."""
    while _Gate.pending:
        gate, signum, frame = _Gate.pending.pop(0)
        gate.hand_on(signum, frame)


# NOTE [ A window restores the depth it found ]
# resume_signals() sets the depth back to what defer_signals() found, rather than count
# down: an interrupt can be handed on at the first bytecode of interruptible.__exit__,
# before it has put the depth back, and a count then went on from 0 to -1, which kept
# every later signal pending for ever.
def resume_signals(before: int) -> None:
    """Close a window (``before``: what :func:`defer_signals` returned): a signal that
    came meanwhile is handed on now."""
    if before < 0:
        return
    _Gate.depth = before
    if before == 0 and _Gate.pending:
        _deliver_pending()


class interruptible:
    """``with interruptible():`` inside a window, a blocking wait (or the user's code) with
    nothing of the loader's half done: a signal (one that came earlier included) is
    handed on at once. (A class, not a generator: it is in next()'s path.)"""

    __slots__ = ("_depth",)

    def __enter__(self) -> None:
        self._depth = depth = _Gate.depth if threading.get_ident() == _MAIN_THREAD and not _Gate.sealed else 0
        if depth:
            _Gate.depth = 0
            if _Gate.pending:
                try:
                    _deliver_pending()
                except BaseException:
                    _Gate.depth = depth  # __exit__ does not run when __enter__ raises
                    raise

    def __exit__(self, *exc: Any) -> None:
        if self._depth:
            _Gate.depth = self._depth


def acquire(lock: Any, timeout: float | None = None) -> bool:
    """Take ``lock`` inside a window: the wait for it is open to interrupts, taking it is
    not, so that an interrupt never leaves it taken by nobody (one handed on as a wait
    that has taken it ends would be raised past the caller's ``try``). False if
    ``timeout`` seconds passed first."""
    deadline = None if timeout is None else time.monotonic() + timeout
    while not lock.acquire(False):
        left = 0.05 if deadline is None else min(0.05, deadline - time.monotonic())
        if left <= 0:
            return False
        with interruptible():
            if lock.acquire(True, left):  # (only to wait for it: given back at once)
                lock.release()
    return True


@contextlib.contextmanager
def signals_deferred() -> Iterator[None]:
    """A window as a ``with`` block (NOTE [ Interrupts wait for a window ])."""
    entered = defer_signals()
    try:
        yield
    finally:
        resume_signals(entered)


# NOTE [ An interrupt during a finalizer ]
# Python prints and drops whatever a weakref finalizer raises ("Exception ignored in"),
# and a finalizer runs wherever the garbage collector or a dropped reference runs it
# (`for b in loader: break` closes the iterator's workers at the break). An interrupt
# handed on inside one would be lost, and the close it cut left unfinished for good (a
# finalizer runs once). So a close run by a finalizer is a window whose waits stay
# closed (it takes at most the workers' bounded shutdown, about 2 s), and the signals
# that came during it are sent to the process again by a helper thread RESEND_DELAY
# after it, so that their handlers run in the user's code (Thread.start() itself waits
# for the thread, still inside the finalizer: hence the delay).
@contextlib.contextmanager
def finalizer_window() -> Iterator[None]:
    """A window for a finalizer's work (NOTE [ An interrupt during a finalizer ])."""
    before = defer_signals()
    if before < 0:
        yield
        return
    _Gate.sealed += 1
    try:
        yield
    finally:
        _Gate.sealed -= 1
        _Gate.depth = before
        if before == 0 and _Gate.pending:
            again = [signum for _, signum, _ in _Gate.pending]
            _Gate.pending = []
            _send_later(again)


RESEND_DELAY = 0.01  # seconds: a finalizer's close is over by then (the thread starts within it)


def _send_later(signums: list[int]) -> None:
    def send() -> None:
        time.sleep(RESEND_DELAY)
        for signum in signums:
            os.kill(os.getpid(), signum)
    try:
        threading.Thread(target=send, name="shmload-signal-again", daemon=True).start()
    except RuntimeError:  # interpreter shutdown: no new threads; sent now (its handler may be lost)
        for signum in signums:
            os.kill(os.getpid(), signum)


# Signals a process is sent by others (not the ones a fault raises in the thread itself).
_ASYNC = frozenset(_CATCHABLE) - {int(getattr(signal, n)) for n in ("SIGSEGV", "SIGBUS", "SIGFPE", "SIGILL",
                                                                      "SIGTRAP", "SIGSYS") if hasattr(signal, n)}


@contextlib.contextmanager
def signals_blocked() -> Iterator[None]:
    """A window that also keeps the kernel from acting on a signal in this thread for its
    few microseconds (a SIGTERM left to its default action would end the process inside
    it): the signals are blocked, and acted on once unblocked. Only where that harm is
    real (shm.py's name window): a process's other threads may still receive them."""
    with signals_deferred():
        mask = signal.pthread_sigmask(signal.SIG_BLOCK, _ASYNC)
        try:
            yield
        finally:
            signal.pthread_sigmask(signal.SIG_SETMASK, mask)


@contextlib.contextmanager
def start_window(execs: bool = False) -> Iterator[None]:
    """A window for starting a worker process, which must start ignoring SIGINT: a
    Ctrl-C reaches the whole process group, and a worker still starting would print a
    traceback of its own, one per worker, before it could set SIG_IGN itself. So SIGINT
    is blocked in this thread while the process starts: a forked child inherits the mask,
    its Ctrl-C stays pending until it ignores SIGINT and unblocks it (worker.py), and
    this process's is kept by the kernel and noted as the window ends.

    A child that ``execs`` a new interpreter (spawn) does not keep the mask through
    multiprocessing's fork and exec, only an ignored disposition, so for it SIGINT is
    also set to SIG_IGN meanwhile (Python then installs no KeyboardInterrupt handler in
    it). That has a cost, which is why it is not done for fork: a Ctrl-C the kernel gives
    to another thread of this process, one that does not block SIGINT (a timer's, the
    user's), is discarded while the disposition is SIG_IGN, and the user's Ctrl-C is lost
    (tests/test_autotune.py, where workers start mid-epoch, caught it under fork)."""
    entered = defer_signals()
    try:
        mask = signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT})
        try:
            gate = _getsignal(_SIGINT) if entered >= 0 and execs else None
            gated = type(gate) is _Gated
            if gated:
                signal.signal(signal.SIGINT, signal.SIG_IGN)
            try:
                yield
            finally:
                if gated:
                    signal.signal(signal.SIGINT, gate)
        finally:
            signal.pthread_sigmask(signal.SIG_SETMASK, mask)  # a SIGINT held by the kernel is noted now
    finally:
        resume_signals(entered)


def _reset_gate_after_fork() -> None:
    # a child forked inside a window (a worker) has no window open
    _Gate.depth, _Gate.pending = 0, []


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_reset_gate_after_fork)
