"""Iterable sources: each worker reads its own stream; batches come in a fixed rotation;
errors, deaths, slot growth and shutdown behave as for map-style datasets. The
rotation's rule (``shmload._ordering.schedule``) is also tested alone, as internals."""

from __future__ import annotations

import os
import sys
import time

import numpy as np
import pytest

import shmload
from shmload import DataLoader, GeneratorSource, ShmloadWarning, WorkerDiedError
from shmload._ordering.schedule import RoundRobinSchedule

from .helpers import DataFlowLike, StatefulWorkerStreams, WorkerStreams, count_up


def labels(loader):
    return [b[1].tolist() for b in loader]


def rotation(lengths, batch_size, drop_last=False):
    """The expected order, written out: batch the streams, then take one batch from each
    stream in turn until all are empty."""
    streams = []
    for w, n in enumerate(lengths):
        items = [w * 1000 + k for k in range(n)]
        batches = [items[i:i + batch_size] for i in range(0, n, batch_size)]
        streams.append([b for b in batches if len(b) == batch_size or not drop_last])
    out = []
    for turn in range(max(map(len, streams))):
        out += [s[turn] for s in streams if turn < len(s)]
    return out


# ---------------------------------------------------------------- the schedule, pure
@pytest.mark.pure
def test_round_robin_schedule_skips_ended_streams_whenever_their_end_is_known():
    """However many draws an ended stream was sent before its end was known, the others
    keep their relative order."""
    def order(known_after):
        s = RoundRobinSchedule(3, 2, False)
        got = []
        while (p := s.peek()) is not None and len(got) < 9:
            got.append((p.load.worker, p.load.number))
            s.commit()
            if len(got) == known_after:
                s.ended(0)
        return [g for g in got if g[0] != 0][:6]
    assert order(1) == order(4) == order(7) == [(1, 0), (2, 0), (1, 1), (2, 1), (1, 2), (2, 2)]


# ---------------------------------------------------------------- order
@pytest.mark.parametrize("workers", [0, 1, 2, 3])
def test_batches_come_in_a_fixed_rotation_over_the_workers(workers, start_method):
    lengths = [7, 2, 11][:max(1, workers)]
    loader = DataLoader(WorkerStreams(lengths), batch_size=3, num_workers=workers, seed=1, timeout=30,
                        multiprocessing_context=start_method if workers else None)
    expected = rotation(lengths, 3)
    first = [(b[0].copy(), b[1].tolist()) for b in loader]
    assert [lab for _, lab in first] == expected
    second = [(b[0].copy(), b[1].tolist()) for b in loader]  # the next epoch: same stream, new seeds
    assert [lab for _, lab in second] == expected
    assert any(not np.array_equal(a[0], b[0]) for a, b in zip(first, second))


def test_same_seed_same_batches_bit_for_bit_and_drop_last(start_method):
    kwargs = dict(batch_size=4, num_workers=2, seed=3, timeout=30, multiprocessing_context=start_method)
    a = [b[0].copy() for b in DataLoader(WorkerStreams([10, 9]), **kwargs)]
    b = [b[0].copy() for b in DataLoader(WorkerStreams([10, 9]), **kwargs)]
    assert len(a) == 6 and all(np.array_equal(x, y) for x, y in zip(a, b))
    dropped = DataLoader(WorkerStreams([10, 9]), drop_last=True, **kwargs)
    assert labels(dropped) == rotation([10, 9], 4, drop_last=True)


@pytest.mark.parametrize("workers", [0, 2])
def test_unbatched_streams(workers):
    loader = DataLoader(WorkerStreams([3, 2][:max(1, workers)]), batch_size=None, num_workers=workers, timeout=30)
    got = [(row.shape, label) for row, label in loader]
    assert [label for _, label in got] == ([0, 1000, 1, 1001, 2] if workers else [0, 1, 2])
    assert all(shape == (4,) for shape, _ in got)


def test_a_worker_whose_stream_is_empty_ends_cleanly():
    loader = DataLoader(WorkerStreams([0, 5, 0]), batch_size=2, num_workers=3, timeout=30)
    assert labels(loader) == [[1000, 1001], [1002, 1003], [1004]]
    assert labels(DataLoader(WorkerStreams([0, 0]), batch_size=2, num_workers=2, timeout=30)) == []


# ---------------------------------------------------------------- kinds of source
@pytest.mark.parametrize("workers", [0, 2])
def test_a_generator_function_is_a_source_read_by_every_worker(workers):
    loader = DataLoader(lambda: count_up(5), batch_size=2, num_workers=workers, timeout=30)
    assert [b.tolist() for b in loader] == ([[0, 1], [2, 3], [4]] if not workers else
                                            [[0, 1], [0, 1], [2, 3], [2, 3], [4], [4]])
    with pytest.raises(TypeError, match=r"has no len\(\)|no length"):
        len(loader)
    sized = DataLoader(GeneratorSource(count_up, 5, length=5), batch_size=2)
    assert len(sized) == 3 and [b.tolist() for b in sized] == [[0, 1], [2, 3], [4]]


@pytest.mark.pure
def test_len_follows_the_source_as_torch_does():
    assert len(DataLoader(DataFlowLike(10, os.devnull), batch_size=4)) == 3
    assert len(DataLoader(DataFlowLike(10, os.devnull), batch_size=4, drop_last=True)) == 2
    assert len(DataLoader(DataFlowLike(10, os.devnull), batch_size=None)) == 10


def test_a_dataflow_is_reset_once_in_each_worker_and_shards_itself(tmp_path, all_start_methods):
    log = tmp_path / "resets"
    loader = DataLoader(DataFlowLike(12, log), batch_size=3, num_workers=2, persistent_workers=True, timeout=30,
                        multiprocessing_context=all_start_methods)
    for _ in range(2):  # two epochs, same workers: still one reset each
        got = sorted(i for b in loader for i in b.tolist())
        assert got == list(range(12))
    loader.close()
    pids = log.read_text().split()
    assert len(pids) == 2 and len(set(pids)) == 2 and str(os.getpid()) not in pids


@pytest.mark.pure
def test_a_dataflow_in_the_main_process_is_reset_once_per_loader(tmp_path):
    log = tmp_path / "resets"
    loader = DataLoader(DataFlowLike(5, log), batch_size=2)
    assert [b.tolist() for b in loader] == [[0, 1], [2, 3], [4]] == [b.tolist() for b in loader]
    assert log.read_text().split() == [str(os.getpid())]


@pytest.mark.pure
@pytest.mark.parametrize("option", [dict(shuffle=True), dict(sampler=[0, 1]), dict(batch_sampler=[[0]])])
def test_options_that_order_a_map_style_dataset_are_refused(option):
    name = next(iter(option))
    with pytest.raises(ValueError, match=rf"iterable source: expected unspecified {name} option, but got {name}="):
        DataLoader(WorkerStreams([3]), **option)


# ---------------------------------------------------------------- slots
def test_a_batch_too_big_for_its_slot_waits_in_the_worker_for_a_larger_one(start_method):
    """A stream cannot be re-read: the worker keeps the batch until the ring has grown."""
    wide = (2, 3, 1004, 1005)  # worker 0's second batch, worker 1's third
    loader = DataLoader(WorkerStreams([6, 6], wide=wide), batch_size=2, seed=4, timeout=30, num_workers=2,
                        multiprocessing_context=start_method)
    got = [(b[0].shape, b[1].tolist()) for b in loader]
    assert [lab for _, lab in got] == rotation([6, 6], 2)
    widths = {tuple(lab): shape[1] for shape, lab in got}
    assert widths[(2, 3)] == widths[(1004, 1005)] == 20000 and widths[(0, 1)] == widths[(1002, 1003)] == 4


# ---------------------------------------------------------------- errors and faults
@pytest.mark.parametrize("workers", [0, 2])
def test_an_error_in_a_stream_is_raised_at_its_position_and_the_epoch_goes_on(workers):
    loader = DataLoader(WorkerStreams([6, 6][:max(1, workers)], fail_at=3), batch_size=2, num_workers=workers,
                        timeout=30)
    it = iter(loader)
    before = [next(it)[1].tolist() for _ in range(2 if workers else 1)]
    where = r"Caught ValueError in DataLoader worker process 0 while loading batch 2 \(draw 1 of worker 0's " \
        r"stream\)(.|\n)*" if workers else ""
    with pytest.raises(ValueError, match=rf"^{where}bad record 3"):
        next(it)
    rest = [b[1].tolist() for b in it]  # a generator that raised is finished: worker 0's stream ends
    assert before == ([[0, 1], [1000, 1001]] if workers else [[0, 1]])
    assert rest == ([[1002, 1003], [1004, 1005]] if workers else [])


def test_a_dead_worker_is_reported_naming_its_draw(tmp_path, start_method):
    loader = DataLoader(WorkerStreams([8, 8], die_at=1004, marker_dir=tmp_path), batch_size=2, num_workers=2,
                        timeout=30, multiprocessing_context=start_method)
    with pytest.raises(WorkerDiedError, match=r"worker process 1 \(pid \d+\) was killed by SIGKILL unexpectedly; "
                                              r"it was loading batch \d+ \(draw 2 of worker 1's stream\)"):
        labels(loader)


@pytest.mark.parametrize("source", [WorkerStreams, StatefulWorkerStreams])
def test_a_restarted_worker_takes_up_its_stream_where_the_dead_one_was(tmp_path, source, start_method):
    """With the source's state_dict the replacement loads the state after the last
    finished draw; without, it re-reads its stream and skips the draws made. Either way
    the epoch is bit-identical to one without the fault."""
    kwargs = dict(batch_size=2, num_workers=2, seed=6, timeout=30, multiprocessing_context=start_method)
    expected = [(b[0].copy(), b[1].tolist()) for b in DataLoader(source([9, 9]), **kwargs)]
    loader = DataLoader(source([9, 9], die_at=1005, marker_dir=tmp_path), max_worker_restarts=1, **kwargs)
    with pytest.warns(ShmloadWarning, match=r"worker process 1 .* SIGKILL unexpectedly; started pid \d+ in its place"):
        got = [(b[0].copy(), b[1].tolist()) for b in loader]
    assert [lab for _, lab in got] == [lab for _, lab in expected]
    assert all(np.array_equal(a, b) for (a, _), (b, _) in zip(got, expected))
    assert (tmp_path / "died").exists()


# ---------------------------------------------------------------- shutdown
def test_breaking_out_stops_the_workers_and_a_new_epoch_starts_the_streams_again(start_method):
    loader = DataLoader(WorkerStreams([50, 50]), batch_size=2, num_workers=2, timeout=30,
                        multiprocessing_context=start_method)
    for i, _ in enumerate(loader):
        if i == 2:
            break
    assert labels(loader)[:2] == [[0, 1], [1000, 1001]]


def test_persistent_workers_start_a_new_iteration_of_their_streams_each_epoch(start_method):
    loader = DataLoader(WorkerStreams([4, 3]), batch_size=2, num_workers=2, persistent_workers=True, timeout=30,
                        multiprocessing_context=start_method)
    it = iter(loader)
    next(it)
    del it  # an abandoned epoch: its draws in flight are dropped
    assert labels(loader) == labels(loader) == rotation([4, 3], 2)
    loader.close()


def test_a_stuck_stream_times_out_naming_the_draw():
    def stuck():
        yield 1
        time.sleep(60)
        yield 2

    loader = DataLoader(stuck, batch_size=1, num_workers=1, timeout=1)
    it = iter(loader)
    assert next(it).tolist() == [1]
    with pytest.raises(shmload.LoaderTimeoutError, match=r"DataLoader timed out after 1 seconds waiting for batch 1: worker 0 "
                                                         r"\(pid \d+\) is loading draw 1 of worker 0's stream"):
        next(it)
    del it


# ---------------------------------------------------------------- torch's IterableDataset
@pytest.mark.torch
def test_a_torch_iterable_dataset_that_shards_with_torch_get_worker_info_works_unchanged():
    torch = pytest.importorskip("torch")

    class Sharded(torch.utils.data.IterableDataset):
        def __iter__(self):
            info = torch.utils.data.get_worker_info()
            assert info is not None and info.id == shmload.get_worker_info().id
            for i in range(info.id, 10, info.num_workers):
                yield torch.tensor([i, info.id])

    loader = DataLoader(Sharded(), batch_size=2, num_workers=2, timeout=30)
    got = [b.tolist() for b in loader]
    assert [row[0] for b in got for row in b] == [0, 2, 1, 3, 4, 6, 5, 7, 8, 9]
    assert all(row[1] == row[0] % 2 for b in got for row in b)
    assert torch.utils.data.get_worker_info() is None  # not in the main process
    assert sys.modules.get("torch") is torch


def test_a_worker_that_dies_idle_takes_up_its_stream_from_the_sources_state(tmp_path):
    """Worker 1 dies while it holds no draw (the rotation waits on worker 0's slow one):
    its replacement still starts from the state after its last draw, not from the start."""
    import os
    import signal
    import threading

    from .helpers import LoggedStreams

    log, release = tmp_path / "log", tmp_path / "release"
    kwargs = dict(batch_size=2, num_workers=2, seed=2, timeout=30, prefetch_factor=1)
    expected = labels(DataLoader(StatefulWorkerStreams([12, 12]), **kwargs))
    loader = DataLoader(LoggedStreams([12, 12], log, hold=4, release=release), max_worker_restarts=1, **kwargs)
    it = iter(loader)
    got = [next(it)[1].tolist() for _ in range(4)]
    pids = {w.id: w.pid for w in loader.stats(memory=False).workers}

    def kill_idle_worker_1():
        deadline = time.monotonic() + 20
        while "1 1005" not in log.read_text() and time.monotonic() < deadline:  # its draw 2 is done
            time.sleep(0.01)
        time.sleep(0.3)  # and reported
        os.kill(pids[1], signal.SIGKILL)
        time.sleep(0.3)
        release.touch()

    killer = threading.Thread(target=kill_idle_worker_1)
    killer.start()
    with pytest.warns(ShmloadWarning, match=r"worker process 1 .* SIGKILL unexpectedly; started pid \d+"):
        got += [b[1].tolist() for b in it]
    killer.join(30)
    assert got == expected
    starts = [line for line in log.read_text().splitlines() if line.startswith("1 start")]
    assert starts == ["1 start 0", "1 start 6"]  # the replacement resumed after label 1005


@pytest.mark.parametrize("workers", [0, 2])
def test_a_source_that_cannot_start_an_epoch_fails_that_epoch_without_replaying_the_last(workers):
    from .helpers import FailingStart

    loader = DataLoader(FailingStart([4, 4][:max(1, workers)]), batch_size=2, num_workers=workers,
                        persistent_workers=workers > 0, timeout=30)
    first = labels(loader)
    it = iter(loader)
    for _ in range(max(1, workers)):  # each worker's stream fails at its first draw
        with pytest.raises(OSError, match=r"cannot open shard"):
            next(it)
    rest = [b[1].tolist() for b in it]  # the failing streams end: nothing of the last epoch again
    assert first == rotation([4, 4][:max(1, workers)], 2) and rest == []
    if workers:
        loader.close()


@pytest.mark.parametrize("workers", [0, 2])
def test_the_profiler_counts_batches_not_draws_that_found_the_stream_ended(workers):
    loader = DataLoader(WorkerStreams([4, 4][:max(1, workers)]), batch_size=2, num_workers=workers, timeout=30)
    delivered = len(labels(loader))
    stats = loader.stats(memory=False)
    assert sum(w.batches for w in stats.workers) == delivered == stats.main.batches
