"""num_workers="auto" against fixed counts (issue 37), on two workloads whose best count differs.

    python -m benchmarks.autotune [--rounds 5] [--epochs 3] [--quick] [--out FILE.json]

* **data-bound**: each sample is pure-Python CPU work in ``__getitem__`` (``--sample-ms``,
  0.75 by default) returning 16 float32 and its index, batches of 32, 200 batches an
  epoch; the consumer does nothing (it drops each batch);
* **consumer-bound**: cheap samples (``np.full`` of 3x32x32 float32 and the index),
  batches of 32, 100 batches an epoch; the consumer computes ``--step-ms`` (25 by default)
  of pure-Python CPU work a batch in the main process (a busy loop: it takes a core, as a
  training step on the CPU does; never a sleep).

Both loops are calibrated once, at start, in this process (iterations per ms, best of 50),
so the work is a fixed number of iterations whatever the load later. For each workload,
each round runs every configuration in turn, the order rotated round by round: fixed
counts 1, 2, 3, 4 (and the usable cores if more: "every core", the default cap of
"auto") and ``num_workers="auto"``. Each is a fresh DataLoader (fork, default settings:
workers not persistent, so every epoch starts its own; ``shuffle=True``, ``seed=0``, and
``timeout=120`` so that a hang fails instead of waiting) run for ``--epochs`` epochs,
each timed alone (batches/s), its CPU read from ``loader.stats().own_cpu()`` (the main
process and the workers, the profile window reset before each epoch).

Reported, per workload: the batches/s of every configuration (median over rounds); for
"auto", its first epoch and the median of its later epochs, each as a ratio to the best
fixed count *of the same round* (a fixed count's rate in a round: the median of all its
epochs, which are alike: each starts its workers), the median of those ratios over the
rounds, and the ratio of medians (auto's median over the best fixed count's median); the
count auto ran at the end of each epoch, its changes (``stats().worker_counts``) and the
count it settled on (the last); CPU per batch of auto and of every core, and the saving
``1 - auto / every core``. Targets (issue 37): auto after its first epoch >= 0.9 of the
best fixed count on both workloads, auto in its first epoch >= 0.8.

The machine comes first: cores, load average, and a check of its parallel speed (two
busy processes at once, each against one alone: a VM's two vCPUs may give less than two
cores). Run it on a quiet machine: about 7 minutes on 2 cores with the defaults (epochs
of 2-4 s at the best count). ``--quick`` is a smoke test (1 round, 2 epochs, tiny epochs,
~15 s) whose figures mean nothing, and nothing about speed is asserted. ``--out`` keeps
every round's per-epoch figures (rate, CPU, the counts run) and the summaries.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import os
import statistics
import sys
import time
import warnings
from pathlib import Path
from typing import Any, Callable, NamedTuple

import numpy as np

import shmload
from shmload._session.scaling import default_cap

from .host import machine
from .per_batch import whence
from .report import Target

AUTO = "auto"
BATCH = 32
SEED = 0


def spin(iterations: int) -> int:
    """Pure-Python CPU work: ``iterations`` turns of a loop (holds the GIL, takes a core)."""
    x = 0
    for i in range(iterations):
        x = (x * 31 + i) & 0xFFFF
    return x


def iterations_per_ms() -> float:
    """How many turns of :func:`spin` take a millisecond here: the best of 50 short runs
    (~1.5 ms each: on a busy machine, some run undisturbed where long ones would not)."""
    n = 20_000
    spin(n)  # warm-up
    best = min(_timed_spin(n) for _ in range(50))
    return n / (best * 1e3)


def _timed_spin(n: int) -> float:
    t0 = time.perf_counter()
    spin(n)
    return time.perf_counter() - t0


def _spin_in_child(n: int, barrier: Any, queue: Any) -> None:
    barrier.wait()
    queue.put(_timed_spin(n))


def parallel_speed(n: int) -> dict[str, float]:
    """Two busy processes at once against one alone (best of 3 each): the share of one
    alone's speed each of the two gets, and the cores' worth that makes."""
    alone = min(_timed_spin(n) for _ in range(3))
    ctx = multiprocessing.get_context("fork")
    pairs = []
    for _ in range(3):
        barrier, queue = ctx.Barrier(2), ctx.Queue()
        procs = [ctx.Process(target=_spin_in_child, args=(n, barrier, queue)) for _ in range(2)]
        for p in procs:
            p.start()
        times = [queue.get(timeout=120) for _ in procs]
        for p in procs:
            p.join()
        pairs.append(max(times))
    each = alone / min(pairs)
    return {"alone_s": alone, "two_at_once_s": min(pairs), "each_of_two": each, "cores_worth": 2 * each}


class Compute:
    """Sample i: ``iterations`` of :func:`spin`, then 16 float32 of i, and i."""

    def __init__(self, n: int, iterations: int):
        self.n, self.iterations = n, iterations

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> tuple[np.ndarray, int]:
        spin(self.iterations)
        return np.full(16, i, np.float32), i


class Cheap:
    """Sample i: 3x32x32 float32 of i, and i: nothing to compute."""

    def __init__(self, n: int):
        self.n = n

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> tuple[np.ndarray, int]:
        return np.full((3, 32, 32), i, np.float32), i


class Workload(NamedTuple):
    name: str
    dataset: Any
    batches: int  # an epoch's
    step: Callable[[Any], Any]  # the consumer's work on a batch's first array
    description: str


def workloads(args: argparse.Namespace, per_ms: float) -> list[Workload]:
    sample, step = round(args.sample_ms * per_ms), round(args.step_ms * per_ms)
    return [
        Workload("data-bound", Compute(BATCH * args.data_batches, sample), args.data_batches, lambda images: None,
                 f"__getitem__ {args.sample_ms:g} ms of pure-Python work a sample ({sample} turns), batch {BATCH}, "
                 f"{args.data_batches} batches an epoch; the consumer does nothing"),
        Workload("consumer-bound", Cheap(BATCH * args.consumer_batches), args.consumer_batches,
                 lambda images: spin(step),
                 f"np.full samples of 3x32x32 float32, batch {BATCH}, {args.consumer_batches} batches an epoch; "
                 f"the consumer computes {args.step_ms:g} ms a batch ({step} turns) in the main process"),
    ]


def epoch(loader: Any, work: Workload) -> dict[str, Any]:
    """One epoch, timed; then (clocks stopped) its CPU and the counts run, from the profile."""
    loader.reset_stats()
    seen = 0
    t0 = time.perf_counter()
    for batch in loader:
        work.step(batch[0])
        seen += 1
        del batch  # dropped before the next is asked for, as a training loop does
    seconds = time.perf_counter() - t0
    if seen != work.batches:
        raise AssertionError(f"{work.name}: an epoch of {seen} batches, expected {work.batches}")
    stats = loader.stats(memory=False)
    return {"seconds": seconds, "batches": seen, "rate": seen / seconds, "cpu": stats.own_cpu(),
            "count": stats.num_workers, "changes": [list(c) for c in stats.worker_counts or ()]}


def run(work: Workload, workers: int | str, epochs: int) -> list[dict[str, Any]]:
    """A fresh loader of ``workers`` (a count or "auto"), ``epochs`` epochs, closed after."""
    with shmload.DataLoader(work.dataset, batch_size=BATCH, shuffle=True, seed=SEED, num_workers=workers,
                            multiprocessing_context="fork", timeout=120) as loader:
        return [epoch(loader, work) for _ in range(epochs)]


def measure(work: Workload, configs: list[str], rounds: int, epochs: int) -> list[dict[str, Any]]:
    """Every configuration once a round, the order rotated each round."""
    out = []
    for r in range(rounds):
        order = configs[r % len(configs):] + configs[:r % len(configs)]
        figures = {c: run(work, AUTO if c == AUTO else int(c), epochs) for c in order}
        out.append({"order": order, "configs": figures})
        auto = figures[AUTO]
        print(f"  round {r + 1}: " + ", ".join(f"{c} {statistics.median(e['rate'] for e in figures[c]):.1f}"
                                               for c in configs) + " batches/s; auto's counts "
              + " | ".join(changes_text(e["changes"]) for e in auto), flush=True)
    return out


def changes_text(changes: list[list[float]]) -> str:
    return ", ".join(f"{n}@{t:.2f}s" for t, n in changes) or "-"


def _med(values: list[float]) -> float:
    return statistics.median(values) if values else float("nan")


def cpu_per_batch(epochs: list[dict[str, Any]]) -> float | None:
    if not epochs or any(e["cpu"] is None for e in epochs):
        return None
    return sum(e["cpu"] for e in epochs) / sum(e["batches"] for e in epochs)


def summarize(rounds: list[dict[str, Any]], every_core: str) -> dict[str, Any]:
    """Per-round ratios and their medians; the ratio of medians; counts; CPU and its saving."""
    fixed = [c for c in rounds[0]["configs"] if c != AUTO]
    rate = {c: [_med([e["rate"] for e in r["configs"][c]]) for r in rounds] for c in fixed}
    first = [r["configs"][AUTO][0]["rate"] for r in rounds]
    later = [_med([e["rate"] for e in r["configs"][AUTO][1:]]) for r in rounds]
    best_each = [max(rate[c][i] for c in fixed) for i in range(len(rounds))]
    best = max(fixed, key=lambda c: _med(rate[c]))
    out: dict[str, Any] = {
        "fixed_rate_median": {c: _med(rate[c]) for c in fixed}, "best_fixed": best,
        "best_fixed_each_round": [max(fixed, key=lambda c: rate[c][i]) for i in range(len(rounds))],
        "auto_first_rate_median": _med(first), "auto_later_rate_median": _med(later),
        "first_ratios": [a / b for a, b in zip(first, best_each)],
        "later_ratios": [a / b for a, b in zip(later, best_each)],
        "first_ratio_of_medians": _med(first) / _med(rate[best]),
        "later_ratio_of_medians": _med(later) / _med(rate[best]),
        "auto_counts": [[e["count"] for e in r["configs"][AUTO]] for r in rounds],
        "auto_changes": [[len(e["changes"]) - 1 for e in r["configs"][AUTO]] for r in rounds],
        "settled": [r["configs"][AUTO][-1]["count"] for r in rounds], "every_core": every_core,
    }
    out["first_ratio"], out["later_ratio"] = _med(out["first_ratios"]), _med(out["later_ratios"])
    for part, pick in (("first", slice(0, 1)), ("later", slice(1, None))):
        cpu = {c: [cpu_per_batch(r["configs"][c][pick]) for r in rounds] for c in (AUTO, every_core)}
        savings = [1 - a / b for a, b in zip(cpu[AUTO], cpu[every_core]) if a is not None and b]
        out[f"cpu_ms_{part}"] = {c: _med([1e3 * x for x in v if x is not None]) for c, v in cpu.items()}
        out[f"cpu_saving_{part}"] = _med(savings)
    return out


def table(work: Workload, rounds: list[dict[str, Any]], s: dict[str, Any]) -> str:
    configs = list(rounds[0]["configs"])
    head = (f"{'':22s}{'epoch 1 b/s':>12s}{'later b/s':>11s}{'all b/s':>10s}{'CPU ms/b':>10s}"
            "  count at each epoch's end (auto: last round)")
    lines = [f"\n{work.name}: {work.description}. Medians of {len(rounds)} round(s):", "  " + head]
    for c in sorted(configs, key=lambda c: (c == AUTO, c.zfill(4))):
        runs = [r["configs"][c] for r in rounds]
        cpu = _med([1e3 * x for x in (cpu_per_batch(e) for e in runs) if x is not None])
        counts = ", ".join(str(n) for n in s["auto_counts"][-1]) if c == AUTO else c
        name = f"{'auto' if c == AUTO else 'fixed ' + c}{' (every core)' if c == s['every_core'] else ''}"
        lines.append(f"  {name:22s}{_med([e[0]['rate'] for e in runs]):12.1f}"
                     f"{_med([_med([x['rate'] for x in e[1:]]) for e in runs]):11.1f}"
                     f"{_med([_med([x['rate'] for x in e]) for e in runs]):10.1f}{cpu:10.2f}  {counts}")
    ratios = lambda xs: ", ".join(f"{x:.2f}" for x in xs)  # noqa: E731
    lines += [
        f"  best fixed count: {s['best_fixed']} (each round's: {', '.join(s['best_fixed_each_round'])})",
        f"  auto / best fixed of its round: first epoch {s['first_ratio']:.3f} (rounds: {ratios(s['first_ratios'])}); "
        f"later epochs {s['later_ratio']:.3f} (rounds: {ratios(s['later_ratios'])})",
        f"  ratio of medians (auto / fixed {s['best_fixed']}): first epoch {s['first_ratio_of_medians']:.3f}, "
        f"later epochs {s['later_ratio_of_medians']:.3f}",
        f"  auto's count at the end of each epoch, by round: {s['auto_counts']}; settled on "
        f"{', '.join(map(str, s['settled']))}; changes per epoch {s['auto_changes']}",
        "  auto's changes (count@seconds into the epoch), last round: "
        + " | ".join(changes_text(e["changes"]) for e in rounds[-1]["configs"][AUTO]),
    ]
    for part, what in (("later", "epochs after the first"), ("first", "first epoch")):
        cpu = s[f"cpu_ms_{part}"]
        lines.append(f"  CPU per batch, {what}: auto {cpu[AUTO]:.2f} ms, every core (fixed {s['every_core']}) "
                     f"{cpu[s['every_core']]:.2f} ms: auto saves {100 * s[f'cpu_saving_{part}']:.0f}% "
                     "(median of the rounds' 1 - auto / every core)")
    return "\n".join(lines)


def targets(summaries: dict[str, dict[str, Any]]) -> list[Target]:
    out = []
    for name, s in summaries.items():
        out.append(Target(f"{name}: auto after its first epoch / best fixed count (median of rounds)",
                          s["later_ratio"], 0.9))
        out.append(Target(f"{name}: auto in its first epoch / best fixed count (median of rounds)",
                          s["first_ratio"], 0.8))
    return out


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--epochs", type=int, default=3, help="epochs of each loader (at least 2)")
    p.add_argument("--counts", type=int, nargs="+", default=[1, 2, 3, 4], help="the fixed counts")
    p.add_argument("--sample-ms", type=float, default=0.75, help="data-bound: CPU work a sample")
    p.add_argument("--step-ms", type=float, default=25.0, help="consumer-bound: CPU work a batch")
    p.add_argument("--data-batches", type=int, default=200)
    p.add_argument("--consumer-batches", type=int, default=100)
    p.add_argument("--quick", action="store_true", help="a smoke test: 1 round, 2 epochs, tiny epochs; "
                   "the figures mean nothing")
    p.add_argument("--out", type=Path, help="write every figure here (JSON)")
    args = p.parse_args(argv)
    if args.quick:
        args.rounds, args.epochs, args.sample_ms, args.step_ms = 1, 2, 0.5, 10.0
        args.data_batches, args.consumer_batches = 40, 30
    if args.epochs < 2 or args.rounds < 1:
        p.error("--epochs must be at least 2 (auto's first epoch, then later ones) and --rounds at least 1")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    warnings.filterwarnings("ignore", message="This DataLoader will create")  # counts above the cores: on purpose
    cores = len(os.sched_getaffinity(0))
    per_ms = iterations_per_ms()
    speed = parallel_speed(round((100 if args.quick else 500) * per_ms))
    print(f"{whence()}; {cores} usable cores of {os.cpu_count()}; load average {os.getloadavg()[0]:.2f} at start; "
          f"two busy processes each ran at {speed['each_of_two']:.2f} of one alone ({speed['cores_worth']:.2f} "
          f"cores' worth); {per_ms:,.0f} loop turns a ms", flush=True)
    every_core = str(default_cap(None))  # auto's default cap: the usable cores
    configs = [str(c) for c in sorted(set(args.counts) | {int(every_core)})] + [AUTO]
    data: dict[str, Any] = {"benchmark": "autotune", "machine": machine(["numpy", "psutil", "shmload"]),
                            "parallel_speed": speed, "iterations_per_ms": per_ms, "settings": vars(args) | {
                                "out": str(args.out), "batch": BATCH, "seed": SEED, "configs": configs,
                                "fixed_rate": "a round's median over all of a fixed count's epochs"},
                            "workloads": {}}
    summaries = {}
    for work in workloads(args, per_ms):
        print(f"{work.name}: {len(configs)} configurations x {args.rounds} round(s) x {args.epochs} epochs",
              flush=True)
        rounds = measure(work, configs, args.rounds, args.epochs)
        summaries[work.name] = summarize(rounds, every_core)
        data["workloads"][work.name] = {"description": work.description, "rounds": rounds,
                                        "summary": summaries[work.name]}
    for work in workloads(args, per_ms):
        print(table(work, data["workloads"][work.name]["rounds"], summaries[work.name]))
    print("\nTargets (issue 37)" + (" (--quick: the figures mean nothing)" if args.quick else "") + ":")
    for t in targets(summaries):
        print(t.line())
    print(f"load average {os.getloadavg()[0]:.2f} at end")
    if args.out:
        args.out.write_text(json.dumps(data, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
