"""Exact resume: ``state_dict()`` in the middle of an epoch, a new loader with any
``num_workers``, ``load_state_dict()``, and the rest is bit-identical to an
uninterrupted run, augmentation included (the contract: shmload.testing). A state that
is not ours, or malformed, is refused naming what is wrong. The bookkeeping behind the
saved position (``shmload._loader.progress``) is also tested alone, as internals."""

from __future__ import annotations

import copy
import json
import random

import numpy as np
import pytest

from shmload import BatchSampler, DataLoader, DistributedSampler, RandomSampler, SequentialSampler, ShmloadWarning
from shmload._loader.progress import BatchProgress
from shmload.testing import assert_resumes_exactly, flatten, run

from .helpers import AugmentedDataset, RangeDataset, StatefulWorkerStreams, VariableDataset, WorkerStreams


class SeededSampler:
    """A user's sampler with its own state: a permutation from its seed and epoch."""

    def __init__(self, n, seed=0):
        self.n, self.seed, self.epoch = n, seed, 0

    def __iter__(self):
        order = np.random.default_rng([self.seed, self.epoch]).permutation(self.n).tolist()
        self.epoch += 1
        return iter(order)

    def __len__(self):
        return self.n

    def state_dict(self):
        return {"seed": self.seed, "epoch": self.epoch}

    def load_state_dict(self, state):
        self.seed, self.epoch = state["seed"], state["epoch"]


class EvensFirstBatches(SeededSampler):
    """A user's batch sampler with state: batches of 3 from a seeded order."""

    def __iter__(self):
        order = list(super().__iter__())
        return iter([order[i:i + 3] for i in range(0, self.n, 3)])

    def __len__(self):
        return -(-self.n // 3)


class PlainSampler:
    """A sampler without state_dict."""

    def __init__(self, n):
        self.n = n

    def __iter__(self):
        return iter(range(self.n))

    def __len__(self):
        return self.n


SAMPLERS = {
    "sequential": lambda ds: dict(batch_size=4),
    "shuffle": lambda ds: dict(batch_size=4, shuffle=True),
    "random-sampler": lambda ds: dict(batch_size=4, sampler=RandomSampler(ds, seed=5)),
    "explicit-sequential": lambda ds: dict(batch_size=3, drop_last=True, sampler=SequentialSampler(ds)),
    "distributed": lambda ds: dict(batch_size=4, sampler=DistributedSampler(ds, num_replicas=3, rank=1, seed=2)),
    "user-sampler": lambda ds: dict(batch_size=4, sampler=SeededSampler(len(ds), seed=9)),
    "user-batch-sampler": lambda ds: dict(batch_sampler=EvensFirstBatches(len(ds), seed=4)),
    "batch-sampler-object": lambda ds: dict(batch_sampler=BatchSampler(RandomSampler(ds, seed=1), 5, False)),
    "unbatched": lambda ds: dict(batch_size=None, shuffle=True),
}


@pytest.mark.parametrize("sampler", list(SAMPLERS))
def test_resume_is_exact_for_every_sampler_and_worker_count(sampler):
    """AugmentedDataset draws from Python's and numpy's global RNGs, so this also checks
    that augmentation randomness resumes exactly."""
    def make(num_workers, seed):
        ds = AugmentedDataset()
        return DataLoader(ds, num_workers=num_workers, seed=seed, timeout=30, **SAMPLERS[sampler](ds))
    per_epoch = len(make(0, 0))
    # in the first epoch, in the second, and right after the first epoch's last batch
    assert_resumes_exactly(make, stops=[3, per_epoch + 2, per_epoch], epochs=2)


def test_resume_is_exact_with_persistent_workers_variable_sizes_and_the_torch_like_options(start_method):
    def make(num_workers, seed):
        return DataLoader(VariableDataset(30, scale=500), batch_size=None, shuffle=True, num_workers=num_workers,
                          seed=seed, persistent_workers=num_workers > 0, prefetch_factor=3 if num_workers else None,
                          timeout=30, multiprocessing_context=start_method if num_workers else None)
    assert_resumes_exactly(make, stops=[1, 5, 17], epochs=1)


def test_resume_across_start_methods(all_start_methods):
    def make(num_workers, seed):
        return DataLoader(AugmentedDataset(), batch_size=8, shuffle=True, num_workers=num_workers, seed=seed,
                          timeout=30, multiprocessing_context=all_start_methods if num_workers else None)
    assert_resumes_exactly(make, stops=[2], epochs=1, pairs=[(2, 1)])


def test_out_of_order_resume_delivers_each_remaining_batch_exactly_once():
    def make(num_workers, seed):
        return DataLoader(VariableDataset(48, scale=100), batch_size=None, shuffle=True, num_workers=num_workers,
                          seed=seed, in_order=False, timeout=30)
    assert_resumes_exactly(make, stops=[4, 9], epochs=1, in_order=False)


@pytest.mark.pure
def test_batch_progress_records_out_of_order_deliveries_compactly():
    p = BatchProgress(start=2)
    for seq in (4, 2, 6, 3):
        p.delivered(seq)
    assert (p.next_batch, sorted(p.beyond)) == (5, [6])
    resumed = BatchProgress(5, frozenset({6}))
    resumed.delivered(5)
    assert (resumed.next_batch, resumed.beyond) == (7, set())


@pytest.mark.pure
def test_a_held_batch_is_taken_out_of_the_saved_position_in_any_order():
    from shmload._loader.progress import BatchProgress
    p = BatchProgress()
    for seq in (0, 1, 3, 4):
        p.record(seq, None)
    assert p.saved() == (2, [3, 4])
    p.held = True  # 4, delivered beyond the gap, kept
    assert p.saved() == (2, [3])
    p.held = False
    p.record(2, None)  # fills the gap: next_batch jumps to 5
    assert p.saved() == (5, [])
    p.held = True  # 2 kept: 3 and 4 stay delivered
    assert p.saved() == (2, [3, 4])


@pytest.mark.pure
def test_a_held_draw_is_taken_out_of_the_saved_streams():
    from shmload._loader.progress import StreamProgress
    from shmload._transport.messages import StreamPoint
    p = StreamProgress(2)
    p.record(0, (0, StreamPoint(1, "a1")))
    p.record(1, (1, StreamPoint(1, "b1")))
    p.record(2, (0, StreamPoint(2, "a2")))
    assert p.saved() == ([2, 1], ["a2", "b1"], 1)
    p.held = True
    assert p.saved() == ([1, 1], ["a1", "b1"], 0)
    assert (p.draws, p.states) == ([2, 1], ["a2", "b1"])  # the record itself is untouched


@pytest.mark.pure
def test_the_state_is_small_documented_json():
    loader = DataLoader(AugmentedDataset(), batch_size=4, shuffle=True, seed=3)
    it = iter(loader)
    for _ in range(3):
        next(it)
    state = loader.state_dict()
    assert state == {"shmload_loader_state": 1, "kind": "map", "epoch": 0, "seed": 3,
                     "batching": {"batch_size": 4, "drop_last": False}, "next_batch": 3,
                     "delivered_beyond": [], "sampler": {"seed": 3, "epoch": 0, "length": 40}}
    assert json.loads(json.dumps(state)) == state
    list(it)
    assert loader.state_dict()["epoch"] == 1 and loader.state_dict()["next_batch"] == 0


@pytest.mark.pure
def test_loading_sets_the_seed_and_the_next_epoch_and_state_dict_returns_it_until_used():
    saved = DataLoader(AugmentedDataset(), batch_size=4, shuffle=True, seed=3)
    it = iter(saved)
    next(it)
    state = saved.state_dict()
    loader = DataLoader(AugmentedDataset(), batch_size=4, shuffle=True, seed=77)
    loader.load_state_dict(state)
    assert loader.seed == 3 and loader.state_dict() == state
    assert len(list(loader)) == 9 and loader.state_dict()["epoch"] == 1


@pytest.mark.parametrize("workers", [0, 2])
def test_a_sampler_without_state_dict_is_saved_as_a_position_and_re_read_with_one_warning(workers):
    """Trainers call state_dict() at every checkpoint: it must not raise for a sampler
    without state (torch's DistributedSampler has none). The resume iterates the sampler
    again and skips what was delivered: exact here, since PlainSampler's order repeats."""
    def make(num_workers, seed):
        return DataLoader(AugmentedDataset(), batch_size=4, sampler=PlainSampler(40), num_workers=num_workers,
                          seed=seed, timeout=30)
    loader = make(workers, 1)
    it = iter(loader)
    next(it)
    with pytest.warns(ShmloadWarning, match=r"DataLoader.state_dict\(\): the sampler PlainSampler has no state_dict "
                                            r"or load_state_dict.*SequentialSampler, RandomSampler or "
                                            r"DistributedSampler.*The state holds the position alone: a resume "
                                            r"iterates the sampler again and skips the batches delivered"):
        state = loader.state_dict()
    assert state["sampler"] is None and state["next_batch"] == 1
    loader.state_dict()  # warned once per loader (pytest's filters turn a second warning into an error)
    del it
    with pytest.warns(ShmloadWarning):
        assert_resumes_exactly(make, stops=[3, 13], epochs=2, pairs=[(workers, 0), (0, workers)])
    with pytest.raises(TypeError, match=r"the sampler PlainSampler has no state_dict or load_state_dict"):
        loader.load_state_dict({"shmload_loader_state": 1, "kind": "map", "epoch": 0, "seed": 1, "next_batch": 0,
                                "batching": {"batch_size": 4, "drop_last": False}, "delivered_beyond": [],
                                "sampler": {}})


@pytest.mark.pure
@pytest.mark.parametrize("bad,message", [
    ({"epoch": 0}, r"expected a dict from DataLoader.state_dict\(\), but got dict \{'epoch': 0\}"),
    ([1, 2], r"expected a dict from DataLoader.state_dict\(\), but got list"),
    ({"shmload_loader_state": 99, "kind": "map"}, r"the state has format 99; this version of shmload reads format 1"),
    ({"shmload_loader_state": 1, "kind": "iterable"}, r"saved by a loader over an iterable dataset, but this "
                                                       r"loader's dataset is map"),
    ({"shmload_loader_state": 1, "kind": "map", "epoch": 0}, r"the state has no seed, batching, next_batch, "
                                                             r"delivered_beyond, sampler"),
])
def test_a_state_that_is_not_ours_is_refused_clearly(bad, message):
    with pytest.raises(ValueError, match=message):
        DataLoader(AugmentedDataset()).load_state_dict(bad)


@pytest.mark.pure
def test_a_state_saved_over_another_dataset_rank_or_batching_is_refused():
    small = DataLoader(AugmentedDataset(), batch_size=4, shuffle=True, seed=1)
    state = small.state_dict()
    other = DataLoader(VariableDataset(30), batch_size=None, shuffle=True)
    state["batching"]["batch_size"] = None
    with pytest.raises(ValueError, match=r"RandomSampler.load_state_dict: the state was saved over a dataset of 40 "
                                         r"samples, but this one has 30"):
        other.load_state_dict(state)
    assert len(list(other)) == 30  # refused at load: nothing pending
    state["batching"]["batch_size"] = 4
    with pytest.raises(ValueError, match=r"the state was saved by a loader with batch_size=4, drop_last=False, but "
                                         r"this one has batch_size=8, drop_last=False: the saved position counts"):
        DataLoader(AugmentedDataset(), batch_size=8, shuffle=True).load_state_dict(state)
    ds = AugmentedDataset()
    rank1 = DataLoader(ds, batch_size=4, sampler=DistributedSampler(ds, num_replicas=2, rank=1))
    rank0 = DataLoader(ds, batch_size=4, sampler=DistributedSampler(ds, num_replicas=2, rank=0))
    with pytest.raises(ValueError, match=r"the state was saved by rank 1 of 2, but this sampler is rank 0 of 2"):
        rank0.load_state_dict(rank1.state_dict())


class TorchStyleSampler(SeededSampler):
    """Like torch's samplers: the epoch moves only by set_epoch()."""

    def __iter__(self):
        order = np.random.default_rng([self.seed, self.epoch]).permutation(self.n).tolist()
        return iter(order)

    def set_epoch(self, epoch):
        self.epoch = epoch


@pytest.mark.pure
@pytest.mark.parametrize("stop", [0, 1, 3])
def test_torchs_set_epoch_loop_resumes_exactly_after_a_checkpoint_between_or_in_epochs(stop):
    """The user's loop calls sampler.set_epoch(epoch) before each epoch, also after
    resuming: the sampler's state is loaded at load_state_dict(), so that call acts as in
    the uninterrupted run."""
    def loader_and_sampler():
        sampler = TorchStyleSampler(12, seed=2)
        return DataLoader(AugmentedDataset(), batch_size=4, sampler=sampler, seed=1), sampler

    def epochs(loader, sampler, first, state=None, stop_at=None):
        out = []
        for epoch in range(first, 3):
            sampler.set_epoch(epoch)
            for batch in loader:
                out.append(batch[2].tolist())
                if (epoch, len(out)) == stop_at:
                    return out, loader.state_dict()
            if (epoch, -1) == stop_at:
                return out, loader.state_dict()
        return out, None

    reference, _ = epochs(*loader_and_sampler(), 0)
    stop_at = (0, -1) if stop == 0 else (1, 3 + stop)  # after epoch 0, or in epoch 1
    head, state = epochs(*loader_and_sampler(), 0, stop_at=stop_at)
    loader, sampler = loader_and_sampler()
    loader.load_state_dict(json.loads(json.dumps(state)))
    tail, _ = epochs(loader, sampler, state["epoch"])  # (after an epoch's last batch: the next epoch's start)
    assert head + tail == reference


@pytest.mark.pure
def test_set_epoch_after_load_state_dict_cancels_the_resume_unless_it_is_the_saved_epoch():
    saved = DataLoader(AugmentedDataset(), batch_size=4, shuffle=True, seed=3)
    it = iter(saved)
    next(it)
    state = saved.state_dict()
    loader = DataLoader(AugmentedDataset(), batch_size=4, shuffle=True)
    loader.load_state_dict(state)
    loader.set_epoch(0)  # the saved epoch: still resumed
    assert len(list(loader)) == 9
    loader.load_state_dict(state)
    loader.set_epoch(5)
    assert len(list(loader)) == 10 and loader.state_dict()["epoch"] == 6


@pytest.mark.pure
def test_moving_a_user_sampler_after_loading_a_mid_epoch_state_is_refused():
    saved = DataLoader(AugmentedDataset(), batch_size=4, sampler=SeededSampler(40, seed=1))
    it = iter(saved)
    next(it)
    state = saved.state_dict()
    sampler = SeededSampler(40, seed=1)
    loader = DataLoader(AugmentedDataset(), batch_size=4, sampler=sampler)
    loader.load_state_dict(state)
    sampler.epoch = 7
    with pytest.raises(ValueError, match=r"the sampler SeededSampler changed after load_state_dict\(\): its state is "
                                         r"\{'seed': 1, 'epoch': 7\}, but the saved position \(batch 1 of epoch 0\)"):
        iter(loader)
    sampler.epoch = 0  # put back: the resume was kept for the retry
    assert len(list(loader)) == 9


# ---------------------------------------------------------------- malformed states
def _map_state():
    loader = DataLoader(RangeDataset(20), batch_size=4, shuffle=True, seed=3)
    it = iter(loader)
    next(it)
    return loader.state_dict()


def _iterable_state():
    loader = DataLoader(StatefulWorkerStreams([10]), batch_size=2, seed=3)
    it = iter(loader)
    next(it)
    return loader.state_dict()


_DELETE = object()


def _changed(state, path, value):
    state = copy.deepcopy(state)
    *parents, last = path
    node = state
    for key in parents:
        node = node[key]
    if value is _DELETE:
        del node[last]
    else:
        node[last] = value
    return state


def _both(path, value, message):
    return [pytest.param(kind, path, value, message, id=f"{kind}-{'.'.join(map(str, path))}-"
                         f"{'deleted' if value is _DELETE else repr(value)}") for kind in ("map", "iterable")]


MALFORMED = [
    *_both(("batching", "drop_last"), _DELETE, r"^load_state_dict: state\['batching'\] has no drop_last: expected "
                                               r"state\['batching'\]\['drop_last'\] \(a bool"),
    *_both(("batching", "batch_size"), _DELETE, r"state\['batching'\] has no batch_size: expected "
                                                r"state\['batching'\]\['batch_size'\] \(a positive int or None"),
    *_both(("batching", "drop_last"), "no", r"^load_state_dict: state\['batching'\]\['drop_last'\] is 'no' \(a str\), "
                                            r"expected a bool"),
    *_both(("batching", "drop_last"), 0, r"state\['batching'\]\['drop_last'\] is 0 \(an int\), expected a bool"),
    *_both(("batching", "batch_size"), "4", r"state\['batching'\]\['batch_size'\] is '4' \(a str\), expected a "
                                            r"positive int or None"),
    *_both(("batching", "batch_size"), 0, r"state\['batching'\]\['batch_size'\] is 0 \(an int\), expected a positive "
                                          r"int or None"),
    *_both(("batching", "shuffle"), True, r"state\['batching'\] has an unexpected key 'shuffle': expected only "
                                          r"'batch_size' and 'drop_last'"),
    *_both(("batching",), [4, False], r"state\['batching'\] is \[4, False\] \(a list\), expected a dict with "
                                      r"'batch_size' and 'drop_last'"),
    *_both(("batching",), _DELETE, r"^load_state_dict: the state has no batching: expected state\['batching'\] "
                                   r"\(a dict with 'batch_size' and 'drop_last'"),
    *_both(("epoch",), "0", r"state\['epoch'\] is '0' \(a str\), expected a non-negative int"),
    *_both(("epoch",), -1, r"state\['epoch'\] is -1 \(an int\), expected a non-negative int"),
    *_both(("epoch",), True, r"state\['epoch'\] is True \(a bool\), expected a non-negative int"),
    *_both(("seed",), 1.5, r"state\['seed'\] is 1.5 \(a float\), expected a non-negative int"),
    *_both(("seed",), None, r"state\['seed'\] is None, expected a non-negative int"),
    pytest.param("map", ("next_batch",), None, r"state\['next_batch'\] is None, expected a "
                                               r"non-negative int", id="map-next_batch-None"),
    pytest.param("map", ("next_batch",), _DELETE, r"the state has no next_batch: expected state\['next_batch'\] "
                                                  r"\(a non-negative int", id="map-next_batch-deleted"),
    pytest.param("map", ("delivered_beyond",), 3, r"state\['delivered_beyond'\] is 3 \(an int\), expected a list of "
                                                  r"non-negative ints", id="map-delivered_beyond-3"),
    pytest.param("map", ("delivered_beyond",), [4, "5"], r"state\['delivered_beyond'\]\[1\] is '5' \(a str\), "
                                                         r"expected a non-negative int",
                 id="map-delivered_beyond-item"),
    pytest.param("map", ("delivered_beyond",), [4, -5, 6, "7", None],
                 r"^load_state_dict: state\['delivered_beyond'\]\[1\] is -5 \(an int\), expected a non-negative "
                 r"int \(and 2 more wrong items in state\['delivered_beyond'\]\)$", id="map-delivered_beyond-items"),
    pytest.param("map", ("sampler",), _DELETE, r"the state has no sampler: expected state\['sampler'\] \(the "
                                               r"sampler's state_dict\(\), or None", id="map-sampler-deleted"),
    pytest.param("iterable", ("streams",), _DELETE, r"the state has no streams: expected state\['streams'\] \(a "
                                                    r"non-empty list", id="iterable-streams-deleted"),
    pytest.param("iterable", ("streams",), {}, r"state\['streams'\] is \{\} \(a dict\), expected a non-empty list",
                 id="iterable-streams-dict"),
    pytest.param("iterable", ("streams",), [], r"state\['streams'\] is \[\] \(a list\), expected a non-empty list",
                 id="iterable-streams-empty"),
    pytest.param("iterable", ("streams", 0), 5, r"state\['streams'\]\[0\] is 5 \(an int\), expected a dict with "
                                                r"'draws', 'state' and 'ended'", id="iterable-stream-int"),
    pytest.param("iterable", ("streams", 0, "ended"), _DELETE, r"state\['streams'\]\[0\] has no ended: expected "
                                                               r"state\['streams'\]\[0\]\['ended'\] \(a bool",
                 id="iterable-stream-ended-deleted"),
    pytest.param("iterable", ("streams", 0, "draws"), -2, r"state\['streams'\]\[0\]\['draws'\] is -2 \(an int\), "
                                                          r"expected a non-negative int", id="iterable-stream-draws"),
    pytest.param("iterable", ("streams", 0, "state"), _DELETE, r"state\['streams'\]\[0\] has no state: expected "
                                                               r"state\['streams'\]\[0\]\['state'\]",
                 id="iterable-stream-state-deleted"),
    pytest.param("iterable", ("next_worker",), _DELETE, r"the state has no next_worker: expected "
                                                        r"state\['next_worker'\] \(a non-negative int",
                 id="iterable-next_worker-deleted"),
    pytest.param("iterable", ("next_worker",), 1, r"state\['next_worker'\] is 1, expected an int below "
                                                  r"len\(state\['streams'\]\), 1", id="iterable-next_worker-range"),
]


@pytest.mark.pure
@pytest.mark.parametrize("kind,path,value,message", MALFORMED)
def test_a_malformed_state_is_a_value_error_naming_the_key_path_and_what_was_expected(kind, path, value, message):
    state = _map_state() if kind == "map" else _iterable_state()
    loader = DataLoader(RangeDataset(20), batch_size=4, shuffle=True, seed=5) if kind == "map" else \
        DataLoader(StatefulWorkerStreams([10]), batch_size=2, seed=5)
    loader.load_state_dict(copy.deepcopy(state))  # the state as saved loads
    fresh = DataLoader(RangeDataset(20), batch_size=4, shuffle=True, seed=5) if kind == "map" else \
        DataLoader(StatefulWorkerStreams([10]), batch_size=2, seed=5)
    with pytest.raises(ValueError, match=message):
        fresh.load_state_dict(_changed(state, path, value))
    assert fresh.seed == 5 and fresh._resume is None  # refused before anything changed


@pytest.mark.pure
def test_every_problem_of_a_state_is_named_in_one_error():
    state = _changed(_changed(_map_state(), ("batching", "drop_last"), _DELETE), ("epoch",), "1")
    with pytest.raises(ValueError, match=r"^load_state_dict: 2 problems with the state: state\['epoch'\] is '1' \(a "
                                         r"str\), expected a non-negative int, the epoch the next iter\(\) runs; "
                                         r"state\['batching'\] has no drop_last: expected "
                                         r"state\['batching'\]\['drop_last'\] \(a bool"):
        DataLoader(RangeDataset(20), batch_size=4, shuffle=True).load_state_dict(state)


@pytest.mark.pure
def test_a_state_that_went_through_json_still_loads():
    import json

    state = json.loads(json.dumps(_map_state()))
    loader = DataLoader(RangeDataset(20), batch_size=4, shuffle=True)
    loader.load_state_dict(state)
    assert len(list(loader)) == 4


# ---------------------------------------------------------------- iterable sources
@pytest.mark.parametrize("workers", [0, 1, 2, 3])
def test_iterable_resume_is_exact_with_the_sources_state(workers):
    lengths = [9, 4, 13][:max(1, workers)]

    def make(num_workers, seed):
        return DataLoader(StatefulWorkerStreams(lengths), batch_size=2, num_workers=num_workers, seed=seed,
                          timeout=30)
    per_epoch = len(run(make(workers, 0), 1)[0])
    stops = [1, 4, per_epoch - 1, per_epoch + 3]
    # each worker reads its own shard, so a stream's state resumes with the same number of
    # workers (0 and 1 both read one stream)
    pairs = [(workers, workers)] + ([(0, 1), (1, 0)] if workers < 2 else [])
    assert_resumes_exactly(make, stops=stops, epochs=2, pairs=pairs, reference_workers=workers)


@pytest.mark.pure
def test_an_iterable_source_without_state_dict_is_saved_as_a_position_and_re_read():
    """Mid-epoch, a source without state_dict() is saved as draws per stream (one
    warning); the resume re-reads each stream and skips the draws delivered: exact for a
    stream that reads the same. Between epochs nothing of the source is needed."""
    loader = DataLoader(WorkerStreams([6]), batch_size=2)
    assert loader.state_dict()["streams"] == [{"draws": 0, "state": None, "ended": False}]
    it = iter(loader)
    head = [flatten(next(it))]
    with pytest.warns(ShmloadWarning, match=r"the iterable source WorkerStreams has no state_dict or load_state_dict.*"
                                            r"a resume re-reads each worker's stream from its start and skips the "
                                            r"draws delivered"):
        state = json.loads(json.dumps(loader.state_dict()))
    assert state["streams"] == [{"draws": 1, "state": None, "ended": False}]
    rest = [flatten(b) for b in it]
    assert loader.state_dict()["epoch"] == 1
    resumed = DataLoader(WorkerStreams([6]), batch_size=2)
    resumed.load_state_dict(state)
    assert [flatten(b) for b in resumed] == rest and len(head + rest) == 3


def test_iterable_resume_with_another_number_of_workers_is_refused():
    saved = DataLoader(StatefulWorkerStreams([6, 6]), batch_size=2, num_workers=2, timeout=30)
    it = iter(saved)
    next(it)
    state = saved.state_dict()
    del it
    loader = DataLoader(StatefulWorkerStreams([6, 6, 6]), batch_size=2, num_workers=3)
    loader.load_state_dict(state)
    with pytest.raises(ValueError, match=r"the loaded state is of an iterable source read by 2 stream\(s\) "
                                         r"\(num_workers=2\), but this loader has num_workers=3"):
        iter(loader)
    loader.num_workers = 2  # the state waits for a loader that can use it
    assert len(list(loader)) == 5


def test_random_streams_of_python_random_resume_too():
    """A source drawing from Python's random: its draws are seeded per (worker, draw)."""
    def make(num_workers, seed):
        return DataLoader(RandomNumbers(), batch_size=3, num_workers=num_workers, seed=seed, timeout=30)
    assert_resumes_exactly(make, stops=[2, 5], epochs=1, pairs=[(0, 0), (1, 0), (0, 1)])


class RandomNumbers:
    def __init__(self):
        self.pos = self.start = 0

    def __iter__(self):
        for k in range(self.start, 20):
            self.pos = k + 1
            yield random.random()
        self.start = 0

    def state_dict(self):
        return {"pos": self.pos}

    def load_state_dict(self, state):
        self.start = state["pos"]
