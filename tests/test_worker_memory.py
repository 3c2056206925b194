"""Worker memory over time: the growth rule and the sampler (pure), and copy-on-read of a
list of file names found end to end (profiler/memory.py)."""

from __future__ import annotations

import json
import os
import re
import time

import numpy as np
import psutil
import pytest

import shmload
from shmload.profiler import memory
from shmload.profiler.diagnosis import diagnose
from shmload.profiler.memory import MemoryHistory, memory_trend
from shmload.profiler.stats import LoaderStats, MainStats, WorkerStats

from .helpers import FileNames

MB = 1e6


def trend(uss_mb, seconds=1.0):
    """The trend of samples ``seconds`` apart with these USS values (MB)."""
    u = np.asarray(uss_mb, dtype=float) * MB
    return memory_trend(123, np.column_stack([np.arange(len(u)) * seconds, u]))


# ---------------------------------------------------------------- the rule
@pytest.mark.pure
def test_steady_growth_is_flagged_as_steady():
    t = trend(np.linspace(20, 120, 20))
    assert t.growing and t.steady
    assert t.first == 20 * MB and t.last == t.peak == 120 * MB and t.growth == 100 * MB
    assert t.samples == 20 and t.seconds == 19.0 and t.rate == pytest.approx(100 * MB / 19)


@pytest.mark.pure
def test_noisy_but_rising_is_flagged():
    rng = np.random.default_rng(0)
    for _ in range(20):
        t = trend(np.linspace(20, 120, 30) + rng.normal(0, 5, 30))  # noise 5% of the growth
        assert t.growing and t.steady


@pytest.mark.pure
def test_a_one_time_step_is_not_flagged():
    # a decoder's buffers at the first batch: 100 MB between two samples, then flat
    assert not trend([20] + [120] * 19).growing
    assert not trend([20] * 10 + [120] * 10).growing  # in the middle
    assert not trend([20, 20, 70, 120] + [120.5] * 16).growing  # spread over two intervals


@pytest.mark.pure
def test_flat_is_not_flagged():
    assert not trend([40.0, 40.1, 39.9, 40.3, 40.2, 40.4] * 4).growing
    # 20 MB: under the 32 MB floor
    assert not trend(np.linspace(40, 60, 20)).growing
    # 100 MB on a 2 GB worker: under a tenth of it
    assert not trend(np.linspace(2000, 2100, 20)).growing


@pytest.mark.pure
def test_too_short_is_not_flagged():
    assert not trend(np.linspace(20, 120, 5)).growing  # too few samples
    assert not trend(np.linspace(20, 120, 20), seconds=0.1).growing  # 1.9 s in all
    assert trend([20]) is None


@pytest.mark.pure
def test_growth_that_levels_off_is_flagged_but_not_steady():
    # copy-on-read in a shuffled order: most pages copied early, then flat
    t = trend(120 - 100 * np.exp(-np.arange(30) / 3.0))
    assert t.growing and not t.steady


@pytest.mark.pure
def test_memory_that_rose_and_fell_back_is_not_flagged():
    assert not trend(list(np.linspace(20, 200, 10)) + list(np.linspace(200, 60, 10))).growing


# ---------------------------------------------------------------- the sampler
class FakeReads:
    """USS by pid, and the pids read, in order; each read takes ``seconds``."""

    def __init__(self, seconds=0.0):
        self.seconds, self.uss, self.read = seconds, {}, []

    def __call__(self, pid):
        self.read.append(pid)
        if self.seconds:
            time.sleep(self.seconds)
        return self.uss.get(pid, 10 * MB)


@pytest.mark.pure
def test_the_sampler_reads_one_worker_a_time_round_robin_each_at_most_every_interval(monkeypatch):
    monkeypatch.setattr(memory, "_clock", lambda: 0.0)  # reads take no time (a busy machine's would count)
    reads = FakeReads()
    history = MemoryHistory(reads)
    pids = {0: 100, 1: 101, 2: 102}
    now = 0.0
    for _ in range(300):  # next() every 10 ms for 3 s
        if now >= history.next_read:
            history.sample(now, pids)
        now += 0.01
    assert reads.read == [100, 101, 102] * 3  # one read every interval / 3
    for pid, rows in history.window(0.0).values():
        assert len(rows) == 3 and np.diff(rows[:, 0]).min() >= memory.MEMORY_INTERVAL
    history.sample(now, {0: 100})  # read a moment ago: not due yet
    assert len(reads.read) == 9


@pytest.mark.pure
def test_slow_reads_are_spaced_to_stay_within_the_budget():
    history = MemoryHistory(FakeReads(seconds=0.02))
    history.sample(0.0, {0: 100, 1: 101})
    assert history.next_read >= 0.02 / memory.MEMORY_BUDGET  # 2 s, not 0.5 s


@pytest.mark.pure
def test_a_full_series_keeps_every_other_sample_and_reads_half_as_often():
    history = MemoryHistory(FakeReads())
    for k in range(memory.SAMPLES + 1):
        history.sample(k * memory.MEMORY_INTERVAL, {0: 100})
    (pid, rows), = history.window(0.0).values()
    assert pid == 100 and len(rows) == memory.SAMPLES // 2 + 1
    assert rows[:, 0].tolist()[:3] == [0.0, 2.0, 4.0] and rows[-1, 0] == memory.SAMPLES
    history.sample(memory.SAMPLES + 1.5, {0: 100})  # due again only 2 intervals on
    assert len(history.window(0.0)[0][1]) == memory.SAMPLES // 2 + 1


@pytest.mark.pure
def test_a_new_process_of_a_worker_starts_a_new_series_and_the_longest_in_the_window_is_reported():
    reads = FakeReads()
    history = MemoryHistory(reads)
    for k in range(5):
        history.sample(float(k), {0: 100})
    for k in range(5, 7):
        history.sample(float(k), {0: 200})  # the next epoch's worker 0
    assert history.window(0.0)[0][0] == 100  # 5 samples against 2
    assert history.window(4.5)[0][0] == 200  # the window began after the first one's samples
    for k in range(7, 9):
        history.sample(float(k), {0: 300})
    assert history.window(0.0)[0][0] == 300  # only the last KEPT series are kept


# ---------------------------------------------------------------- the diagnosis
def _stats(*trends):
    workers = tuple(WorkerStats(i, 1000 + i, 50, 200, 0, 0.1, 0.5, 0.1, 0.0, memory=m) for i, m in enumerate(trends))
    return LoaderStats(2.0, len(trends), 4, 2, MainStats(1, 100, 0, 0.1, 1.9), workers, None)


@pytest.mark.pure
def test_the_diagnosis_names_copy_on_read_and_the_fix_only_when_memory_grows():
    steady = trend(np.linspace(20, 120, 20))
    s = _stats(steady, trend([20] * 20))
    assert re.search(r"\nMemory: the workers' private memory grows steadily \(\+100\.0 MB over 19 s per worker, "
                     r"\+5\.3 MB/s; 1 of 2 workers\): likely copy-on-read\. .*PyTorch issue 13246.*Hold them in "
                     r"numpy arrays or shmload\.datasets\.StringArray", diagnose(s))
    assert re.search(r"workers' private memory \(USS\): 40\.0 MB -> 140\.0 MB over 19\.0 s \(\+5\.3 MB/s\); "
                     r"growing steadily in 1 of 2 workers", s.table())
    levelled = _stats(trend(120 - 100 * np.exp(-np.arange(30) / 3.0)))
    assert re.search(r"grew and levelled off \(\+[\d.]+ MB over 29 s per worker, to 120\.0 MB; 1 of 1 workers\): "
                     r"likely copy-on-read", diagnose(levelled))
    flat = _stats(trend([20] * 20), trend([20] + [120] * 19))
    assert "copy-on-read" not in diagnose(flat) and "growing" not in flat.table()
    assert "private memory" not in _stats(None, None).table()


# ---------------------------------------------------------------- end to end
# A million file names in the main process, before the workers fork. In the dataset's
# order each worker reads the list front to back, copying its pages as it goes: about
# 55 MB a worker, steadily over the epoch (a shuffled order copies most pages in its first
# few percent, then levels off). The consumer's step stretches the epoch to about 4 s;
# the workers are sampled every 0.1 s instead of every second, and the reads may take a
# fifth of the main process's time (about 5 ms for a worker of 60 MB in 4 kB pages).
FAST_SAMPLING = {"MEMORY_INTERVAL": 0.1, "MEMORY_BUDGET": 0.2}


def _epoch(dataset, monkeypatch):
    for name, value in FAST_SAMPLING.items():
        monkeypatch.setattr(memory, name, value)
    loader = shmload.DataLoader(dataset, batch_size=1024, num_workers=2, multiprocessing_context="fork", timeout=30)
    for _ in loader:
        time.sleep(0.004)
    return loader


@pytest.mark.timeout(60)
def test_a_list_of_file_names_read_by_the_workers_is_diagnosed_as_copy_on_read(monkeypatch, tmp_path):
    loader = _epoch(FileNames(1_000_000), monkeypatch)
    s = loader.stats(memory=False)  # (the history is reported either way)
    trends = [w.memory for w in s.workers]
    assert len(trends) == 2 and all(m.growing and m.steady and m.growth >= 32 * MB for m in trends), trends
    assert re.search(r"workers' private memory \(USS\): [\d.]+ MB -> [\d.]+ MB over [\d.]+ s \(\+[\d.]+ [kM]B/s\); "
                     r"growing steadily in 2 of 2 workers", str(s)), str(s)
    assert re.search(r"Memory: the workers' private memory grows steadily \(\+[\d.]+ MB over \d+ s per worker, .*\): "
                     r"likely copy-on-read\. .*numpy arrays or shmload\.datasets\.StringArray", str(s)), str(s)
    s.trace(str(tmp_path / "trace.json"))
    counters = [e for e in json.loads((tmp_path / "trace.json").read_text())["traceEvents"]
                if e["ph"] == "C" and e["name"] == "private memory (USS)"]
    assert len({e["pid"] for e in counters}) == 2 and len(counters) == sum(m.samples for m in trends)


@pytest.mark.timeout(60)
def test_the_same_file_names_in_a_numpy_array_are_not(monkeypatch):
    loader = _epoch(FileNames(1_000_000, array=True), monkeypatch)
    s = loader.stats()
    trends = [w.memory for w in s.workers]
    assert len(trends) == 2 and all(m.samples >= memory.MIN_SAMPLES and not m.growing for m in trends), trends
    assert all(abs(m.growth) < 8 * MB for m in trends), trends
    assert "workers' private memory (USS)" in str(s) and "copy-on-read" not in str(s), str(s)


def test_a_worker_that_exited_unreaped_reads_as_no_sample_not_as_zero():
    import subprocess
    import sys

    from shmload.profiler.profile import _memory

    child = subprocess.Popen([sys.executable, "-c", "pass"])
    try:
        deadline = time.monotonic() + 10
        while psutil.Process(child.pid).status() != psutil.STATUS_ZOMBIE:  # exited, not yet waited for
            assert time.monotonic() < deadline
            time.sleep(0.01)
        assert _memory(child.pid) == (None, None, None)
    finally:
        child.wait(timeout=10)
    assert _memory(os.getpid())[2] > 0
