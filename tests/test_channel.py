"""Internals, tested on purpose (``shmload._transport.channel`` and ``messages``):
channel.py in one process: the main process's :class:`Channel` and the worker's
:class:`Inbox` (with the worker's sending ``Connection``) on the two ends of one
``socket.socketpair()``, as supervisor.py and worker.py hold them. No worker processes.

Covered: the framing (``Connection``'s, both ways), deferred sends leaving in one write,
frames cut across reads, descriptors (``SCM_RIGHTS``) in their places among the messages
and working, the main end never blocking on a full socket, end-of-file and a closed peer,
and no descriptor leaked. Every wait has a deadline (``select`` with a timeout): a bug
fails a test instead of hanging it.
"""

from __future__ import annotations

import fcntl
import gc
import os
import pickle
import resource
import select
import socket
import struct
import threading
import time
from multiprocessing.connection import Connection

import pytest

from shmload._transport import channel as channel_module
from shmload._transport.channel import Channel, Inbox, _frame
from shmload._transport.messages import (
    Attach,
    AttachBoard,
    Detach,
    Done,
    Draw,
    Exhausted,
    Failed,
    NeedSpace,
    Ready,
    Reassign,
    Shutdown,
    SlotRef,
    StartupFailed,
    StreamPoint,
    Task,
)
from shmload.errors import RemoteError, ShmloadError

pytestmark = [pytest.mark.timeout(30), pytest.mark.pure]

WAIT = 5.0  # seconds any one exchange may take before the test fails
BIG = 3 * channel_module._READ_SIZE  # larger than one read and than the socket's buffer


# ---------------------------------------------------------------- descriptors
def open_fds() -> dict[int, str]:
    """This process's descriptors and what each refers to."""
    found = {}
    for name in os.listdir("/proc/self/fd"):
        try:
            found[int(name)] = os.readlink(f"/proc/self/fd/{name}")
        except OSError:  # the listing's own descriptor, closed by now
            pass
    return found


@pytest.fixture(autouse=True)
def no_fd_leaks():
    """Fail a test that leaves a descriptor open (torn down after the test's fixtures)."""
    before = open_fds()
    yield
    gc.collect()
    new = {fd: target for fd, target in open_fds().items() if before.get(fd) != target}
    assert not new, f"descriptors left open: {new}"


@pytest.fixture
def owned():
    """Descriptors a test holds (made or received): closed after it, even if it fails."""
    fds: list[int] = []
    yield fds
    for fd in fds:
        try:
            os.close(fd)
        except OSError:
            pass


def segment(owned: list[int], content: bytes) -> int:
    """A memfd holding ``content``, standing in for a shared-memory segment."""
    fd = os.memfd_create("channel-test")
    owned.append(fd)
    os.write(fd, content)
    return fd


def content(fd: int) -> bytes:
    return os.pread(fd, 1 << 16, 0)


# ---------------------------------------------------------------- the two ends
class Ends:
    """A worker's socket pair as the supervisor makes it: the main side's Channel, the
    worker's Connection (it sends with it) and Inbox (it reads with it) on one descriptor."""

    def __init__(self):
        ours, theirs = socket.socketpair()
        self.channel = Channel(ours)
        self.conn = Connection(theirs.detach())
        self.inbox = Inbox(self.conn.fileno())

    def close_worker(self) -> None:
        self.inbox.close()
        self.conn.close()

    def close(self) -> None:
        self.channel.close()
        self.close_worker()


@pytest.fixture
def ends():
    e = Ends()
    yield e
    e.close()


def worker_send(ends: Ends, msg) -> None:
    ends.conn.send_bytes(pickle.dumps(msg, pickle.HIGHEST_PROTOCOL))  # as Worker.send


def main_receive(channel: Channel, count: int, timeout: float = WAIT) -> list:
    """The next ``count`` messages on the main side (Supervisor.poll's reading), loaded."""
    frames: list[bytes] = []
    deadline = time.monotonic() + timeout
    while len(frames) < count:
        remaining = deadline - time.monotonic()
        assert remaining > 0, f"only {len(frames)} of {count} messages reached the main side"
        if select.select([channel], [], [], remaining)[0]:
            frames += channel.receive()
            assert not channel.eof or len(frames) >= count, "end-of-file before the messages"
    assert len(frames) == count, f"{len(frames)} messages where {count} were sent"
    return [pickle.loads(f) for f in frames]


def exchange(ends: Ends, count: int, owned: list[int] | None = None, timeout: float = WAIT) -> list[tuple]:
    """Run both ends until the worker has ``count`` messages: the main side flushes when
    its socket is writable (as Supervisor.poll does), the worker reads when its socket is
    readable and takes an Attach's or AttachBoard's descriptor right after it (as
    Worker.recv and Worker.control do). Returns (message, descriptor or None) pairs."""
    got: list[tuple] = []
    waiting = None  # an Attach whose descriptor has not arrived yet
    deadline = time.monotonic() + timeout
    while len(got) < count:
        if waiting is not None:
            fd = ends.inbox.take_fd()
            if fd is not None:
                if owned is not None:
                    owned.append(fd)
                got.append((waiting, fd))
                waiting = None
                continue
        else:
            msg = ends.inbox.next_message()
            if msg is not None:
                if type(msg) in (Attach, AttachBoard):
                    waiting = msg
                else:
                    got.append((msg, None))
                continue
        remaining = deadline - time.monotonic()
        assert remaining > 0, f"only {len(got)} of {count} messages reached the worker"
        writable = [ends.channel] if ends.channel.backlogged else []
        readable, writable, _ = select.select([ends.inbox.sock], writable, [], remaining)
        if writable:
            ends.channel.flush()
        if readable:
            ends.inbox.read()
    return got


def nothing_more(ends: Ends) -> bool:
    """The worker holds no further message and none is waiting on its socket."""
    return ends.inbox.next_message() is None and not select.select([ends.inbox.sock], [], [], 0)[0]


def same_types(a: list, b: list) -> bool:
    """Equal, and of the same record types (NamedTuples compare equal to plain tuples)."""
    return a == b and [type(x) for x in a] == [type(x) for x in b]


def frame_bytes(msg) -> bytes:
    """``msg`` framed as ``multiprocessing.connection.Connection`` frames it (below 2 GiB)."""
    data = pickle.dumps(msg, pickle.HIGHEST_PROTOCOL)
    return struct.pack("!i", len(data)) + data


CONTROL = [  # what the main process sends besides Attach and AttachBoard
    Task(0, 0, 0, [3, 1, 4, 1, 5], SlotRef(0, 4096, 8192)),
    Task(0, 0, 1, 7, None),  # batch_size=None: one index
    Task(1, 2, 3, Draw(1, 4, 8, True, StreamPoint(4, {"pos": 12})), None),  # a draw that resumes a stream
    Reassign(0, 1, SlotRef(1, 0, 1 << 20)),
    Reassign(0, 2, None),
    Detach(0),
    Shutdown(),
]


# ---------------------------------------------------------------- framing
def test_frame_finds_a_complete_frame_and_nothing_sooner():
    body = pickle.dumps(Task(0, 0, 5, list(range(10)), None))
    buf = bytearray(struct.pack("!i", len(body)) + body + b"next")
    assert _frame(buf) == (4, 4 + len(body))
    for cut in range(4 + len(body)):  # every proper prefix: header or body incomplete
        assert _frame(buf[:cut]) is None, cut
    # Connection's header for 2 GiB or more: -1, then the size as 8 bytes
    huge = bytearray(struct.pack("!i", -1) + struct.pack("!Q", 3) + b"abc")
    assert _frame(huge) == (12, 15)
    for cut in range(len(huge)):
        assert _frame(huge[:cut]) is None, cut


def test_the_channel_frames_as_a_connection_does():
    """What the main side sends, a plain Connection reads (the framing is Connection's)."""
    ours, theirs = socket.socketpair()
    channel, conn = Channel(ours), Connection(theirs.detach())
    try:
        msgs = CONTROL + [Task(0, 0, 9, list(range(20000)), None)]  # one frame above 16 KiB
        for msg in msgs:
            channel.send(msg)
        assert not channel.backlogged
        got = []
        for _ in msgs:
            assert conn.poll(WAIT), "a message did not arrive"
            got.append(pickle.loads(conn.recv_bytes()))
        assert same_types(got, msgs)
    finally:
        channel.close()
        conn.close()


def test_the_workers_messages_reach_the_main_side_intact(ends):
    try:
        raise ValueError("bad sample 3")
    except ValueError as exc:
        error = RemoteError.capture(exc)
    msgs = [
        Ready(2, 12345),
        StartupFailed(2, error),
        Done(0, 0, -1, b"layout" * 10),
        Done(0, 1, -1, b"x" * 40000, StreamPoint(3, {"state": [1, 2]})),  # Connection writes header and body apart
        NeedSpace(0, 2, 1 << 22),
        Failed(0, 3, error, StreamPoint(4, None)),
        Exhausted(0, 4),
    ]
    for msg in msgs:
        worker_send(ends, msg)
    assert same_types(main_receive(ends.channel, len(msgs)), msgs)
    assert ends.channel.receive() == [] and not ends.channel.eof


def test_control_messages_round_trip_to_the_worker(ends, owned):
    msgs = [Attach(0, 1 << 20), AttachBoard(4096, 3, 1)] + CONTROL
    for msg in msgs:
        ends.channel.send(msg, segment(owned, b"seg") if type(msg) in (Attach, AttachBoard) else None)
    got = exchange(ends, len(msgs), owned)
    assert same_types([m for m, _ in got], msgs)
    assert [fd is not None for _, fd in got] == [type(m) in (Attach, AttachBoard) for m in msgs]
    assert nothing_more(ends)


def test_deferred_messages_leave_in_one_write_and_come_out_one_by_one():
    """Supervisor.send(defer=True) then flush(): one write for the lot, read in one go,
    cut into the messages in order."""

    class CountingSocket:  # the channel's socket, counting its writes
        def __init__(self, sock):
            self.sock, self.writes = sock, 0

        def send(self, *args):
            self.writes += 1
            return self.sock.send(*args)

        def __getattr__(self, name):
            return getattr(self.sock, name)

    e = Ends()
    try:
        counting = e.channel.sock = CountingSocket(e.channel.sock)
        msgs = [Task(0, 0, seq, list(range(seq, seq + 64)), SlotRef(0, seq * 4096, 4096)) for seq in range(12)]
        for msg in msgs:
            e.channel.send(msg, flush=False)
        assert e.channel.backlogged and counting.writes == 0
        assert not select.select([e.inbox.sock], [], [], 0)[0], "a deferred message left before flush()"
        e.channel.flush()
        assert not e.channel.backlogged and counting.writes == 1
        assert select.select([e.inbox.sock], [], [], WAIT)[0]
        e.inbox.read()  # all of it in one read
        got = []
        while (msg := e.inbox.next_message()) is not None:
            got.append(msg)
        assert same_types(got, msgs)
        assert nothing_more(e)
    finally:
        e.close()  # the counting socket passes close() on


# ---------------------------------------------------------------- frames across reads
def test_the_worker_reassembles_a_frame_fed_one_byte_at_a_time():
    main, theirs = socket.socketpair()  # a raw main side, to write byte by byte
    conn = Connection(theirs.detach())
    inbox = Inbox(conn.fileno())
    try:
        msgs = [Task(0, 0, 0, [1, 2, 3], SlotRef(0, 0, 4096)), Reassign(0, 0, None)]
        frames = [frame_bytes(m) for m in msgs]
        got = []
        for frame in frames:
            for i, byte in enumerate(frame):
                main.sendall(bytes([byte]))
                assert select.select([inbox.sock], [], [], WAIT)[0], "a byte did not arrive"
                inbox.read()
                msg = inbox.next_message()
                if i < len(frame) - 1:
                    assert msg is None, f"a message out of {i + 1} of its {len(frame)} bytes"
                else:
                    got.append(msg)
        assert same_types(got, msgs)
        assert inbox.next_message() is None
    finally:
        main.close()
        inbox.close()
        conn.close()


def test_the_main_side_reassembles_a_frame_fed_one_byte_at_a_time():
    ours, worker = socket.socketpair()  # a raw worker side, to write byte by byte
    channel = Channel(ours)
    try:
        msgs = [Done(0, 0, -1, b"layout"), NeedSpace(0, 1, 1 << 20)]
        got = []
        for msg in msgs:
            frame = frame_bytes(msg)
            for i, byte in enumerate(frame):
                worker.sendall(bytes([byte]))
                assert select.select([channel], [], [], WAIT)[0], "a byte did not arrive"
                frames = channel.receive()
                assert len(frames) == (i == len(frame) - 1), f"after {i + 1} of {len(frame)} bytes: {frames}"
                got += [pickle.loads(f) for f in frames]
        assert same_types(got, msgs) and not channel.eof
    finally:
        channel.close()
        worker.close()


def test_a_message_larger_than_a_read_reaches_the_worker_whole(ends):
    big = Task(0, 0, 1, b"\x07" * BIG, None)
    msgs = [Task(0, 0, 0, [1], None), big, Task(0, 0, 2, [2], None)]
    for msg in msgs:
        ends.channel.send(msg)  # the big one waits in the outbox: the socket takes less
    assert ends.channel.backlogged
    got = exchange(ends, len(msgs))
    assert same_types([m for m, _ in got], msgs)
    assert nothing_more(ends) and not ends.channel.backlogged


def test_a_message_larger_than_a_read_reaches_the_main_side_whole(ends):
    msgs = [Done(0, 0, -1, b"a"), Done(0, 1, -1, bytes(range(256)) * (BIG // 256)), Exhausted(0, 2)]
    # The worker's Connection blocks until the main side reads: send from a thread.
    sender = threading.Thread(target=lambda: [worker_send(ends, m) for m in msgs], daemon=True)
    sender.start()
    try:
        got = main_receive(ends.channel, len(msgs))
    finally:
        sender.join(WAIT)
    assert not sender.is_alive()
    assert same_types(got, msgs)


# ---------------------------------------------------------------- descriptors
def test_descriptors_arrive_in_their_places_and_work(ends, owned):
    """Each descriptor follows its Attach, two in a row keep their order, and each is
    the sender's file (its bytes, its inode; writes through it are shared)."""
    plan = [
        (Task(0, 0, 0, [0], None), None),
        (Attach(0, 4096), b"segment zero"),
        (Attach(1, 4096), b"segment one"),  # two in a row
        (Task(0, 0, 1, [1], SlotRef(1, 0, 4096)), None),
        (AttachBoard(4096, 2, 0), b"the board"),
        (Detach(0), None),
        (Attach(2, 4096), b"segment two"),
        (Shutdown(), None),
    ]
    sent = []
    for msg, data in plan:
        fd = None if data is None else segment(owned, data)
        sent.append(fd)
        ends.channel.send(msg, fd)
    got = exchange(ends, len(plan), owned)
    assert same_types([m for m, _ in got], [m for m, _ in plan])
    for (msg, data), mine, (_, theirs) in zip(plan, sent, got):
        if data is None:
            assert theirs is None
            continue
        assert theirs is not None and theirs != mine, msg
        assert content(theirs) == data, msg
        assert os.fstat(theirs).st_ino == os.fstat(mine).st_ino, msg
        os.pwrite(theirs, b"S", 0)
        assert content(mine) == b"S" + data[1:], msg
    assert nothing_more(ends)


def test_deferred_descriptors_keep_their_places_in_one_flush(ends, owned):
    """Supervisor.send(defer=True) with descriptors between tasks, then one flush()."""
    plan = [(Task(0, 0, 0, [0], None), None), (Attach(0, 64), b"A"), (Attach(1, 64), b"B"),
            (Task(0, 0, 1, [1], None), None), (Task(0, 0, 2, [2], None), None), (Attach(2, 64), b"C"),
            (Reassign(0, 1, None), None)]
    for msg, data in plan:
        ends.channel.send(msg, None if data is None else segment(owned, data), flush=False)
    assert not select.select([ends.inbox.sock], [], [], 0)[0], "a deferred message left before flush()"
    ends.channel.flush()
    got = exchange(ends, len(plan), owned)
    assert same_types([m for m, _ in got], [m for m, _ in plan])
    assert [None if fd is None else content(fd) for _, fd in got] == [data for _, data in plan]
    assert nothing_more(ends)


def test_a_read_ends_at_a_descriptors_byte(ends, owned):
    """What Inbox relies on (its docstring): with everything already on the socket, a
    read stops at the byte that carries a descriptor, so each read holds at most one."""
    plan = [(Task(0, 0, 0, [0], None), None), (Attach(0, 64), b"A"), (Task(0, 0, 1, [1], None), None),
            (Attach(1, 64), b"B"), (Task(0, 0, 2, [2], None), None)]
    for msg, data in plan:
        ends.channel.send(msg, None if data is None else segment(owned, data), flush=False)
    ends.channel.flush()
    assert not ends.channel.backlogged
    rounds = []
    while True:
        assert select.select([ends.inbox.sock], [], [], WAIT)[0]
        ends.inbox.read()
        msgs = []
        while (msg := ends.inbox.next_message()) is not None:
            msgs.append(msg)
            if type(msg) is Attach:
                fd = ends.inbox.take_fd()
                assert fd is not None, "an Attach read without its descriptor"
                owned.append(fd)
                msgs.append(content(fd))
                break
        rounds.append(msgs)
        if type(msgs[-1]) is Task and msgs[-1].seq == 2:
            break
        assert len(rounds) < 5, rounds
    assert rounds == [[plan[0][0], plan[1][0], b"A"], [plan[2][0], plan[3][0], b"B"], [plan[4][0]]]


def test_the_channel_sends_a_duplicate_and_closes_it_once_sent(ends, owned):
    """The caller may close its descriptor while the message still waits; the channel's
    duplicate is closed once it has left, or when the channel closes."""
    fill = Task(0, 0, 0, b"\0" * BIG, None)  # the socket takes only part of it
    ends.channel.send(fill)
    assert ends.channel.backlogged
    fd = segment(owned, b"kept")
    baseline = set(open_fds())
    ends.channel.send(Attach(0, 64), fd)
    os.close(owned.pop())  # the caller's own, while the Attach waits
    assert len(set(open_fds()) - baseline) == 1, "the channel should hold one duplicate while queued"
    got = exchange(ends, 2, owned)
    assert same_types([m for m, _ in got], [fill, Attach(0, 64)]) and content(got[1][1]) == b"kept"
    os.close(owned.pop())
    assert set(open_fds()) <= baseline - {fd}, "the duplicate stayed open after it was sent"

    ends.channel.send(fill)
    ends.channel.send(Attach(1, 64), segment(owned, b"never sent"))
    assert ends.channel.backlogged
    before_close = set(open_fds())
    ends.channel.close()  # with the Attach still queued
    assert len(before_close - set(open_fds())) == 2, "closing should close the socket and the duplicate"


def test_descriptors_not_taken_are_closed_with_the_inbox(ends, owned):
    for sid in range(3):
        ends.channel.send(Attach(sid, 64), segment(owned, b"x"), flush=False)
    ends.channel.flush()
    baseline = set(open_fds())
    for _ in range(3):  # one read per descriptor; none taken
        assert select.select([ends.inbox.sock], [], [], WAIT)[0]
        ends.inbox.read()
    assert len(set(open_fds()) - baseline) == 3, "the worker should hold the three descriptors"
    ends.inbox.close()
    assert set(open_fds()) <= baseline


# ---------------------------------------------------------------- never blocking
def test_the_main_side_never_blocks_and_a_full_socket_queues_in_order(ends, owned):
    """With the worker not reading, sends return at once and queue (descriptors too);
    the worker can still send to the main side meanwhile (the deadlock channel.py
    avoids); once the worker reads, flushing delivers everything in order."""
    assert ends.channel.sock.getblocking() is False
    plan = []
    for seq in range(48):  # 48 x 64 KiB: far more than the socket's buffer
        plan.append((Task(0, 0, seq, bytes([seq]) * (64 << 10), None), None))
        if seq % 8 == 3:
            plan.append((Attach(seq, 64), b"segment %d" % seq))
    started = time.monotonic()
    for msg, data in plan:
        fd = None if data is None else os.memfd_create("channel-test")
        if fd is not None:
            os.write(fd, data)
        ends.channel.send(msg, fd)
        if fd is not None:
            os.close(fd)  # the channel keeps its own duplicate
    assert time.monotonic() - started < WAIT
    assert ends.channel.backlogged
    ends.channel.flush()  # nothing more fits: returns, still queued
    assert ends.channel.backlogged

    worker_send(ends, Done(0, 0, -1, b"while the main side's outbox is full"))
    assert main_receive(ends.channel, 1) == [Done(0, 0, -1, b"while the main side's outbox is full")]

    got = exchange(ends, len(plan), owned)
    assert same_types([m for m, _ in got], [m for m, _ in plan])
    assert [None if fd is None else content(fd) for _, fd in got] == [data for _, data in plan]
    assert not ends.channel.backlogged and nothing_more(ends)


@pytest.mark.timeout(10)  # a read that waits fails here, not after the module's 30 s
def test_an_inbox_read_with_nothing_waiting_returns_at_once(ends):
    """The worker's socket stays blocking (its Connection shares it), yet a read with
    nothing there must not wait."""
    assert ends.inbox.sock.getblocking()
    started = time.monotonic()
    ends.inbox.read()
    assert time.monotonic() - started < 1.0
    assert ends.inbox.next_message() is None and ends.inbox.take_fd() is None
    assert not fcntl.fcntl(ends.conn.fileno(), fcntl.F_GETFL) & os.O_NONBLOCK, "the Connection's socket became non-blocking"


# ---------------------------------------------------------------- end-of-file, a closed peer
def test_the_main_side_sees_end_of_file_after_the_last_messages(ends):
    worker_send(ends, Ready(0, 1))
    worker_send(ends, Done(0, 0, -1, b"last"))
    os.write(ends.conn.fileno(), frame_bytes(Done(0, 1, -1, b"cut short"))[:9])  # a frame the worker died writing
    ends.close_worker()
    frames = []
    deadline = time.monotonic() + WAIT
    while not ends.channel.eof:
        assert time.monotonic() < deadline, "no end-of-file"
        select.select([ends.channel], [], [], WAIT)
        frames += ends.channel.receive()
    assert same_types([pickle.loads(f) for f in frames], [Ready(0, 1), Done(0, 0, -1, b"last")])
    assert ends.channel.receive() == [] and ends.channel.eof  # and again, without raising


def test_sending_to_a_closed_worker_breaks_the_channel_quietly(ends, owned):
    fill = Task(0, 0, 0, b"\0" * BIG, None)
    ends.channel.send(fill)
    ends.channel.send(Attach(0, 64), segment(owned, b"x"))  # a duplicate in the outbox
    assert ends.channel.backlogged and not ends.channel.broken
    baseline = set(open_fds())
    ends.close_worker()
    ends.channel.flush()
    assert ends.channel.broken and not ends.channel.backlogged
    assert len(baseline - set(open_fds())) == 3, "the outbox's duplicate should be closed (besides the worker's two)"
    after = set(open_fds())
    ends.channel.send(Attach(1, 64), segment(owned, b"y"))  # a no-op now: no duplicate made
    ends.channel.send(Shutdown(), flush=False)
    ends.channel.flush()
    assert set(open_fds()) - after == {owned[-1]} and not ends.channel.backlogged


def test_the_worker_gets_end_of_file_after_what_was_sent(ends, owned):
    ends.channel.send(Task(0, 0, 0, [0], None))
    ends.channel.send(Attach(0, 64), segment(owned, b"A"))
    ends.channel.send(Shutdown())
    ends.channel.close()
    got = exchange(ends, 3, owned)
    assert same_types([m for m, _ in got], [Task(0, 0, 0, [0], None), Attach(0, 64), Shutdown()])
    assert content(got[1][1]) == b"A"
    assert select.select([ends.inbox.sock], [], [], WAIT)[0]
    with pytest.raises(EOFError):
        ends.inbox.read()
    with pytest.raises(EOFError):  # and again
        ends.inbox.read()


def test_closing_with_a_backlog_drops_it_and_the_worker_gets_end_of_file(ends, owned):
    """Supervisor._close_channel: the worker reads what had left, then end-of-file; the
    queued descriptors are closed, not leaked."""
    for seq in range(8):
        ends.channel.send(Task(0, 0, seq, b"\1" * (256 << 10), None))
        ends.channel.send(Attach(seq, 64), segment(owned, b"s"))
    assert ends.channel.backlogged
    ends.channel.close()
    deadline = time.monotonic() + WAIT
    with pytest.raises(EOFError):
        while True:
            assert time.monotonic() < deadline, "no end-of-file"
            if select.select([ends.inbox.sock], [], [], WAIT)[0]:
                ends.inbox.read()
            while (msg := ends.inbox.next_message()) is not None:
                assert type(msg) in (Task, Attach)
                if type(msg) is Attach:
                    fd = ends.inbox.take_fd()
                    if fd is None:  # its byte is still on the socket
                        assert select.select([ends.inbox.sock], [], [], WAIT)[0]
                        ends.inbox.read()
                        fd = ends.inbox.take_fd()
                    assert fd is not None
                    owned.append(fd)


def test_a_descriptor_the_worker_cannot_take_is_an_error_not_a_wait(ends, owned):
    ends.channel.send(Attach(0, 64), segment(owned, b"A"))
    ends.channel.send(Task(0, 0, 1, [1], None))
    assert select.select([ends.inbox.sock], [], [], WAIT)[0]
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    filler: list[int] = []
    try:
        # no descriptor number left: the limit just above the highest open one, the gaps filled
        resource.setrlimit(resource.RLIMIT_NOFILE, (max(open_fds()) + 1, hard))
        with pytest.raises(OSError):
            while True:
                filler.append(os.open("/dev/null", os.O_RDONLY))
        # the kernel drops the descriptor (MSG_CTRUNC): the worker fails, naming the limit,
        # and the main process learns of it as a dead worker, instead of a wait for ever
        with pytest.raises(ShmloadError, match=r"run out of file descriptors .*ulimit -n"):
            ends.inbox.read()
    finally:
        for f in filler:
            os.close(f)
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))
