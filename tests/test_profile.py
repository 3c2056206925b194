"""The profiler: counters, stats, diagnosis, trace, plot and the `shmload profile` command.
Its figures' units are checked at their formatter (``shmload._core._units``), an
internal, on purpose.

Stage times are made known with sleeps (a sleeping worker's stage lasts at least the
sleep, and on a busy machine somewhat longer), so the attribution is checked within a
stated tolerance: at least 90% of the slept time, at most 150% plus 5 ms a batch.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time

import numpy as np
import pytest

import shmload
from shmload._core._units import decimal_rate, decimal_size
from shmload.errors import OptionalDependencyError
from shmload.profiler import counters
from shmload.profiler.dataset import DatasetInfo, describe_dataset
from shmload.profiler.diagnosis import diagnose
from shmload.profiler.profile import CALLS, ConsumerClock, machine_cpu_seconds, usable_cpus
from shmload.profiler.stats import (
    LoaderStats,
    MainStats,
    WorkerStats,
)

from .helpers import SleepyCollate, SleepyDataset


def within(measured: float, expected: float) -> bool:
    return 0.9 * expected <= measured <= 1.5 * expected + 0.005


# ---------------------------------------------------------------- pure parts
@pytest.mark.pure
def test_recorder_adds_batches_and_keeps_the_last_events_in_order():
    board = np.zeros((2, counters.row_words(4)))
    rec = counters.Recorder(board, 1)
    for seq in range(10):
        t = 100.0 + seq
        rec.batch(seq, t, t + 0.1, 0.2, 0.3, t + 0.7, samples=8, nbytes=64)
    tot = dict(zip(counters.FIELDS, counters.totals(board)[1]))
    assert tot["batches"] == 10 and tot["samples"] == 80 and tot["bytes"] == 640 and tot["events"] == 10
    assert tot["wait"] == pytest.approx(1.0) and tot["fetch"] == pytest.approx(2.0)
    assert tot["collate"] == pytest.approx(3.0) and tot["other"] == pytest.approx(1.0)  # 0.7 - 0.1 - 0.2 - 0.3
    events, count = counters.events(board, 1)
    assert count == 10 and events[:, 0].tolist() == [6, 7, 8, 9]  # the last 4, oldest first
    newer, _ = counters.events(board, 1, since=8)
    assert newer[:, 0].tolist() == [8, 9]
    assert counters.totals(board)[0].tolist() == [0] * len(counters.FIELDS)  # row 0 untouched
    rec.close()


@pytest.mark.pure
def test_consumer_clock_counts_steps_between_calls_but_not_across_epochs():
    clock = ConsumerClock()
    t = clock.enter()
    clock.leave(t, 10)
    time.sleep(0.02)  # the consumer's step
    t = clock.enter()
    clock.ended(t)  # StopIteration
    time.sleep(0.05)  # between epochs: not a step
    t = clock.enter()
    clock.leave(t, 10)
    assert clock.batches == 2 and clock.bytes == 20
    assert 0.02 <= clock.step < 0.045
    # neither delivered call followed a step: the first had nothing before it, the other
    # followed an epoch's end
    assert clock.calls[:2, 3].tolist() == [0.0, 0.0]
    before = clock.step
    t = clock.enter()
    clock.leave(t, 10)
    assert clock.calls[2, 3] > 0 and clock.calls[2, 3] == pytest.approx(t - clock.calls[1, 1])
    assert clock.step == pytest.approx(before + clock.calls[2, 3])


@pytest.mark.pure
def test_totals_stay_exact_across_flushes_and_for_a_replacement_recorder():
    board = np.zeros((1, counters.row_words(8)))
    rec = counters.Recorder(board, 0)  # flushes every 4 batches
    for seq in range(11):
        rec.batch(seq, 0.0, 1.0, 0.5, 0.25, 2.0, samples=seq, nbytes=2 * seq)
        tot = dict(zip(counters.FIELDS, counters.totals(board)[0]))
        assert tot["batches"] == seq + 1 and tot["samples"] == sum(range(seq + 1))
        assert tot["bytes"] == 2 * sum(range(seq + 1)) and tot["events"] == seq + 1
        assert tot["wait"] == pytest.approx(seq + 1) and tot["other"] == pytest.approx(0.25 * (seq + 1))
    rec.close()
    again = counters.Recorder(board, 0)  # a replacement worker carries on the row
    again.batch(11, 0.0, 1.0, 0.5, 0.25, 2.0, samples=11, nbytes=22)
    tot = dict(zip(counters.FIELDS, counters.totals(board)[0]))
    assert tot["batches"] == 12 and tot["samples"] == sum(range(12)) and tot["fetch"] == pytest.approx(6.0)
    again.close()


@pytest.mark.pure
def test_consumer_clock_totals_survive_more_calls_than_it_keeps():
    clock = ConsumerClock()
    for _ in range(CALLS + 700):
        t = clock.enter()
        clock.leave(t, 3)
    assert clock.batches == CALLS + 700 and clock.bytes == 3 * (CALLS + 700)
    assert 0 < clock.stall < 1 and 0 < clock.step < 1


def _stats(num_workers=2, cores=2, stall=0.0, step=1.0, batches=100, fetch=0.5, collate=0.1, other=0.05,
           wait=0.0, prefetch=2, cpu=None, machine_cpu=None, dataset=None, auto=None) -> LoaderStats:
    """``auto``: num_workers="auto"'s cap (the counts went 1, then ``num_workers``)."""
    """``cpu``: CPU seconds of each process of the loader; ``machine_cpu``: of all processes."""
    per = max(1, num_workers)
    workers = tuple(WorkerStats(i if num_workers else -1, 1000 + i, batches // per, batches // per * 4, 0, wait / per,
                                fetch / per, collate / per, other / per, cpu) for i in range(per))
    main = MainStats(1, batches, 0, stall, step, cpu)
    return LoaderStats(stall + step, num_workers, cores, prefetch, main, workers, None, machine_cpu=machine_cpu,
                       dataset=dataset, worker_counts=((0.0, 1), (0.3, num_workers)) if auto else None,
                       max_workers=auto)


@pytest.mark.pure
def test_data_bound_with_busy_workers_and_spare_cores_recommends_more_workers():
    # a batch costs a worker 6.5 ms and the consumer 1 ms: about 7 workers keep up
    text = diagnose(_stats(num_workers=2, cores=8, stall=3.0, step=0.1, fetch=0.5, collate=0.1, other=0.05))
    assert "DATA-BOUND" in text and "num_workers=7" in text
    assert re_search(r"busy time in fetch", text)


@pytest.mark.pure
def test_data_bound_on_every_core_names_the_stage_to_speed_up():
    text = diagnose(_stats(num_workers=2, cores=2, stall=3.0, step=0.1, fetch=0.1, collate=0.5, other=0.05))
    assert "DATA-BOUND" in text and "speed up collate and the copy into the slot" in text
    assert "2 workers already use the 2 usable cores" in text


@pytest.mark.pure
@pytest.mark.parametrize("running, cap, says", [
    (2, 8, r"it runs 2 of at most 8: it adds workers only while a core is free"),
    (2, 2, r"it runs its cap of 2 \(max_workers, by default the usable cores\); about 7 would keep up and 8 "
           r"cores are usable: raise max_workers"),
    (8, 8, r"it runs its cap of 8 \(max_workers, by default the usable cores\)\."),
])
def test_data_bound_with_auto_workers_says_why_the_count_is_what_it_is(running, cap, says):
    text = diagnose(_stats(num_workers=running, cores=8, stall=3.0, step=0.1, fetch=0.5, collate=0.1, other=0.05,
                           auto=cap))
    assert "DATA-BOUND" in text and re_search(says, text) and "Recommendation: num_workers=" not in text
    assert "num_workers='auto' (at most {}): 1 at 0.00 s, {} at 0.30 s".format(cap, running) in str(
        _stats(num_workers=running, cores=8, stall=3.0, step=0.1, auto=cap))


@pytest.mark.pure
def test_consumer_bound_with_auto_workers_recommends_no_count():
    text = diagnose(_stats(num_workers=4, cores=8, stall=0.01, step=2.0, fetch=0.05, collate=0.01, other=0.005,
                           wait=5.0, auto=4))
    assert "CONSUMER-BOUND" in text and "would keep up" not in text


@pytest.mark.pure
def test_data_bound_with_idle_workers_recommends_a_deeper_queue():
    text = diagnose(_stats(num_workers=2, cores=8, stall=3.0, step=0.1, fetch=0.05, collate=0.01, wait=2.0))
    assert "DATA-BOUND" in text and "prefetch_factor=4 (now 2" in text


@pytest.mark.pure
def test_consumer_bound_recommends_fewer_workers_when_fewer_keep_up():
    # a batch costs a worker 0.65 ms and the consumer 20 ms: one worker keeps up
    text = diagnose(_stats(num_workers=4, cores=8, stall=0.01, step=2.0, fetch=0.05, collate=0.01, other=0.005,
                           wait=5.0))
    assert "CONSUMER-BOUND" in text and "num_workers=1 would keep up and free 3 core(s)" in text


@pytest.mark.pure
def test_loading_in_process_is_told_to_use_workers():
    text = diagnose(_stats(num_workers=0, cores=4, stall=2.0, step=1.0, fetch=1.5, collate=0.3, other=0.2))
    assert "DATA-BOUND" in text and "load in worker processes: num_workers=2" in text


@pytest.mark.pure
def test_an_empty_window_says_so():
    assert "no batch delivered" in diagnose(_stats(batches=0, stall=0.0, step=0.0))


@pytest.mark.pure
def test_figures_are_printed_in_decimal_units():
    assert [decimal_size(n) for n in (512, 32_000, 9_633_792, 1.5e9)] == ["512 B", "32.0 kB", "9.6 MB", "1.50 GB"]
    assert decimal_rate(147_650_000) == "147.7 MB/s" and decimal_rate(11e9) == "11.00 GB/s"
    s = _stats(num_workers=2, stall=0.5, step=0.5)
    s = LoaderStats(1.0, 2, 2, 2, MainStats(1, 10, 96_000_000, 0.5, 0.5, rss=37_000_000), s.workers, None)
    assert re_search(r"10\.0 batches/s, 96\.0 MB/s\)", str(s)) and re_search(r"main \(1\) .* 37\.0 MB", str(s))
    assert not re_search(r"\b[KMG]iB\b", str(s))


FETCH_BOUND = dict(num_workers=2, cores=2, stall=3.0, step=0.1, fetch=0.5, collate=0.1, other=0.05)


@pytest.mark.pure
def test_the_fetch_advice_of_a_plain_dataset_names_its_getitem_and_no_image_decoding():
    text = diagnose(_stats(**FETCH_BOUND, dataset=DatasetInfo("Arrays")))
    assert re_search(r"speed up Arrays\.__getitem__ \(do less work per sample; cache what it reads or computes; "
                     r"serve whole batches with __getitems__\)", text)
    assert "JPEG" not in text and "decod" not in text
    unknown = diagnose(_stats(**FETCH_BOUND))  # a snapshot not told what the dataset is
    assert "speed up the dataset's __getitem__ (do less work per sample" in unknown and "JPEG" not in unknown
    batched = diagnose(_stats(**FETCH_BOUND, dataset=DatasetInfo("ArrayDataset", batched=True)))
    assert "__getitems__" not in batched


@pytest.mark.pure
def test_the_fetch_advice_of_an_image_dataset_is_about_decoding():
    full = diagnose(_stats(**FETCH_BOUND, dataset=DatasetInfo("ImageFolder", images=True)))
    assert re_search(r"speed up ImageFolder\.__getitem__ \(image decoding at full size: decode with "
                     r"shmload\.transforms .* 1/2, 1/4 or 1/8 size", full)
    reduced = diagnose(_stats(**FETCH_BOUND, dataset=DatasetInfo("ImageFolder", images=True, reduced_decode=True)))
    assert re_search(r"image decoding, which shmload\.transforms already do at reduced size: .*fast_decode=True",
                     reduced)


@pytest.mark.pure
def test_describe_dataset_knows_image_datasets_and_their_transforms(tmp_path):
    from PIL import Image

    from shmload.datasets import ArrayDataset, ImageFolder
    from shmload.tools.synthetic import SyntheticImages
    from shmload.transforms import train_pipeline

    os.makedirs(tmp_path / "cat")
    Image.new("RGB", (8, 8)).save(tmp_path / "cat" / "a.jpg")
    assert describe_dataset(ImageFolder(tmp_path, transform=train_pipeline(4))) == \
        DatasetInfo("ImageFolder", images=True, reduced_decode=True)
    assert describe_dataset(ImageFolder(tmp_path, transform=lambda img: img)) == DatasetInfo("ImageFolder", True)
    assert describe_dataset(ImageFolder(tmp_path)) == DatasetInfo("ImageFolder", True)
    assert describe_dataset(SyntheticImages(4, 8)) == DatasetInfo("SyntheticImages")
    assert describe_dataset(ArrayDataset(np.zeros(4))).batched
    assert describe_dataset(lambda: iter(range(3))).stream


@pytest.mark.pure
def test_a_pipeline_told_not_to_decode_at_reduced_size_is_diagnosed_as_full_size(tmp_path):
    # The profiler used to decide by the transform's module name: reduced_decode=False was
    # reported as reduced, and the advice said to store smaller images or decode faster.
    from PIL import Image

    from shmload.datasets import ImageFolder
    from shmload.records import RecordDataset, write
    from shmload.transforms import Compose, RandomHorizontalFlip, RandomResizedCrop, train_pipeline

    os.makedirs(tmp_path / "img" / "cat")
    Image.new("RGB", (8, 8)).save(tmp_path / "img" / "cat" / "a.jpg")
    full = ImageFolder(tmp_path / "img", transform=train_pipeline(4, reduced_decode=False))
    assert describe_dataset(full) == DatasetInfo("ImageFolder", images=True, reduced_decode=False)
    text = diagnose(_stats(**FETCH_BOUND, dataset=describe_dataset(full)))
    assert re_search(r"speed up ImageFolder\.__getitem__ \(image decoding at full size, as the transform was told "
                     r"\(reduced_decode=False\): .*reduced_decode=True", text)
    assert "already do at reduced size" not in text
    composed = Compose([RandomResizedCrop(4, reduced_decode=False), RandomHorizontalFlip()])
    assert describe_dataset(ImageFolder(tmp_path / "img", transform=composed)).reduced_decode is False
    composed = Compose([RandomResizedCrop(4), RandomHorizontalFlip()])
    assert describe_dataset(ImageFolder(tmp_path / "img", transform=composed)).reduced_decode is True

    class MyImages:  # any dataset may say it decodes images
        decodes_images = True
        transform = None

        def __getitem__(self, i):
            return i
    assert describe_dataset(MyImages()) == DatasetInfo("MyImages", images=True)
    write([b"x"], tmp_path / "rec")
    assert not describe_dataset(RecordDataset(tmp_path / "rec")).images


@pytest.mark.pure
def test_contention_is_flagged_only_when_others_took_cores_the_loader_could_use():
    # a 4 s window; the main process and 2 workers used 1 CPU second each: 0.75 cores
    busy = dict(FETCH_BOUND, stall=3.9, step=0.1, cpu=1.0)
    quiet = _stats(**busy, machine_cpu=3.4)  # others: 0.4 s, 0.1 core
    assert quiet.other_cores() == pytest.approx(0.1) and quiet.contention() is None
    assert "Caution" not in diagnose(quiet)
    loaded = _stats(**busy, machine_cpu=6.6)  # others: 3.6 s, 0.9 of the 2 cores
    assert loaded.contention() == "other programs used 0.90 of the 2 usable cores"
    assert re_search(r"\nCaution: other programs used 0\.90 of the 2 usable cores during this window, .* may be "
                     r"too low; measure again on a quiet machine\.$", diagnose(loaded))
    assert re_search(r"cores: the 2 usable cores were 82% busy: this loader 0\.75 cores, other programs 0\.90",
                     loaded.table())
    roomy = _stats(**dict(busy, cores=16), machine_cpu=6.6)  # 15.1 cores left for 3 processes
    assert roomy.contention() is None
    assert _stats(**busy).other_cores() is None and _stats(**busy).contention() is None  # not measured


@pytest.mark.pure
def test_the_machines_cpu_time_counts_this_process_spinning():
    cpus = usable_cpus()
    before = machine_cpu_seconds(cpus)
    end = time.process_time() + 0.2
    while time.process_time() < end:
        pass
    assert before is not None and machine_cpu_seconds(cpus) - before >= 0.15


def re_search(pattern, text):
    import re

    return re.search(pattern, text) is not None


# ---------------------------------------------------------------- with processes
@pytest.mark.timeout(60)
def test_stage_times_are_attributed_to_fetch_and_collate():
    # 4 samples x 4 ms in __getitem__ = 16 ms of fetch a batch; 8 ms in collate_fn
    loader = shmload.DataLoader(SleepyDataset(48, 0.004), batch_size=4, num_workers=2,
                                collate_fn=SleepyCollate(0.008), timeout=30)
    batches = sum(1 for _ in loader)
    s = loader.stats()
    assert batches == 12 and s.main.batches == 12
    assert sum(w.batches for w in s.workers) == 12 and len(s.workers) == 2
    done = sum(w.batches for w in s.workers)
    fetch, collate = s.stage_seconds()["fetch"] / done, s.stage_seconds()["collate"] / done
    assert within(fetch, 0.016), fetch
    assert within(collate, 0.008), collate
    assert s.data_bound and "DATA-BOUND" in str(s) and "busy time in fetch" in str(s)
    assert sum(w.samples for w in s.workers) == 48


@pytest.mark.pure
@pytest.mark.timeout(60)
def test_in_process_loading_is_profiled_too():
    loader = shmload.DataLoader(SleepyDataset(24, 0.004), batch_size=4, num_workers=0)
    for _ in loader:
        pass
    s = loader.stats()
    (inline,) = s.workers
    assert inline.id == -1 and inline.batches == 6 and inline.wait == 0.0
    assert within(inline.fetch / 6, 0.016)
    assert "in-process" in s.table() and "load in worker processes" in s.diagnosis()


@pytest.mark.timeout(60)
def test_a_slow_consumer_is_consumer_bound():
    # prefetch_factor=2: the workers load as the consumer goes, not all 24 batches up front
    with shmload.DataLoader(SleepyDataset(96), batch_size=4, num_workers=2, persistent_workers=True,
                            prefetch_factor=2, timeout=30) as loader:
        it = iter(loader)
        for _ in range(4):  # the workers are up and the ring is sized: the window starts now
            next(it)
        loader.reset_stats()
        for _ in it:
            time.sleep(0.02)  # the training step
        s = loader.stats()
    assert s.main.batches == 20
    assert s.main.step >= 20 * 0.02 * 0.9
    assert not s.data_bound and "CONSUMER-BOUND" in str(s), str(s)
    assert all(w.utilization < 0.5 for w in s.workers), str(s)  # they mostly wait for tasks


@pytest.mark.timeout(60)
def test_stats_work_during_and_after_an_epoch_and_reset_starts_a_new_window():
    # (unsplit: a split batch counts once per worker that loaded a part, see the test below)
    loader = shmload.DataLoader(SleepyDataset(40, 0.001), batch_size=4, num_workers=2, timeout=30,
                                split_batches=False)
    it = iter(loader)
    for _ in range(5):
        next(it)
    during = loader.stats()
    assert during.main.batches == 5 and len(during.workers) == 2
    assert all(w.pid is not None and w.rss and w.pss and w.uss for w in during.workers)
    for _ in it:
        pass
    after = loader.stats()  # the workers have exited: their counters were kept
    assert after.main.batches == 10 and sum(w.batches for w in after.workers) == 10
    after.reset()
    fresh = loader.stats()
    assert fresh.main.batches == 0 and sum(w.batches for w in fresh.workers) == 0
    assert "no batch delivered" in fresh.diagnosis()
    for _ in loader:  # a second epoch, new workers: counted in the new window only
        pass
    assert loader.stats().main.batches == 10 and sum(w.batches for w in loader.stats().workers) == 10


@pytest.mark.timeout(60)
def test_ring_occupancy_and_memory_are_reported():
    with shmload.DataLoader(SleepyDataset(64, 0.001), batch_size=4, num_workers=2, persistent_workers=True,
                            timeout=30) as loader:
        for _ in loader:
            time.sleep(0.006)
        s = loader.stats()
    assert s.ring is not None and s.ring.samples > 0 and s.ring.slots >= 2
    occupancy = s.ring.free + s.ring.filling + s.ring.ready + s.ring.held
    # each sample counts every slot the ring had then, in one state each; the ring may have
    # grown during the epoch (more slots once the automatic depth measured the pace), so
    # the mean is of the samples' totals, not the final count (before: flaky, 2 runs of 12)
    totals = s.timeline["occupancy"][:, 1:].sum(axis=1)
    assert len(totals) == s.ring.samples and totals.min() >= 2 and np.all(totals == np.round(totals))
    assert occupancy == pytest.approx(totals.mean(), abs=0.01)
    assert s.ring.held <= 1.0  # only the batch the loop body holds
    assert "total PSS (shared memory counted once)" in str(s) and "ring:" in str(s)


@pytest.mark.timeout(60)
def test_the_trace_is_chrome_trace_json_with_a_track_per_worker(tmp_path):
    path = tmp_path / "trace.json"
    with shmload.DataLoader(SleepyDataset(32, 0.001), batch_size=4, num_workers=2, persistent_workers=True,
                            timeout=30, split_batches=False) as loader:
        for _ in loader:
            time.sleep(0.006)
        loader.stats().trace(str(path))
    events = json.loads(path.read_text())["traceEvents"]
    names = {e["args"]["name"] for e in events if e["ph"] == "M" and e["name"] == "process_name"}
    assert any(n.startswith("main (pid") for n in names)
    assert sum(n.startswith("worker ") for n in names) == 2
    slices = [e for e in events if e["ph"] == "X"]
    assert {e["name"] for e in slices} >= {"next()", "step", "fetch", "collate", "wait for task"}
    assert sum(e["name"] == "next()" for e in slices) == 8
    assert all(e["dur"] >= 0 and isinstance(e["ts"], float) for e in slices)
    worker_batches = sorted(e["args"]["batch"] for e in slices if e["name"] == "fetch")
    assert worker_batches == list(range(8))
    assert any(e["ph"] == "C" and e["name"] == "ring" and set(e["args"]) == {"free", "filling", "ready", "held"}
               for e in events)


@pytest.mark.timeout(60)
def test_a_split_batch_counts_its_parts_for_the_workers_that_loaded_them(tmp_path):
    path = tmp_path / "trace.json"
    with shmload.DataLoader(SleepyDataset(24, 0.001), batch_size=6, num_workers=2, timeout=30,
                            split_batches=True, prefetch_factor=16) as loader:  # room on both workers (test_split.py)
        assert len(list(loader)) == 4
        stats = loader.stats()
        stats.trace(str(path))
    # every batch in two parts of 3 rows, one per worker: each worker loaded a part of each
    assert [w.batches for w in stats.workers] == [4, 4] and [w.samples for w in stats.workers] == [12, 12]
    assert stats.main.batches == 4 and sum(w.bytes for w in stats.workers) == stats.main.bytes
    events = json.loads(path.read_text())["traceEvents"]
    fetches = sorted((e["args"]["batch"], e["pid"]) for e in events if e["ph"] == "X" and e["name"] == "fetch")
    assert [b for b, _ in fetches] == [0, 0, 1, 1, 2, 2, 3, 3]
    assert all(fetches[i][1] != fetches[i + 1][1] for i in range(0, 8, 2))  # two workers on each batch


@pytest.mark.pure
def test_plot_without_matplotlib_names_the_extra(monkeypatch):
    monkeypatch.setitem(sys.modules, "matplotlib", None)
    s = _stats()
    with pytest.raises(OptionalDependencyError, match=r"pip install 'shmload\[plot\]'"):
        s.plot("never-written.png")


@pytest.mark.timeout(60)
@pytest.mark.parametrize("workers", [2, "auto"])
def test_plot_draws_a_png(tmp_path, workers):
    """With num_workers="auto" the count over time is drawn too, on an axis of its own."""
    pytest.importorskip("matplotlib")
    loader = shmload.DataLoader(SleepyDataset(32, 0.001), batch_size=4, num_workers=workers, timeout=30)
    for _ in loader:
        pass
    path = tmp_path / "profile.png"
    stats = loader.stats()
    assert (stats.worker_counts is not None) is (workers == "auto")
    stats.plot(str(path))
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


# ---------------------------------------------------------------- the command
def run_cli(*args, timeout=90):
    return subprocess.run([sys.executable, "-m", "shmload", *args], capture_output=True, text=True, timeout=timeout,
                          cwd=os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


@pytest.mark.timeout(120)
def test_profile_command_compares_worker_counts_and_recommends_one(tmp_path):
    trace = tmp_path / "t.json"
    out = run_cli("profile", "tests.helpers:small_dataset", "--workers", "0,1,2", "--batches", "12",
                  "--batch-size", "4", "--quiet", "--trace", str(trace))
    assert out.returncode == 0, out.stderr
    rows = [line.split() for line in out.stdout.splitlines() if line.strip()[:1].isdigit()]
    assert [r[0] for r in rows[:3]] == ["0", "1", "2"]
    assert re_search(r"recommended: num_workers=[012]: the fewest workers within 5% of the best", out.stdout)
    assert "diagnosis:" in out.stdout
    assert json.loads(trace.read_text())["traceEvents"]


@pytest.mark.timeout(60)
def test_profile_command_explains_a_bad_factory():
    out = run_cli("profile", "tests.helpers:no_such_thing", "--workers", "1", "--batches", "2", "--quiet")
    assert out.returncode == 2 and "module 'tests.helpers' has no attribute 'no_such_thing'" in out.stderr
    out = run_cli("profile", "tests.helpers", "--quiet")
    assert out.returncode == 2 and "expected MODULE:FACTORY" in out.stderr
