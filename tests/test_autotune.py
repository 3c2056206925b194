"""num_workers="auto": the policy (pure: windows in, counts out), and loaders whose worker
count changes mid-epoch, forced at known batches by ``shmload.testing.script_workers``:
the batches stay those of ``num_workers=0``, with split batches, persistent workers, a
worker killed, Ctrl-C, a resume, and every start method. No test asserts a timing.

The policy's tests import ``shmload._session.autotune`` (pure, no public surface), and a
few read the loader's tuner (``loader._sessions.tuner``) for which counts ran."""

from __future__ import annotations

import json
import os
import random
import time

import numpy as np
import pytest

from shmload import DataLoader
from shmload._session.autotune import (
    FIRST_BAR,
    MANY_BATCHES,
    MIN_BATCHES,
    MIN_WINDOW,
    SHORT_WINDOW,
    Policy,
    Window,
    enough,
)
from shmload.testing import flatten, run, script_workers

from .helpers import AugmentedDataset, DyingDataset, RangeDataset, rows_under_interrupts

pytestmark = pytest.mark.timeout(120)


# ---------------------------------------------------------------- the policy (pure)
def _window(wait=0.5, busy=1.0, workers=1, free=1.0, rate=100.0, room=None, seconds=0.5):
    """A window of ``seconds`` in which the consumer waited ``wait`` of its time, the
    ``workers`` were each busy ``busy`` of it and ``free`` cores were left."""
    batches = int(rate * seconds)
    return Window(seconds, batches, wait * seconds, (1 - wait) * seconds, busy * workers * seconds, free,
                  None if room is None else lambda: room)


def test_a_waiting_consumer_with_busy_workers_and_a_free_core_gets_a_worker():
    p = Policy(cap=4, count=1)
    assert p.decide(_window(free=1.0)) == 2
    assert p.probe is not None and p.probe.grew


def test_a_consumer_that_does_nothing_gets_as_many_as_the_free_cores_allow():
    p = Policy(cap=8, count=1)
    w = Window(0.5, 50, 0.5, 0.0001, 0.5, 3.2, None)  # no step at all, 3.2 cores free
    assert p.decide(w) == 4  # 1 + floor(3.2 + 0.5)


@pytest.mark.parametrize("why", ["idle workers", "no free core", "at the cap", "no memory", "not waiting"])
def test_no_worker_is_added_without_every_reason(why):
    p = Policy(cap=1 if why == "at the cap" else 4, count=1)
    w = _window(busy=0.3 if why == "idle workers" else 1.0, free=0.2 if why == "no free core" else 1.5,
                room=0 if why == "no memory" else None, wait=0.02 if why == "not waiting" else 0.5)
    assert p.decide(w) == 1


def test_an_addition_that_does_not_raise_the_rate_is_undone_and_barred():
    p = Policy(cap=4, count=1)
    assert p.decide(_window(rate=100)) == 2
    assert p.decide(_window(workers=2, rate=103)) == 1  # +3% is not the 5% asked: back to 1
    assert p.bar_above == (1, FIRST_BAR)
    for _ in range(FIRST_BAR - 1):  # barred: the same evidence does not add one again
        assert p.decide(_window(rate=100)) == 1
    assert p.decide(_window(rate=100)) == 2  # the bar has run out
    assert p.decide(_window(workers=2, rate=100)) == 1
    assert p.bar_above == (1, 2 * FIRST_BAR)  # twice as long after a second undone probe


def test_an_addition_that_raises_the_rate_stays():
    p = Policy(cap=4, count=1)
    assert p.decide(_window(rate=100)) == 2
    assert p.decide(_window(workers=2, rate=190)) == 2
    assert p.probe is None and p.strikes == 0


def test_idle_workers_are_stopped_one_at_a_time_and_a_stop_that_costs_is_undone():
    p = Policy(cap=4, count=3)
    assert p.decide(_window(wait=0.0, busy=0.3, workers=3, rate=50)) == 2
    assert p.decide(_window(wait=0.0, busy=0.3, workers=2, rate=50)) == 2  # the same rate: kept
    assert p.decide(_window(wait=0.0, busy=0.45, workers=2, rate=50)) == 2  # one would be 90% busy: kept
    assert p.decide(_window(wait=0.0, busy=0.3, workers=2, rate=50)) == 1
    assert p.decide(_window(wait=0.3, busy=0.9, workers=1, rate=40)) == 2  # 20% slower: undone
    assert p.bar_below == (2, FIRST_BAR)
    assert p.decide(_window(wait=0.0, busy=0.3, workers=2, rate=50)) == 2  # not under 2 while barred


def test_a_saturated_machine_stops_a_worker_while_the_consumer_does_not_wait():
    p = Policy(cap=4, count=2)
    assert p.decide(_window(wait=0.01, busy=0.9, workers=2, free=0.05)) == 1
    p = Policy(cap=4, count=2)
    assert p.decide(_window(wait=0.01, busy=0.9, workers=2, free=0.6)) == 2  # a core left: nothing to gain


def test_the_count_never_leaves_one_to_the_cap():
    p = Policy(cap=3, count=9)
    assert p.count == 3
    assert Policy(cap=3, count=0).count == 1
    p = Policy(cap=1, count=1)
    assert p.decide(_window(wait=0.0, busy=0.0)) == 1
    with pytest.raises(ValueError, match=r"the cap of workers must be at least 1, not 0"):
        Policy(cap=0, count=1)


def test_a_window_is_long_enough_by_time_and_batches():
    assert not enough(SHORT_WINDOW / 2, 1000)
    assert not enough(MIN_WINDOW, MIN_BATCHES - 1)
    assert not enough(SHORT_WINDOW, MANY_BATCHES - 1)
    assert enough(SHORT_WINDOW, MANY_BATCHES)
    assert enough(MIN_WINDOW, MIN_BATCHES)
    assert enough(10.0, 1)  # slow batches: a long window decides with one


# ---------------------------------------------------------------- loaders, counts forced
SCRIPT = {0: 1, 4: 3, 9: 2, 15: 1}  # an epoch is 20 batches


@pytest.mark.parametrize("split", [None, True, False])
@pytest.mark.parametrize("persistent", [False, True])
def test_batches_equal_num_workers_0_while_the_count_changes(split, persistent, start_method):
    expected, _ = run(DataLoader(AugmentedDataset(), batch_size=2, seed=5, split_batches=split), 2)
    loader = DataLoader(AugmentedDataset(), batch_size=2, seed=5, num_workers="auto", max_workers=3,
                        split_batches=split, persistent_workers=persistent, multiprocessing_context=start_method,
                        timeout=30)
    script_workers(loader, SCRIPT)
    with loader:
        got, _ = run(loader, 2)
        counts = [n for _, n in loader._sessions.tuner.history]
        stats = loader.stats(memory=False)
        if persistent:  # every id was started (which loads what depends on timing: not asserted)
            assert len(loader._sessions.persistent.supervisor.workers) == 3
    assert got == expected
    assert counts == [1, 3, 2, 1, 3, 2, 1]  # each change in each epoch (the second begins at 1, as it ended)
    assert [n for _, n in stats.worker_counts] == counts and stats.max_workers == 3 and stats.num_workers == 1


@pytest.mark.parametrize("method", ["spawn", "forkserver"])
def test_workers_start_and_stop_mid_epoch_with_every_start_method(method):
    expected = [flatten(b) for b in DataLoader(AugmentedDataset(), batch_size=2, seed=5)]
    loader = DataLoader(AugmentedDataset(), batch_size=2, seed=5, num_workers="auto", max_workers=3,
                        multiprocessing_context=method, timeout=60)
    script_workers(loader, {0: 1, 3: 3, 12: 1, 15: 2})
    with loader:
        got, _ = run(loader, 1)
    assert got == expected


def test_a_stopped_worker_finishes_what_it_holds_and_takes_no_more():
    loader = DataLoader(RangeDataset(200), batch_size=2, seed=5, num_workers="auto", max_workers=2,
                        prefetch_factor=4, timeout=30, split_batches=False)
    script_workers(loader, {0: 2, 10: 1})
    with loader:
        got = [b.tolist() for b in loader]
        session_workers = loader.stats(memory=False).workers
    assert got == [[i, i + 1] for i in range(0, 200, 2)]
    by_id = {w.id: w.batches for w in session_workers}
    # worker 1 stopped once batch 10 was delivered: by then at most 10 + 2 x 4 batches had
    # been sent out (two workers of depth 4), so it loaded no more than those, not a share
    # of the other 80 (how many of those it had depends on when it started: not asserted)
    assert by_id.get(1, 0) <= 18 and by_id[0] >= 100 - 18


def test_a_worker_killed_while_the_count_changes_is_restarted_with_nothing_lost(tmp_path):
    dataset = DyingDataset(120, at=61, marker_dir=tmp_path, how="kill")
    expected = [flatten(b) for b in DataLoader(dataset, batch_size=3, seed=5)]
    loader = DataLoader(dataset, batch_size=3, seed=5, num_workers="auto", max_workers=3, max_worker_restarts=1,
                        timeout=30)
    script_workers(loader, {0: 1, 2: 3, 25: 2})
    with pytest.warns(Warning, match=r"unexpectedly; started pid \d+ in its place \(restart 1 of "
                                     r"max_worker_restarts=1\)"):
        with loader:
            got, _ = run(loader, 1)
    assert got == expected
    assert os.listdir(tmp_path) == ["died-0"]


def test_ctrl_c_while_workers_start_and_stop_then_going_on_yields_every_batch_once():
    rng = random.Random(3)
    loader = DataLoader(RangeDataset(600), batch_size=2, num_workers="auto", max_workers=3, timeout=30,
                        prefetch_factor=2)
    script_workers(loader, {k: 1 + k % 3 for k in range(0, 300, 7)})
    with loader:
        got, interrupts = rows_under_interrupts(iter(loader), rng, 0.003, 0.0005)
    expected = [[i, i + 1] for i in range(0, 600, 2)]
    first = next((k for k, (a, b) in enumerate(zip(got, expected)) if a != b), min(len(got), len(expected)))
    assert got == expected, (f"{interrupts} interrupts, {len(got)} batches; first difference at {first}: "
                             f"{got[first - 2:first + 3]} against {expected[first - 2:first + 3]}")
    # every timer's SIGINT must land: one discarded (a start_window that set SIG_IGN
    # while this test's timer thread received it) ended the series after 5-16 of ~130
    assert interrupts >= 30


def test_ctrl_c_then_a_resume_continues_exactly_and_from_the_last_count():
    expected, _ = run(DataLoader(AugmentedDataset(), batch_size=2, seed=5), 2)
    loader = DataLoader(AugmentedDataset(), batch_size=2, seed=5, num_workers="auto", max_workers=3, timeout=30)
    script_workers(loader, {0: 1, 3: 3, 8: 2})
    got = []
    with loader:
        try:
            for i, b in enumerate(loader):
                got.append(flatten(b))
                if i == 11:
                    raise KeyboardInterrupt  # the user's Ctrl-C, in the loop's body
        except KeyboardInterrupt:
            pass
        state = json.loads(json.dumps(loader.state_dict()))
    assert state["workers"] == 2
    resumed = DataLoader(AugmentedDataset(), batch_size=2, seed=99, num_workers="auto", max_workers=3, timeout=30)
    resumed.load_state_dict(state)
    with resumed:
        rest, _ = run(resumed, 2)
        first = resumed._sessions.tuner.history[0][1]
    assert got + rest[:len(expected) - len(got)] == expected
    assert first == 2  # it began with the saved count


def test_an_unscripted_auto_loader_yields_num_workers_0s_batches_and_reports_its_counts(tmp_path):
    expected, _ = run(DataLoader(AugmentedDataset(), batch_size=1, seed=5), 3)
    loader = DataLoader(AugmentedDataset(), batch_size=1, seed=5, num_workers="auto", timeout=30)
    with loader:
        got, _ = run(loader, 3)
        stats = loader.stats(memory=False)
    assert got == expected
    counts = stats.worker_counts
    assert counts and counts[0][0] >= 0.0 and all(1 <= n <= stats.max_workers for _, n in counts)
    assert "num_workers='auto' (at most " in str(stats)
    stats.trace(str(tmp_path / "t.json"))
    events = json.loads((tmp_path / "t.json").read_text())["traceEvents"]
    assert [e["args"]["workers"] for e in events if e["name"] == "workers run"] == [n for _, n in counts]


# ---------------------------------------------------------------- settings
def test_auto_is_refused_for_an_iterable_source():
    class Stream:
        def __iter__(self):
            return iter(range(10))

    with pytest.raises(ValueError, match=r"num_workers='auto' needs a map-style dataset: an iterable source is read "
                                         r"as one stream per worker"):
        DataLoader(Stream(), batch_size=2, num_workers="auto")


@pytest.mark.parametrize("kwargs, message", [
    ({"num_workers": "Auto"}, r"num_workers should be a non-negative integer, but got num_workers='Auto' \(.*"
                              r"or num_workers='auto'\)"),
    ({"num_workers": -1}, r"num_workers option should be non-negative"),
    ({"num_workers": "auto", "max_workers": 0}, r"max_workers should be a positive integer or None, but got "
                                                r"max_workers=0"),
    ({"num_workers": 2, "max_workers": 3}, r"max_workers is the cap of num_workers='auto', but got num_workers=2: "
                                           r"pass num_workers='auto', or leave max_workers out"),
])
def test_bad_worker_settings_are_named(kwargs, message):
    with pytest.raises(ValueError, match=message):
        DataLoader(RangeDataset(8), batch_size=2, **kwargs)


def test_a_state_with_a_bad_count_is_refused_and_changes_nothing():
    saved = DataLoader(RangeDataset(8), batch_size=2, shuffle=True, seed=3)
    assert "workers" not in saved.state_dict()  # a fixed count saves none
    for _ in range(3):
        list(saved)
    state = saved.state_dict()  # at epoch 3: loading it moves a sampler
    loader = DataLoader(RangeDataset(8), batch_size=2, shuffle=True, num_workers="auto", seed=3)
    fresh = [b.tolist() for b in DataLoader(RangeDataset(8), batch_size=2, shuffle=True, seed=3)]
    with pytest.raises(ValueError, match=r"state\['workers'\] should be a positive integer, but got "
                                         r"state\['workers'\]=0"):
        loader.load_state_dict({**state, "workers": 0, "seed": 4})
    assert loader.seed == 3 and loader._sessions.first_count is None and loader.sampler.epoch == 0
    with loader:
        assert [b.tolist() for b in loader] == fresh  # epoch 0, as if nothing had been loaded


def test_an_auto_loader_reports_before_its_first_epoch_and_can_be_given_a_count_later():
    loader = DataLoader(RangeDataset(8), batch_size=2, num_workers="auto", max_workers=3)
    stats = loader.stats(memory=False)
    assert (stats.num_workers, stats.max_workers, stats.worker_counts) == (1, 3, ())
    assert "num_workers='auto' (at most 3): no worker started yet" in str(stats)
    assert "num_workers='auto'" in repr(loader)
    loader.num_workers = 2  # max_workers is then unused, not an error
    with loader:
        assert np.concatenate(list(loader)).tolist() == list(range(8))
    assert loader.stats(memory=False).worker_counts is None


def test_script_workers_needs_an_auto_loader_and_sane_counts():
    with pytest.raises(ValueError, match=r"script_workers needs a loader with num_workers='auto', not "
                                         r"num_workers=2"):
        script_workers(DataLoader(RangeDataset(8), num_workers=2), {0: 1})
    with pytest.raises(ValueError, match=r"expected \{batch: workers\} with batch >= 0 and workers >= 1, but got "
                                         r"3: 0"):
        script_workers(DataLoader(RangeDataset(8), num_workers="auto"), {3: 0})


def test_the_cap_defaults_to_the_usable_cores():
    loader = DataLoader(RangeDataset(8), batch_size=2, num_workers="auto")
    cfg = loader._config()
    assert cfg.auto_workers and cfg.num_workers == len(os.sched_getaffinity(0))
    assert np.array_equal(np.concatenate([b for b in DataLoader(RangeDataset(8), batch_size=2)]), np.arange(8))


def test_a_worker_parked_long_enough_exits_and_its_id_starts_again_when_needed(monkeypatch):
    """A stopped worker's process stays scaling.PARKED seconds (0 here), then exits; the
    count coming back starts a new process for its id, and the batches do not change."""
    from shmload._session import scaling
    monkeypatch.setattr(scaling, "PARKED", 0.0)
    expected, _ = run(DataLoader(RangeDataset(120), batch_size=2, seed=5), 1)
    loader = DataLoader(RangeDataset(120), batch_size=2, seed=5, num_workers="auto", max_workers=3,
                        persistent_workers=True, timeout=30)
    script_workers(loader, {0: 3, 8: 1, 40: 3})
    got = []
    with loader:
        for seq, b in enumerate(loader):
            got.append(flatten(b))
            if seq == 4:
                first = [h.pid for h in loader._sessions.persistent.supervisor.workers]
            if 8 <= seq < 40:
                time.sleep(0.02)  # ticks of the tuner (every 50 ms) while workers 1 and 2 are parked
            if seq == 39:
                stopped = [h.stopped for h in loader._sessions.persistent.supervisor.workers]
        last = [h.pid for h in loader._sessions.persistent.supervisor.workers]
        stats = loader.stats(memory=False)
    assert got == expected
    assert all(w.cpu is not None for w in stats.workers) and stats.own_cpu() is not None  # read before they exited
    assert stopped == [False, True, True]
    assert len(first) == len(last) == 3 and last[0] == first[0] and set(last[1:]).isdisjoint(first)


def test_a_worker_that_cannot_be_started_leaves_the_count_and_loses_no_batch(monkeypatch):
    """A start that fails (here: out of file descriptors) never costs the batch being
    delivered: the count stays where it runs, with a warning, and the epoch goes on."""
    import errno

    from shmload._session.supervisor import Supervisor
    real, calls = Supervisor._start_process, []

    def start(self, wid, args):
        calls.append(wid)
        if len(calls) > 1:
            raise OSError(errno.EMFILE, "Too many open files")
        return real(self, wid, args)
    monkeypatch.setattr(Supervisor, "_start_process", start)
    expected, _ = run(DataLoader(RangeDataset(40), batch_size=2, seed=5), 1)
    loader = DataLoader(RangeDataset(40), batch_size=2, seed=5, num_workers="auto", max_workers=3, timeout=30)
    script_workers(loader, {3: 2, 6: 3})
    with pytest.warns(Warning, match=r"num_workers='auto' could not change its worker count and stays at 1 for "
                                     r"this loader \(ShmloadError: this process has run out of file descriptors"):
        with loader:
            got, _ = run(loader, 1)
            assert loader._sessions.tuner.cap == 1
    assert got == expected


def test_the_tuner_keeps_no_closed_session_alive():
    import gc
    import weakref
    loader = DataLoader(RangeDataset(16), batch_size=2, num_workers="auto", timeout=30)
    it = iter(loader)
    for b in it:
        pass
    session = weakref.ref(it._session)
    del it, b
    gc.collect()
    assert session() is None  # its ring unmapped, its descriptors closed
    loader.close()


def test_a_new_count_loaded_into_a_persistent_loader_is_run_by_its_workers():
    loader = DataLoader(RangeDataset(16), batch_size=2, num_workers="auto", max_workers=3, persistent_workers=True,
                        timeout=30)
    script_workers(loader, {0: 3})
    with loader:
        list(loader)
        state = loader.state_dict()
        assert state["workers"] == 3 and loader._sessions.persistent.scaling.target == 3
        script_workers(loader, {})  # no more changes: the loaded count is what runs
        loader.load_state_dict({**state, "workers": 1})
        assert [b.tolist() for b in loader] == [[i, i + 1] for i in range(0, 16, 2)]
        assert loader._sessions.persistent.scaling.target == 1 and loader.state_dict()["workers"] == 1
        assert loader.stats(memory=False).worker_counts[-1][1] == 1


class _Handle:
    def __init__(self, wid):
        self.id, self.ready, self.exited, self.stopped, self.pid = wid, False, False, False, 100 + wid


class _Supervisor:
    """What Scaling uses of a supervisor: processes started, stopped, restarted (no process)."""

    def __init__(self, started):
        self.workers = [_Handle(w) for w in range(started)]
        self.stops = []

    def add(self):
        self.workers.append(_Handle(len(self.workers)))
        return self.workers[-1]

    def stop(self, wid):
        self.stops.append(wid)
        self.workers[wid].stopped = self.workers[wid].exited = True

    def restart(self, wid):
        self.workers[wid] = _Handle(wid)

    def reap_stopped(self):
        pass


def test_workers_dropped_while_still_starting_are_parked_and_stopped_once_ready(monkeypatch):
    from shmload._session import scaling
    from shmload._session.dispatch import Dispatcher
    monkeypatch.setattr(scaling, "PARKED", 0.0)
    d = Dispatcher(3, 2)
    sup = _Supervisor(1)
    sup.workers[0].ready = True
    s = scaling.Scaling(d, 1)
    s.set(3, sup, lambda wid: None, now=0.0)
    assert len(sup.workers) == 3 and d.accepting == [True, False, False] and not s.settled  # starting
    s.set(1, sup, lambda wid: None, now=1.0)  # dropped before they said they are ready
    assert s.parked == {1: 1.0, 2: 1.0}
    s.stop_parked(sup, 2.0, lambda wid, pid: None)
    assert sup.stops == []  # not while they start
    for h in sup.workers[1:]:
        h.ready = True
        s.ready(h.id)
    assert d.accepting == [True, False, False]  # ready, but not among the target
    seen = []
    s.stop_parked(sup, 3.0, lambda wid, pid: seen.append((wid, pid)))
    assert sup.stops == [1, 2] and seen == [(1, 101), (2, 102)] and s.parked == {}
    s.set(2, sup, lambda wid: None, now=4.0)  # a stopped id gets a new process, given tasks once ready
    assert not sup.workers[1].stopped and d.accepting == [True, False, False]
    sup.workers[1].ready = True
    s.ready(1)
    assert d.accepting == [True, True, False] and s.settled
