"""The pool: a loader's worker sessions across epochs, and the epoch iterator each
``iter()`` gets.

With ``persistent_workers=True`` one session (``session.py``) serves every epoch until
the settings change; otherwise each iterator owns a session of its own, which stops with
the iterator (its finalizer, ``break``, the end of the epoch). The pool is kept apart
from the loader so the loader's finalizer can close it, and it never outlives a fork: a
forked child's pool starts its own workers.
"""

from __future__ import annotations

import os
import threading
import time
import weakref
from typing import Any, Callable

from .._core import _signals
from .._core._platform import owned_here
from .._ordering.stream import Stream
from .._session.config import LoaderConfig
from .._session.recovery import RestartBudget
from .._session.scaling import Tuner
from .._session.session import Session
from ..profiler.profile import Profile
from .epoch import SingleProcessEpoch
from .worker_epoch import MultiprocessEpoch


class SessionPool:
    """A loader's sessions: the persistent one, every live one (closed with the loader),
    the restart budget and profile they share, and an iterable source's in-process stream."""

    def __init__(self) -> None:
        self.persistent: Session | None = None
        self.live: weakref.WeakSet[Session] = weakref.WeakSet()
        self.restarts = RestartBudget()  # max_worker_restarts counts per loader, across its sessions
        self.profile = Profile()  # always on: see profiler/profile.py and loader.stats()
        self.stream: Stream | None = None  # an iterable source's in num_workers=0 epochs
        self.tuner: Tuner | None = None  # num_workers="auto"'s, kept across epochs (scaling.py)
        self.first_count: int | None = None  # "auto"'s count to begin with: a loaded state's
        self.script: dict[int, int] | None = None  # tests: the count at given batches (testing.script_workers)
        # Two threads' iter() must not both start a persistent session, nor one close the
        # session another's iterator is using (NOTE [ Threads sharing a session ]). A
        # forked child takes a lock of its own: one another thread held at the fork would
        # be held for ever there.
        self._opening = threading.Lock()
        self._opening_pid = os.getpid()

    def starts_workers(self, cfg: LoaderConfig) -> bool:
        """Does ``open_epoch(cfg)`` start worker processes? With ``num_workers > 0``, always
        unless it keeps a persistent session (owned here, open, of these settings)."""
        if cfg.num_workers == 0:
            return False
        held = self.persistent
        return not cfg.persistent_workers or held is None or held.closed or held.cfg is not cfg or \
            not owned_here(held.owner_pid)

    def open_epoch(self, cfg: LoaderConfig, claim: Callable[[], tuple[int, Any, Any]], length: int | None,
                   loader: Any) -> SingleProcessEpoch | MultiprocessEpoch:
        """The iterator of the next epoch, with its session (started now, as torch's
        ``iter()`` starts its workers) or none for ``num_workers=0``."""
        if self._opening_pid != os.getpid():
            self._opening, self._opening_pid = threading.Lock(), os.getpid()
        # A window (_signals.py, NOTE [ Interrupts wait for a window ]): waiting for
        # another thread's iter() is open to an interrupt, and starting workers is not; an
        # interrupt is handed on once the session is whole and owned, by the loader
        # (persistent) or by the iterator, whose finalizer closes it.
        entered = _signals.defer_signals()
        try:
            _signals.acquire(self._opening)
            try:
                return self._open_epoch(cfg, claim, length, loader)
            finally:
                self._opening.release()
        finally:
            _signals.resume_signals(entered)

    def _open_epoch(self, cfg: LoaderConfig, claim: Callable[[], tuple[int, Any, Any]], length: int | None,
                    loader: Any) -> SingleProcessEpoch | MultiprocessEpoch:
        if self.persistent is not None and not owned_here(self.persistent.owner_pid):
            self.persistent = None  # inherited through a fork: those workers are not ours
            self.live = weakref.WeakSet()
        if self.persistent is not None and self.persistent.cfg is not cfg:
            self.persistent.close()  # settings changed since its workers started
            self.persistent = None
        if cfg.num_workers == 0:
            if cfg.iterable and self.stream is None:
                self.stream = Stream(cfg.dataset)  # reset_state(), once per loader
            return SingleProcessEpoch(cfg, claim, length, self.profile, self.stream)
        return self._multiprocess_epoch(cfg, claim, length, loader)

    def _multiprocess_epoch(self, cfg: LoaderConfig, claim: Callable[[], tuple[int, Any, Any]], length: int | None,
                            loader: Any) -> MultiprocessEpoch:
        tuner = self._tuner(cfg)
        if cfg.persistent_workers:
            if self.persistent is None or self.persistent.closed:
                self.persistent = self._session(cfg, tuner)
                self.live.add(self.persistent)
            elif tuner is not None and not tuner.runs(self.persistent):  # (a tuner made anew: a loaded count)
                tuner.attach(self.persistent, time.perf_counter())
            return MultiprocessEpoch(cfg, self.persistent, False, claim, length, loader, self.profile, tuner)
        session = self._session(cfg, tuner)
        try:
            self.live.add(session)
            return MultiprocessEpoch(cfg, session, True, claim, length, loader, self.profile, tuner)
        except BaseException:
            session.close()
            raise

    def _session(self, cfg: LoaderConfig, tuner: Tuner | None) -> Session:
        session = Session(cfg, self.restarts, self.profile, workers=tuner.count if tuner is not None else None)
        if tuner is not None:
            tuner.attach(session, time.perf_counter())
        return session

    def _tuner(self, cfg: LoaderConfig) -> Tuner | None:
        """num_workers="auto"'s tuner: the loader's, made again for another cap."""
        if not cfg.auto_workers:
            return None
        if self.tuner is None or self.tuner.cap != cfg.num_workers or self.first_count is not None:
            self.tuner = Tuner(cfg.num_workers, self.first_count or (self.tuner.count if self.tuner else None),
                               self.script)
            self.first_count = None
        return self.tuner

    def close(self, finalizing: bool = False) -> None:
        """Close every session (``finalizing``: run by the loader's finalizer)."""
        for session in [self.persistent, *self.live]:
            if session is not None:
                session.close(finalizing)
        self.persistent = None
