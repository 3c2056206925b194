"""Where a small batch's time goes: shmload's per-batch costs, main process and workers.

    python -m benchmarks.per_batch [--workload tiny] [--batches 3000] [--repeat 3]

Runs one loader (2 workers, persistent, its default prefetch) over the workload's
dataset and reports, per batch, medians of ``--repeat`` runs:

* main process: CPU (``process_time``), and its voluntary context switches (each one a
  sleep, hence a wake-up someone paid a system call for);
* workers: CPU (psutil), the dataset's ``__getitem__`` alone (timed in this process on
  the same batches), the loader's own cost (CPU minus ``__getitem__``; and CPU minus the
  *fetch* stage, the ``__getitem__`` loop as the workers ran it: wall time, so on a
  core shared with another process it counts the wait too and leaves less to the
  loader), and the stages the loader's profiler records (``loader.stats()``: fetch,
  collate = plan + write, other = seeding and reporting, wait = waiting for a task),
  and their context switches.

The header line names the path the per-sample work took: the compiled core or pure
Python (``shmload._core.native.DESCRIPTION``; ``SHMLOAD_PURE_PYTHON=1`` forces pure
Python). ``--json FILE`` writes the medians and each run's figures there too.

``--both`` compares the two paths (issue 35): the same command, run in a child process
per path and round (``--repeat`` rounds; each child runs the loader once, writing
``--json``), once with the compiled core and once with ``SHMLOAD_PURE_PYTHON=1``,
alternating which goes first so that drift on the machine hits both alike. It prints
each figure's median for each path and their ratio (compiled / pure Python), and a line
naming the machine and its load average at start and end, to tell whether it was quiet
(``--json FILE``: the medians, every child's figures and the machine). Where the
compiled core is not built, it says so and exits with status 2::

    python -m benchmarks.per_batch --both [--workload tiny] [--batches 3000] [--repeat 3]

It imports whichever ``shmload`` comes first on ``sys.path``, so the same script measures
an older checkout: ``PYTHONPATH=/path/to/old/checkout python benchmarks/per_batch.py``
(one from before the compiled core reports pure Python). Speed is never asserted; run it
on a quiet machine.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import psutil

import shmload


def _sibling(name: str):
    """This directory's ``<name>.py``, whichever checkout's shmload is imported (an older
    one on PYTHONPATH has its own benchmarks/, without this workload table)."""
    spec = importlib.util.spec_from_file_location(f"_per_batch_{name}", Path(__file__).with_name(f"{name}.py"))
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # (its dataclasses look their module up)
    spec.loader.exec_module(module)
    return module


_w = _sibling("workloads")
WORKLOADS, getitem_ms = _w.WORKLOADS, _w.getitem_ms
cpu_model = _sibling("host").cpu_model


MAIN_STAGES = {  # Session's methods, the same in older checkouts: what each does per batch
    "try_dispatch": "dispatch (task made and handed to the control path)",
    "flush": "flush (tasks leave: a socket write, or a queue record)",
    "poll": "poll (wait for and take completions, decode, bookkeeping)",
    "deliver": "deliver (views into the slot, the batch built)",
}


class StageClock:
    """CPU time (``thread_time``) spent inside some of Session's methods, by wrapping them."""

    def __init__(self) -> None:
        self.seconds = dict.fromkeys(MAIN_STAGES, 0.0)
        self._saved: list = []

    def install(self) -> None:
        from shmload._session.session import Session
        for name in MAIN_STAGES:
            real = getattr(Session, name)
            self._saved.append((name, real))
            setattr(Session, name, self._timed(name, real))

    def _timed(self, name, real):
        clock, seconds = time.thread_time, self.seconds

        def timed(*args, **kwargs):
            t0 = clock()
            try:
                return real(*args, **kwargs)
            finally:
                seconds[name] += clock() - t0
        return timed

    def remove(self) -> None:
        from shmload._session.session import Session
        for name, real in self._saved:
            setattr(Session, name, real)


def one_run(workload: str, batches: int, workers: int, stages: bool = False) -> dict[str, float]:
    w = WORKLOADS[workload]
    per_epoch = min(batches, w.batches)  # the workload's own epochs (see workloads.py)
    dataset = w.make_dataset(w.batch_size * per_epoch)
    index_batches = [list(range(s, s + w.batch_size)) for s in range(0, len(dataset), w.batch_size)]
    getitem = getitem_ms(dataset, index_batches)
    loader = shmload.DataLoader(dataset, batch_size=w.batch_size, num_workers=workers, persistent_workers=True,
                                seed=0, timeout=60)
    try:
        for _ in loader:  # warm-up: workers started, ring sized, caches warm
            pass
        me = psutil.Process()
        kids = me.children()
        cpu0 = time.process_time()
        ctx0 = me.num_ctx_switches().voluntary
        kid_cpu0 = {k.pid: sum(k.cpu_times()[:2]) for k in kids}
        kid_ctx0 = {k.pid: k.num_ctx_switches().voluntary for k in kids}
        loader.reset_stats()  # the profiler's window starts here
        clock = StageClock()
        if stages:
            clock.install()
        t0 = time.perf_counter()
        n = 0
        while n < batches:
            for _ in loader:
                n += 1
        seconds = time.perf_counter() - t0
        stats = loader.stats(memory=False)
        main_cpu = time.process_time() - cpu0
        main_ctx = me.num_ctx_switches().voluntary - ctx0
        kid_cpu = sum(sum(k.cpu_times()[:2]) - kid_cpu0[k.pid] for k in kids)
        kid_ctx = sum(k.num_ctx_switches().voluntary - kid_ctx0[k.pid] for k in kids)
    finally:
        clock.remove()
        loader.close()
    us = 1e6 / n
    done = sum(s.batches for s in stats.workers) or 1
    stage = lambda name: 1e6 * sum(getattr(s, name) for s in stats.workers) / done  # noqa: E731
    out = {f"main_{name}_us": clock.seconds[name] * us for name in MAIN_STAGES} if stages else {}
    return out | {
        "batches_per_s": n / seconds,
        "main_cpu_us": main_cpu * us,
        "main_ctx_per_batch": main_ctx / n,
        "workers_cpu_us": kid_cpu * us,
        "workers_ctx_per_batch": kid_ctx / n,
        "getitem_us": 1e3 * getitem,
        "workers_own_us": kid_cpu * us - 1e3 * getitem,
        "workers_own_in_loop_us": kid_cpu * us - stage("fetch"),
        "worker_fetch_us": stage("fetch"),
        "worker_collate_us": stage("collate"),
        "worker_other_us": stage("other"),
        "worker_wait_us": stage("wait"),
    }


LABELS = {
    "batches_per_s": "batches/s",
    "main_cpu_us": "main process CPU, us per batch",
    "main_ctx_per_batch": "main process sleeps (voluntary context switches) per batch",
    "workers_cpu_us": "workers CPU, us per batch (all workers)",
    "getitem_us": "  of which the dataset's __getitem__ alone, us",
    "workers_own_us": "  the rest: the loader's own cost in the workers, us",
    "workers_own_in_loop_us": "  the rest, less the fetch stage as the workers ran it instead, us",
    "worker_fetch_us": "worker stage: fetch (__getitem__ in the loop, index checks), us",
    "worker_collate_us": "worker stage: collate (plan + write into the slot), us",
    "worker_other_us": "worker stage: other (seeding, reporting the batch), us",
    "worker_wait_us": "worker stage: waiting for a task, us",
    "workers_ctx_per_batch": "worker sleeps (voluntary context switches) per batch",
}


# ---------------------------------------------------------------- the two paths (--both)
# (benchmarks.worker_floor's --both runs on these too)
PURE_PYTHON_ENV = "SHMLOAD_PURE_PYTHON"  # (shmload._core.native's; an older shmload has none)


def core() -> tuple[str, bool]:
    """The path this process's shmload takes for the per-sample work, as
    ``shmload._core.native.DESCRIPTION`` words it, and whether that is the compiled core."""
    try:
        from shmload._core import native
    except ImportError:  # a checkout from before the compiled core
        return "pure Python (this shmload has no compiled core)", False
    return native.DESCRIPTION, native.compiled_core()


def location() -> str:
    return os.path.dirname(shmload.__file__)


def whence() -> str:
    """The header's start: which shmload, from where, on which path."""
    return f"shmload {shmload.__version__} from {location()}; core: {core()[0]}"


def write_json(out: Path, **figures) -> None:
    """``--json``: the figures, and which shmload measured them on which path (what
    ``--both`` checks a child by)."""
    description, compiled = core()
    out.write_text(json.dumps({"shmload": location(), "core": description, "compiled": compiled} | figures, indent=1))


def _why_not_compiled() -> str | None:
    """None where a child process without ``SHMLOAD_PURE_PYTHON`` runs the compiled core;
    otherwise why it does not."""
    description, compiled = core()
    if compiled:
        return None
    if os.environ.get(PURE_PYTHON_ENV, "") in ("", "0"):
        return description
    try:  # forced pure here: is the extension there for a child without the variable?
        importlib.import_module("shmload._core._native")
    except ImportError as exc:
        return f"the compiled core is not built: {exc}"
    return None


def _child(child_args: list[str], pure: bool) -> dict:
    """This benchmark (``python -m <it>``, or its file if run as one) in a child process
    with ``child_args --json FILE``, on the path asked for: the JSON it wrote."""
    spec = sys.modules["__main__"].__spec__
    me = ["-m", spec.name] if spec is not None else [os.path.abspath(sys.argv[0])]
    env = {k: v for k, v in os.environ.items() if k != PURE_PYTHON_ENV} | ({PURE_PYTHON_ENV: "1"} if pure else {})
    with tempfile.TemporaryDirectory(prefix="shmload-both-") as tmp:
        out = Path(tmp) / "figures.json"
        proc = subprocess.run([sys.executable, *me, *child_args, "--json", str(out)], env=env, text=True,
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        if proc.returncode != 0 or not out.exists():
            sys.exit(f"{' '.join(me)} {' '.join(child_args)} ({PURE_PYTHON_ENV}={int(pure)}) failed, exit code "
                     f"{proc.returncode}:\n{proc.stderr.strip()}")
        result = json.loads(out.read_text())
    if result["shmload"] != location() or result["compiled"] == pure:
        sys.exit(f"a child measured shmload from {result['shmload']}, {result['core']}; "
                 f"asked for the one from {location()}, {'pure Python' if pure else 'compiled'}")
    return result


def both_paths(child_args: list[str], rounds: int, key: str, what: str, out: Path | None) -> int:
    """``--both``: ``rounds`` rounds of a child process per path, the compiled core and
    ``SHMLOAD_PURE_PYTHON=1``, alternating which goes first; prints, for each figure (the
    dict under ``key`` in a child's JSON, labelled by its ``labels``), the median of each
    path and their ratio, and a line naming the machine. 2 if there is no compiled core."""
    why_not = _why_not_compiled()
    if why_not is not None:
        print(f"--both compares the compiled core with pure Python, but the compiled core is not available here: "
              f"{why_not}", file=sys.stderr)
        return 2
    load_start = os.getloadavg()
    results: dict[str, list[dict]] = {"compiled": [], "pure": []}
    for r in range(rounds):
        order = ("compiled", "pure") if r % 2 == 0 else ("pure", "compiled")
        print(f"round {r + 1} of {rounds}: {order[0]} first", file=sys.stderr, flush=True)
        for path in order:
            results[path].append(_child(child_args, pure=path == "pure"))
    load_end = os.getloadavg()
    medians = {path: {k: statistics.median(res[key][k] for res in runs) for k in runs[0][key]}
               for path, runs in results.items()}
    labels = results["compiled"][0]["labels"]
    width = max(map(len, labels.values()))
    print(f"shmload {shmload.__version__} from {location()}; {what}; compiled core vs "
          f"pure Python ({PURE_PYTHON_ENV}=1): medians of {rounds} rounds, a process per path in each, "
          f"alternating which goes first")
    print(f"  {'':<{width}} {'compiled':>10} {'pure Python':>11} {'compiled/pure':>13}")
    for k, label in labels.items():
        compiled, pure = medians["compiled"][k], medians["pure"][k]
        places = 1 if max(abs(compiled), abs(pure)) >= 1 else 3  # (context switches per batch: fractions)
        # (a difference of two timings can come out at or below 0 in noise: no ratio then)
        ratio = f"{compiled / pure:13.2f}" if compiled > 0 and pure > 0 else f"{'-':>13}"
        print(f"  {label:<{width}} {compiled:10.{places}f} {pure:11.{places}f} {ratio}")
    machine = {"cpu_count": os.cpu_count(), "cpu": cpu_model(), "load_average_start": load_start,
               "load_average_end": load_end}
    load = lambda avg: " ".join(f"{x:.2f}" for x in avg)  # noqa: E731
    print(f"machine: {machine['cpu_count']} CPUs (os.cpu_count()), {machine['cpu']}; load average "
          f"(1, 5, 15 min) {load(load_start)} at start, {load(load_end)} at end")
    if out:
        out.write_text(json.dumps({"machine": machine, "rounds": rounds, "medians": medians, "runs": results},
                                  indent=1))
    return 0


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--workload", default="tiny", choices=sorted(WORKLOADS))
    p.add_argument("--batches", type=int, default=3000)
    p.add_argument("--workers", type=int, default=2)
    p.add_argument("--repeat", type=int, default=3, help="runs (with --both: rounds, a run per path in each)")
    p.add_argument("--json", type=Path, default=None, help="write the medians here too")
    p.add_argument("--main-stages", action="store_true",
                   help="also time the main process's stages (wrapping Session's methods costs ~1 us each)")
    p.add_argument("--both", action="store_true",
                   help="compare the compiled core with pure Python (SHMLOAD_PURE_PYTHON=1), in child processes")
    args = p.parse_args(argv)
    if args.both:
        child_args = ["--workload", args.workload, "--batches", str(args.batches), "--workers", str(args.workers),
                      "--repeat", "1"] + (["--main-stages"] if args.main_stages else [])
        return both_paths(child_args, args.repeat, "medians",
                          f"{args.workload}, {args.workers} workers, {args.batches} batches", args.json)
    runs = [one_run(args.workload, args.batches, args.workers, args.main_stages) for _ in range(args.repeat)]
    medians = {k: statistics.median(r[k] for r in runs) for k in runs[0]}
    print(f"{whence()}; {args.workload}, {args.workers} workers, {args.batches} batches, median of {args.repeat} runs")
    labels = LABELS | ({f"main_{k}_us": f"main stage: {v}, us" for k, v in MAIN_STAGES.items()}
                       if args.main_stages else {})
    for key, label in labels.items():
        print(f"  {label:<64} {medians[key]:10.1f}")
    if args.json:
        write_json(args.json, labels=labels, medians=medians, runs=runs)
    return 0


if __name__ == "__main__":
    sys.exit(main())
