"""Iterable sources: shmload against torch's DataLoader on the same stream, and what
exact resume costs.

    python -m benchmarks.iterable [--runs 5] [--quick]

The source is a torch ``IterableDataset`` that shards itself with
``torch.utils.data.get_worker_info()`` (which shmload's workers answer too) and yields
``(uint8 image 3x96x96, int)`` samples: 27 KiB a sample, batches of 64 (1.77 MB), 2
workers. Both loaders read the same stream; shmload returns torch tensors
(``output="torch"``) so the consumer gets the same type. A third loader reads the same
stream with ``state_dict()``/``load_state_dict()``, which shmload calls in the worker
after every draw and sends with the batch: the cost of being able to resume mid-epoch.

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
    parser.add_argument("--quick", action="store_true", help="1 run of 640 samples: a smoke test")
    args = parser.parse_args()
    if args.quick:
        args.runs, args.samples = 1, 640
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
    print(json.dumps({"benchmark": "iterable", "samples": args.samples, "runs": args.runs,
                      "samples_per_s": rates, "machine": machine(["numpy", "torch", "shmload"])}))


if __name__ == "__main__":
    main()
