"""Split batches (issue 21): time to the first batch, a short epoch's tail, and steady
state, for shmload with splitting (its default policy), shmload with ``split_batches=False``,
and torch's DataLoader, in one run.

    python -m benchmarks.split [--runs 3] [--workers 2 4] [--kinds sleep cpu jpeg] [--quick]
                               [--contend F] [--both-loads]

The dataset's samples take ``--ms`` milliseconds each (20 by default): ``sleep`` (waiting,
as a remote read does) or ``cpu`` (a busy loop, as decoding and augmenting do), and are a
float32 array of 3x64x64 and a label; batches of 32. Each figure is a fresh loader
(workers started, as a validation pass or each epoch with non-persistent workers has them):

* first batch: seconds from ``iter()`` to the first batch;
* tail: seconds for an epoch of 3 batches (``workers`` 2: one worker would load two of them);
* steady: batches per second over an epoch of ``--steady`` batches, first batch included.

Runs alternate the loaders' order (ABC, CBA, ...) so a shared machine's drift hits all
alike; figures are medians of ``--runs``, and the ratios are of medians from the same run.
torch is optional: without it, its rows are left out. Speed is never asserted; run it on
a quiet machine.

``--kinds jpeg`` (issue 35: short image epochs): the ~500x375 JPEG folder of images.py
through ImageFolder + ``train_pipeline``, batch 64, 2 workers (``--workers``), epochs of
``--epoch-batches`` batches (10 and 30); per loader, images/s with a fresh loader per
epoch and with persistent workers (epochs after the first), and the time to the first
batch of each; ``--epochs`` epochs of each per run. See split_jpeg.py. Not in the
default ``--kinds``; ``--quick`` uses the small folder and epochs of 3 and 6 batches.

Contention: ``--contend F`` (0 to 1; 0, quiet, by default) runs the measurements next to
one competing process taking about F of a core (a busy loop with a duty cycle,
contend.py), started before and stopped after them. ``--both-loads`` measures quiet,
then contended (``--contend``, or 0.5), in one invocation. The competitor shares the
cores the benchmark may use: on a larger machine, ``taskset -c 0,1 python -m ...``
gives two cores to it all. Ends with one JSON line: every figure, each entry with its
``contend`` share and the share of a core the competitor took, and the machine.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from typing import Any, Callable

import numpy as np

from . import split_jpeg
from .contend import contender
from .host import machine

BATCH = 32
SHAPE = (3, 64, 64)


class SlowSamples:
    """Sample i: a float32 array filled with i, and i; each takes ``ms`` milliseconds of
    sleeping (``kind="sleep"``) or of busy CPU (``kind="cpu"``)."""

    def __init__(self, n: int, ms: float, kind: str):
        self.n, self.seconds, self.kind = n, ms / 1000, kind

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int):
        if self.kind == "sleep":
            time.sleep(self.seconds)
        else:
            end = time.thread_time() + self.seconds
            while time.thread_time() < end:
                pass
        return np.full(SHAPE, i, np.float32), i


def _first(make: Callable[[], Any]) -> float:
    loader = make()
    started = time.perf_counter()
    it = iter(loader)
    next(it)
    elapsed = time.perf_counter() - started
    del it
    return elapsed


def _epoch(make: Callable[[], Any], batches: int) -> float:
    loader = make()
    started = time.perf_counter()
    seen = sum(1 for _ in loader)
    elapsed = time.perf_counter() - started
    if seen != batches:
        raise AssertionError(f"got {seen} batches, expected {batches}")
    return elapsed


def loaders(kind: str, ms: float, workers: int, batches: int) -> dict[str, Callable[[], Any]]:
    import shmload

    def ds() -> SlowSamples:
        return SlowSamples(batches * BATCH, ms, kind)

    out = {
        "shmload (split)": lambda: shmload.DataLoader(ds(), batch_size=BATCH, num_workers=workers, timeout=120),
        "shmload (split_batches=False)": lambda: shmload.DataLoader(ds(), batch_size=BATCH, num_workers=workers,
                                                                   timeout=120, split_batches=False),
    }
    try:
        import torch
    except ImportError:
        return out
    out[f"torch {torch.__version__}"] = lambda: torch.utils.data.DataLoader(ds(), batch_size=BATCH,
                                                                           num_workers=workers, timeout=120)
    return out


def measure(kind: str, ms: float, workers: int, runs: int, steady: int) -> dict[str, dict[str, list[float]]]:
    """{loader: {"first": [s], "tail": [s], "steady": [batches/s]}}"""
    results: dict[str, dict[str, list[float]]] = {}
    for what, batches in (("first", steady), ("tail", 3), ("steady", steady)):
        makers = loaders(kind, ms, workers, batches)
        names = list(makers)
        for r in range(runs):
            for name in (names if r % 2 == 0 else names[::-1]):
                row = results.setdefault(name, {"first": [], "tail": [], "steady": []})
                if what == "first":
                    row["first"].append(_first(makers[name]))
                elif what == "tail":
                    row["tail"].append(_epoch(makers[name], batches))
                else:
                    row["steady"].append(batches / _epoch(makers[name], batches))
    return results


def report(kind: str, ms: float, workers: int, results: dict, load: str = "") -> None:
    med = {name: {k: statistics.median(v) for k, v in row.items()} for name, row in results.items()}
    base = med["shmload (split_batches=False)"]
    print(f"\n{kind}, {ms:g} ms a sample, batch {BATCH}, {workers} workers{load} (medians):")
    print(f"  {'loader':32s} {'first batch s':>14s} {'x unsplit':>9s} {'3-batch epoch s':>16s} {'x unsplit':>9s} "
          f"{'steady b/s':>10s} {'x unsplit':>9s}")
    for name, m in med.items():
        print(f"  {name:32s} {m['first']:14.3f} {m['first'] / base['first']:9.2f} {m['tail']:16.3f} "
              f"{m['tail'] / base['tail']:9.2f} {m['steady']:10.2f} {m['steady'] / base['steady']:9.2f}")


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--workers", type=int, nargs="+", default=None, help="default: 2 4 (jpeg: 2)")
    parser.add_argument("--kinds", nargs="+", default=["sleep", "cpu"], choices=["sleep", "cpu", "jpeg"])
    parser.add_argument("--ms", type=float, default=20.0)
    parser.add_argument("--steady", type=int, default=12, help="batches in the steady-state epoch")
    parser.add_argument("--epoch-batches", type=int, nargs="+", default=None, help="jpeg: batches an epoch (10 30)")
    parser.add_argument("--epochs", type=int, default=3, help="jpeg: epochs of each figure per run")
    parser.add_argument("--contend", type=float, default=0.0, help="a competing process takes F of a core (0-1)")
    parser.add_argument("--both-loads", action="store_true", help="quiet, then contended (--contend, or 0.5)")
    parser.add_argument("--quick", action="store_true", help="1 run, 2 ms samples, 2 workers, jpeg: small folder, "
                        "1 epoch, epochs of 3 and 6 batches: a smoke test")
    args = parser.parse_args()
    if not 0 <= args.contend <= 1:
        parser.error("--contend takes a share of one core, within 0 and 1")
    if args.quick:
        args.runs, args.ms, args.workers, args.steady, args.epochs = 1, 2.0, [2], 6, 1
        args.epoch_batches = args.epoch_batches or [3, 6]
    args.epoch_batches = args.epoch_batches or [10, 30]
    args.loads = [0.0, args.contend or 0.5] if args.both_loads else [args.contend]
    return args


def measure_kind(args: argparse.Namespace, kind: str, workers: int, share: float, root: str) -> dict[str, Any]:
    load = f"contended ({share:g} of a core)" if share else "quiet"
    if kind != "jpeg":
        results = measure(kind, args.ms, workers, args.runs, args.steady)
        report(kind, args.ms, workers, results, f", {load}" if share else "")
        return {"kind": kind, "workers": workers, "results": results}
    by_length = split_jpeg.measure(root, workers, args.runs, args.epochs, args.epoch_batches)
    summary = split_jpeg.report(load, workers, by_length)
    return {"kind": kind, "workers": workers, "root": root, "batch": split_jpeg.BATCH_SIZE,
            "epoch_batches": args.epoch_batches, "epochs": args.epochs, "results": by_length, "summary": summary}


def main() -> None:
    args = parse_args()
    import warnings

    warnings.filterwarnings("ignore", message="This DataLoader will create")  # 4 workers on 2 cores: said once here
    root = split_jpeg.prepare(args.quick) if "jpeg" in args.kinds else ""  # written once, before any contention
    everything = []
    for share in args.loads:
        with contender(share) as competitor:
            block = [measure_kind(args, kind, workers, share, root) | {"contend": share}
                     for kind in args.kinds for workers in args.workers or ([2] if kind == "jpeg" else [2, 4])]
        everything += [entry | {"contender_cores": competitor.cores} for entry in block]
        if share:
            print(f"(the competing process took {competitor.cores or 0:.2f} of a core)")
    print(json.dumps({"benchmark": "split", "ms": args.ms, "batch": BATCH, "runs": args.runs, "steady": args.steady,
                      "loads": args.loads, "results": everything,
                      "machine": machine(["numpy", "Pillow", "torch", "shmload"] if "jpeg" in args.kinds else
                                         ["numpy", "torch", "shmload"])}))


if __name__ == "__main__":
    main()
