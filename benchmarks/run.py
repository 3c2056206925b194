"""shmload against the loaders users would otherwise pick, side by side, in one run.

    python -m benchmarks.run [--quick] [--workloads ...] [--loaders ...] [--repeat N]

Each (workload, loader) runs in a fresh process (``benchmarks.measure``) while this
process samples the peak PSS of it and its workers; with ``--repeat N`` the runs are
interleaved (every loader once, then again) so slow drift on a shared machine hits every
loader alike, and each figure is the median over the runs. Ceilings are measured here,
in the same run. Prints one markdown table per workload and the targets, writes all
figures and the machine to JSON and, with matplotlib, a chart (PNG).

``--quick`` (fewer batches, one run) finishes in under two minutes on two cores and is
CI's smoke test; it asserts nothing about speed.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from . import ceilings as ceilings_mod
from . import report
from .host import machine
from .memory import PeakSampler
from .peers import PEERS
from .workloads import WORKLOADS, make_jpeg_folder, thread_env

ROOT = Path(__file__).resolve().parent.parent
RESULTS = Path(__file__).resolve().parent / "results"
OPT_IN = ("shmload-posix",)  # run only when named: --loaders shmload shmload-posix compares the backends


def run_child(workload: str, loader: str, args: argparse.Namespace) -> dict[str, Any]:
    with tempfile.TemporaryDirectory(prefix="shmload-bench-") as tmp:
        out = Path(tmp) / "result.json"
        cmd = [sys.executable, "-m", "benchmarks.measure", "--workload", workload, "--loader", loader,
               "--workers", str(args.workers), "--start-method", args.start_method, "--epochs", str(args.epochs),
               "--out", str(out)] + (["--quick"] if args.quick else [])
        t0 = time.perf_counter()
        proc = subprocess.Popen(cmd, cwd=ROOT, env=os.environ | thread_env(), stdout=subprocess.DEVNULL,
                                stderr=subprocess.PIPE, text=True)
        with PeakSampler(proc.pid) as sampler:
            try:
                _, stderr = proc.communicate(timeout=args.child_timeout)
            except subprocess.TimeoutExpired:
                proc.kill()
                _, stderr = proc.communicate()
                return {"error": f"timed out after {args.child_timeout:.0f} s"}
        if proc.returncode != 0 or not out.exists():
            tail = stderr.strip().splitlines()[-1:] or ["no output"]
            return {"error": f"exit code {proc.returncode}: {tail[0][:200]}"}
        result = json.loads(out.read_text())
        result["peak_pss"] = sampler.peak
        result["pss_samples"] = sampler.samples
        result["wall_seconds"] = time.perf_counter() - t0
        return result


def progress(workload: str, loader: str, result: dict[str, Any]) -> str:
    if "epochs" not in result:
        return f"  {workload:<14} {loader:<10} {result.get('skipped') or result.get('error')}"
    s = report.summarize_run(result)
    return (f"  {workload:<14} {loader:<10} {s['batches_per_s']:8.1f} batches/s  "
            f"first batch {s['time_to_first_batch']:.3f} s  ({result['wall_seconds']:.1f} s)")


def print_report(data: dict[str, Any]) -> None:
    results = {w: {name: report.combine(runs) for name, runs in by_loader.items()}
               for w, by_loader in data["runs"].items()}
    workers = data["config"]["workers"]
    for workload, rows in results.items():
        print(f"\n### {workload}: {WORKLOADS[workload].note}\n")
        print(report.table(workload, rows, data.get("ceilings"), workers))
    print("\n### Targets\n")
    for target in report.targets(results, data.get("ceilings"), workers, data["runs"]):
        print(target.line())
    data["combined"] = results


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--quick", action="store_true", help="fewer batches, one run: under 2 minutes on 2 cores")
    p.add_argument("--workloads", nargs="+", choices=list(WORKLOADS), default=list(WORKLOADS))
    p.add_argument("--loaders", nargs="+", choices=list(PEERS), default=[p for p in PEERS if p not in OPT_IN],
                   help=f"default: all but {', '.join(OPT_IN)}")
    p.add_argument("--workers", type=int, default=2, help="worker processes (or threads, for spdl); default 2")
    p.add_argument("--start-method", default="fork", choices=["fork", "spawn", "forkserver"],
                   help="for the loaders that take one (tensorpack always forks); default fork")
    p.add_argument("--epochs", type=int, default=None, help="timed epochs per run (default 3; 5 without --quick)")
    p.add_argument("--repeat", type=int, default=None,
                   help="runs per (workload, loader) (default 1; 3 without --quick)")
    p.add_argument("--child-timeout", type=float, default=300.0, help="seconds before a run is killed")
    p.add_argument("--out", type=Path, default=None, help="JSON (default benchmarks/results/run-<time>.json)")
    p.add_argument("--chart", type=Path, default=None, help="PNG (default: next to the JSON)")
    p.add_argument("--report", type=Path, default=None, help="only print the report of a saved JSON")
    args = p.parse_args(argv)
    if args.epochs is None:
        args.epochs = 3 if args.quick else 5
    if args.repeat is None:
        args.repeat = 1 if args.quick else 3
    if min(args.workers, args.epochs, args.repeat) < 1:
        p.error("--workers, --epochs and --repeat must be at least 1")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.report:
        data = json.loads(args.report.read_text())
        print_report(data)
        return 0
    stamp = datetime.datetime.now().strftime("%Y%m%d-%H%M%S")
    out = args.out or RESULTS / f"run-{stamp}{'-quick' if args.quick else ''}.json"
    chart_path = args.chart or out.with_suffix(".png")
    t0 = time.perf_counter()
    data: dict[str, Any] = {
        "machine": machine(("numpy", "Pillow", "torch", "tensorpack", "pyzmq", "spdl", "shmload")),
        "config": {k: (str(v) if isinstance(v, Path) else v) for k, v in vars(args).items()}}
    m = data["machine"]
    print(f"machine: {m['cpu']}, {m['cpu_count']} CPUs, {m['ram_gib']} GiB, {m['platform']}, "
          f"python {m['python']}; {', '.join(f'{k} {v}' for k, v in m['versions'].items())}")
    if "jpeg" in args.workloads:
        jpeg = WORKLOADS["jpeg"]
        make_jpeg_folder(jpeg.batch_size * jpeg.epoch_batches(args.quick))
    os.environ.update(thread_env())
    data["ceilings"] = ceilings_mod.measure(args.quick, args.workers)
    c = data["ceilings"]
    print(f"ceilings (one core): copy into touched memory {c['copy']['transport']['touched']['gb_per_s']:.1f} GB/s, "
          f"into fresh pages {c['copy']['transport']['fresh']['gb_per_s']:.1f} GB/s (9.6 MB); "
          f"jpeg pipeline {c['jpeg_one_core']['images_per_s']:.0f} images/s on one core, "
          f"{c['jpeg_one_core']['independent_processes_images_per_s']:.0f} in {args.workers} processes at once")
    data["runs"] = {w: {name: [] for name in args.loaders} for w in args.workloads}
    for rep in range(args.repeat):
        print(f"run {rep + 1} of {args.repeat}:")
        for workload in args.workloads:
            for loader in args.loaders:
                result = run_child(workload, loader, args)
                data["runs"][workload][loader].append(result)
                print(progress(workload, loader, result), flush=True)
    data["elapsed_seconds"] = time.perf_counter() - t0
    print_report(data)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(data, indent=1, default=float) + "\n")
    why_not = report.chart(data["combined"], str(chart_path))
    print(f"\nJSON: {out}\nchart: {chart_path if why_not is None else 'not drawn, ' + why_not}")
    print(f"total {data['elapsed_seconds']:.0f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())

