"""Worker memory over time: the growth rule and the sampler (profiler/memory.py)."""

from __future__ import annotations

import time

import numpy as np
import pytest

from shmload.profiler import memory
from shmload.profiler.memory import MemoryHistory, memory_trend

MB = 1e6


def trend(uss_mb, seconds=1.0):
    """The trend of samples ``seconds`` apart with these USS values (MB)."""
    u = np.asarray(uss_mb, dtype=float) * MB
    return memory_trend(123, np.column_stack([np.arange(len(u)) * seconds, u]))


# ---------------------------------------------------------------- the rule
def test_steady_growth_is_flagged_as_steady():
    t = trend(np.linspace(20, 120, 20))
    assert t.growing and t.steady
    assert t.first == 20 * MB and t.last == t.peak == 120 * MB and t.growth == 100 * MB
    assert t.samples == 20 and t.seconds == 19.0 and t.rate == pytest.approx(100 * MB / 19)


def test_noisy_but_rising_is_flagged():
    rng = np.random.default_rng(0)
    for _ in range(20):
        t = trend(np.linspace(20, 120, 30) + rng.normal(0, 5, 30))  # noise 5% of the growth
        assert t.growing and t.steady


def test_a_one_time_step_is_not_flagged():
    # a decoder's buffers at the first batch: 100 MB between two samples, then flat
    assert not trend([20] + [120] * 19).growing
    assert not trend([20] * 10 + [120] * 10).growing  # in the middle
    assert not trend([20, 20, 70, 120] + [120.5] * 16).growing  # spread over two intervals


def test_flat_is_not_flagged():
    assert not trend([40.0, 40.1, 39.9, 40.3, 40.2, 40.4] * 4).growing
    # 20 MB: under the 32 MB floor
    assert not trend(np.linspace(40, 60, 20)).growing
    # 100 MB on a 2 GB worker: under a tenth of it
    assert not trend(np.linspace(2000, 2100, 20)).growing


def test_too_short_is_not_flagged():
    assert not trend(np.linspace(20, 120, 5)).growing  # too few samples
    assert not trend(np.linspace(20, 120, 20), seconds=0.1).growing  # 1.9 s in all
    assert trend([20]) is None


def test_growth_that_levels_off_is_flagged_but_not_steady():
    # copy-on-read in a shuffled order: most pages copied early, then flat
    t = trend(120 - 100 * np.exp(-np.arange(30) / 3.0))
    assert t.growing and not t.steady


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


def test_the_sampler_reads_one_worker_a_time_round_robin_each_at_most_every_interval():
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


def test_slow_reads_are_spaced_to_stay_within_the_budget():
    history = MemoryHistory(FakeReads(seconds=0.02))
    history.sample(0.0, {0: 100, 1: 101})
    assert history.next_read >= 0.02 / memory.MEMORY_BUDGET  # 2 s, not 0.5 s


def test_a_full_series_keeps_every_other_sample_and_reads_half_as_often():
    history = MemoryHistory(FakeReads())
    for k in range(memory.SAMPLES + 1):
        history.sample(k * memory.MEMORY_INTERVAL, {0: 100})
    (pid, rows), = history.window(0.0).values()
    assert pid == 100 and len(rows) == memory.SAMPLES // 2 + 1
    assert rows[:, 0].tolist()[:3] == [0.0, 2.0, 4.0] and rows[-1, 0] == memory.SAMPLES
    history.sample(memory.SAMPLES + 1.5, {0: 100})  # due again only 2 intervals on
    assert len(history.window(0.0)[0][1]) == memory.SAMPLES // 2 + 1


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
