"""Split batches (issue 21): the parts of a batch, which worker loads which span, and a
batch put together from spans that equals the batch loaded whole. The parts, spans and
their dispatch are tested alone first, as internals (``shmload._batching``,
``shmload._session``), then through the loader."""

from __future__ import annotations

import collections
import os
import random
import re
import time

import numpy as np
import pytest

import shmload
import shmload._session.spans
from shmload import CollateError, WorkerDiedError
from shmload._batching.layout import ArraySpec, Layout, Leaf, ObjectValue, Seq, widened
from shmload._batching.parts import Span, bounds, cuts_within, plan_spans, span, tail_wait
from shmload._batching.splitting import SplitBatch, merged
from shmload._ordering import seeding
from shmload._session.dispatch import Dispatcher, InFlight
from shmload._transport.messages import Indices, Task

from .helpers import DyingDataset, SleepyDataset

pytestmark = [pytest.mark.timeout(90),  # (3 workers on a 2-core machine: torch's warning, in its words)
              pytest.mark.filterwarnings("ignore:This DataLoader will create 3 worker processes")]


# ---------------------------------------------------------------- pure: parts and spans
@pytest.mark.pure
def test_bounds_cut_a_batch_into_even_contiguous_parts_larger_first():
    assert bounds(10, 2) == [0, 5, 10]
    assert bounds(10, 3) == [0, 4, 7, 10]
    assert bounds(3, 8) == [0, 1, 2, 3]  # never more parts than rows
    assert bounds(7, 1) == [0, 7]
    assert bounds(1, 4) == [0, 1]


@pytest.mark.pure
def test_cuts_are_where_a_new_part_begins_in_what_a_task_loads():
    assert cuts_within(10, 1, None) == []
    assert cuts_within(10, 3, None) == [(4, 1), (7, 2)]  # the whole batch: reseed before rows 4 and 7
    sp = span(10, 3, 1, 3)  # parts 1 and 2: rows 4..9
    assert sp == Span(1, 3, 4, 10, 10)
    assert cuts_within(10, 3, sp) == [(3, 2)]  # position 3 of the span is row 7
    assert cuts_within(10, 3, span(10, 3, 2, 3)) == []


@pytest.mark.pure
def test_idle_workers_share_a_batch_and_busy_ones_leave_it_whole():
    # the epoch's first batch: both idle, each takes half
    assert plan_spans(32, 2, [0, 0], [True, True]) == [(0, Span(0, 1, 0, 16, 32)), (1, Span(1, 2, 16, 32, 32))]
    # one worker still holds a whole batch: giving it half finishes later than one idle worker alone
    assert plan_spans(32, 2, [32, 0], [True, True]) == [(1, Span(0, 2, 0, 32, 32))]
    # four parts, two workers idle and one busy: two spans of two parts on the idle ones
    got = plan_spans(32, 4, [0, 64, 0], [True, True, True])
    assert [(w, s.first, s.end) for w, s in got] == [(0, 0, 2), (2, 2, 4)]
    # a worker without room takes nothing; with no room anywhere, nothing is planned
    assert [w for w, _ in plan_spans(32, 2, [0, 0], [False, True])] == [1]
    assert plan_spans(32, 2, [0, 0], [False, False]) == []


@pytest.mark.pure
def test_forced_splitting_uses_every_worker_with_room_even_when_it_finishes_no_sooner():
    assert len(plan_spans(32, 4, [0, 100, 100], [True, True, True])) == 1
    got = plan_spans(32, 4, [0, 100, 100], [True, True, True], force=True)
    assert [(s.first, s.end) for _, s in got] == [(0, 2), (2, 3), (3, 4)]
    assert got[0][0] == 0  # the largest span to the least loaded worker


@pytest.mark.pure
def test_at_the_end_a_batch_waits_for_a_worker_about_to_be_idle_and_not_for_a_slow_one():
    # w0 idle; w1 holds 32 rows at 10 ms a row (0.32 s) and began 0.30 s ago: due in 0.02 s
    assert tail_wait([True, False], [0, 32], [None, 0.0], 0.30, 0.01, 2) == pytest.approx(0.032)  # a tenth, at least
    assert tail_wait([True, False], [0, 32], [None, 0.0], 0.20, 0.01, 2) == pytest.approx(0.12)  # until its end
    assert tail_wait([True, False], [0, 32], [None, 0.0], 0.10, 0.01, 2) == 0  # not half way: send now
    assert tail_wait([True, False], [0, 32], [None, 0.0], 0.45, 0.01, 2) == 0  # late beyond a quarter: slow
    assert tail_wait([True, True], [0, 0], [None, None], 0.3, 0.01, 2) == 0  # enough idle workers for the parts
    assert tail_wait([True, False], [0, 32], [None, 0.0], 0.3, None, 2) == 0  # nothing measured yet
    # the first of two busy workers to be done sets the wait
    assert tail_wait([True, False, False], [0, 32, 32], [None, 0.0, 0.1], 0.3, 0.01, 3) == pytest.approx(0.032)


@pytest.mark.pure
def test_the_dispatcher_counts_rows_held_and_when_each_worker_began_its_task():
    d = Dispatcher(3, 4)
    whole = Task(1, 0, 0, Indices(np.arange(8)), None)
    part = Task(1, 0, 1, [8, 9, 10], None, 2, span(6, 2, 1, 2))
    d.assign(0, (1, 0), InFlight(whole, None))
    d.assign(1, (1, 1), InFlight(part, None))
    d.assign(1, (1, 2), InFlight(Task(1, 0, 2, 5, None), None))  # one index (batch_size=None) counts one
    assert d.loads() == [8, 4, 0] and d.idle_workers() == 1
    assert d.busy_since[0] is not None and d.busy_since[2] is None
    began = d.busy_since[1]
    d.complete(1, (1, 1))
    assert d.busy_since[1] >= began  # its next task begins now
    d.complete(1, (1, 2))
    assert d.busy_since[1] is None and d.loads() == [8, 0, 0]


@pytest.mark.pure
def test_a_part_is_seeded_apart_and_part_zero_keeps_the_batch_seed():
    assert seeding.batch_seed(3, 1, 7, part=0) == seeding.batch_seed(3, 1, 7)
    seeds = {seeding.batch_seed(3, 1, 7, part=p) for p in range(8)} | {seeding.batch_seed(3, 1, 8)}
    assert len(seeds) == 9


def _layout(rows: int, names: list | None = None) -> Layout:
    leaves = (ArraySpec(0, (rows, 3), np.dtype(np.float32)), ArraySpec(64 * -(-(rows * 12) // 64), (rows,),
                                                                         np.dtype(np.int64)))
    structure = Seq("list", tuple, (Leaf(0), Leaf(1)))
    if names is not None:
        leaves += (ObjectValue(names),)
        structure = Seq("list", tuple, (Leaf(0), Leaf(1), Leaf(2)))
    return Layout(structure, leaves, leaves[1].offset + rows * 8)


@pytest.mark.pure
def test_a_span_layout_widens_to_the_whole_batch_layout():
    assert widened(_layout(3), 10) == _layout(10)
    assert widened(_layout(3, ["a", "b", "c"]), 10) == _layout(10, ["a", "b", "c"])


@pytest.mark.pure
def test_spans_merge_with_object_leaves_joined_in_order_and_refuse_to_merge_when_they_differ():
    a, b = widened(_layout(2, ["x0", "x1"]), 4), widened(_layout(2, ["x2", "x3"]), 4)
    assert merged([a, b]) == _layout(4, ["x0", "x1", "x2", "x3"])
    assert merged([widened(_layout(2), 4)] * 2) == _layout(4)
    other_dtype = a._replace(leaves=(a.leaves[0]._replace(dtype=np.dtype(np.float64)),) + a.leaves[1:])
    assert merged([a, other_dtype]) is None
    assert merged([widened(_layout(2), 4), a]) is None  # a leaf more


@pytest.mark.pure
def test_a_split_batch_waits_for_every_span_and_a_collate_error_loads_it_again_whole():
    spans = {0: span(8, 2, 0, 1), 1: span(8, 2, 1, 2)}
    split = SplitBatch(0, 5, list(range(8)), 2, spans, slot=None)
    split.done(1, widened(_layout(4), 8))
    assert not split.finished
    split.failed(0, shmload.errors.RemoteError("CollateError", None, "shapes differ", ""))
    assert split.finished and split.redo and split.error is None
    failing = SplitBatch(0, 5, list(range(8)), 2, spans, slot=None)
    failing.failed(1, shmload.errors.RemoteError("ValueError", None, "late", ""))
    failing.failed(0, shmload.errors.RemoteError("KeyError", None, "early", ""))
    assert failing.error[0] == 0  # the earliest rows' error, as loading the batch whole raises it


@pytest.mark.pure
def test_a_redo_before_an_error_loads_the_batch_again_and_a_redo_after_one_leaves_the_error():
    """A batch loaded whole stops at its first bad sample: a collate error in an earlier
    span than a dataset error is the batch's (loaded again whole, it raises it), and a
    dataset error in an earlier span than a collate error is the batch's."""
    spans = {0: span(8, 2, 0, 1), 1: span(8, 2, 1, 2)}
    early_redo = SplitBatch(0, 5, list(range(8)), 2, spans, slot=None)
    early_redo.failed(1, shmload.errors.RemoteError("KeyError", None, "late", ""))
    early_redo.failed(0, shmload.errors.RemoteError("RowwiseTypeMismatch", None, "types", ""))
    assert early_redo.finished and early_redo.redo
    late_redo = SplitBatch(0, 5, list(range(8)), 2, spans, slot=None)
    late_redo.failed(1, shmload.errors.RemoteError("CollateError", None, "shapes", ""))
    late_redo.failed(0, shmload.errors.RemoteError("KeyError", None, "early", ""))
    assert late_redo.finished and not late_redo.redo and late_redo.error[0] == 0


@pytest.mark.pure
def test_a_batch_loaded_again_whole_goes_to_a_worker_holding_no_later_batch():
    """A worker loads its tasks in order: behind a later batch that waits for a larger
    slot, the batch sent again (an earlier one, which the allocator serves first) would
    never be loaded. So it goes to a worker holding no later batch, even a busier one."""
    from types import SimpleNamespace

    from shmload._session.spans import SplitBatches

    dispatcher = Dispatcher(3, 8)
    for wid, seqs in ((0, [9]), (1, [3, 4]), (2, [7])):
        for seq in seqs:
            dispatcher.assign(wid, (1, seq), InFlight(Task(1, 0, seq, [seq], None), None))
    sent = []
    session = SimpleNamespace(iteration=1, dispatcher=dispatcher, worker_ids=lambda: [0, 1, 2],  # (spans.SpanHost)
                              send=lambda wid, task, defer=False: sent.append((wid, task.seq)))
    split = SplitBatch(0, 5, list(range(8)), 2, {0: span(8, 2, 0, 1), 2: span(8, 2, 1, 2)}, slot=None)
    SplitBatches(session)._send_whole(split)
    assert sent == [(1, 5)]  # worker 1 holds two tasks, but both before batch 5
    assert [e.task.seq for e in dispatcher.held_by(1)] == [3, 4, 5]


def test_a_failure_to_size_the_ring_for_a_split_batch_loads_it_whole_and_loses_nothing(monkeypatch):
    """The ring is sized by the first span's NeedSpace, while the session reads its
    workers' messages: a shared-memory error there must not escape (it would lose the
    messages read with it and leave the span's worker waiting). The batch is loaded
    again whole, whose slot is asked for where growth may fail safely (here it then
    succeeds)."""
    from shmload._transport.ring import Ring
    from shmload.errors import SharedMemoryError

    failures = []
    grow = Ring.grow_capacity

    def failing_once(self, *args, **kwargs):
        if not failures:
            failures.append(args)
            raise SharedMemoryError("no space left in /dev/shm (injected)")
        return grow(self, *args, **kwargs)

    monkeypatch.setattr(Ring, "grow_capacity", failing_once)
    want = _batches(shmload.DataLoader(Augmented(24), batch_size=8, seed=1))
    with shmload.DataLoader(Augmented(24), batch_size=8, num_workers=2, split_batches=True, seed=1,
                            timeout=30) as loader:
        got = _batches(loader)
    assert failures and _equal(got, want)


@pytest.mark.pure
def test_a_note_is_kept_where_exceptions_have_no_add_note():
    from shmload._session.spans import _add_note

    class Old:  # an exception of Python 3.10, which has no add_note
        pass

    old = Old()
    _add_note(old, "first")
    _add_note(old, "second")
    assert old.__notes__ == ["first", "second"]
    new = ValueError("x")
    _add_note(new, "note")
    assert new.__notes__ == ["note"]


# ---------------------------------------------------------------- through the loader
class Augmented:
    """Samples from the global RNGs (as random augmentations are), a label and a name;
    ``delay`` seconds per sample."""

    def __init__(self, n: int = 48, delay: float = 0.0):
        self.n, self.delay = n, delay

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int):
        if self.delay:
            time.sleep(self.delay)
        info = shmload.get_worker_info()
        return (np.random.rand(3).astype(np.float32) + i, random.random(), f"s{i}",
                -1 if info is None else info.id)


def _batches(loader) -> list:
    return [(b[0].copy(), b[1].copy(), list(b[2])) for b in loader]


def _equal(got: list, want: list) -> bool:
    return len(got) == len(want) and all(
        np.array_equal(g[0], w[0]) and np.array_equal(g[1], w[1]) and g[2] == w[2] for g, w in zip(got, want))


@pytest.mark.parametrize("parts", [2, 3])
def test_batches_are_bit_identical_for_any_workers_split_or_not(parts, start_method):
    kw = dict(batch_size=7, shuffle=True, seed=11, batch_parts=parts, timeout=30)
    want = _batches(shmload.DataLoader(Augmented(), **kw))
    for workers, split in [(1, None), (2, True), (2, None), (3, True)]:
        with shmload.DataLoader(Augmented(), num_workers=workers, split_batches=split,
                                multiprocessing_context=start_method, **kw) as loader:
            assert _equal(_batches(loader), want), (workers, split)


def test_split_batches_under_every_start_method(all_start_methods):
    kw = dict(batch_size=6, shuffle=True, seed=4, timeout=60)
    want = _batches(shmload.DataLoader(Augmented(24), **kw))
    with shmload.DataLoader(Augmented(24), num_workers=2, split_batches=True,
                            multiprocessing_context=all_start_methods, **kw) as loader:
        assert _equal(_batches(loader), want)


def test_only_the_first_and_last_sixteen_batches_have_parts_unless_every_batch_is_split():
    kw = dict(batch_size=2, seed=6, timeout=30)  # 120 samples: 60 batches
    default = _batches(shmload.DataLoader(Augmented(120), **kw))
    unsplit = _batches(shmload.DataLoader(Augmented(120), split_batches=False, **kw))
    everywhere = _batches(shmload.DataLoader(Augmented(120), split_batches=True, **kw))
    differs = [not np.array_equal(d[0], u[0]) for d, u in zip(default, unsplit)]
    assert differs == [True] * 16 + [False] * 28 + [True] * 16  # (part 1 of each edge batch has its own seed)
    assert all(not np.array_equal(e[0], u[0]) for e, u in zip(everywhere, unsplit))
    with shmload.DataLoader(Augmented(120), num_workers=2, **kw) as loader:
        assert _equal(_batches(loader), default)


@pytest.mark.pure
def test_parts_change_the_seeding_and_split_batches_false_keeps_one_seed_per_batch():
    kw = dict(batch_size=8, seed=2, timeout=30)
    two = _batches(shmload.DataLoader(Augmented(), **kw))
    one = _batches(shmload.DataLoader(Augmented(), split_batches=False, **kw))
    assert np.array_equal(two[0][0][:4], one[0][0][:4])  # part 0 keeps the batch's seed
    assert not np.array_equal(two[0][0][4:], one[0][0][4:])  # part 1 has its own
    assert _equal(one, _batches(shmload.DataLoader(Augmented(), batch_parts=1, **kw)))


def _loaders_of(batches) -> list[list[int]]:
    return [sorted(set(b[3].tolist())) for b in batches]


def test_by_default_the_first_and_last_batches_are_split_and_the_rest_are_whole():
    with shmload.DataLoader(Augmented(48, delay=0.004), batch_size=6, num_workers=2, timeout=30) as loader:
        epochs = [_loaders_of(list(loader)) for _ in range(3)]
    who = epochs[0]
    assert who[0] == [0, 1]
    assert all(len(w) == 1 for w in who[1:-2]), who
    # The last batch is split when a worker is idle (or about to be) as it is sent, which
    # depends on the machine's timing: on a loaded one a worker may still be busy, so in
    # at least one of three epochs (the rule itself is tested without timing: tail_wait above).
    assert any(w[-1] == [0, 1] for w in epochs), epochs


def test_split_batches_false_never_splits_and_true_always_does():
    # deep queues: True splits over the workers with room, and with torch's 2 (the
    # automatic depth of batches this slow) a worker two spans ahead has none
    kw = dict(batch_size=6, num_workers=2, timeout=30, prefetch_factor=16)
    with shmload.DataLoader(Augmented(24, delay=0.002), split_batches=False, **kw) as loader:
        assert all(len(w) == 1 for w in _loaders_of(list(loader)))
    with shmload.DataLoader(Augmented(24, delay=0.002), split_batches=True, **kw) as loader:
        assert all(w == [0, 1] for w in _loaders_of(list(loader)))


class GetitemsAugmented(Augmented):
    def __getitems__(self, indices):
        return [self[i] for i in indices]


def _worker_ids(samples):
    from shmload import default_collate
    return default_collate(samples)


def test_getitems_and_collate_fn_batches_are_never_split():
    kw = dict(batch_size=6, num_workers=2, timeout=30, split_batches=True)
    with shmload.DataLoader(GetitemsAugmented(24), **kw) as loader:
        assert all(len(w) == 1 for w in _loaders_of(list(loader)))
    with shmload.DataLoader(Augmented(24), collate_fn=_worker_ids, **kw) as loader:
        assert all(len(w) == 1 for w in _loaders_of(list(loader)))


def test_in_order_false_delivers_every_split_batch_once():
    kw = dict(batch_size=5, shuffle=True, seed=3, timeout=30)
    want = sorted(tuple(b[2]) for b in _batches(shmload.DataLoader(Augmented(), **kw)))
    with shmload.DataLoader(Augmented(), num_workers=2, split_batches=True, in_order=False, **kw) as loader:
        assert sorted(tuple(b[2]) for b in _batches(loader)) == want


class Mixed:
    """Sample i: a label that is an int, except a float at ``float_at``; an array whose
    length is 3, except 4 at ``long_at``."""

    def __init__(self, n=16, float_at=None, long_at=None, fail_at=None):
        self.n, self.float_at, self.long_at, self.fail_at = n, float_at, long_at, fail_at

    def __len__(self):
        return self.n

    def __getitem__(self, i):
        if i == self.fail_at:
            raise KeyError(f"no sample {i}")
        return np.full(4 if i == self.long_at else 3, i, np.int16), (float(i) if i == self.float_at else i)


def test_a_type_promoted_in_one_span_only_gives_the_batch_loaded_whole():
    kw = dict(batch_size=8, timeout=30)
    want = list(shmload.DataLoader(Mixed(float_at=6), **kw))
    with shmload.DataLoader(Mixed(float_at=6), num_workers=2, split_batches=True, **kw) as loader:
        got = list(loader)
    assert got[0][1].dtype == want[0][1].dtype and want[0][1].dtype.kind == "f"
    assert all(np.array_equal(g[0], w[0]) and np.array_equal(g[1], w[1]) for g, w in zip(got, want))


def test_a_sample_that_does_not_stack_in_a_span_raises_the_unsplit_error_naming_its_position():
    with pytest.raises(CollateError) as unsplit:
        list(shmload.DataLoader(Mixed(long_at=13), batch_size=8, num_workers=0))
    first_line = str(unsplit.value).splitlines()[0]
    assert "position 5 in the batch" in first_line
    with shmload.DataLoader(Mixed(long_at=13), batch_size=8, num_workers=2, split_batches=True,
                            timeout=30) as loader:
        it = iter(loader)
        assert next(it)[0].shape == (8, 3)
        with pytest.raises(CollateError, match=re.escape(first_line)):
            next(it)



class Shaped:
    """Sample i: ``{"x": an array, "y": i}``, the array of shape (3, 4), except where
    ``changed(i)``: there the sample is ``KINDS[kind]`` of it."""

    KINDS = {
        "shape": lambda x, i: {"x": np.zeros((3, 5), np.float32), "y": i},
        "dtype": lambda x, i: {"x": x.astype("U3"), "y": i},
        "ndim": lambda x, i: {"x": x[:, 0], "y": i},
        "missing": lambda x, i: {"x": x},
        "nested": lambda x, i: {"x": {"a": x}, "y": i},
        "scalar": lambda x, i: {"x": float(i), "y": i},
        "none": lambda x, i: {"x": None, "y": i},
    }

    def __init__(self, kind, changed, n=16):
        self.kind, self.changed, self.n = kind, changed, n

    def __len__(self):
        return self.n

    def __getitem__(self, i):
        x = np.full((3, 4), i, np.float32)
        return self.KINDS[self.kind](x, i) if self.changed(i) else {"x": x, "y": i}


def _first_error_line(exc: BaseException) -> str:
    return next(line[line.index("cannot batch"):] for line in str(exc).splitlines() if "cannot batch" in line)


@pytest.mark.parametrize("workers", [2, 3])
def test_spans_that_differ_from_what_a_worker_cached_raise_the_unsplit_collate_error(workers):
    """Issue 32, item 6: batch 1's rows 0-3 of shape (3, 4) and rows 4-7 of (3, 5). A
    worker that loaded a span of (3, 4) rows before was given rows 4-7 and wrote them
    against its cached plan: numpy's "Output array is the wrong shape"."""
    ds = Shaped("shape", lambda i: i >= 12)
    with pytest.raises(CollateError) as unsplit:
        list(shmload.DataLoader(ds, batch_size=8, num_workers=0))
    said = _first_error_line(unsplit.value)
    assert "field sample['x']: dataset index 12 (position 4 in the batch) has an array of shape (3, 5)" in said
    with shmload.DataLoader(ds, batch_size=8, num_workers=workers, split_batches=True, timeout=30) as loader:
        it = iter(loader)
        assert next(it)["x"].shape == (8, 3, 4)
        with pytest.raises(CollateError, match=re.escape(said)):
            next(it)


@pytest.mark.parametrize("kind", ["shape", "ndim", "none"])
@pytest.mark.parametrize("workers, split", [(0, None), (2, False), (2, True)])
def test_batches_whose_samples_agree_but_differ_from_the_batch_before_are_collated_afresh(kind, workers, split):
    """Rows 4-7 differ from rows 0-3; each batch of 4 (and each span of 2) agrees in
    itself: every batch is what collating it alone gives (a cached plan is the previous
    batch's, not this one's: NOTE [ The cached plan ])."""
    ds = Shaped(kind, lambda i: 4 <= i < 8)
    want = [shmload.default_collate([ds[i] for i in range(b, b + 4)]) for b in range(0, 16, 4)]
    with shmload.DataLoader(ds, batch_size=4, num_workers=workers, split_batches=split, timeout=30) as loader:
        got = [{k: v.copy() if isinstance(v, np.ndarray) else v for k, v in b.items()} for b in loader]
    assert len(got) == 4
    for g, w in zip(got, want):
        assert type(g["x"]) is type(w["x"]) and type(g["y"]) is type(w["y"])
        assert np.array_equal(g["y"], w["y"])
        if isinstance(w["x"], np.ndarray):
            assert g["x"].dtype == w["x"].dtype and np.array_equal(g["x"], w["x"])
        else:
            assert list(g["x"]) == list(w["x"])


@pytest.mark.parametrize("kind", sorted(Shaped.KINDS))
def test_every_kind_of_mismatch_between_spans_raises_the_unsplit_collate_error(kind):
    """Rows 4-7 of each batch of 8 differ from rows 0-3: spans of 4 (or 2 with 4 parts)
    agree in themselves and not with each other."""
    ds = Shaped(kind, lambda i: i % 8 >= 4)
    with pytest.raises(CollateError) as unsplit:
        list(shmload.DataLoader(ds, batch_size=8, num_workers=0))
    said = _first_error_line(unsplit.value)
    for workers, parts in [(2, 2), (3, 4)]:
        with shmload.DataLoader(ds, batch_size=8, num_workers=workers, split_batches=True, batch_parts=parts,
                                timeout=30) as loader:
            with pytest.raises(CollateError, match=re.escape(said)):
                list(loader)


class Ordered:
    """Samples in an OrderedDict that carries an attribute: a batch copies sample 0's
    container (as torch's default_collate does), attribute included."""

    def __len__(self):
        return 16

    def __getitem__(self, i):
        sample = collections.OrderedDict(x=np.full(3, i, np.float32), y=i)
        sample.origin = f"sample {i}"
        return sample


def test_samples_in_a_copied_container_merge_and_keep_sample_zeros_container(monkeypatch):
    sent_whole = []
    original = shmload._session.spans.SplitBatches._send_whole
    monkeypatch.setattr(shmload._session.spans.SplitBatches, "_send_whole",
                        lambda self, split: (sent_whole.append(split.seq), original(self, split))[1])
    want = list(shmload.DataLoader(Ordered(), batch_size=8))
    with shmload.DataLoader(Ordered(), batch_size=8, num_workers=2, split_batches=True, timeout=30) as loader:
        got = [(type(b), b.origin, b["x"].copy(), b["y"].copy()) for b in loader]
    assert sent_whole == []  # merged, not loaded again whole
    assert [(t, o) for t, o, _, _ in got] == [(collections.OrderedDict, "sample 0"), (collections.OrderedDict, "sample 8")]
    assert [o for o in (b.origin for b in want)] == ["sample 0", "sample 8"]
    assert all(np.array_equal(g[2], w["x"]) and np.array_equal(g[3], w["y"]) for g, w in zip(got, want))


class Empty:
    """Samples with an always-empty array before another one (they share an offset)."""

    def __len__(self):
        return 16

    def __getitem__(self, i):
        return {"e": np.zeros(0, np.float32), "x": np.full(3, i, np.float32)}


def test_an_empty_array_before_another_is_written_by_spans_as_loaded_whole():
    want = list(shmload.DataLoader(Empty(), batch_size=8))
    with shmload.DataLoader(Empty(), batch_size=8, num_workers=2, split_batches=True, timeout=30) as loader:
        got = [{k: v.copy() for k, v in b.items()} for b in loader]
    assert [g["e"].shape for g in got] == [(8, 0), (8, 0)]
    assert all(np.array_equal(g["x"], w["x"]) for g, w in zip(got, want))


class Wide:
    """Samples of 80 KB (written row by row, rowwise.py) whose float type changes at
    ``double_at``, and a KeyError at ``fail_at``."""

    def __init__(self, double_at=None, fail_at=None):
        self.double_at, self.fail_at = double_at, fail_at

    def __len__(self):
        return 8

    def __getitem__(self, i):
        if i == self.fail_at:
            raise KeyError(f"no sample {i}")
        return np.full(20000, i, np.float64 if i == self.double_at else np.float32)


@pytest.mark.parametrize("fail_at", [None, 6])
def test_a_row_by_row_type_mismatch_in_a_span_raises_the_unsplit_error(fail_at):
    """Sample 5 (in the second span) is float64 where sample 0 is float32: the batch
    loaded whole names position 5 against position 0, not positions within the span;
    a dataset error later in the batch does not take its place."""
    with shmload.DataLoader(Wide(double_at=5, fail_at=fail_at), batch_size=8, num_workers=1, split_batches=False,
                            timeout=30) as loader:
        with pytest.raises(CollateError) as unsplit:  # (written row by row in a worker, so not promoted)
            list(loader)
    said = [line for line in str(unsplit.value).splitlines() if "position" in line]
    assert len(said) == 1 and "position 5" in said[0], said
    with shmload.DataLoader(Wide(double_at=5, fail_at=fail_at), batch_size=8, num_workers=2, split_batches=True,
                            timeout=30) as loader:
        with pytest.raises(CollateError, match=r"Caught RowwiseTypeMismatch in DataLoader worker process \d while "
                                               r"loading batch 0 \(dataset indices \[0, 1, 2, 3, 4, 5, 6, 7\]\)"
                                               r"(?s:.*)" + re.escape(said[0])):
            list(loader)


def test_a_dataset_error_in_a_span_names_the_batch_its_indices_and_in_a_note_the_rows():
    with shmload.DataLoader(Mixed(fail_at=11), batch_size=8, num_workers=2, split_batches=True,
                            timeout=30) as loader:
        it = iter(loader)
        next(it)
        with pytest.raises(KeyError, match=r"(?s)^Caught KeyError in DataLoader worker process \d while loading batch 1 "
                                           r"\(dataset indices \[8, 9, 10, 11, 12, 13, 14, 15\]\)\.\nOriginal Traceback"
                                           r".*no sample 11") as error:
            next(it)
    assert re.fullmatch(r"Worker \d was loading rows 0 to 3 of the batch's 8: a part of it \(split_batches, "
                        r"docs/api.md\)\.", error.value.__notes__[-1])


def test_a_time_out_on_a_split_batch_names_a_worker_and_its_rows():
    with shmload.DataLoader(SleepyDataset(8, 0.5), batch_size=8, num_workers=2, split_batches=True,
                            timeout=0.3) as loader:
        with pytest.raises(shmload.LoaderTimeoutError, match=r"waiting for batch 0: worker \d \(pid \d+\) is loading "
                                                             r"dataset indices \[\d, \d, \d, \d\] \(rows [04] to [37] "
                                                             r"of the batch's 8, a part of it\)"):
            next(iter(loader))


class Sized:
    """Batch b (of 4 samples) holds arrays of 10,000 x (b % 3 + 1) int32: a later batch
    needs a larger slot than the first one sized."""

    def __len__(self):
        return 36

    def __getitem__(self, i):
        return np.full(10_000 * ((i // 4) % 3 + 1), i, np.int32) + np.random.randint(0, 3, 1).astype(np.int32)


def test_batches_larger_than_their_slot_are_loaded_whole_in_a_larger_one():
    kw = dict(batch_size=4, seed=1, timeout=30)
    reference = shmload.DataLoader(Sized(), **kw)
    want = [b.copy() for b in reference]
    want_again = [b.copy() for b in reference]  # (the second epoch has its own seeds)
    with shmload.DataLoader(Sized(), num_workers=2, split_batches=True, **kw) as loader:
        got = [b.copy() for b in loader]
        again = [b.copy() for b in loader]  # the sized ring, and spans in it
    assert all(np.array_equal(g, w) for g, w in zip(got, want)) and len(got) == len(want)
    assert all(np.array_equal(g, w) for g, w in zip(again, want_again)) and len(again) == len(want)


def test_a_worker_killed_while_loading_a_span_is_replaced_and_sent_only_its_span(tmp_path):
    kw = dict(batch_size=8, seed=5, timeout=30)
    ds = DyingDataset(32, at=13, marker_dir=tmp_path)
    want = list(shmload.DataLoader(ds, **kw))
    with pytest.warns(shmload.ShmloadWarning, match=r"was killed by SIGKILL unexpectedly; started pid \d+ in its place"):
        with shmload.DataLoader(ds, num_workers=2, split_batches=True, max_worker_restarts=1, **kw) as loader:
            got = list(loader)
    assert all(np.array_equal(g[0], w[0]) and np.array_equal(g[1], w[1]) for g, w in zip(got, want))
    assert os.path.exists(tmp_path / "died-0")


def test_a_worker_killed_while_loading_a_span_without_restarts_raises(tmp_path):
    ds = DyingDataset(32, at=13, marker_dir=tmp_path)
    with shmload.DataLoader(ds, batch_size=8, num_workers=2, split_batches=True, timeout=30) as loader:
        with pytest.raises(WorkerDiedError, match=r"killed by signal: Killed|SIGKILL"):
            list(loader)


def test_resume_with_split_batches_continues_with_the_uninterrupted_batches():
    kw = dict(batch_size=6, shuffle=True, seed=9, timeout=30)
    want = _batches(shmload.DataLoader(Augmented(), **kw))
    with shmload.DataLoader(Augmented(), num_workers=2, split_batches=True, **kw) as first:
        it = iter(first)
        head = [next(it) for _ in range(3)]
        head = [(b[0].copy(), b[1].copy(), list(b[2])) for b in head]
        state = first.state_dict()
    with shmload.DataLoader(Augmented(), num_workers=3, **kw) as second:
        second.load_state_dict(state)
        tail = _batches(second)
    assert _equal(head + tail, want)


def test_an_epoch_left_with_spans_in_flight_gives_their_slot_back_when_they_report():
    with shmload.DataLoader(SleepyDataset(40, 0.003), batch_size=8, num_workers=2, persistent_workers=True,
                            split_batches=True, timeout=30) as loader:
        for _ in range(3):
            it = iter(loader)
            next(it)
            del it  # spans of later batches are still loading
        assert len(list(loader)) == 5


@pytest.mark.pure
def test_split_settings_are_checked():
    with pytest.raises(ValueError, match=r"split_batches should be True, False or None, but got split_batches='yes'"):
        shmload.DataLoader(Augmented(), split_batches="yes")
    with pytest.raises(ValueError, match=r"batch_parts should be a positive integer, but got batch_parts=0"):
        shmload.DataLoader(Augmented(), batch_parts=0)
    with pytest.raises(ValueError, match=r"batch_parts should be at most 255, but got batch_parts=256"):
        shmload.DataLoader(Augmented(), batch_parts=256)
