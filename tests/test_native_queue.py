"""The control queue's compiled ends (``_core/_queue.c``) against control.py's Python ones:
the same records, the same bytes left in the segment, the same errors, either kind of end
reading what the other wrote; and no reference or memory held per call (valgrind runs
this file too: .ci/valgrind-native)."""

from __future__ import annotations

import mmap
import os
import random

import pytest

from shmload._core import native as native_mod
from shmload._transport import queues as control
from shmload._transport.control import ControlBlock
from shmload._transport.queues import SEM_SLOT

from .helpers import assert_holds_nothing

pytestmark = [pytest.mark.timeout(60), pytest.mark.pure]
needs_core = pytest.mark.skipif(native_mod.native is None, reason=f"no compiled core: {native_mod.DESCRIPTION}")
core = native_mod.native


def queue(kinds=("python", "python")):
    """A fresh one-worker control segment, and a writer and a reader of its task queue of
    the given kinds ("python" or "compiled")."""
    mm = mmap.mmap(-1, ControlBlock.size(1))
    cb = ControlBlock(mm, 1)  # (initialises the semaphores)
    q = cb.tasks[0].q
    writer = control.Producer(q) if kinds[0] == "python" else control._CompiledProducer(q, core.QueueWriter)
    reader = control.Consumer(q) if kinds[1] == "python" else control._CompiledConsumer(q, core.QueueReader)
    return mm, cb, writer, reader


STEPS = int(os.environ.get("SHMLOAD_QUEUE_STEPS", "3000"))  # (fewer under valgrind: .ci/valgrind-native)


def script(seed: int, writer, reader, steps: int = STEPS) -> list:
    """Random puts (of one to three parts, bytes or memoryviews, every size up to a
    record's maximum), takes and counts of the records pending, filling the queue now and
    then: what each call returned."""
    rng = random.Random(seed)
    out = []
    for i in range(steps):
        if rng.random() < 0.55:
            n = rng.choice((0, 1, 7, 8, 9, rng.randrange(0, writer.max_record + 1)))
            body = bytes([i % 251]) * n
            cut = rng.randrange(0, n + 1)
            parts = [body] if rng.random() < 0.5 else [body[:cut], memoryview(body[cut:]), b""]
            out.append(("put", writer.put(*parts)))
        else:
            out.append(("take", reader.take()))
        if rng.random() < 0.2:
            out.append(("pending", writer.pending()))
    return out


@needs_core
@pytest.mark.parametrize("seed", range(4))
def test_both_kinds_return_the_same_and_leave_the_same_bytes(seed):
    runs = {}
    for kind in ("python", "compiled"):
        mm, cb, writer, reader = queue((kind, kind))
        runs[kind] = script(seed, writer, reader), bytes(mm)
        writer.close(), reader.close(), cb.close()
    assert runs["python"][0] == runs["compiled"][0]
    assert ("put", False) in runs["python"][0], "the queue never filled"
    assert sum(1 for k, v in runs["python"][0] if k == "take" and v is not None) > STEPS // 6
    assert runs["python"][1] == runs["compiled"][1]


@needs_core
@pytest.mark.parametrize("kinds", [("python", "compiled"), ("compiled", "python")])
def test_either_kind_reads_what_the_other_wrote(kinds):
    mm, cb, writer, reader = queue(kinds)
    rng = random.Random(5)
    pending = []
    for i in range(STEPS):
        if rng.random() < 0.5 and writer.put(rec := bytes([i % 256]) * rng.randrange(0, 5000)):
            pending.append(rec)
        elif (got := reader.take()) is not None:
            assert got == pending.pop(0)
    while (got := reader.take()) is not None:
        assert got == pending.pop(0)
    assert not pending


@needs_core
def test_a_wait_for_room_frees_as_a_take_does():
    _, _, writer, reader = queue(("compiled", "compiled"))
    while writer.put(b"x" * 1000):
        pass
    assert reader.take() == b"x" * 1000
    writer.wait_for_room(1)  # takes the free token the take posted
    assert writer.put(b"y" * 1000) and not writer.put(b"z" * 1000)


@pytest.mark.parametrize("kind", ["python", pytest.param("compiled", marks=needs_core)])
def test_a_corrupt_length_is_an_error_not_a_read_past_the_queue(kind):
    mm, cb, writer, reader = queue(("python", kind))
    assert writer.put(b"12345678")
    data = cb.tasks[0].q.data
    mm[data:data + 4] = (10**9).to_bytes(4, "little")
    with pytest.raises(ValueError, match=r"a control record of 1000000000 bytes at offset 0 overruns its queue "
                                         r"of \d+ bytes"):
        reader.take()


@needs_core
def test_a_compiled_end_checks_its_area_against_the_mapping():
    mm = mmap.mmap(-1, 4096)
    with pytest.raises(ValueError, match="data area of 8192 bytes at offset 0 is not within a mapping of 4096"):
        core.QueueWriter(mm, 0, 8192, 0, SEM_SLOT)
    with pytest.raises(ValueError, match="not within a mapping of 4096 bytes .or not a multiple of 8"):
        core.QueueReader(mm, 0, 1001, 0, SEM_SLOT)
    with pytest.raises(ValueError, match="the free semaphore at offset 4090 is not within the mapping"):
        core.QueueWriter(mm, 128, 1024, 0, 4090)
    with pytest.raises(ValueError, match="the items semaphore at offset 3 is not within the mapping, aligned"):
        core.QueueReader(mm, 128, 1024, 3, SEM_SLOT)
    with pytest.raises(BufferError, match="not writable"):
        core.QueueWriter(b"read-only", 0, 16, 0, 0)
    mm.close()  # (the refused ends let go of it)


@needs_core
def test_a_closed_compiled_end_refuses_and_lets_the_mapping_close():
    mm, cb, writer, reader = queue(("compiled", "compiled"))
    with pytest.raises(BufferError):
        mm.close()  # (the ends hold it)
    writer.close(), reader.close(), cb.close()
    for call in (lambda: writer.put(b"x"), reader.take, writer.reset, writer.pending):
        with pytest.raises(ValueError, match="this queue end is closed"):
            call()
    mm.close()


@needs_core
def test_the_compiled_ends_hold_no_references_or_memory():
    _, _, writer, reader = queue(("compiled", "compiled"))
    payload, view = b"p" * 300, memoryview(b"q" * 700)

    def run():
        for _ in range(40):  # fills the queue: the refusals and the frees are run too
            writer.put(payload, view, b"")
            writer.pending()
        while reader.take() is not None:
            pass

    assert_holds_nothing(run, [payload, view], 300)


@pytest.mark.parametrize("kinds", [("python", "python"), pytest.param(("compiled", "compiled"), marks=needs_core),
                                   pytest.param(("compiled", "python"), marks=needs_core),
                                   pytest.param(("python", "compiled"), marks=needs_core)])
def test_pending_counts_the_records_put_and_not_yet_taken(kinds):
    _, _, writer, reader = queue(kinds)
    assert writer.pending() == 0
    counts = []
    for body in (b"a", b"bb", b"ccc"):
        assert writer.put(body)
        counts.append(writer.pending())
    assert counts == [1, 2, 3]
    assert reader.take() == b"a" and writer.pending() == 2
    assert reader.take() == b"bb" and reader.take() == b"ccc" and reader.take() is None
    assert writer.pending() == 0


@pytest.mark.parametrize("kind", ["python", pytest.param("compiled", marks=needs_core)])
def test_a_failing_post_is_the_same_oserror_both_ways(kind):
    mm, cb, writer, _ = queue((kind, "python"))
    cb.tasks[0].q.items.init(2**31 - 1)  # SEM_VALUE_MAX: one more post overflows
    with pytest.raises(OSError, match=r"^\[Errno 75\] sem_post: Value too large for defined data type$"):
        writer.put(b"x")
