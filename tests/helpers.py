"""Datasets and functions shared by the tests. Module-level, so spawn and forkserver
workers can import them."""

from __future__ import annotations

import collections
import gc
import os
import random
import signal
import sys
import threading
import time

import numpy as np
import psutil

from shmload import DeferredArray, RandomSampler

Pair = collections.namedtuple("Pair", ["image", "label"])

TIMEOUT = 30  # seconds, for loaders with workers: a hang fails the test instead of the run


def assert_holds_nothing(run, watched, rounds: int) -> None:
    """Compiled code called by ``run()`` keeps no reference and no memory: after one warm
    ``run()``, ``rounds`` more leave the reference counts of the ``watched`` objects as
    they were and at most 100 more allocated blocks (ints are not tracked by gc: a leaked
    list, item or bound shows as blocks never freed)."""
    run()
    gc.collect()
    before, blocks = [sys.getrefcount(o) for o in watched], sys.getallocatedblocks()
    for _ in range(rounds):
        run()
    gc.collect()
    assert [sys.getrefcount(o) for o in watched] == before
    assert sys.getallocatedblocks() - blocks < 100


def gone(pids, within=5.0):
    """Whether the processes ``pids`` have all exited (or are zombies) within ``within``
    seconds."""
    deadline = time.monotonic() + within
    while time.monotonic() < deadline:
        alive = []
        for pid in pids:
            try:
                if psutil.Process(pid).status() != psutil.STATUS_ZOMBIE:
                    alive.append(pid)
            except psutil.NoSuchProcess:
                pass
        if not alive:
            return True
        time.sleep(0.05)
    return False


def rows_of(loader):
    return [b.tolist() if isinstance(b, np.ndarray) else b for b in loader]


def shuffled_order(n: int, epoch: int, seed: int = 0) -> list[int]:
    """The order of ``range(n)`` that ``shuffle=True`` and ``seed`` give in ``epoch``, as a
    user can have it: from the public :class:`RandomSampler`."""
    sampler = RandomSampler(range(n), seed=seed)
    sampler.set_epoch(epoch)
    return list(sampler)


class RangeDataset:
    """Sample i is i (a Python int)."""

    def __init__(self, n: int):
        self.n = n

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> int:
        if not 0 <= i < self.n:
            raise IndexError(i)
        return i


class ImageDataset:
    """A dict sample: a uint8 image filled with i, an int label, a string name; each
    sample sleeps ``delay`` seconds first (a decode's time)."""

    def __init__(self, n: int, shape=(3, 8, 8), delay: float = 0.0):
        self.n, self.shape, self.delay = n, shape, delay

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> dict:
        if self.delay:
            time.sleep(self.delay)
        return {"image": np.full(self.shape, i % 256, np.uint8), "label": i, "name": f"sample-{i}"}


class AugmentedDataset:
    """Samples drawn from the global RNGs, as random augmentations are."""

    def __len__(self) -> int:
        return 40

    def __getitem__(self, i: int):
        return (np.random.rand(4).astype(np.float32), random.random(), i)


class VariableDataset:
    """Sample i holds an array of length (i % 7 + 1) * scale: batches differ in size."""

    def __init__(self, n: int, scale: int = 1000):
        self.n, self.scale = n, scale

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int):
        return np.full((i % 7 + 1) * self.scale, i, np.int64)


class GetitemsDataset(RangeDataset):
    """Counts __getitems__ calls in the sample itself, so the test can see it was used."""

    def __getitem__(self, i):
        raise AssertionError("__getitem__ should not be called when __getitems__ exists")

    def __getitems__(self, indices):
        return [(i, len(indices)) for i in indices]


class FailingDataset(RangeDataset):
    """Raises ValueError on the given indices."""

    def __init__(self, n: int, bad=(5,), exc_type=ValueError):
        super().__init__(n)
        self.bad, self.exc_type = set(bad), exc_type

    def __getitem__(self, i: int) -> int:
        if i in self.bad:
            raise self.exc_type(f"bad sample {i}")
        return i


class NeedsTwoArgsError(Exception):
    def __init__(self, a, b):
        super().__init__(f"{a}/{b}")


class TwoArgsFailingDataset(RangeDataset):
    def __getitem__(self, i: int) -> int:
        if i == 3:
            raise NeedsTwoArgsError("x", "y")
        return i


class SlowDataset(RangeDataset):
    def __init__(self, n: int, delay: float, slow=None):
        super().__init__(n)
        self.delay, self.slow = delay, slow

    def __getitem__(self, i: int) -> int:
        if self.slow is None or i in self.slow:
            time.sleep(self.delay)
        return i


class ExitingDataset(RangeDataset):
    """The worker that loads index ``at`` dies: os._exit or SIGKILL."""

    def __init__(self, n: int, at: int, how: str = "exit"):
        super().__init__(n)
        self.at, self.how = at, how

    def __getitem__(self, i: int) -> int:
        if i == self.at:
            if self.how == "kill":
                os.kill(os.getpid(), signal.SIGKILL)
            os._exit(7)
        return i


class UnpicklableDataset(RangeDataset):
    def __init__(self, n: int):
        super().__init__(n)
        self.hook = lambda: None  # lambdas cannot be pickled


def pair_collate(samples):
    """A user collate returning a namedtuple of arrays and a plain int."""
    return Pair(np.stack([np.full(2, s, np.int32) for s in samples]), len(samples))


def failing_init(worker_id: int) -> None:
    raise RuntimeError(f"init failed in worker {worker_id}")


def worker_info_sample(i):
    import shmload

    info = shmload.get_worker_info()
    return (info.id, info.num_workers, info.seed, type(info.dataset).__name__) if info else None


class WorkerInfoDataset(RangeDataset):
    def __getitem__(self, i):
        return worker_info_sample(i)


def record_init(worker_id: int) -> None:
    os.environ["SHMLOAD_TEST_INIT"] = str(worker_id)


class InitRecordingDataset(RangeDataset):
    def __getitem__(self, i):
        return int(os.environ.get("SHMLOAD_TEST_INIT", "-1"))


class SizedDataset:
    """batch_size=None items: item i is an int64 array of sizes[i] bytes, filled with i;
    items in ``slow`` take ``delay`` seconds."""

    def __init__(self, sizes, slow=(), delay=0.0):
        self.sizes, self.slow, self.delay = list(sizes), set(slow), delay

    def __len__(self) -> int:
        return len(self.sizes)

    def __getitem__(self, i: int):
        if i in self.slow:
            time.sleep(self.delay)
        return np.full(self.sizes[i] // 8, i, np.int64)


class StringRowsDataset(RangeDataset):
    """Many small strings per batch: large completion messages."""

    def __getitems__(self, indices):
        return [(i, f"row-{i:08d}") for i in indices]


class ZeroSizeDataset(RangeDataset):
    def __getitem__(self, i):
        return np.zeros((0, 4), np.float32), "no boxes"


class StopIterationDataset(RangeDataset):
    def __getitem__(self, i):
        if i == 3:
            raise StopIteration
        return i


def _only_in_workers():
    if os.getpid() == _MAIN_PID:
        raise ModuleNotFoundError("No module named 'worker_only_plugin'")
    return "ok"


_MAIN_PID = os.getpid()


class WorkerOnlyValue:
    """Pickles in a worker, cannot be unpickled in the main process."""

    def __reduce__(self):
        return (_only_in_workers, ())


class WorkerOnlyDataset(RangeDataset):
    def __getitem__(self, i):
        return {"x": np.full(4, i), "tag": WorkerOnlyValue() if i == 2 else None}


class SlowSizesDataset(RangeDataset):
    """Item i is sizes.get(i, default) zero bytes; item ``slow`` sleeps ``delay`` first."""

    def __init__(self, n, sizes, default, slow=None, delay=0.0):
        super().__init__(n)
        self.sizes, self.default, self.slow, self.delay = sizes, default, slow, delay

    def __getitem__(self, i):
        if i == self.slow:
            time.sleep(self.delay)
        return np.zeros(self.sizes.get(i, self.default), np.uint8)


class KeyedDataset(RangeDataset):
    """Index (size, sleep, pad): sleep, then return ``size`` zero bytes (pad only makes the
    task message large)."""

    def __getitem__(self, key):
        size, sleep, _pad = key
        time.sleep(sleep)
        return np.zeros(size, np.uint8)


class ListBatchSampler:
    def __init__(self, batches):
        self.batches = batches

    def __iter__(self):
        return iter(self.batches)

    def __len__(self):
        return len(self.batches)


class LiveSamplesDataset(RangeDataset):
    """Large samples (a 96 KiB float32 array, its live count, i, a name); the count is how
    many arrays this dataset returned are still alive in this process when sample i is made,
    which shows whether a worker keeps a whole batch in memory."""

    def __init__(self, n: int, bad: int | None = None):
        super().__init__(n)
        self.bad = bad  # this index returns a smaller array

    alive = 0  # per process

    @staticmethod
    def _gone() -> None:
        LiveSamplesDataset.alive -= 1

    def __getitem__(self, i: int):
        import weakref
        image = np.full((128, 192) if i != self.bad else (128, 191), i, np.float32)
        count = LiveSamplesDataset.alive
        LiveSamplesDataset.alive += 1
        weakref.finalize(image, LiveSamplesDataset._gone)
        return image, count, i, f"s{i}"


class DyingDataset:
    """Sample i: an int8 row depending on i and on numpy's global RNG (so a batch loaded
    again must be seeded again to match), and the label i. The worker loading index ``at``
    dies (``how``: "exit", "kill" or "segv") the first ``times`` times it is loaded in any
    process: a marker file per death in ``marker_dir`` remembers across processes."""

    def __init__(self, n: int, at: int, marker_dir, how: str = "kill", times: int = 1):
        self.n, self.at, self.marker_dir, self.how, self.times = n, at, str(marker_dir), how, times
        self.parent = os.getpid()  # the test process, where num_workers=0 runs never die

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int):
        if i == self.at and os.getpid() != self.parent:
            for k in range(self.times):
                try:
                    fd = os.open(os.path.join(self.marker_dir, f"died-{k}"), os.O_CREAT | os.O_EXCL | os.O_WRONLY)
                except FileExistsError:
                    continue
                os.close(fd)
                die(self.how)
        return np.full(4, i % 100, np.int8) + np.random.randint(0, 20, 4).astype(np.int8), i


def die(how: str) -> None:
    if how == "kill":
        os.kill(os.getpid(), signal.SIGKILL)
    elif how == "segv":
        import ctypes
        import faulthandler
        import resource
        # A real SIGSEGV, quietly: the handler pytest's faulthandler installed (inherited by
        # a forked worker) would print a "Fatal Python error" dump into the run, and a
        # core file could land in the working directory. Both are this process's own.
        faulthandler.disable()
        resource.setrlimit(resource.RLIMIT_CORE, (0, resource.getrlimit(resource.RLIMIT_CORE)[1]))
        ctypes.string_at(0)  # a NULL read: SIGSEGV, the default action
    os._exit(7)


class FaultyDataset:
    """For the randomized fault schedules: sample i is a uint8 row of a length that varies
    with i (when ``vary`` > 1), filled from i and numpy's global RNG, plus the label i.
    Index in ``fail_at``: raises ValueError. Index in ``die_at``: the worker loading it
    dies once (a marker file in ``marker_dir`` remembers)."""

    def __init__(self, n: int, vary: int, fail_at=(), die_at=(), marker_dir=None):
        self.n, self.vary = n, vary
        self.fail_at, self.die_at, self.marker_dir = frozenset(fail_at), frozenset(die_at), marker_dir
        self.parent = os.getpid()

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int):
        if i in self.die_at and os.getpid() != self.parent:
            try:
                os.close(os.open(os.path.join(self.marker_dir, f"died-at-{i}"), os.O_CREAT | os.O_EXCL | os.O_WRONLY))
                die("kill")
            except FileExistsError:
                pass
        if i in self.fail_at:
            raise ValueError(f"bad sample {i}")
        length = 1000 + (i * 7919) % self.vary
        return (np.random.randint(0, 255, length).astype(np.uint8) + i).astype(np.uint8), i


def concat_collate(samples):
    """A user collate for samples of different lengths: one row of all their bytes, and the labels."""
    return np.concatenate([s[0] for s in samples]), np.array([s[1] for s in samples])


class SleepyDataset:
    """Each sample sleeps ``fetch_s`` seconds in __getitem__ (a known fetch time) and is a
    small array plus its index."""

    def __init__(self, n: int, fetch_s: float = 0.0):
        self.n, self.fetch_s = n, fetch_s

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int):
        if self.fetch_s:
            time.sleep(self.fetch_s)
        return np.full(16, i, np.float32), i


class SleepyCollate:
    """The default collate after sleeping ``seconds`` (a known collate time)."""

    def __init__(self, seconds: float):
        self.seconds = seconds

    def __call__(self, samples):
        from shmload import default_collate

        time.sleep(self.seconds)
        return default_collate(samples)


def small_dataset():
    """A factory for `shmload profile tests.helpers:small_dataset`."""
    return SleepyDataset(64, 0.0005)


class RampArray(DeferredArray):
    """A [rows, 4] float32 array i, i+1, ... written straight into its row."""

    def __init__(self, start: int, rows: int = 3):
        self.start, self.shape, self.dtype = start, (rows, 4), np.dtype(np.float32)

    def write_into(self, out: np.ndarray) -> None:
        out[...] = np.arange(self.start, self.start + out.size, dtype=np.float32).reshape(out.shape)


class DeferredDataset:
    """Sample i: ``{"x": RampArray(i) (rows rows), "y": i}``; ``big_at`` returns one with a
    different shape."""

    def __init__(self, n: int, rows: int = 3, big_at: int | None = None):
        self.n, self.rows, self.big_at = n, rows, big_at

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> dict:
        return {"x": RampArray(i, self.rows + (i == self.big_at)), "y": i}


def ramp(i: int, rows: int = 3) -> np.ndarray:
    return np.arange(i, i + rows * 4, dtype=np.float32).reshape(rows, 4)


# ---------------------------------------------------------------- iterable sources
def _stream_worker() -> tuple[int, int]:
    from shmload import get_worker_info
    info = get_worker_info()
    return (info.id, info.num_workers) if info is not None else (0, 1)


class WorkerStreams:
    """An iterable source whose worker w yields ``lengths[w]`` samples (in a num_workers=0
    loader: ``lengths[0]``). Sample k of worker w has the label ``w * 1000 + k`` and an
    int16 row of ``width(label)`` values drawn from numpy's global RNG (so a draw made
    again must be seeded again to match). The label ``fail_at`` raises ValueError; the
    label ``die_at`` kills the worker the first time (a marker file in ``marker_dir``)."""

    def __init__(self, lengths, fail_at=None, die_at=None, marker_dir=None, how="kill", wide=()):
        self.lengths, self.fail_at, self.die_at = list(lengths), fail_at, die_at
        self.marker_dir, self.how, self.wide = marker_dir and str(marker_dir), how, tuple(wide)
        self.start = 0  # where the next __iter__ starts (load_state_dict of the stateful kind)
        self.pos = 0
        self.parent = os.getpid()

    def __iter__(self):
        w, _ = _stream_worker()
        start, self.start = self.start, 0
        self.pos = start
        for k in range(start, self.lengths[w]):
            label = w * 1000 + k
            self.pos = k + 1
            if label == self.fail_at:
                raise ValueError(f"bad record {label}")
            if label == self.die_at and os.getpid() != self.parent and self._first_death():
                die(self.how)
            width = 20000 if label in self.wide else 4
            yield np.full(width, label % 100, np.int16) + np.random.randint(0, 50, width).astype(np.int16), label

    def _first_death(self) -> bool:
        try:
            os.close(os.open(os.path.join(self.marker_dir, "died"), os.O_CREAT | os.O_EXCL | os.O_WRONLY))
            return True
        except FileExistsError:
            return False


class StatefulWorkerStreams(WorkerStreams):
    """:class:`WorkerStreams` with the state_dict protocol: the position in the stream."""

    def state_dict(self) -> dict:
        return {"pos": self.pos}

    def load_state_dict(self, state: dict) -> None:
        self.start = state["pos"]


class DataFlowLike:
    """A tensorpack-style DataFlow: must be reset_state()'d (once per process) before it is
    iterated; each reset appends the pid to ``log`` (a file)."""

    def __init__(self, n: int, log):
        self.n, self.log, self.rng = n, str(log), None

    def reset_state(self) -> None:
        with open(self.log, "a") as f:
            f.write(f"{os.getpid()}\n")
        self.rng = np.random.RandomState(7)

    def __iter__(self):
        if self.rng is None:
            raise RuntimeError("reset_state() was not called")
        w, n_workers = _stream_worker()
        for i in range(w, self.n, n_workers):
            yield i

    def __len__(self) -> int:
        return self.n


def count_up(n: int):
    """A generator function: an iterable source of 0..n-1 (every worker reads all of it)."""
    yield from range(n)


class LoggedStreams(StatefulWorkerStreams):
    """:class:`StatefulWorkerStreams` that logs each ``__iter__`` start (``"<w> start <pos>"``)
    and each sample (``"<w> <label>"``) to ``log``; worker 0 waits at the label ``hold``
    until the file ``release`` exists (at most 20 s)."""

    def __init__(self, lengths, log, hold=None, release=None, **kwargs):
        super().__init__(lengths, **kwargs)
        self.log, self.hold, self.release = str(log), hold, release and str(release)

    def _write(self, line: str) -> None:
        with open(self.log, "a") as f:
            f.write(line + "\n")

    def __iter__(self):
        w, _ = _stream_worker()
        self._write(f"{w} start {self.start}")
        for sample in super().__iter__():
            if sample[1] == self.hold:
                deadline = time.monotonic() + 20
                while not os.path.exists(self.release) and time.monotonic() < deadline:
                    time.sleep(0.01)
            self._write(f"{w} {sample[1]}")
            yield sample


class FailingStart(StatefulWorkerStreams):
    """Its ``__iter__`` raises at the start of epoch ``bad_epoch`` (counted per process)."""

    def __init__(self, lengths, bad_epoch=1):
        super().__init__(lengths)
        self.bad_epoch, self.epochs = bad_epoch, 0

    def __iter__(self):
        self.epochs += 1
        if self.epochs - 1 == self.bad_epoch:
            raise OSError("cannot open shard")
        return super().__iter__()


def slow_count(n: int, delay: float):
    """A generator function: 0..n-1, ``delay`` seconds each."""
    for i in range(n):
        time.sleep(delay)
        yield i


class FileNames:
    """``n`` file names like ImageNet's, made in the main process before the workers fork.
    Held in a Python list they are what PyTorch issue 13246 is about: reading one writes
    its reference count, so each worker copies the pages it reads (copy-on-read). With
    ``array=True`` they are one numpy bytes array, which reads do not write. A sample is
    its name's length."""

    def __init__(self, n: int, array: bool = False):
        names = [f"/data/train/n{i % 1000:08d}/n{i % 1000:08d}_{i}.JPEG" for i in range(n)]
        self.names = np.array(names, dtype=np.bytes_) if array else names

    def __len__(self) -> int:
        return len(self.names)

    def __getitem__(self, i: int) -> int:
        return len(self.names[i])


class Interrupt:
    """A real Ctrl-C (or ``signum``): the signal sent to this process by another thread
    after ``delay`` seconds (Python runs its handler in the main thread, wherever it is
    then: a KeyboardInterrupt, or what the handler raises)."""

    def __init__(self, delay: float, signum: int = signal.SIGINT):
        self._timer = threading.Timer(delay, os.kill, (os.getpid(), signum))

    def __enter__(self):
        self._timer.start()
        return self

    def __exit__(self, *exc):
        self._timer.cancel()
        self._timer.join(5)
        return False


def rows_under_interrupts(it, rng, max_delay: float, pause: float, signum: int = signal.SIGINT,
                          raised: type[BaseException] = KeyboardInterrupt) -> tuple[list, int]:
    """Every batch of iterator ``it`` as a list, taking the same iterator up again after
    each interrupt (``signum``, at a random moment up to ``max_delay`` seconds from each
    start, raising ``raised``); ``pause`` seconds of "work" per batch. Also returns how
    many interrupts landed."""
    got: list = []
    interrupts = 0
    b = None
    while True:
        try:
            with Interrupt(rng.uniform(0.0, max_delay), signum):
                for b in it:
                    got.append(b.tolist())
                    time.sleep(pause)  # (the timer mostly lands in next(), not here)
            return got, interrupts
        except raised:
            interrupts += 1
            # the for-loop bound b before the interrupt could land in its body: file it once
            if b is not None and (not got or got[-1] != b.tolist()):
                got.append(b.tolist())
