"""Supervisor: start the worker processes, talk to them, notice when they die, stop them.

Knows nothing about batches. Messages go through each worker's queues in the control
segment (``control.py``; records encoded by ``wire.py``), file descriptors and the rare
oversized message through its socket (``channel.py``).

Waiting. The main process sleeps on the control segment's bell (rung by any worker's
completion) for at most :data:`DEATH_CHECK` seconds at a time; before each sleep, and
after one that brought nothing, it asks the kernel without waiting whether a worker died
(its pidfd) or a socket needs attention. While a socket has work (an outbox to flush, a
large message announced), it waits on the sockets instead, :data:`SOCKET_SLICE` at a time.

Shutdown escalates in a fixed order: ask (a Shutdown message, then closing our end of
the socket, which a worker sees as end-of-file), wait ``JOIN_TIMEOUT`` seconds, SIGTERM,
wait, SIGKILL. A worker stuck in a slow ``__getitem__`` is therefore stopped within about
two seconds, never waited on forever."""

from __future__ import annotations

import multiprocessing.forkserver
import selectors
import socket
import time
from collections import deque
from multiprocessing import connection
from typing import Any

from .._core import _platform, _signals
from .._loading.worker import UserCode, WorkerArgs, worker_main
from .._ordering.shuffle import StreamShuffle
from .._transport import wire
from .._transport.channel import Channel
from .._transport.control import ControlBlock
from .._transport.messages import AttachControl, Shutdown
from .._transport.shm import Segment
from .handle import WorkerHandle
from .shipping import PerWorker

JOIN_TIMEOUT = 1.0
TERM_TIMEOUT = 1.0
DEATH_CHECK = 0.05  # longest sleep on the bell between two looks for dead workers
SOCKET_SLICE = 0.002  # longest wait on the sockets while one has work, between looks at the queues
_READ, _WRITE = selectors.EVENT_READ, selectors.EVENT_WRITE


class Supervisor:
    def __init__(self, ctx: Any, num_workers: int, seed: int, rank: int, auto_batch: bool, user: UserCode,
                 stream_shuffle: StreamShuffle | None = None, shm_backend: str = "memfd", start: int | None = None):
        # (``num_workers`` ids, the first ``start`` started now, the next by add(): scaling.py)
        _platform.check_supported(num_workers)
        _platform.check_can_start_children()
        self.ctx = ctx
        self._selector = selectors.PollSelector()  # poll(2): no kernel object a fork could share
        self._control_segment: Segment | None = None
        self._control: ControlBlock | None = None
        # per worker: messages deferred to the next flush(), then records its task queue had
        # no room for yet (each a list of parts), oldest first; and whether flush() has work
        self._outgoing: list[list] = [[] for _ in range(num_workers)]
        self._overflow: list[deque] = [deque() for _ in range(num_workers)]
        self._unsent = False  # (set by every write; most next() calls have nothing to flush)
        # per worker: frames read from its socket and not yet put in their announcement's
        # place, and whether a taken announcement (wire.NOTICE) still waits for its frame
        self._frames: list[deque] = [deque() for _ in range(num_workers)]
        self._awaiting = [False] * num_workers
        method = ctx.get_start_method()
        self._execs = method == "spawn"  # (its workers are new interpreters: _signals.start_window)
        payload = user if method == "fork" else PerWorker(user, method)
        self._args = WorkerArgs(0, num_workers, seed, rank, auto_batch, payload, None, stream_shuffle)
        self.workers: list[WorkerHandle] = []
        if method == "forkserver":
            # started outside start_window(), or the server (shared with the user's own
            # processes) would inherit SIGINT ignored and hand that to all its children
            multiprocessing.forkserver.ensure_running()
        try:
            self._control_segment = Segment(-1, ControlBlock.size(num_workers), backend=shm_backend)
            self._control = ControlBlock(self._control_segment.mmap, num_workers)
            for _ in range(num_workers if start is None else start):
                self.add()
        except BaseException:
            self.shutdown()
            raise

    def add(self) -> WorkerHandle:  # the next worker id's process
        wid = len(self.workers)
        # a started process is in the list before a Ctrl-C can land (NOTE [ Interrupts wait for a window ])
        with _signals.start_window(self._execs):
            self.workers.append(self._start(wid, self._args._replace(worker_id=wid)))
        return self.workers[wid]

    @property
    def control(self) -> ControlBlock:
        """The workers' queues; a supervisor that could not make them shut down as it raised."""
        assert self._control is not None, "the control block is made by the constructor"
        return self._control

    def _start(self, wid: int, args: WorkerArgs) -> WorkerHandle:
        with _platform.fd_limit_named():
            return self._start_process(wid, args)

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
        channel = Channel(ours)
        handle = WorkerHandle(wid, process, channel)
        handle.death_fd = _platform.death_watch(process)
        self._selector.register(handle.death_fd, selectors.EVENT_READ, handle)
        seg = self._control_segment
        assert seg is not None, "workers start after the control block is made"
        channel.send(AttachControl(seg.size, self.control.areas[wid]), fd=seg.fd)
        self._unsent = True
        self._watch(handle)
        return handle

    def _watch(self, h: WorkerHandle, events: int | None = None) -> None:
        """Wait on ``h``'s socket for ``events`` (by default: writable while its outbox
        holds data, readable while it owes an announced frame; 0: not at all)."""
        channel = h.channel
        if events is None:
            events = ((_WRITE if channel.backlogged else 0) | (_READ if self._awaiting[h.id] else 0)
                      if channel is not None and not channel.eof else 0)
        if events == h.events:
            return
        # (a closed channel is watched for nothing: _retire() unwatches it before _close_channel())
        assert channel is not None, f"worker {h.id}'s closed socket is still watched"
        fd = channel.fileno()
        if not events:
            self._selector.unregister(fd)
        elif not h.events:
            self._selector.register(fd, events, h)
        else:
            self._selector.modify(fd, events, h)
        h.events = events

    # ------------------------------------------------------------ talking
    def send(self, wid: int, msg: Any, fd: int | None = None, defer: bool = False) -> None:
        """Queue ``msg`` (after ``fd``, which goes by the socket) for worker ``wid``; never
        blocks. A deferred message leaves at the next :meth:`flush` (or :meth:`poll`), with
        the others deferred for the same worker in one record: one wake-up of a sleeping
        worker for several tasks, instead of one each."""
        h = self.workers[wid]
        channel = h.channel
        if h.exited or channel is None or channel.eof:
            return  # poll() reports the death, with what the worker held
        if fd is not None:
            channel.send_fd(fd)
        head, body = wire.encode_to_worker(msg)
        if len(head) + len(body) > self.control.tasks[wid].max_record:
            channel.send(msg)  # by the socket, announced in the queue
            head, body = wire.NOTICE, b""
        self._outgoing[wid].append((head, body))
        self._unsent = True
        if not defer:
            self._push(h)
        if fd is not None or head is wire.NOTICE:  # a socket write (only one can make it backlogged)
            self._watch(h)

    def _push(self, h: WorkerHandle) -> None:
        """Put worker ``h``'s deferred messages and overflow into its task queue, as far as
        it has room; what does not fit waits in the overflow, in order."""
        wid = h.id
        outgoing, overflow, tasks = self._outgoing[wid], self._overflow[wid], self.control.tasks[wid]
        while overflow and tasks.put(*overflow[0]):
            overflow.popleft()
        if outgoing:
            for parts in wire.bundles(outgoing, tasks.max_record):
                if overflow or not tasks.put(*parts):
                    overflow.append([bytes(p) for p in parts])  # (a body may be a view of the sampler's array)
            outgoing.clear()

    def flush(self) -> None:
        """Send the deferred messages, and write what the sockets take."""
        if not self._unsent:
            return
        unsent = False  # (stored at the end: a flush cut short by an exception is done again whole)
        for h in self.workers:
            channel = h.channel
            if h.exited or channel is None:
                self._outgoing[h.id].clear()
                self._overflow[h.id].clear()
                continue
            if self._outgoing[h.id] or self._overflow[h.id]:
                self._push(h)
            if channel.backlogged:
                channel.flush()
                self._watch(h)
            unsent = unsent or bool(self._overflow[h.id]) or channel.backlogged
        self._unsent = unsent

    def restart(self, wid: int) -> WorkerHandle:
        """Start a replacement for worker ``wid``, which has died: same id, new process and
        socket, fresh queues (NOTE [ Deaths and the queues ], control.py). The caller
        re-sends what the dead one held."""
        old = self.workers[wid]
        if not old.exited:
            self._retire(old)
        self._close_channel(old)
        if not old.reaped:  # (a stopped worker may have been: reap_stopped)
            old.process.join(JOIN_TIMEOUT)  # it has exited (death_fd, or stopped): this reaps it, no zombie stays
            old.exitcode = old.process.exitcode
            old.forget_death_fd()
            old.process.close()
        self.control.reset(wid)
        self._outgoing[wid].clear()
        self._overflow[wid].clear()
        self._frames[wid].clear()
        self._awaiting[wid] = False
        with _signals.start_window(self._execs):  # NOTE [ Interrupts wait for a window ] (_signals.py)
            self.workers[wid] = self._start(wid, self._args._replace(worker_id=wid))
        return self.workers[wid]

    def _close_channel(self, h: WorkerHandle) -> None:
        channel = h.channel
        if channel is not None:
            _platform.unregister_parent_only(channel.fileno())
            channel.close()  # end-of-file for a worker still waiting for messages
            h.channel = None

    def live(self) -> list[WorkerHandle]:
        return [h for h in self.workers if not h.exited]

    def poll(self, timeout: float) -> tuple[list[tuple[int, bytes]], list[WorkerHandle]]:
        """Records (``wire.py``) that arrived within ``timeout`` seconds, each with its
        worker's id, and workers that have died. Returns as soon as there is either.

        A dead worker's last records are taken before its death is reported."""
        self.flush()
        got = self._take_all()
        if not got:
            self.control.drain_bell()  # NOTE [ A doorbell rung only for a sleeper ] (control.py)
            got = self._take_all()
        if got:
            return got, []
        dead = self._events(0, got)
        if got or dead:
            return got, dead
        if any(h.events for h in self.workers):  # a socket has work: wait on the sockets
            with _signals.interruptible():
                ready = self._selector.select(min(timeout, SOCKET_SLICE))
            dead = self._handle_events(ready, got)
            got.extend(self._take_all())
            return got, dead
        with _signals.interruptible():  # the one wait of next(): nothing is half done here
            self.control.sleep(min(timeout, DEATH_CHECK))
        got = self._take_all()
        if not got:
            dead = self._events(0, got)
        return got, dead

    def _take_all(self) -> list[tuple[int, bytes]]:
        got: list[tuple[int, bytes]] = []
        for h in self.workers:
            if not h.exited and h.channel is not None:
                self._take(h, got)
        return got

    def _take(self, h: WorkerHandle, got: list) -> None:
        """Take worker ``h``'s records in order. A :data:`wire.NOTICE` is replaced by the
        next frame from the socket (frames come in the order they were announced); while
        that frame has not arrived, the records after it wait in the queue."""
        wid, take, frames = h.id, self.control.take, self._frames[h.id]
        if self._awaiting[wid]:
            if not frames:
                return
            got.append((wid, wire.frame_record(frames.popleft())))
            self._awaiting[wid] = False
        while (record := take(wid)) is not None:
            if record[0] != wire.NOTICE_KIND:
                got.append((wid, record))
                continue
            if not frames:
                frames.extend(_open(h).receive())
            if not frames:
                self._awaiting[wid] = True
                self._watch(h)
                return
            got.append((wid, wire.frame_record(frames.popleft())))

    def _events(self, timeout: float, got: list) -> list[WorkerHandle]:
        """Deaths and socket events within ``timeout`` (0: those already there)."""
        return self._handle_events(self._selector.select(timeout), got)

    def _handle_events(self, ready: list, got: list) -> list[WorkerHandle]:
        dead = []
        for key, mask in ready:
            h = key.data
            if h.exited:
                continue
            if key.fd == h.death_fd:
                self._take_last(h, got)
                self._retire(h)
                dead.append(h)
                continue
            channel = _open(h)  # (watched: its socket is open)
            if mask & _WRITE:
                channel.flush()
            if mask & _READ:
                self._frames[h.id].extend(channel.receive())
                self._take(h, got)
            self._watch(h, 0 if channel.eof else None)  # closed: wait for the death, which follows at once
        return dead

    def _take_last(self, h: WorkerHandle, got: list) -> None:
        """A dead worker's records, in order, each announced frame in its place (all of
        them have arrived: nothing more can come), then any frame it sent unannounced
        (before it had mapped its queues)."""
        wid, frames = h.id, self._frames[h.id]
        frames.extend(_open(h).receive())
        self._take(h, got)
        while self._awaiting[wid]:  # announced, but the frame never came: nothing more can
            self._awaiting[wid] = False
            self._take(h, got)
        got.extend((wid, wire.frame_record(frame)) for frame in frames)
        frames.clear()

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
        """Stop every worker. Idempotent, so that a shutdown interrupted in its waits is
        finished by the next call (session.py, NOTE [ A close() that did not finish ])."""
        for h in self.workers:
            self._ask_to_exit(h)
        self._reap(JOIN_TIMEOUT)
        for escalate in ("terminate", "kill"):
            stuck = [h for h in self.workers if not h.reaped]
            if not stuck:
                break
            for h in stuck:
                getattr(h.process, escalate)()
            self._reap(TERM_TIMEOUT)
        self._selector.close()
        if self._control is not None:
            self._control.close()
        if self._control_segment is not None:
            self._control_segment.close()

    def stop(self, wid: int) -> None:
        """Ask worker ``wid``, holding no task, to exit (scaling.py): no death; reaped later."""
        self._ask_to_exit(self.workers[wid])
        self.workers[wid].stopped = True

    def reap_stopped(self) -> None:
        """Reap the stopped workers that have exited, without waiting (no zombie stays)."""
        for h in self.workers:
            if h.stopped and not h.reaped:
                h.reap_if_exited()

    def _ask_to_exit(self, h: WorkerHandle) -> None:
        if h.channel is None:
            return
        try:
            if not h.exited and self._control is not None:
                self._control.tasks[h.id].put(*wire.encode_to_worker(Shutdown()))  # (full: EOF, and the escalation)
        finally:
            if not h.exited:
                self._retire(h)
            self._close_channel(h)  # end-of-file: a worker that missed the message exits too

    def _reap(self, timeout: float) -> None:
        """Wait up to ``timeout`` seconds for the workers to exit, and reap those that did.
        The wait is open to an interrupt; reaping is not (``WorkerHandle.reap_if_exited``)."""
        deadline = time.monotonic() + timeout
        while True:
            running = [h for h in self.workers if not h.reaped and not h.reap_if_exited()]
            left = deadline - time.monotonic()
            if not running or left <= 0:
                return
            with _signals.interruptible():  # the one wait of close(): nothing is half done here
                connection.wait([h.death_fd for h in running], left)

    @property
    def pids(self) -> list[int]:
        return [h.pid for h in self.workers]


def _open(h: WorkerHandle) -> Channel:
    """Worker ``h``'s socket, while it is open: until its death has been taken in
    (_take_last, then _retire) nothing closes it."""
    assert h.channel is not None, f"worker {h.id}'s socket is closed"
    return h.channel

