"""Shuffling streams (issue 22): a seeded shuffle buffer per worker stream that resumes
exactly, and stream_parts(), the shared shuffle of a stream's parts. The buffer and the
arrangement are tested alone first, as internals (``shmload._ordering.shuffle``), then
through the loader."""

from __future__ import annotations

import json

import numpy as np
import pytest

import shmload
from shmload import DataLoader, GeneratorSource, ShmloadWarning
from shmload._ordering.shuffle import BLOCK, ShuffleBuffer, StreamShuffle, arrangement, parts_order, share_of_parts
from shmload._ordering.stream import Stream, StreamPlace
from shmload._transport.messages import Draw, StreamPoint
from shmload.testing import assert_resumes_exactly, flatten, run

from .helpers import StatefulWorkerStreams, WorkerStreams


def numbers(n):
    """A stream of n (float32 row, label) samples: label k is the k-th sample."""
    for k in range(n):
        yield np.full(3, k, np.float32), k


def labels(loader, epochs=1):
    return [[int(x) for b in loader for x in b[1]] for _ in range(epochs)]


def simulate(size, key, total):
    """The buffer's order over range(total), written out the plain way (NOTE [ A shuffle
    buffer that resumes exactly ], shuffle.py): fill, then pick with u_t mod held, refill
    or move the last slot in."""
    from shmload._ordering.shuffle import block_picks
    buf, out, src, t = [], [], iter(range(total)), 0
    for x in src:
        buf.append(x)
        if len(buf) == size:
            break
    ended = len(buf) < size
    while buf:
        u = int(block_picks(key, t // BLOCK)[t % BLOCK])
        nxt = None if ended else next(src, None)
        ended = ended or nxt is None
        j = u % len(buf)
        out.append(buf[j])
        if nxt is not None:
            buf[j] = nxt
        else:
            last = buf.pop()
            if j < len(buf):
                buf[j] = last
        t += 1
    return out


# ---------------------------------------------------------------- the buffer, pure
@pytest.mark.pure
@pytest.mark.parametrize("size,total", [(1, 50), (7, 0), (7, 3), (7, 7), (7, 8), (64, 5000), (5000, 20000)])
def test_the_buffer_is_the_plain_algorithm_and_emits_every_sample_once(size, total):
    key = (3, 1, 0, 2)
    got = list(ShuffleBuffer(iter(range(total)), size, key))
    assert got == simulate(size, key, total)
    assert sorted(got) == list(range(total))
    if size == 1:
        assert got == list(range(total))


@pytest.mark.pure
@pytest.mark.parametrize("size,total", [(1, 40), (5, 3), (5, 5), (16, 400), (300, 9000)])
def test_the_arrangement_is_computed_for_any_step_without_the_samples(size, total):
    """arrangement() (picks found backwards, the drain replayed) equals the slots of a
    buffer run forward, at every step, in both phases."""
    key = (9, 4, 1, 0)
    buf = ShuffleBuffer(iter(range(total)), size, key)
    checked = 0
    while True:
        if buf.read and (buf.emitted % 7 == 0 or buf.end is not None):
            assert arrangement(size, key, buf.emitted, buf.read, buf.end) == buf._positions
            checked += 1
        try:
            next(buf)
        except StopIteration:
            break
    assert checked > 2


@pytest.mark.pure
def test_an_arrangement_no_buffer_can_reach_is_refused():
    with pytest.raises(ValueError, match=r"a shuffle buffer of 8 after 5 steps has read 13 samples, not 12"):
        arrangement(8, (0, 0, 0, 0), 5, 12, None)


@pytest.mark.pure
def test_a_source_error_changes_nothing_and_the_next_call_asks_again():
    def flaky():
        for k in range(30):
            if k in (3, 17):
                yield "bad"
            yield k

    class Raising:
        def __init__(self):
            self.it = flaky()

        def __next__(self):
            x = next(self.it)
            if x == "bad":
                raise ValueError("bad record")
            return x

    buf = ShuffleBuffer(Raising(), 8, (1, 1, 1, 1))
    got, errors = [], 0
    while True:
        try:
            got.append(next(buf))
        except ValueError:
            errors += 1
        except StopIteration:
            break
    assert errors == 2
    assert got == simulate(8, (1, 1, 1, 1), 30)


@pytest.mark.pure
def test_the_parts_share_is_a_partition_shuffled_alike_everywhere():
    parts = [f"part-{i:03d}" for i in range(23)]
    shuffle = StreamShuffle(100, parts_seed=5)
    for epoch in range(3):
        shares = [share_of_parts(parts, r, 4, shuffle, epoch) for r in range(4)]
        assert sorted(sum(shares, [])) == parts
        assert shares == [share_of_parts(parts, r, 4, shuffle, epoch) for r in range(4)]  # the same in every process
    assert share_of_parts(parts, 0, 1, shuffle, 0) != share_of_parts(parts, 0, 1, shuffle, 1)
    assert share_of_parts(parts, 0, 1, shuffle, 0) != parts
    assert share_of_parts(parts, 1, 4, StreamShuffle(1, 5), 0) == parts[1::4]  # a buffer of one: in order
    assert share_of_parts(parts, 1, 4, None, 0) == parts[1::4]
    assert parts_order(23, 5, 0).tolist() != parts_order(23, 6, 0).tolist()


# ---------------------------------------------------------------- through the loader
@pytest.mark.parametrize("workers", [0, 2])
def test_every_sample_once_per_epoch_in_an_order_that_differs_from_the_file_and_between_epochs(workers):
    loader = DataLoader(StatefulWorkerStreams([300, 250]), batch_size=8, num_workers=workers, seed=3, timeout=30,
                        shuffle_buffer=64)
    first, second = labels(loader, 2)
    plain = labels(DataLoader(StatefulWorkerStreams([300, 250]), batch_size=8, num_workers=workers, timeout=30))[0]
    assert sorted(first) == sorted(second) == sorted(plain)
    assert len(set(first)) == len(first)
    assert first != plain and second != plain and first != second


def test_every_start_method_gives_the_same_shuffled_batches(all_start_methods):
    """The buffer's key travels to spawned workers with their arguments: one worker gives
    what num_workers=0 gives (one stream), two what two forked workers give."""
    def batches(lengths, workers, method):
        loader = DataLoader(StatefulWorkerStreams(lengths), batch_size=4, num_workers=workers, seed=9, timeout=30,
                            shuffle_buffer=8, multiprocessing_context=method)
        return run(loader, 1)[0]

    assert batches([40], 1, all_start_methods) == batches([40], 0, None)
    assert batches([40, 30], 2, all_start_methods) == batches([40, 30], 2, "fork")


def test_a_buffer_of_one_is_the_unshuffled_order():
    kwargs = dict(batch_size=5, num_workers=2, seed=3, timeout=30)
    plain = labels(DataLoader(StatefulWorkerStreams([47, 31]), **kwargs), 2)
    assert labels(DataLoader(StatefulWorkerStreams([47, 31]), shuffle_buffer=1, **kwargs), 2) == plain
    assert labels(DataLoader(StatefulWorkerStreams([47, 31]), shuffle_buffer=0, **kwargs), 2) == plain


def test_the_same_seed_gives_the_same_batches_and_one_stream_is_one_stream():
    """num_workers=0 and 1 read one stream (worker 0 of 1), so they give the same
    batches; with more workers each stream is shuffled by its own key, and a rerun with
    the same seed gives the same batches."""
    def batches(workers, seed):
        loader = DataLoader(StatefulWorkerStreams([120, 90, 60]), batch_size=4, num_workers=workers, seed=seed,
                            timeout=30, shuffle_buffer=32)
        return run(loader, 2)[0]

    assert batches(0, 7) == batches(1, 7)
    assert batches(3, 7) == batches(3, 7)
    assert batches(0, 7) != batches(0, 8)


@pytest.mark.pure
def test_mixing_grows_with_the_buffer():
    """Mean displacement of a sample from its position in the stream: about N/2 for a
    buffer of N in steady state (each step takes any slot with equal chance), 0 for N=1."""
    def displacement(size):
        loader = DataLoader(GeneratorSource(numbers, 20000), batch_size=500, seed=1, shuffle_buffer=size)
        order = labels(loader)[0]
        return float(np.mean(np.abs(np.arange(len(order)) - np.array(order))))

    figures = [displacement(n) for n in (1, 10, 100, 1000)]
    assert figures[0] == 0
    assert figures[1] < figures[2] < figures[3]
    for n, d in zip((10, 100, 1000), figures[1:]):
        assert 0.5 * n < d < 2 * n, (n, d)


@pytest.mark.pure
def test_the_buffer_holds_references_not_copies():
    kept = []

    def objects():
        for k in range(50):
            row = np.full(4, k, np.int32)
            kept.append(row)
            yield row

    buf = ShuffleBuffer(objects(), 10, (0, 0, 0, 0))
    out = list(buf)
    assert all(any(o is k for k in kept) for o in out)


# ---------------------------------------------------------------- exact resume
def make(lengths, buffer=16, source=StatefulWorkerStreams, **extra):
    def make_loader(num_workers, seed):
        return DataLoader(source(lengths), batch_size=4, num_workers=num_workers, seed=seed, timeout=30,
                          shuffle_buffer=buffer, **extra)
    return make_loader


def test_a_shuffled_stream_resumes_exactly_at_any_point_with_one_stream():
    """Stops while the buffer fills, in steady state, while it drains, at an epoch's end."""
    assert_resumes_exactly(make([70]), stops=[1, 4, 9, 15, 18, 19, 25], epochs=2, workers=(0, 1))


@pytest.mark.parametrize("workers", [2, 3])
def test_a_shuffled_stream_resumes_exactly_with_several_workers(workers):
    assert_resumes_exactly(make([70, 45, 90][:workers]), stops=[2, 11, 30], epochs=2,
                           pairs=[(workers, workers)], reference_workers=workers)


def test_a_large_buffer_resumes_exactly_and_its_state_stays_small():
    """A buffer bigger than a pick block, a stream longer than several: the state is a few
    ints and one state of the source whatever the buffer's size."""
    assert_resumes_exactly(make([9000], buffer=5000), stops=[3, 700], epochs=1, workers=(0, 1))
    states = {}
    for buffer in (10, 5000):
        loader = make([9000], buffer=buffer)(num_workers=0, seed=1)
        _, states[buffer] = run(loader, 1, stop_after=600)
    sizes = {b: len(json.dumps(s)) for b, s in states.items()}
    assert sizes[5000] < 600 and abs(sizes[5000] - sizes[10]) < 40, sizes


def test_a_resumed_stream_saves_and_resumes_again():
    """The placeholders' positions of a resumed buffer choose its later snapshots: a
    state saved after a resume resumes exactly too."""
    make_loader = make([80, 66], buffer=12)
    reference = run(make_loader(num_workers=2, seed=5), 2)[0]
    _, state = run(make_loader(num_workers=2, seed=5), 2, stop_after=5)
    done = 5
    for more in (6, 9, 7):
        loader = make_loader(num_workers=2, seed=5)
        loader.load_state_dict(state)
        got, state = run(loader, 2 - state["epoch"], stop_after=more)
        assert got == reference[done:done + more], done
        done += more
    loader = make_loader(num_workers=2, seed=5)
    loader.load_state_dict(state)
    assert run(loader, 2 - state["epoch"])[0] == reference[done:]


def test_a_source_without_state_dict_resumes_by_reading_again():
    with pytest.warns(ShmloadWarning, match=r"has no state_dict or load_state_dict"):
        assert_resumes_exactly(make([60], source=WorkerStreams), stops=[3, 12], epochs=1, workers=(0, 1))


def test_a_restarted_worker_takes_up_its_shuffled_stream(tmp_path, start_method):
    """The replacement loads the snapshot its predecessor last reported and replays the
    draws since: the epoch is bit-identical to one without the fault."""
    kwargs = dict(batch_size=3, num_workers=2, seed=6, timeout=30, multiprocessing_context=start_method,
                  shuffle_buffer=10)
    expected = run(DataLoader(StatefulWorkerStreams([60, 60]), **kwargs), 1)[0]
    loader = DataLoader(StatefulWorkerStreams([60, 60], die_at=1040, marker_dir=tmp_path), max_worker_restarts=1,
                        **kwargs)
    with pytest.warns(ShmloadWarning, match=r"worker process 1 .* SIGKILL unexpectedly; started pid \d+ in its place"):
        got = run(loader, 1)[0]
    assert (tmp_path / "died").exists()
    assert got == expected


@pytest.mark.pure
def test_resuming_behind_another_buffer_or_in_another_world_is_refused_in_the_middle_of_an_epoch():
    loader = make([40])(num_workers=0, seed=1)
    _, state = run(loader, 1, stop_after=2)
    other = make([40], buffer=8)(num_workers=0, seed=1)
    with pytest.raises(ValueError, match=r"saved in the middle of an epoch by a loader with shuffle_buffer=16, but "
                                         r"this one has shuffle_buffer=8"):
        other.load_state_dict(state)
    for key, value, message in [
            ("shuffle_buffer", -1, r"state\['shuffle_buffer'\] is -1 \(an int\), expected a non-negative int"),
            ("world", [2, 1], r"saved in the middle of an epoch by rank 1 of 2 processes, but this loader is rank 0 "
                              r"of 1"),
            ("world", [1, 1], r"state\['world'\] is \[1, 1\] \(a list\), expected \[world size, rank\]")]:
        with pytest.raises(ValueError, match=message):
            make([40])(num_workers=0, seed=1).load_state_dict({**state, key: value})
    # between epochs nothing was read behind the buffer: another one is taken
    between = make([40])(num_workers=0, seed=1)
    run(between, 1)
    again = make([40], buffer=8)(num_workers=0, seed=1)
    again.load_state_dict(between.state_dict())
    assert sorted(sum(labels(again), [])) == list(range(40))


@pytest.mark.pure
@pytest.mark.parametrize("change,message", [
    (dict(read=1), r"a shuffle buffer of 16 after \d+ steps has read \d+ samples, not \d+"),
    (dict(end=-3), r"end=-3, expected a non-negative int or None"),
    (dict(draws=99), r"at draw 99, after the 40 draws it says were delivered"),
    (dict(source=None), r"has read samples but no state of the source"),
    (dict(buffer=4), r"saved with shuffle_buffer=4, but this loader has shuffle_buffer=16")])
def test_a_malformed_stream_position_is_refused_at_load_state_dict(change, message):
    _, state = run(make([400])(num_workers=0, seed=1), 1, stop_after=40)
    position = state["streams"][0]["state"]
    assert position["read"] > 0
    bad = {**position, **{k: (position[k] + v if k == "read" else v) for k, v in change.items()}}
    loader = make([400])(num_workers=0, seed=1)
    with pytest.raises(ValueError, match=r"load_state_dict: state\['streams'\]\[0\]\['state'\]: .*" + message):
        loader.load_state_dict({**state, "streams": [{**state["streams"][0], "state": bad}]})
    loader.load_state_dict(state)  # nothing was half loaded: the good state still loads
    assert run(loader, 1)[0] == run(make([400])(num_workers=0, seed=1), 1)[0][40:]


@pytest.mark.pure
def test_the_saved_position_moves_forward_so_a_resume_reads_again_about_n_ln_n():
    """In steady state the saved source state is from about N·ln N samples back, not from
    the start: what a resume reads again stays bounded however far into the stream."""
    import math

    buffer = 32
    _, state = run(make([4000], buffer=buffer)(num_workers=0, seed=2), 1, stop_after=600)
    position = state["streams"][0]["state"]
    behind = position["read"] and (600 * 4 + buffer) - position["read"]
    assert position["read"] > 0 and position["draws"] > 0, position
    assert 4 <= behind <= 4 * buffer * math.log(buffer) + 4, (behind, position)


@pytest.mark.pure
def test_the_states_a_stream_keeps_are_few_whatever_the_draws():
    """Unbatched draws through a buffer of 1,000: the source's state is kept about every
    1,000 / 16 samples read, not at every draw, so the copies kept stay near 16·ln N,
    and the saved position is still at most that spacing behind the best one."""
    import math

    size = 1000
    stream = Stream(StatefulWorkerStreams([20000]))
    place = StreamPlace(0, 3, 0, 0, 1, StreamShuffle(size, 0))
    key, most, point = object(), 0, None
    for number in range(15000):
        assert stream.draw(key, Draw(0, number, None, False), lambda n: None, place) is not None
        point = stream.point()
        most = max(most, len(stream._snapshots))
    assert most <= 1.5 * 16 * math.log(size) + 2, most
    buffer = stream._buffer
    assert 0 < buffer.oldest() - point.state["read"] <= size // 16 + size * math.log(size), point.state


@pytest.mark.parametrize("extra", [dict(batch_size=None), dict(batch_size=3, drop_last=True)])
def test_unbatched_and_drop_last_streams_resume_exactly(extra):
    def make_loader(num_workers, seed):
        return DataLoader(StatefulWorkerStreams([41, 29]), num_workers=num_workers, seed=seed, timeout=30,
                          shuffle_buffer=6, **extra)
    assert_resumes_exactly(make_loader, stops=[2, 9, 14], epochs=2, pairs=[(2, 2)], reference_workers=2)


@pytest.mark.filterwarnings(r"ignore:DataLoader.state_dict\(\). the iterable source Parts has no state_dict")
def test_the_parts_order_survives_a_resume_into_a_loader_given_another_seed():
    """The order of parts is seeded by the loader's seed only if one was given (else 0):
    the state says which, so a loader resumed with or without a seed of its own reads
    the saved epoch's parts."""
    def make_loader(seed):
        return DataLoader(Parts(), batch_size=10, num_workers=2, timeout=30, shuffle_buffer=4, seed=seed)

    for saved_seed, resumed_seed in ((7, None), (None, 5)):
        reference, batches, state = make_loader(saved_seed), [], None
        for batch in reference:  # one uninterrupted epoch, its state taken after 4 batches
            batches.append(flatten(batch))
            if len(batches) == 4:
                state = json.loads(json.dumps(reference.state_dict()))
        reference.close()
        expected = batches[4:]
        resumed = make_loader(resumed_seed)
        resumed.load_state_dict(state)
        assert run(resumed, 1)[0] == expected


@pytest.mark.pure
def test_a_buffer_that_was_not_refilled_is_an_error_not_a_placeholder():
    """A stream resumed at a position whose buffer the draws since do not empty (a state
    put together by hand) raises rather than deliver what it does not have."""
    stream = Stream(StatefulWorkerStreams([50]))
    saved = {"buffer": 8, "draws": 3, "emitted": 12, "read": 20, "end": None, "source": {"pos": 20}, "at": 12}
    place = StreamPlace(0, 1, 0, 0, 1, StreamShuffle(8, 0))
    draw = Draw(0, 3, 4, False, StreamPoint(3, saved))
    with pytest.raises(RuntimeError, match=r"draw 3 of worker 0's stream: the iterable source StatefulWorkerStreams "
                                           r"did not read the same samples again after load_state_dict\(\): 8 "
                                           r"sample\(s\)"):
        stream.draw(object(), draw, lambda n: None, place)


class Flaky:
    """A stateful iterator source of n samples that raises once at each position in
    ``fail`` (the next read succeeds: a transient error, a network read retried)."""

    def __init__(self, n, fail=()):
        self.n, self.fail, self.pos, self.start = n, set(fail), 0, 0

    def __iter__(self):
        self.pos, self.start = self.start, 0
        return self

    def __next__(self):
        if self.pos >= self.n:
            raise StopIteration
        k = self.pos
        if k in self.fail:
            self.fail.discard(k)
            raise ValueError(f"transient error at {k}")
        self.pos += 1
        return np.full(2, k, np.int32), k

    def state_dict(self):
        return {"pos": self.pos}

    def load_state_dict(self, state):
        self.start = state["pos"]


@pytest.mark.pure
def test_a_replay_that_reads_differently_is_an_error_not_a_shifted_stream():
    """The saved run met a transient error (its draw failed, having taken fewer samples);
    the resumed one replays that draw without it. Every later batch would be shifted: the
    resume raises instead, saying how many samples each took."""
    loader = DataLoader(Flaky(200, fail={30}), batch_size=4, shuffle_buffer=8, seed=1)
    it = iter(loader)
    with pytest.raises(ValueError, match="transient error at 30"):
        for _ in range(50):
            next(it)
    state = json.loads(json.dumps(loader.state_dict()))
    del it
    resumed = DataLoader(Flaky(200), batch_size=4, shuffle_buffer=8, seed=1)
    resumed.load_state_dict(state)
    with pytest.raises(RuntimeError, match=r"did not read the same samples again after load_state_dict\(\): "
                                           r"replaying its stream to draw \d+ took \d+ samples through the shuffle "
                                           r"buffer where the saved run took \d+"):
        it = iter(resumed)
        next(it)
    with pytest.raises(RuntimeError, match=r"did not read the same samples again"):
        next(it)  # and every later batch of that stream: they would be shifted
    del it
    # the same source without the error resumes exactly
    clean = DataLoader(Flaky(200), batch_size=4, shuffle_buffer=8, seed=1)
    _, state = run(clean, 1, stop_after=9)
    again = DataLoader(Flaky(200), batch_size=4, shuffle_buffer=8, seed=1)
    again.load_state_dict(state)
    assert run(again, 1)[0] == run(DataLoader(Flaky(200), batch_size=4, shuffle_buffer=8, seed=1), 1)[0][9:]


class Unreachable(StatefulWorkerStreams):
    """Its load_state_dict() fails (a shard that cannot be reached)."""

    def load_state_dict(self, state):
        raise OSError("shard not reachable")


@pytest.mark.pure
def test_a_resumed_stream_that_cannot_start_fails_that_draw_and_then_ends():
    """The start's error is the draw's; the stream is then ended (no replay was made, so
    nothing to find wrong with one)."""
    place = StreamPlace(0, 3, 0, 0, 1, StreamShuffle(16, 0))
    stream, key, point = Stream(StatefulWorkerStreams([400])), object(), None
    for number in range(30):
        stream.draw(key, Draw(0, number, 4, False), lambda n: None, place)
        point = stream.point()
    assert point.state["read"] > 0
    resumed, key = Stream(Unreachable([400])), object()
    with pytest.raises(OSError, match="shard not reachable"):
        resumed.draw(key, Draw(0, 30, 4, False, point), lambda n: None, place)
    assert resumed.draw(key, Draw(0, 31, 4, False), lambda n: None, place) is None


# ---------------------------------------------------------------- stream_parts
class Parts:
    """A source made of parts: 12 parts of 10 samples, part p's sample i labelled p*100+i."""

    def __iter__(self):
        for part in shmload.stream_parts(range(12)):
            for i in range(10):
                yield np.zeros(1, np.float32), part * 100 + i


@pytest.mark.parametrize("workers", [0, 3])
def test_stream_parts_divides_the_parts_and_shuffles_them_per_epoch(workers):
    """Each worker reads every third part (of the epoch's order when the loader
    shuffles); batches come in rotation, so worker w gave batches w, w + 3, ..."""
    streams = max(1, workers)

    def parts_read(buffer):
        loader = DataLoader(Parts(), batch_size=10, num_workers=workers, seed=2, timeout=30, shuffle_buffer=buffer)
        out = []
        for _ in range(2):
            batches = [[int(x) // 100 for x in b[1]] for b in loader]
            out.append([list(dict.fromkeys(sum(batches[w::streams], []))) for w in range(streams)])
        return out

    plain = parts_read(None)
    assert plain[0] == plain[1] == [list(range(12))[w::streams] for w in range(streams)]
    assert parts_read(1) == plain  # a buffer of one: the stream's own order, parts included
    first, second = parts_read(2)
    for epoch in (first, second):
        assert sorted(sum(epoch, [])) == list(range(12))
    assert first != second and first != plain[0]


@pytest.mark.pure
def test_stream_parts_outside_a_loader_is_every_part_in_order():
    assert shmload.stream_parts(["a", "b", "c"]) == ["a", "b", "c"]
    assert [lab for _, lab in Parts()][:3] == [0, 1, 2]


# ---------------------------------------------------------------- settings
@pytest.mark.pure
def test_the_settings_are_checked_with_clear_messages():
    with pytest.raises(ValueError, match=r"shuffle_buffer=10 is for iterable sources .* a map-style dataset is "
                                         r"shuffled by shuffle=True"):
        DataLoader(list(range(10)), shuffle_buffer=10)
    for bad in (-1, True, 2.5, "10"):
        with pytest.raises(ValueError, match=r"shuffle_buffer should be a non-negative int"):
            DataLoader(GeneratorSource(numbers, 10), shuffle_buffer=bad)
    with pytest.raises(ValueError, match=r"expected unspecified shuffle option, but got shuffle=True\. A stream is "
                                         r"read in its own order: shuffle it with a shuffle buffer \(shuffle_buffer=N"):
        DataLoader(GeneratorSource(numbers, 10), shuffle=True)
    with pytest.raises(ValueError, match=r"shuffle=False contradicts shuffle_buffer=4"):
        DataLoader(GeneratorSource(numbers, 10), shuffle=False, shuffle_buffer=4)
    with pytest.raises(ValueError, match=r"shuffle should be True, False or None, but got shuffle='yes'"):
        DataLoader(GeneratorSource(numbers, 10), shuffle="yes", shuffle_buffer=4)
    with pytest.raises(ValueError, match=r"expected unspecified shuffle option.*N above 1"):
        DataLoader(GeneratorSource(numbers, 10), shuffle=True, shuffle_buffer=1)
    DataLoader(GeneratorSource(numbers, 10), shuffle=False, shuffle_buffer=1)  # one sample: the stream's order
    assert DataLoader(GeneratorSource(numbers, 10), shuffle_buffer=np.int64(4)).shuffle_buffer == 4
    loader = DataLoader(GeneratorSource(numbers, 10), shuffle=True, shuffle_buffer=4, batch_size=5, seed=0)
    assert sorted(sum(labels(loader), [])) == list(range(10))
    with pytest.raises(ValueError, match=r"shuffle_buffer attribute should not be set after DataLoader is initialized"):
        loader.shuffle_buffer = 8


@pytest.mark.pure
def test_unbatched_draws_shuffle_too():
    loader = DataLoader(GeneratorSource(numbers, 40), batch_size=None, seed=4, shuffle_buffer=8)
    got = [int(lab) for _, lab in loader]
    assert sorted(got) == list(range(40)) and got != list(range(40))
    assert got == [int(lab) for _, lab in DataLoader(GeneratorSource(numbers, 40), batch_size=None, seed=4,
                                                     shuffle_buffer=8)]
