"""Interrupts: what a signal's handler raises (Ctrl-C's KeyboardInterrupt, a preemption
handler's SystemExit, a time-out's own exception) wherever it lands, and other threads
and forks of the main process while a loader runs. Every batch is delivered once when
the loop is taken up again, a state saved meanwhile counts what was delivered, and
nothing is left behind: no segment, descriptor or child.

Most tests go through the public API, with real signals (a timer's, or the process
sending itself one). Some reach in where only that makes a moment certain, and say so:
the signal gate itself (``shmload._core._signals``), a close() interrupted at its first
step (``shmload.profiler.profile``), a signal inside the POSIX backend's name window
(``shmload._transport.shm``) or inside a finalizer's close
(``shmload._session.supervisor``).
"""

from __future__ import annotations

import gc
import multiprocessing.util
import os
import random
import re
import signal
import subprocess
import sys
import textwrap
import threading
import time

import numpy as np
import psutil
import pytest

import shmload
from shmload import DataLoader, ShmloadError
from shmload.testing import flatten, run

from .helpers import AugmentedDataset, Interrupt, RangeDataset, rows_under_interrupts
from .scripts import ROOT


def _children() -> set[int]:
    return {p.pid for p in psutil.Process().children() if p.status() != psutil.STATUS_ZOMBIE}


def _fds() -> int:
    return len(os.listdir("/proc/self/fd"))


def _mappings() -> int:
    with open("/proc/self/maps") as maps:
        return sum(1 for line in maps if "/dev/shm/shmload-" in line)


def _our_entries() -> set[str]:
    return {name for name in os.listdir("/dev/shm") if name.startswith("shmload-")}


class _Alarm(Exception):
    """What a user's time-out handler raises."""


class _RaisingHandler:
    """``signum``'s handler raises ``exc`` (SIGTERM: SystemExit, as cluster jobs' preemption
    handlers do; SIGALRM: a user's time-out). Restored after."""

    def __init__(self, signum: int, exc: type[BaseException]):
        self.signum, self.exc = signum, exc

    def __enter__(self):
        self._previous = signal.signal(self.signum, self._handler)
        return self

    def _handler(self, signum, frame):
        raise self.exc(143)

    def __exit__(self, *exc):
        signal.signal(self.signum, self._previous)
        return False


def _PreemptionHandler() -> _RaisingHandler:
    """What cluster jobs install: SIGTERM's handler raises SystemExit."""
    return _RaisingHandler(signal.SIGTERM, SystemExit)


_KINDS = {"ctrl-c": (signal.SIGINT, KeyboardInterrupt), "preemption": (signal.SIGTERM, SystemExit)}


def _raise_system_exit(signum, frame):
    raise SystemExit(143)


# ---------------------------------------------------------------- inside next()
@pytest.mark.parametrize("in_order", [True, False])
def test_ctrl_c_inside_next_then_going_on_yields_every_batch_exactly_once(in_order):
    """NOTE [ An interrupt during next() ] (epoch.py): SIGINT at random moments of an epoch,
    the same iterator taken up again after each KeyboardInterrupt."""
    rng = random.Random(9 + in_order)
    loader = DataLoader(RangeDataset(400), batch_size=2, num_workers=2, timeout=20, in_order=in_order,
                        prefetch_factor=4)
    with loader:
        got, interrupts = rows_under_interrupts(iter(loader), rng, 0.002, 0.0002)
    assert interrupts >= 20
    expected = [[i, i + 1] for i in range(0, 400, 2)]
    assert (got if in_order else sorted(got)) == expected


@pytest.mark.parametrize("kind", sorted(_KINDS))
def test_interrupts_inside_next_then_going_on_yields_every_batch_exactly_once(kind):
    """NOTE [ An interrupt during next() ] (epoch.py), for a preemption handler's
    SystemExit as for Ctrl-C."""
    signum, raised = _KINDS[kind]
    rng = random.Random(32)
    with _PreemptionHandler(), DataLoader(RangeDataset(400), batch_size=2, num_workers=2, timeout=20,
                                          prefetch_factor=4) as loader:
        got, interrupts = rows_under_interrupts(iter(loader), rng, 0.002, 0.0002, signum, raised)
    assert interrupts >= 8
    assert got == [[i, i + 1] for i in range(0, 400, 2)]


class _SelfInterruptingDataset:
    """Sample i is i; loading sample ``at`` the first time sends this process ``signum``,
    so its handler raises inside __getitem__, deterministically."""

    def __init__(self, n: int, at: int, signum: int):
        self.n, self.at, self.signum, self.sent = n, at, signum, False

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> int:
        if i == self.at and not self.sent:
            self.sent = True
            os.kill(os.getpid(), self.signum)
            time.sleep(1)  # (the handler runs at once, in the call above or here)
        return i


@pytest.mark.pure
@pytest.mark.parametrize("kind", sorted(_KINDS))
def test_an_interrupted_batch_is_the_next_one_with_num_workers_0(kind):
    """Before: the interrupted batch was skipped (next() returned the one after it) while
    state_dict() counted it as not delivered."""
    signum, raised = _KINDS[kind]
    loader = DataLoader(_SelfInterruptingDataset(20, at=9, signum=signum), batch_size=4)
    it = iter(loader)
    got = [next(it).tolist(), next(it).tolist()]
    with _PreemptionHandler(), pytest.raises(raised):
        next(it)
    state = loader.state_dict()
    got += [b.tolist() for b in it]
    assert got == [[i, i + 1, i + 2, i + 3] for i in range(0, 20, 4)]
    resumed = DataLoader(_SelfInterruptingDataset(20, at=-1, signum=signum), batch_size=4)
    resumed.load_state_dict(state)
    assert [b.tolist() for b in resumed] == got[2:]


@pytest.mark.pure
def test_a_dataset_error_is_still_raised_at_its_position_with_num_workers_0():
    """An exception of the dataset's own is the batch's (torch's rule), not an interrupt:
    the next next() goes on with the batch after it."""
    class Failing(_SelfInterruptingDataset):
        def __getitem__(self, i):
            if i == 5:
                raise ValueError("sample 5 is broken")
            return i
    it = iter(DataLoader(Failing(12, -1, 0), batch_size=4))
    assert next(it).tolist() == [0, 1, 2, 3]
    with pytest.raises(ValueError, match="^sample 5 is broken$"):
        next(it)
    assert next(it).tolist() == [8, 9, 10, 11]


@pytest.mark.pure
def test_ctrl_c_in_a_single_process_load_leaves_the_batch_to_the_resumed_run():
    class Interrupting(AugmentedDataset):
        def __getitem__(self, i):
            if i == 9 and not getattr(self, "done", False):
                self.done = True
                raise KeyboardInterrupt
            return super().__getitem__(i)

    reference, _ = run(DataLoader(AugmentedDataset(), batch_size=4, seed=5), 1)
    loader = DataLoader(Interrupting(), batch_size=4, seed=5)
    got = []
    with pytest.raises(KeyboardInterrupt):
        for batch in loader:
            got.append(flatten(batch))
    state = loader.state_dict()
    assert state["next_batch"] == 2
    resumed = DataLoader(AugmentedDataset(), batch_size=4, seed=5)
    resumed.load_state_dict(state)
    assert got + run(resumed, 1)[0] == reference


@pytest.mark.parametrize("num_workers", [0, 2])
def test_a_batch_kept_by_an_interrupted_next_is_not_delivered_in_a_state_saved_meanwhile(num_workers):
    """A SIGTERM landing in next()'s bookkeeping is handed on as next() ends, and the
    batch it had is kept for the following next() (NOTE [ An interrupt during next() ]).
    A checkpoint saved meanwhile, as a preemption handler saves one, must count that batch
    as still to come, or a resumed run would never see it."""
    loader = DataLoader(RangeDataset(24), batch_size=4, num_workers=num_workers, timeout=20)
    consumer = loader._sessions.profile.consumer  # (the profiler's clock runs inside next()'s window)
    leave, calls = consumer.leave, []

    def leave_and_signal(*args):
        calls.append(1)
        if len(calls) == 3:
            os.kill(os.getpid(), signal.SIGTERM)  # deferred: the handler runs as next() ends
        return leave(*args)
    consumer.leave = leave_and_signal
    with loader, _PreemptionHandler():
        it = iter(loader)
        got = [next(it).tolist(), next(it).tolist()]
        with pytest.raises(SystemExit):
            next(it)
        state = loader.state_dict()
        assert (state["next_batch"], state["delivered_beyond"]) == (2, [])
        got += [b.tolist() for b in it]
        assert got == [[i, i + 1, i + 2, i + 3] for i in range(0, 24, 4)]
    resumed = DataLoader(RangeDataset(24), batch_size=4)
    resumed.load_state_dict(state)
    assert [b.tolist() for b in resumed] == got[2:]


def test_a_time_out_handler_installed_anew_before_every_batch_never_cuts_its_bookkeeping():
    """The per-call time-out idiom: signal.signal(SIGALRM, h) and an interval timer before
    each batch. The handler replaces the gate every time (before: ReorderError, a dead
    iterator); a signal seen with a Python handler once is watched by every window."""
    rng = random.Random(4)
    got, alarms, b = [], 0, None
    live = True  # False from the first instruction of each disarm: an alarm already on its way lands harmlessly

    def alarm(signum, frame):
        if live:
            raise _Alarm

    def arm():
        nonlocal live
        live = True
        signal.signal(signal.SIGALRM, alarm)
        signal.setitimer(signal.ITIMER_REAL, rng.uniform(0.00005, 0.001))
    previous = signal.signal(signal.SIGALRM, alarm)
    try:
        with DataLoader(RangeDataset(600), batch_size=2, num_workers=2, timeout=20) as loader:
            it = iter(loader)
            while True:
                try:
                    arm()
                    for b in it:
                        got.append(b.tolist())
                        arm()
                    break
                except _Alarm:
                    alarms += 1
                    # the for-loop bound b before the alarm could land in its body: file it once
                    if b is not None and (not got or got[-1] != b.tolist()):
                        got.append(b.tolist())
                finally:
                    # (a store runs no signal handler: an alarm that fires after the loop, before
                    # the timer is stopped, cannot raise out of this finally, as it once did under load)
                    live = False
                    signal.setitimer(signal.ITIMER_REAL, 0)
    finally:
        signal.signal(signal.SIGALRM, previous)
    assert alarms >= 10
    assert got == [[i, i + 1] for i in range(0, 600, 2)]


class _InterruptedGenerator:
    """An iterable source whose generator sends this process SIGTERM at sample 9, once."""

    def __init__(self):
        self.sent = False

    def __iter__(self):
        for i in range(24):
            if i == 9 and not self.sent:
                self.sent = True
                os.kill(os.getpid(), signal.SIGTERM)
                time.sleep(0.5)
            yield i


@pytest.mark.pure
def test_an_iterable_source_cut_by_an_interrupt_says_so_and_resumes():
    """num_workers=0: an exception passing through a generator ends it, so the epoch must
    not go on as if the stream had ended (before: 8 of 24 samples, then a normal end)."""
    loader = DataLoader(_InterruptedGenerator(), batch_size=4)
    it = iter(loader)
    got = [next(it).tolist(), next(it).tolist()]
    with _PreemptionHandler(), pytest.raises(SystemExit):
        next(it)
    with pytest.raises(ShmloadError, match=r"^this epoch's iterable source was interrupted inside its own code"):
        next(it)
    with pytest.warns(shmload.ShmloadWarning, match="has no state_dict or load_state_dict"):
        state = loader.state_dict()  # (a resume then re-reads the stream and skips what was delivered)
    loader.load_state_dict(state)
    got += [b.tolist() for b in loader]
    assert got == [list(range(i, i + 4)) for i in range(0, 24, 4)]


def test_ctrl_c_raises_keyboard_interrupt_once_and_workers_print_nothing():
    proc = subprocess.Popen([sys.executable, "-c", textwrap.dedent("""
        import shmload
        from tests.helpers import SlowDataset
        loader = shmload.DataLoader(SlowDataset(1000, 0.05), batch_size=1, num_workers=2)
        for i, batch in enumerate(loader):
            if i == 1:
                print("ready", flush=True)
    """)], cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        assert proc.stdout.readline().strip() == "ready"
        proc.send_signal(signal.SIGINT)
        _, err = proc.communicate(timeout=30)
    finally:
        proc.kill()
        proc.wait(10)
    assert err.count("Traceback") == 1 and err.rstrip().endswith("KeyboardInterrupt"), err
    assert proc.returncode != 0


# ---------------------------------------------------------------- start-up, ring growth and close()
class _GrowingDataset:
    """Sample i holds (i // 2 + 1) * 20,000 bytes: each batch of 2 needs a larger ring slot."""

    def __len__(self) -> int:
        return 12

    def __getitem__(self, i: int) -> np.ndarray:
        return np.full((i // 2 + 1) * 2500, i, np.int64)


def _one_round(method: str, stop: float | None, signum: int, exc: type[BaseException], backend: str,
               close_again: bool = True) -> None:
    """Start-up, an epoch whose ring grows at every batch, close(): with ``signum`` sent
    after ``stop`` seconds (None: none), its handler raising ``exc``. That is caught and
    close() called again, as a job that saves a checkpoint on preemption would, or
    (``close_again=False``) the loader is left to the garbage collector."""
    loader = DataLoader(_GrowingDataset(), batch_size=2, num_workers=2, multiprocessing_context=method,
                        timeout=30, persistent_workers=True, shm_backend=backend)
    it = None
    try:
        with Interrupt(stop if stop is not None else 3600, signum):
            it = iter(loader)
            for k, b in enumerate(it):
                assert b[:, 0].tolist() == [2 * k, 2 * k + 1] and b.shape[1] == (k + 1) * 2500
            loader.close()
            if stop is not None:
                time.sleep(max(0.0, stop + 0.05))  # the signal lands here if the round was quicker
    except exc:
        if close_again:
            loader.close()
        raise
    finally:
        del it, loader
        gc.collect()


_ANY_HANDLER = [  # (start method, signal, what its handler raises, backend)
    ("fork", signal.SIGTERM, SystemExit, "memfd"),
    ("spawn", signal.SIGTERM, SystemExit, "memfd"),
    ("forkserver", signal.SIGTERM, SystemExit, "memfd"),
    ("fork", signal.SIGALRM, _Alarm, "memfd"),
    pytest.param("fork", signal.SIGTERM, SystemExit, "posix", marks=pytest.mark.shm_names),
]


@pytest.mark.timeout(240)
@pytest.mark.parametrize("method,signum,exc,backend", _ANY_HANDLER)
def test_any_handlers_exception_anywhere_leaves_nothing_behind(method, signum, exc, backend):
    """An exception raised by a signal's handler at random moments of start-up, next(),
    ring growth and close(), then close() again or garbage collection: no descriptor, no
    child, nothing in /dev/shm, and the next loader works (the autouse leak check looks
    too)."""
    if os.environ.get("SHMLOAD_SHM_BACKEND"):
        # CI's POSIX-backend subset sets it for loaders given shm_backend=None; these name
        # theirs (both backends are among the cases), so that run would repeat this one's
        pytest.skip("every loader here names its shm_backend: $SHMLOAD_SHM_BACKEND changes nothing")
    rounds = 40 if method == "fork" else 8
    rng = random.Random(f"32-{method}-{signum}-{backend}")
    with _RaisingHandler(signum, exc):
        began = time.monotonic()
        _one_round(method, None, signum, exc, backend)  # (also starts the fork server once)
        span = time.monotonic() - began
        children, fds, entries = _children(), _fds(), _our_entries()
        landed = 0
        for k in range(rounds):
            try:
                _one_round(method, rng.uniform(0.0, span), signum, exc, backend, close_again=k % 2 == 0)
            except exc:
                landed += 1
        _one_round(method, None, signum, exc, backend)  # the next loader works
    assert landed == rounds  # each signal landed in the round, or in its closing sleep
    gc.collect()  # (the last exception's frames are a cycle)
    assert _our_entries() <= entries
    assert _fds() == fds
    assert _children() <= children


def test_a_close_interrupted_before_it_released_anything_is_finished_by_the_next(monkeypatch):
    children_before = _children()
    from shmload.profiler import profile as profile_module
    loader = DataLoader(RangeDataset(16), batch_size=4, num_workers=2, timeout=20)
    it = iter(loader)  # (held: an iterator dropped closes its workers itself)
    assert next(it).tolist() == [0, 1, 2, 3]
    fds = _fds()
    calls = []

    def interrupted(pid):  # the first thing close() does: read the workers' CPU times
        calls.append(pid)
        raise KeyboardInterrupt
    monkeypatch.setattr(profile_module, "cpu_seconds", interrupted)
    with pytest.raises(KeyboardInterrupt):
        loader.close()
    monkeypatch.undo()
    assert calls and _fds() == fds  # nothing released yet
    loader.close()
    assert _fds() < fds - 2  # the sockets and the segments are gone
    assert _children() <= children_before


def test_closes_interrupted_at_random_points_leak_nothing():
    """Ctrl-C at a random moment of close(), then close() again, 30 times: every
    descriptor, mapping and worker is released (the autouse leak check covers /dev/shm)."""
    children_before = _children()
    rng = random.Random(18)
    gc.collect()
    fds, maps = _fds(), _mappings()
    interrupted = 0
    for _ in range(30):
        loader = DataLoader(RangeDataset(16), batch_size=4, num_workers=2, timeout=20)
        it = iter(loader)
        assert len(next(it)) == 4
        try:
            with Interrupt(rng.uniform(0.0001, 0.004)):
                loader.close()
                time.sleep(0.01)  # the timer fires here when close() was quicker
        except KeyboardInterrupt:
            interrupted += 1
        loader.close()
        del loader, it
    gc.collect()
    assert interrupted >= 5
    assert _fds() == fds and _mappings() <= maps
    assert _children() <= children_before


def test_a_signal_during_a_close_run_by_a_finalizer_is_not_lost_and_the_close_finishes(monkeypatch):
    """`for b in loader: break` closes the workers in the iterator's finalizer, where
    Python drops whatever a handler raises; the SIGTERM that came meanwhile is raised in
    the user's code after it (before: "Exception ignored in", the close left unfinished)."""
    from shmload._session.supervisor import Supervisor
    shutdown = Supervisor.shutdown

    def signalled_shutdown(self):
        os.kill(os.getpid(), signal.SIGTERM)
        return shutdown(self)
    monkeypatch.setattr(Supervisor, "shutdown", signalled_shutdown)
    children = _children()  # (spawn's and forkserver's helpers, if an earlier test started them)
    loader = DataLoader(RangeDataset(40), batch_size=4, num_workers=2, timeout=20)
    with _PreemptionHandler(), pytest.raises(SystemExit):
        for _ in loader:
            break  # the iterator's finalizer closes its workers here
        time.sleep(2)
    monkeypatch.undo()
    assert _children() <= children  # the close finished: its workers are gone


def test_loader_creation_interrupted_at_random_points_leaves_no_entry():
    children_before = _children()
    rng = random.Random(1818)
    before, fds = _our_entries(), _fds()
    interrupted = 0
    for _ in range(40):
        loader = DataLoader(RangeDataset(8), batch_size=4, num_workers=1, timeout=20, slot_bytes=1 << 16)
        it = None
        try:
            with Interrupt(rng.uniform(0.00005, 0.003)):
                it = iter(loader)
                next(it)
                time.sleep(0.01)
        except KeyboardInterrupt:
            interrupted += 1
        loader.close()
        del loader, it
        gc.collect()
    assert interrupted >= 5  # (a Ctrl-C that lands in a finalizer or weakref callback is ignored by Python)
    assert _our_entries() <= before and _fds() == fds
    assert _children() <= children_before


@pytest.mark.pure
@pytest.mark.shm_names
@pytest.mark.parametrize("signum,handler,exc", [(signal.SIGINT, signal.default_int_handler, KeyboardInterrupt),
                                                (signal.SIGTERM, _raise_system_exit, SystemExit)])
def test_an_interrupt_while_a_posix_segment_has_a_name_leaves_no_entry(monkeypatch, signum, handler, exc):
    """The POSIX backend's name window (shm.py): the signal lands exactly inside it,
    deterministically; Ctrl-C, and a preemption handler's SystemExit."""
    import posix_ipc

    from shmload._transport import shm
    real = posix_ipc.SharedMemory
    names = []

    def signal_inside(name, *args, **kwargs):
        segment = real(name, *args, **kwargs)
        names.append(name)
        os.kill(os.getpid(), signum)  # while the name exists
        return segment
    monkeypatch.setattr(posix_ipc, "SharedMemory", signal_inside)
    previous = signal.signal(signum, handler)
    fds = _fds()
    try:
        with pytest.raises(exc):
            shm.Segment(0, 1 << 16, backend="posix")
    finally:
        signal.signal(signum, previous)
    assert names and not os.path.exists("/dev/shm" + names[0])
    assert _fds() == fds  # the descriptor was closed on the interrupt's way out


_CTRL_C_AT_START = """
import os, signal, sys, threading, time
sys.path.insert(0, {root!r})
from shmload import DataLoader
from tests.helpers import RangeDataset
loader = DataLoader(RangeDataset(64), batch_size=4, num_workers=2, multiprocessing_context={method!r}, timeout=60)
# Ctrl-C in a terminal reaches the whole process group: the workers too, while they start
threading.Timer({delay}, os.killpg, (os.getpgid(0), signal.SIGINT)).start()
for _ in loader:
    time.sleep(0.05)
"""


@pytest.mark.parametrize("method,delay", [("spawn", 0.05), ("spawn", 0.3)])  # (forkserver: see reliability.md)
def test_ctrl_c_while_spawned_workers_start_is_one_traceback(method, delay):
    import subprocess
    import sys
    from pathlib import Path
    root = str(Path(__file__).resolve().parents[1])
    done = subprocess.run([sys.executable, "-c", _CTRL_C_AT_START.format(root=root, method=method, delay=delay)],
                          capture_output=True, text=True, timeout=120, start_new_session=True)
    assert done.returncode != 0
    assert done.stderr.count("Traceback (most recent call last)") == 1, done.stderr
    assert "KeyboardInterrupt" in done.stderr and "Fatal Python error" not in done.stderr


# ---------------------------------------------------------------- the gate (_core/_signals.py)
@pytest.mark.pure
def test_a_window_defers_any_handlers_exception_to_its_end_and_marks_it():
    from shmload._core import _signals
    order = []

    def usr1(signum, frame):
        order.append("usr1")

    previous = {s: signal.getsignal(s) for s in (signal.SIGTERM, signal.SIGUSR1)}
    with _PreemptionHandler():
        signal.signal(signal.SIGUSR1, usr1)
        try:
            _signals.SCAN_INTERVAL, interval = 0.0, _signals.SCAN_INTERVAL  # (look at every signal now)
            _signals._Gate.next_scan = 0.0
            try:
                with pytest.raises(SystemExit) as raised:
                    with _signals.signals_deferred():
                        os.kill(os.getpid(), signal.SIGUSR1)
                        os.kill(os.getpid(), signal.SIGTERM)
                        time.sleep(0.01)
                        order.append("window's end")
            finally:
                _signals.SCAN_INTERVAL = interval
        finally:
            signal.signal(signal.SIGUSR1, previous[signal.SIGUSR1])
    assert order == ["window's end", "usr1"]  # in the order they came, after the window
    assert _signals.raised_by_signal(raised.value)
    assert not _signals.raised_by_signal(SystemExit(0)) and _signals.raised_by_signal(KeyboardInterrupt())
    assert signal.getsignal(signal.SIGTERM) == previous[signal.SIGTERM]


@pytest.mark.pure
def test_a_handler_restored_after_a_window_wrapped_another_is_the_one_it_was():
    """A gate wraps one handler: putting back a saved gate brings back its handler, not the
    one installed meanwhile (with one shared gate, a temporary handler stayed for ever)."""
    from shmload._core import _signals
    calls = []
    with _PreemptionHandler():
        signal.signal(signal.SIGTERM, lambda s, f: calls.append("first"))
        with _signals.signals_deferred():
            pass
        saved = signal.signal(signal.SIGTERM, lambda s, f: calls.append("second"))
        with _signals.signals_deferred():
            pass
        signal.signal(signal.SIGTERM, saved)
        os.kill(os.getpid(), signal.SIGTERM)
        time.sleep(0.01)
    assert calls == ["first"]


@pytest.mark.pure
def test_a_window_interrupted_as_its_wait_ends_restores_its_depth():
    """A handler can raise at the first bytecode of interruptible.__exit__, before it put
    the depth back; the window's close must still leave no window open (before: depth -1,
    and every later signal stayed pending for ever)."""
    from shmload._core import _signals
    before = _signals.defer_signals()
    _signals.interruptible().__enter__()  # (its __exit__ never runs, as when a handler raised there)
    _signals.resume_signals(before)
    assert _signals._Gate.depth == 0
    with _PreemptionHandler():
        with _signals.signals_deferred():
            pass
        with pytest.raises(SystemExit):
            os.kill(os.getpid(), signal.SIGTERM)
            time.sleep(0.5)


@pytest.mark.pure
def test_a_handlers_exception_leaves_the_signals_after_it_pending_not_lost():
    from shmload._core import _signals
    calls = []

    def hup(signum, frame):
        calls.append("hup")
    previous = signal.signal(signal.SIGHUP, hup)
    try:
        with _PreemptionHandler():
            _signals._Gate.next_scan = 0.0  # (look at every signal in the next window)
            with pytest.raises(SystemExit):
                with _signals.signals_deferred():
                    os.kill(os.getpid(), signal.SIGTERM)
                    os.kill(os.getpid(), signal.SIGHUP)
                    time.sleep(0.01)
            with _signals.signals_deferred():
                pass
    finally:
        signal.signal(signal.SIGHUP, previous)
    assert calls == ["hup"]


# ---------------------------------------------------------------- threads
class _JitteryDataset:
    """Sample i is [i, i, i, i]; some samples take a millisecond, so threads interleave."""

    def __len__(self) -> int:
        return 48

    def __getitem__(self, i: int) -> np.ndarray:
        if i % 5 == 0:
            time.sleep(0.001)
        return np.full(4, i, np.int64)


_TAKEN_OVER = r"^this iterator can no longer be used: a newer iter\(\) of the same loader"


def test_threads_iterating_one_persistent_loader_get_whole_epochs_or_the_clear_error():
    """Two threads each run `for b in loader` on one persistent loader, many rounds with
    random pauses: every epoch a thread finishes is whole and correct, and a thread whose
    iterator was taken over gets the documented ShmloadError, nothing else (before: other
    epochs' batches, zeros, ReorderError, KeyError, workers dying at start-up)."""
    rng = random.Random(32)
    finished = 0
    for _ in range(12):
        outcomes: list = []

        def run(pause: float) -> None:
            for _ in range(3):
                time.sleep(pause)
                try:
                    rows = [b[:, 0].tolist() for b in loader]
                except ShmloadError as exc:
                    outcomes.append(exc)
                else:
                    outcomes.append([x for r in rows for x in r])
        with DataLoader(_JitteryDataset(), batch_size=6, num_workers=2, persistent_workers=True,
                        timeout=30) as loader:
            threads = [threading.Thread(target=run, args=(rng.random() * 0.004,)) for _ in range(2)]
            for t in threads:
                t.start()
            for t in threads:
                t.join(60)
            assert not any(t.is_alive() for t in threads)
        assert len(outcomes) == 6
        for outcome in outcomes:
            if isinstance(outcome, ShmloadError):
                assert re.match(_TAKEN_OVER, str(outcome)), outcome
            else:
                assert outcome == list(range(48))
                finished += 1
    assert finished >= 12  # each round's last iterator runs to its end


def test_threads_sharing_one_iterator_get_each_batch_exactly_once():
    loader = DataLoader(RangeDataset(800), batch_size=4, num_workers=2, timeout=20)
    got: list[list[int]] = []
    errors: list[BaseException] = []

    def take(it):
        try:
            for b in it:
                got.append(b.tolist())
        except BaseException as exc:  # (reported below: a thread's exception would be lost)
            errors.append(exc)
    with loader:
        it = iter(loader)
        threads = [threading.Thread(target=take, args=(it,)) for _ in range(4)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(60)
        assert not any(t.is_alive() for t in threads)
    assert errors == []
    assert sorted(got) == [[i, i + 1, i + 2, i + 3] for i in range(0, 800, 4)]


@pytest.mark.pure
def test_threads_sharing_one_single_process_iterator_get_each_batch_exactly_once():
    loader = DataLoader(RangeDataset(400), batch_size=4)
    it = iter(loader)
    got: list[list[int]] = []
    threads = [threading.Thread(target=lambda: got.extend(b.tolist() for b in it)) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert sorted(got) == [[i, i + 1, i + 2, i + 3] for i in range(0, 400, 4)]


_CLOSE_FROM_ANOTHER_THREAD = """
import random, re, sys, threading, time
import numpy as np
import shmload

class Slowish:
    def __len__(self): return 400
    def __getitem__(self, i):
        time.sleep(0.0005)
        return np.full(4, i, np.int64)

rng = random.Random(int(sys.argv[1]))
outcomes = []
for _ in range(8):
    loader = shmload.DataLoader(Slowish(), batch_size=4, num_workers=2, timeout=20,
                                persistent_workers=rng.random() < 0.5)
    def run():
        try:
            got = [b[:, 0].tolist() for b in loader]
            outcomes.append("whole" if [x for r in got for x in r] == list(range(400)) else "WRONG")
        except shmload.ShmloadError as exc:
            outcomes.append("taken over" if re.match("this iterator can no longer be used", str(exc)) else repr(exc))
    t = threading.Thread(target=run)
    t.start()
    time.sleep(rng.uniform(0.0, 0.3))
    loader.close()
    t.join(30)
    assert not t.is_alive()
print(sorted(set(outcomes)))
"""


def test_close_from_another_thread_while_one_iterates_is_the_clear_error_not_a_crash():
    """loader.close() in the main thread while a thread waits in next(): before, the
    control block was unmapped under the waiting thread (SIGSEGV, 4 runs of 4)."""
    from .scripts import describe, run_script
    result = run_script(["-c", _CLOSE_FROM_ANOTHER_THREAD, "32"], timeout=120)
    assert result.returncode == 0 and result.stderr == "", describe(result)
    seen = set(eval(result.stdout.strip()))
    assert seen <= {"whole", "taken over"} and "taken over" in seen, describe(result)


def test_workers_start_while_other_threads_hold_locks_and_allocate():
    stop = threading.Event()
    lock = threading.Lock()

    def busy():
        while not stop.is_set():
            with lock:
                np.ones(1000).sum()

    threads = [threading.Thread(target=busy) for _ in range(2)]
    for t in threads:
        t.start()
    try:
        for _ in range(3):  # forks land at random moments of the other threads' work
            loader = DataLoader(RangeDataset(24), batch_size=4, num_workers=2, timeout=30)
            assert [b.tolist() for b in loader] == [list(range(i, i + 4)) for i in range(0, 24, 4)]
    finally:
        stop.set()
        for t in threads:
            t.join(10)


# ---------------------------------------------------------------- forks
def test_a_forked_child_that_exits_leaves_the_parents_workers_alone():
    """At exit multiprocessing SIGTERMs the daemonic children it knows of; a raw fork's
    child inherited the parent's list and must not act on it (_platform.py)."""
    loader = DataLoader(RangeDataset(40), batch_size=4, num_workers=2, timeout=20)
    with loader:
        it = iter(loader)
        got = [next(it).tolist()]
        pid = os.fork()
        if pid == 0:  # the child ends as a script ends: multiprocessing's exit handler runs
            try:
                multiprocessing.util._exit_function()
            finally:
                os._exit(0)
        _, status = os.waitpid(pid, 0)
        assert os.waitstatus_to_exitcode(status) == 0
        got += [b.tolist() for b in it]
    assert got == [list(range(i, i + 4)) for i in range(0, 40, 4)]


def test_a_forked_child_can_iterate_though_another_thread_was_starting_an_epoch_at_the_fork():
    loader = DataLoader(RangeDataset(8), batch_size=4)
    opening = loader._sessions._opening
    opening.acquire()  # (another thread inside iter() at the moment of the fork)
    try:
        pid = os.fork()
        if pid == 0:
            signal.alarm(10)  # a deadlock ends the child, unreaped by its default action
            ok = [b.tolist() for b in loader] == [[0, 1, 2, 3], [4, 5, 6, 7]]
            os._exit(0 if ok else 1)
    finally:
        opening.release()
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0


def test_a_forked_child_starts_its_own_workers_and_refuses_the_parents_iterator():
    loader = DataLoader(RangeDataset(6), batch_size=2, num_workers=1, persistent_workers=True)
    with loader:
        parents = iter(loader)
        next(parents)
        pid = os.fork()
        if pid == 0:  # the child: report through the exit code, never return into pytest
            code = 1
            try:
                try:
                    next(parents)
                except ShmloadError as exc:
                    code = 2 if "forked child" in str(exc) else 3
                if code == 2 and [b.tolist() for b in loader] == [[0, 1], [2, 3], [4, 5]]:
                    code = 0
                loader.close()
            finally:
                os._exit(code)
        _, status = os.waitpid(pid, 0)
        assert os.waitstatus_to_exitcode(status) == 0
        assert [b.tolist() for b in parents] == [[2, 3], [4, 5]]  # the parent's workers were untouched
