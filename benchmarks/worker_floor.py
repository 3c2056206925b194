"""How low a worker's own cost per small batch can go in Python: each step of a `tiny`
batch (256 samples of 32 float32 + an int label) timed alone, in one process.

    python -m benchmarks.worker_floor [--number 3000] [--repeat 5] [--json FILE]
    python -m benchmarks.worker_floor --both [--number 3000] [--repeat 5]

No processes and no shared memory: the figures are what the steps cost with warm
caches, a floor under what a worker pays (``benchmarks.per_batch`` measures the real
thing, where the cores also trade cache lines). Three groups:

* the dataset's part: ``__getitem__`` for 256 indices, and freeing the 256 samples;
* shmload's collate as it runs for a recurring structure (``collate.StackPlans``, the
  cached plan): planning and writing into a buffer;
* the least that any collate of these samples must do in Python, checking nothing:
  transposing the tuples (one ``zip``), joining the rows' bytes, converting the labels;
* the rest of a worker's batch: seeding the global RNGs, decoding the task's record.

Best of ``--repeat`` runs of ``--number`` batches each (after one untimed batch), in µs
per batch. The header line names the path the per-sample work took: the compiled core or
pure Python (``shmload._core.native.DESCRIPTION``; ``SHMLOAD_PURE_PYTHON=1`` forces pure
Python). ``--json FILE`` writes the figures there too.

``--both`` compares the two paths (issue 35) as ``benchmarks.per_batch --both`` does:
``--repeat`` rounds, each running this command once in a child process per path (one run
of ``--number`` batches: ``--repeat 1 --json FILE``), with the compiled core and with
``SHMLOAD_PURE_PYTHON=1``, alternating which goes first; it prints each figure's median
for each path, their ratio (compiled / pure Python) and a line naming the machine and its
load average at start and end (``--json FILE``: all of it). Where the compiled core is
not built, it says so and exits with status 2.

Speed is never asserted; run it on a quiet machine.
"""

from __future__ import annotations

import argparse
import sys
import time
import timeit
from pathlib import Path

import numpy as np

from shmload._batching.collate import StackPlans, write
from shmload._ordering import seeding
from shmload._transport import wire
from shmload._transport.messages import Indices, SlotRef, Task

from .per_batch import both_paths, whence, write_json
from .workloads import TinyRows

BATCH, BATCHES = 256, 600


def steps() -> dict[str, tuple[str, object]]:
    dataset = TinyRows(BATCH * BATCHES)
    batches = [list(range(s, s + BATCH)) for s in range(0, len(dataset), BATCH)]
    turn = iter(range(1 << 62))

    def indices() -> list[int]:
        return batches[next(turn) % BATCHES]

    plans = StackPlans()
    plans.plan([dataset[i] for i in batches[0]], batches[0])
    buffers: dict[int, np.ndarray] = {}

    def destination(spec):  # one buffer per leaf, reused: as a worker's kept slot views
        out = buffers.get(spec.offset)
        if out is None:
            out = buffers[spec.offset] = np.empty(spec.shape, spec.dtype)
        return out

    samples = [dataset[i] for i in batches[0]]
    rows, labels = map(list, zip(*samples))
    plan = plans.plan(samples, batches[0])
    flat = np.empty(BATCH * 32 * 4, np.uint8)
    label_out = np.empty(BATCH, np.int64)
    head, body = wire.encode_task(Task(1, 0, 5, Indices(np.arange(1000, 1000 + BATCH)), SlotRef(0, 4096, 1 << 20)))
    record = bytes(head) + bytes(body)

    def fetch_and_free() -> None:
        fetched = [dataset[i] for i in indices()]
        del fetched

    def whole_batch() -> None:  # fetch, plan, write, free: the collate's part of a worker's batch
        idx = indices()
        write(plans.plan([dataset[i] for i in idx], idx), destination)

    return {
        "getitem": ("the dataset's __getitem__, 256 samples (freed outside the clock)", _Untimed(
            lambda: [dataset[i] for i in indices()])),
        "getitem+free": ("__getitem__, then freeing the samples", fetch_and_free),
        "batch": ("__getitem__ + plan + write + freeing samples and plan", whole_batch),
        "plan": ("shmload: plan against the cached plan (its checks)", lambda: plans.plan(samples, batches[0])),
        "write": ("shmload: write the plan into the buffers", lambda: write(plan, destination)),
        "zip": ("bare: transpose the tuples (one zip)", lambda: list(zip(*samples))),
        "join": ("bare: join the rows' bytes, copy them into the buffer", lambda: flat.__setitem__(
            slice(None), np.frombuffer(b"".join(rows), np.uint8))),
        "labels": ("bare: the labels into an int64 buffer", lambda: label_out.__setitem__(Ellipsis, labels)),
        "seed": ("seeding random, numpy (seeding.seed_globals)", lambda: seeding.seed_globals(0, 3, next(turn))),
        "decode": ("decoding a task record of 256 raw indices", lambda: wire.decode_to_worker(record)),
    }


class _Untimed:
    """A step whose result is freed outside the clock: its time is measured by the step
    itself, so ``timeit`` sees only the sum of the timed parts."""

    def __init__(self, fn):
        self.fn = fn

    def time(self, number: int) -> float:
        total = 0.0
        for _ in range(number):
            t0 = time.perf_counter()
            result = self.fn()
            total += time.perf_counter() - t0
            del result
        return total


def _best(fn, number: int, repeat: int) -> float:
    if isinstance(fn, _Untimed):
        fn.time(1)  # (a run in a fresh process, as --both's, starts warm too)
        return min(fn.time(number) for _ in range(repeat)) / number
    fn()
    return min(timeit.repeat(fn, number=number, repeat=repeat)) / number


DERIVED = {  # the figures the steps' times give, printed below them
    "own": "plan + write + freeing the plan (batch - getitem+free)",
    "bare": "the bare minimum, checking nothing (zip + join + labels)",
    "free": "freeing the samples (getitem+free - getitem)",
}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--number", type=int, default=3000)
    p.add_argument("--repeat", type=int, default=5, help="runs, the best kept (with --both: rounds)")
    p.add_argument("--json", type=Path, default=None, help="write the figures (us per batch) here too")
    p.add_argument("--both", action="store_true",
                   help="compare the compiled core with pure Python (SHMLOAD_PURE_PYTHON=1), in child processes")
    args = p.parse_args(argv)
    if args.both:
        return both_paths(["--number", str(args.number), "--repeat", "1"], args.repeat, "us",
                          f"a tiny batch ({BATCH} samples), a run of {args.number} batches per process, us per batch",
                          args.json)
    print(f"{whence()}; a tiny batch ({BATCH} samples), best of {args.repeat} runs of {args.number} batches, "
          f"us per batch")
    timed, labels = {}, {}
    for name, (what, fn) in steps().items():
        timed[name] = 1e6 * _best(fn, args.number, args.repeat)
        labels[name] = what
        print(f"  {what:<66} {timed[name]:7.1f} us")
    timed["own"] = timed["batch"] - timed["getitem+free"]
    timed["bare"] = timed["zip"] + timed["join"] + timed["labels"]
    timed["free"] = timed["getitem+free"] - timed["getitem"]
    for name, width in (("own", 70), ("bare", 69), ("free", 69)):  # (the widths these lines have had)
        print(f"  {DERIVED[name]:<{width}}{timed[name]:7.1f} us")
    if args.json:
        write_json(args.json, labels=labels | DERIVED, us=timed)
    return 0


if __name__ == "__main__":
    sys.exit(main())
