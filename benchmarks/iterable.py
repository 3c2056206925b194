"""Iterable sources: shmload against torch's DataLoader on the same stream, and what
exact resume costs; then shuffled streams.

    python -m benchmarks.iterable [--runs 5] [--quick] [--buffer-samples 40000]

The source is a torch ``IterableDataset`` that shards itself with
``torch.utils.data.get_worker_info()`` (which shmload's workers answer too) and yields
``(uint8 image 3x96x96, int)`` samples: 27 KiB a sample, batches of 64 (1.77 MB), 2
workers. Both loaders read the same stream; shmload returns torch tensors
(``output="torch"``) so the consumer gets the same type. A third loader reads the same
stream with ``state_dict()``/``load_state_dict()``, which shmload calls in the worker
after every draw and sends with the batch: the cost of being able to resume mid-epoch.

Shuffled streams (issue 22): the same stream, ``--buffer-samples`` long, through
shmload's ``shuffle_buffer=N`` and through torch's DataLoader over the stream wrapped in
a hand-written buffer of N (the usual tf.data-style loop, ``random.Random`` seeded per
worker), for N = 0, 1,000 and 10,000 samples per worker. Then what resuming a shuffled
stream costs: the state's size as JSON, and the time from ``load_state_dict()`` to the
first batch in a new loader, half-way through the epoch (the resumed stream reads again
the samples since the saved state of the source, about N·ln N).

Runs alternate in ABBA order so a shared machine's drift hits all alike; the figures are
medians of ``--runs`` runs each, and the ratio is of the medians, measured in the same run.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time

import numpy as np

from .host import machine

SHAPE, BATCH, WORKERS = (3, 96, 96), 64, 2


def make_source(torch, samples: int, stateful: bool):
    class Stream(torch.utils.data.IterableDataset):
        def __init__(self):
            self.pos = self.start = 0

        def __iter__(self):
            info = torch.utils.data.get_worker_info()
            w, n = (info.id, info.num_workers) if info is not None else (0, 1)
            base = np.arange(np.prod(SHAPE), dtype=np.uint8).reshape(SHAPE)
            start, self.start = self.start, 0
            for k, i in enumerate(range(w, samples, n)):
                if k < start:
                    continue
                self.pos = k + 1
                yield base + np.uint8(i % 7), i

    class StatefulStream(Stream):
        def state_dict(self):
            return {"pos": self.pos}

        def load_state_dict(self, state):
            self.start = state["pos"]

    return StatefulStream() if stateful else Stream()


def hand_buffered(torch, source, size: int, seed: int):
    """``source`` through a shuffle buffer of ``size``, written as users write it for
    torch's DataLoader (fill, then emit a random slot and refill it; drain at the end)."""
    import random

    class Buffered(torch.utils.data.IterableDataset):
        def __iter__(self):
            info = torch.utils.data.get_worker_info()
            rng = random.Random(seed * 1000 + (info.id if info is not None else 0))
            buf = []
            for sample in source:
                if len(buf) < size:
                    buf.append(sample)
                    continue
                j = rng.randrange(size)
                yield buf[j]
                buf[j] = sample
            rng.shuffle(buf)
            yield from buf

    return Buffered()


def one_run(make_loader, samples: int) -> float:
    loader = make_loader()
    started = time.perf_counter()
    seen = 0
    for _, labels in loader:
        seen += len(labels)
    elapsed = time.perf_counter() - started
    if seen != samples:
        raise AssertionError(f"read {seen} samples, expected {samples}")
    return samples / elapsed


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--samples", type=int, default=6000)
    parser.add_argument("--buffer-samples", type=int, default=40000,
                        help="the stream's length for the shuffled runs (default 40000)")
    parser.add_argument("--quick", action="store_true", help="1 run of 640 samples: a smoke test")
    args = parser.parse_args()
    if args.quick:
        args.runs, args.samples, args.buffer_samples = 1, 640, 1280
    import torch

    import shmload

    loaders = {
        "shmload": lambda: shmload.DataLoader(make_source(torch, args.samples, False), batch_size=BATCH,
                                              num_workers=WORKERS, output="torch", timeout=60),
        "shmload, source with state_dict": lambda: shmload.DataLoader(
            make_source(torch, args.samples, True), batch_size=BATCH, num_workers=WORKERS, output="torch", timeout=60),
        f"torch {torch.__version__}": lambda: torch.utils.data.DataLoader(
            make_source(torch, args.samples, False), batch_size=BATCH, num_workers=WORKERS, timeout=60),
    }
    names = list(loaders)
    rates: dict[str, list[float]] = {name: [] for name in names}
    for r in range(args.runs):
        for name in (names if r % 2 == 0 else names[::-1]):
            rates[name].append(one_run(loaders[name], args.samples))
    medians = {name: statistics.median(v) for name, v in rates.items()}
    peer = names[-1]
    print(f"{args.samples} samples of {SHAPE} uint8, batches of {BATCH}, {WORKERS} workers, "
          f"medians of {args.runs} run(s):")
    for name in names:
        print(f"  {name:32s} {medians[name]:9.0f} samples/s  ({medians[name] / medians[peer]:.2f}x {peer})  "
              f"runs: {', '.join(f'{x:.0f}' for x in rates[name])}")
    buffers = shuffled(torch, shmload, args)
    print(json.dumps({"benchmark": "iterable", "samples": args.samples, "runs": args.runs,
                      "samples_per_s": rates, "shuffled": buffers, "machine": machine(["numpy", "torch", "shmload"])}))


def shuffled(torch, shmload, args) -> dict:
    n = args.buffer_samples
    sizes = [0, 100] if args.quick else [0, 1000, 10000]
    rates: dict[str, list[float]] = {}
    for size in sizes:
        loaders = {
            f"shmload shuffle_buffer={size}": lambda: shmload.DataLoader(
                make_source(torch, n, False), batch_size=BATCH, num_workers=WORKERS, output="torch", timeout=60,
                shuffle_buffer=size, seed=1),
            f"torch, hand-written buffer of {size}": lambda: torch.utils.data.DataLoader(
                hand_buffered(torch, make_source(torch, n, False), size, 1) if size else make_source(torch, n, False),
                batch_size=BATCH, num_workers=WORKERS, timeout=60),
        }
        names = list(loaders)
        for name in names:
            rates[name] = []
        for r in range(args.runs):
            for name in (names if r % 2 == 0 else names[::-1]):
                rates[name].append(one_run(loaders[name], n))
    print(f"\nshuffled: {n} samples of {SHAPE} uint8, batches of {BATCH}, {WORKERS} workers, buffers per worker, "
          f"medians of {args.runs} run(s):")
    medians = {name: statistics.median(v) for name, v in rates.items()}
    for size in sizes:
        ours, peer = f"shmload shuffle_buffer={size}", f"torch, hand-written buffer of {size}"
        for name in (ours, peer):
            print(f"  {name:38s} {medians[name]:9.0f} samples/s  ({medians[name] / medians[peer]:.2f}x torch)  "
                  f"runs: {', '.join(f'{x:.0f}' for x in rates[name])}")
    resume = {size: resume_cost(torch, shmload, n, size, args.runs) for size in sizes}
    print("resuming half-way (a new loader; medians):")
    for size, figures in resume.items():
        print(f"  shuffle_buffer={size:<6d} state {figures['state_bytes']:5d} bytes of JSON, "
              f"load_state_dict() to first batch {figures['first_batch_s']:.3f} s, a fresh epoch's first batch "
              f"{figures['fresh_first_batch_s']:.3f} s")
    return {"samples": n, "samples_per_s": rates, "resume": resume}


def resume_cost(torch, shmload, n: int, size: int, runs: int) -> dict:
    def make():
        return shmload.DataLoader(make_source(torch, n, True), batch_size=BATCH, num_workers=WORKERS,
                                  output="torch", timeout=60, shuffle_buffer=size, seed=1)

    loader = make()
    it = iter(loader)
    for _ in range(n // BATCH // 2):
        next(it)
    state = json.loads(json.dumps(loader.state_dict()))
    del it
    loader.close()
    first, fresh = [], []
    for _ in range(runs):
        again = make()
        started = time.perf_counter()
        again.load_state_dict(state)
        next(iter(again))
        first.append(time.perf_counter() - started)
        again.close()
        new = make()
        started = time.perf_counter()
        next(iter(new))
        fresh.append(time.perf_counter() - started)
        new.close()
    return {"state_bytes": len(json.dumps(state)), "first_batch_s": statistics.median(first),
            "fresh_first_batch_s": statistics.median(fresh)}


if __name__ == "__main__":
    main()
