"""The ``shmload`` command: ``shmload profile`` (here) and ``shmload demo`` (demo.py).

``shmload profile MODULE:FACTORY``: import a dataset (``FACTORY`` is a dataset, or a
callable returning one), load ``--batches`` batches with each worker count of
``--workers``, print throughput, stall and utilization side by side, and recommend the
fewest workers within 5% of the best throughput on this machine.
"""

from __future__ import annotations

import argparse
import importlib
import importlib.util
import os
import sys
import time
from typing import Any

from .errors import format_bytes
from .loader import DataLoader
from .stats import LoaderStats

NEAR_BEST = 0.95  # a worker count within this share of the best throughput is good enough


def load_factory(spec: str) -> Any:
    """The dataset named by ``MODULE:ATTRIBUTE`` (MODULE may be a path to a .py file); a
    callable attribute is called with no arguments."""
    module_name, sep, attr = spec.partition(":")
    if not sep or not module_name or not attr:
        raise SystemExit(f"shmload profile: expected MODULE:FACTORY (e.g. shmload.synthetic:images), got {spec!r}")
    if module_name.endswith(".py") or os.sep in module_name:
        path = os.path.abspath(module_name)
        name = os.path.splitext(os.path.basename(path))[0]
        module_spec = importlib.util.spec_from_file_location(name, path)
        if module_spec is None or not os.path.exists(path):
            raise SystemExit(f"shmload profile: no Python file at {path}")
        module = importlib.util.module_from_spec(module_spec)
        sys.modules[name] = module  # workers started with spawn import it by this name
        sys.path.insert(0, os.path.dirname(path))
        module_spec.loader.exec_module(module)
    else:
        sys.path.insert(0, os.getcwd())
        module = importlib.import_module(module_name)
    try:
        obj = getattr(module, attr)
    except AttributeError:
        raise SystemExit(f"shmload profile: module {module_name!r} has no attribute {attr!r}") from None
    dataset = obj() if callable(obj) and not hasattr(obj, "__getitem__") else obj
    missing = [m for m in ("__getitem__", "__len__") if not hasattr(dataset, m)]
    if missing:
        raise SystemExit(f"shmload profile: {spec} gave a {type(dataset).__name__}, which has no "
                         f"{' or '.join(missing)}; expected a map-style dataset or a factory returning one")
    return dataset


def _worker_counts(text: str) -> list[int]:
    try:
        counts = [int(part) for part in text.split(",") if part.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated worker counts like 1,2,4, got {text!r}") from None
    if not counts or any(n < 0 for n in counts):
        raise argparse.ArgumentTypeError(f"expected worker counts >= 0, got {text!r}")
    return counts


class Progress:
    """A one-line progress bar on stderr, drawn only when stderr is a terminal."""

    def __init__(self, total: int, enabled: bool):
        self.total, self.enabled, self.done = total, enabled, 0
        self._last = 0.0

    def advance(self, label: str) -> None:
        self.done += 1
        now = time.monotonic()
        if self.enabled and (now - self._last > 0.1 or self.done == self.total):
            self._last = now
            filled = int(30 * self.done / max(1, self.total))
            sys.stderr.write(f"\r[{'#' * filled}{'.' * (30 - filled)}] {self.done}/{self.total} batches  {label}  ")
            sys.stderr.flush()

    def close(self) -> None:
        if self.enabled:
            sys.stderr.write("\n")


def _spin(seconds: float) -> None:
    """Stand-in for a training step: keeps a core busy, as compute would."""
    end = time.perf_counter() + seconds
    while time.perf_counter() < end:
        pass


def profile_one(dataset: Any, workers: int, args: argparse.Namespace, progress: Progress) -> LoaderStats:
    loader = DataLoader(dataset, batch_size=args.batch_size, shuffle=True, num_workers=workers,
                        persistent_workers=workers > 0, multiprocessing_context=args.start_method, seed=0)
    try:
        warmup, measured = max(2, 2 * workers), 0
        label = f"num_workers={workers}"
        while measured < args.batches:
            for _ in loader:
                if warmup:
                    warmup -= 1
                    if not warmup:
                        loader.reset_stats()  # the window starts after the workers are up
                    continue
                _spin(args.step_ms / 1000)
                measured += 1
                progress.advance(label)
                if measured >= args.batches:
                    break
        return loader.stats()
    finally:
        loader.close()


def recommend(results: dict[int, LoaderStats]) -> tuple[int, str]:
    """The fewest workers within NEAR_BEST of the best throughput, and why."""
    best = max(results, key=lambda n: results[n].batches_per_second)
    top = results[best].batches_per_second
    pick = min(n for n, s in results.items() if s.batches_per_second >= NEAR_BEST * top)
    why = (f"the fewest workers within {100 * (1 - NEAR_BEST):.0f}% of the best throughput "
           f"({top:.1f} batches/s with num_workers={best})")
    return pick, why


def format_comparison(results: dict[int, LoaderStats]) -> str:
    lines = [f"{'workers':>7}{'batches/s':>11}{'MB/s':>9}{'stall':>8}{'workers busy':>14}{'fetch':>9}{'collate':>9}"
             f"{'other':>8}{'main CPU':>10}{'total PSS':>12}",
             f"{'':>7}{'':>11}{'':>9}{'':>8}{'':>14}{'ms/batch':>9}{'':>9}{'':>8}"]
    for n, s in sorted(results.items()):
        batches = max(1, sum(w.batches for w in s.workers))
        stages = s.stage_seconds()
        busy = sum(w.busy for w in s.workers) / max(1e-12, sum(w.busy + w.wait for w in s.workers))
        pss = [p for p in [s.main.pss] + [w.pss for w in s.workers] if p is not None]
        cpu = f"{100 * s.main.cpu / s.duration:.0f}%" if s.main.cpu is not None and s.duration else "-"
        lines.append(f"{n:>7}{s.batches_per_second:>11.1f}{s.bytes_per_second / 1e6:>9.1f}"
                     f"{100 * s.stall_fraction:>7.0f}%{100 * busy:>13.0f}%"
                     f"{1000 * stages['fetch'] / batches:>9.2f}{1000 * stages['collate'] / batches:>9.2f}"
                     f"{1000 * stages['other'] / batches:>8.2f}{cpu:>10}"
                     f"{format_bytes(sum(pss)) if pss else '-':>12}")
    return "\n".join(lines)


def cmd_profile(args: argparse.Namespace) -> int:
    dataset = load_factory(args.factory)
    progress = Progress(args.batches * len(args.workers), sys.stderr.isatty() and not args.quiet)
    results: dict[int, LoaderStats] = {}
    try:
        for n in args.workers:
            results[n] = profile_one(dataset, n, args, progress)
    finally:
        progress.close()
    print(f"shmload profile {args.factory}: {len(dataset)} samples, batch_size={args.batch_size}, "
          f"{args.batches} batches per run, consumer step {args.step_ms:g} ms, "
          f"{results[args.workers[0]].cores} usable cores\n")
    print(format_comparison(results))
    pick, why = recommend(results)
    print(f"\nrecommended: num_workers={pick}: {why}.\n")
    print(f"profile with num_workers={pick}:\n")
    print(results[pick])
    if args.trace:
        results[pick].trace(args.trace)
        print(f"\ntrace of num_workers={pick}: {args.trace} (open it in https://ui.perfetto.dev)")
    if args.plot:
        results[pick].plot(args.plot)
        print(f"picture of num_workers={pick}: {args.plot}")
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="shmload", description="shmload's command-line tools.")
    sub = parser.add_subparsers(dest="command", required=True)
    p = sub.add_parser("profile", help="find out whether loading keeps up, and how many workers to use",
                       description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("factory", metavar="MODULE:FACTORY",
                   help="a dataset, or a callable returning one (e.g. shmload.synthetic:images, mydata.py:make)")
    p.add_argument("--batch-size", type=int, default=64)
    p.add_argument("--workers", type=_worker_counts, default=[1, 2, 4], metavar="N,N,...",
                   help="worker counts to try (default 1,2,4)")
    p.add_argument("--batches", type=int, default=100, help="batches measured per worker count (default 100)")
    p.add_argument("--step-ms", type=float, default=0.0,
                   help="a simulated training step per batch, busy on the CPU (default 0: loading alone)")
    p.add_argument("--start-method", choices=["fork", "spawn", "forkserver"], default=None)
    p.add_argument("--trace", metavar="OUT.json", help="write the recommended run's Chrome trace here")
    p.add_argument("--plot", metavar="OUT.png", help="draw the recommended run here (needs matplotlib)")
    p.add_argument("--quiet", action="store_true", help="no progress bar")
    p.set_defaults(run=cmd_profile)
    from .demo import add_parser as add_demo
    from .records.pack import add_parser as add_pack

    add_demo(sub)
    add_pack(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    if getattr(args, "batch_size", 1) < 1 or getattr(args, "batches", 1) < 1:
        raise SystemExit("shmload profile: --batch-size and --batches must be at least 1")
    return args.run(args)


if __name__ == "__main__":
    sys.exit(main())
