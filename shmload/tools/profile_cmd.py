"""``shmload profile``: load the user's dataset, time it with each worker count, print the runs.

The command's parser (:func:`add_parser`, as demo.py and pack_cmd.py have theirs),
loading the dataset named by ``MODULE:FACTORY`` (:func:`load_factory`), the sweep over
worker counts (:func:`sweep`) and what it prints (:func:`print_results`). Mistakes and
exceptions from the user's code become a :class:`CommandError` (:func:`user_code_failed`),
which cli.py reports on one line: see NOTE [ Command errors ] in cli.py.
"""

from __future__ import annotations

import argparse
import difflib
import importlib
import importlib.util
import inspect
import os
import sys
import time
from typing import Any

from .._core._units import decimal_size
from .._loader.loader import DataLoader
from ..errors import CommandError, SharedMemoryError
from ..profiler.stats import LoaderStats
from .args import counted

NEAR_BEST = 0.95  # a worker count within this share of the best throughput is good enough


# ---------------------------------------------------------------- parsing
def _milliseconds(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        value = float("nan")
    if not 0 <= value < float("inf"):  # refuses nan and inf too (a step that never ends)
        raise argparse.ArgumentTypeError(f"expected milliseconds, 0 or more, got {text!r}")
    return value


def _worker_counts(text: str) -> list[int]:
    try:
        counts = [int(part) for part in text.split(",") if part.strip()]
    except ValueError:
        counts = []
    if not counts or any(n < 0 for n in counts):
        raise argparse.ArgumentTypeError(f"expected worker counts 0 or more separated by commas, like 1,2,4, "
                                         f"got {text!r}")
    return list(dict.fromkeys(counts))


def _factory_spec(text: str) -> str:
    module_name, sep, attr = text.partition(":")
    if not sep or not module_name or not attr:
        raise argparse.ArgumentTypeError(f"expected MODULE:FACTORY (e.g. mydata:make, ./mydata.py:make or "
                                         f"shmload.tools.synthetic:images), got {text!r}")
    return text


DESCRIPTION = """\
Find out whether loading keeps up with training, and how many worker processes
to use.

Imports your dataset from MODULE:FACTORY, then for each worker count in
--workers loads --batches batches (after a warm-up of two batches per worker)
and prints the runs side by side: batches/s, MB/s (10**6 bytes a second), the
stall (the share of time a training loop would wait for data), how busy the
workers were, where a batch's time goes (ms/batch), the main process's CPU, the
memory used (PSS), and the cores other programs used meanwhile. It recommends
the fewest workers within 5% of the best throughput, and prints that run's full
profile with a diagnosis.

examples:
  shmload profile mydata.py:make_dataset --batch-size 64 --workers 1,2,4
  shmload profile shmload.tools.synthetic:imagefolder     (the demo's JPEG folder)
"""


def add_parser(sub: Any) -> argparse.ArgumentParser:
    p = sub.add_parser("profile", help="find out whether loading keeps up, and how many workers to use",
                       description=DESCRIPTION)
    p.add_argument("factory", metavar="MODULE:FACTORY", type=_factory_spec,
                   help="where your dataset comes from: a module (importable from the current folder, or the path "
                        "of a .py file), a colon, and the name of a dataset in it or of a function that returns "
                        "one when called with no arguments (e.g. mydata:make, ./mydata.py:train_set, "
                        "shmload.tools.synthetic:images)")
    p.add_argument("--batch-size", type=counted(1, "samples per batch"), default=64, metavar="N",
                   help="samples per batch (default: 64)")
    p.add_argument("--workers", type=_worker_counts, default=[1, 2, 4], metavar="N,N,...",
                   help="worker counts to compare, separated by commas; 0 loads in this process, without workers "
                        "(default: 1,2,4)")
    p.add_argument("--batches", type=counted(1, "batches per run"), default=100, metavar="N",
                   help="batches timed for each worker count, after the warm-up (default: 100)")
    p.add_argument("--step-ms", type=_milliseconds, default=0.0, metavar="MS",
                   help="milliseconds of simulated training per batch, spent busy on the CPU as a training step "
                        "would be; 0 times loading alone (default: 0)")
    p.add_argument("--start-method", choices=["fork", "spawn", "forkserver"], default=None,
                   help="how worker processes start: fork copies this process (fastest); spawn and forkserver "
                        "start fresh interpreters that import your module again (default: fork on Linux)")
    p.add_argument("--trace", metavar="OUT.json",
                   help="also write the recommended run's timeline here, as a Chrome trace: open it in "
                        "https://ui.perfetto.dev")
    p.add_argument("--plot", metavar="OUT.png",
                   help="also draw the recommended run's worker utilization and stage times here (needs "
                        "matplotlib: pip install 'shmload[plot]')")
    p.add_argument("--quiet", action="store_true", help="no progress bar (one is drawn only when stderr is a terminal)")
    p.set_defaults(run=cmd_profile)
    return p


# ---------------------------------------------------------------- the user's code failing
def describe_exception(exc: BaseException) -> str:
    """``Type: message`` on one line. An exception a worker raised and the loader re-raised
    (``errors.RemoteError.rebuild``: ``Caught Type in DataLoader worker process 0 while
    loading batch 1 (...).`` and the worker's traceback) gives where and its own message."""
    lines = str(exc).splitlines()
    if len(lines) > 1 and lines[0].startswith("Caught ") and lines[1].startswith("Original Traceback"):
        frames = [i for i, line in enumerate(lines) if line.startswith(" ")]
        last = lines[frames[-1] + 1] if frames and frames[-1] + 1 < len(lines) else ""
        message = last.partition(": ")[2] if ": " in last else last
        where = lines[0][len("Caught "):].rstrip(".").replace("DataLoader worker", "worker")
        return f"{where}: {message}" if message else where
    return f"{type(exc).__name__}: {lines[0]}" if lines else type(exc).__name__


def user_code_failed(what: str, exc: BaseException) -> CommandError:
    """The one-line error for an exception raised in the user's code, while doing ``what``."""
    return CommandError(f"{what} raised {describe_exception(exc)}")


# ---------------------------------------------------------------- loading the dataset
def _exec_file(module_name: str) -> Any:
    path = os.path.abspath(module_name)
    if not os.path.isfile(path):
        raise CommandError(f"no Python file at {path}; give the path of a .py file, or a module name")
    name = os.path.splitext(os.path.basename(path))[0]
    spec = importlib.util.spec_from_file_location(name, path)
    if spec is None or spec.loader is None:  # (a suffix Python does not load, such as .txt)
        raise CommandError(f"{path} is not a Python file; give the path of a .py file, or a module name")
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module  # workers started with spawn import it by this name
    sys.path.insert(0, os.path.dirname(path))
    try:
        spec.loader.exec_module(module)
    except BaseException:
        del sys.modules[name]
        raise
    return module


def _import(module_name: str) -> Any:
    """The module ``module_name``: a dotted name (found from the current folder or the
    installed packages) or a path to a ``.py`` file."""
    try:
        if module_name.endswith(".py") or os.sep in module_name:
            return _exec_file(module_name)
        if os.getcwd() not in sys.path:
            sys.path.insert(0, os.getcwd())
        return importlib.import_module(module_name)
    except CommandError:
        raise
    except ModuleNotFoundError as e:
        if e.name and (module_name == e.name or module_name.startswith(e.name + ".")):
            raise CommandError(f"no module named {e.name!r} in {os.getcwd()} or the installed packages; check the "
                               f"name, run from the folder that holds it, or give its path (./mydata.py)") from None
        raise user_code_failed(f"importing {module_name}", e) from e
    except Exception as e:
        raise user_code_failed(f"importing {module_name}", e) from e


def load_factory(spec: str) -> Any:
    """The dataset named by ``MODULE:ATTRIBUTE`` (MODULE may be a path to a .py file); a
    callable attribute is called with no arguments. Mistakes raise :class:`CommandError`."""
    module_name, _, attr = _factory_spec(spec).partition(":")
    module = _import(module_name)
    try:
        obj = getattr(module, attr)
    except AttributeError:
        names = [n for n in dir(module) if not n.startswith("_")]
        close = difflib.get_close_matches(attr, names, n=3)
        hint = (f"did you mean {' or '.join(map(repr, close))}?" if close else
                f"it has: {', '.join(names[:10]) or 'nothing'}")
        raise CommandError(f"module {module_name!r} has no attribute {attr!r}; {hint}") from None
    dataset = obj
    if callable(obj) and not hasattr(obj, "__getitem__"):
        try:
            inspect.signature(obj).bind()
        except TypeError:
            raise CommandError(f"{spec} needs arguments, but FACTORY is called with none: give a function that "
                               "takes none (def make(): return MyData('/data'))") from None
        except ValueError:
            pass  # no signature to check (a builtin)
        try:
            dataset = obj()
        except Exception as e:
            raise user_code_failed(spec, e) from e
    missing = [m for m in ("__getitem__", "__len__") if not hasattr(dataset, m)]
    if missing:
        raise CommandError(f"{spec} gave a {type(dataset).__name__}, which has no {' or '.join(missing)}; "
                           "expected a map-style dataset or a factory returning one")
    try:
        size = len(dataset)
    except Exception as e:
        raise user_code_failed(f"len() of {spec}", e) from e
    if size < 1:
        raise CommandError(f"{spec} has no samples (len() is {size}); give a dataset with at least one")
    return dataset


# ---------------------------------------------------------------- the sweep over worker counts
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
                        persistent_workers=workers > 0, seed=0,
                        multiprocessing_context=args.start_method if workers > 0 else None)  # (torch's rule)
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


def sweep(dataset: Any, args: argparse.Namespace) -> dict[int, LoaderStats]:
    """One run for each of ``args.workers``, under one progress bar: the stats by worker count."""
    progress = Progress(args.batches * len(args.workers), sys.stderr.isatty() and not args.quiet)
    results: dict[int, LoaderStats] = {}
    try:
        for n in args.workers:
            try:
                results[n] = profile_one(dataset, n, args, progress)
            except SharedMemoryError:
                raise  # the machine's, not the dataset's: see NOTE [ Command errors ] in cli.py
            except Exception as e:
                raise user_code_failed(f"loading {args.factory} with num_workers={n}", e) from e
    finally:
        progress.close()
    return results


# ---------------------------------------------------------------- what it prints
def recommend(results: dict[int, LoaderStats]) -> tuple[int, str]:
    """The fewest workers within NEAR_BEST of the best throughput, and why."""
    best = max(results, key=lambda n: results[n].batches_per_second)
    top = results[best].batches_per_second
    pick = min(n for n, s in results.items() if s.batches_per_second >= NEAR_BEST * top)
    why = (f"the fewest workers within {100 * (1 - NEAR_BEST):.0f}% of the best throughput "
           f"({top:.1f} batches/s with num_workers={best})")
    return pick, why


def contention_warning(results: dict[int, LoaderStats]) -> str | None:
    """A warning when other programs took cores during some runs (``LoaderStats.contention``):
    fewer cores for the runs with more workers make fewer workers look as good."""
    flagged = {n: s.other_cores() or 0.0 for n, s in results.items() if s.contention()}
    if not flagged:
        return None
    worst = max(flagged, key=flagged.__getitem__)
    runs = ", ".join(map(str, sorted(flagged)))
    return (f"other programs used up to {flagged[worst]:.2f} of the {results[worst].cores} usable cores during the "
            f"runs (num_workers={runs}): the recommendation may be too low; run again on a quiet machine")


def format_comparison(results: dict[int, LoaderStats]) -> str:
    lines = [f"{'workers':>7}{'batches/s':>11}{'MB/s':>9}{'stall':>8}{'workers busy':>14}{'fetch':>9}{'collate':>9}"
             f"{'other':>8}{'main CPU':>10}{'total PSS':>12}{'others':>8}",
             f"{'':>7}{'':>11}{'':>9}{'':>8}{'':>14}{'ms/batch':>9}{'':>9}{'':>8}{'':>10}{'':>12}{'cores':>8}"]
    for n, s in sorted(results.items()):
        batches = max(1, sum(w.batches for w in s.workers))
        stages = s.stage_seconds()
        busy = sum(w.busy for w in s.workers) / max(1e-12, sum(w.busy + w.wait for w in s.workers))
        pss = [p for p in [s.main.pss] + [w.pss for w in s.workers] if p is not None]
        cpu = f"{100 * s.main.cpu / s.duration:.0f}%" if s.main.cpu is not None and s.duration else "-"
        others = s.other_cores()
        lines.append(f"{n:>7}{s.batches_per_second:>11.1f}{s.bytes_per_second / 1e6:>9.1f}"
                     f"{100 * s.stall_fraction:>7.0f}%{100 * busy:>13.0f}%"
                     f"{1000 * stages['fetch'] / batches:>9.2f}{1000 * stages['collate'] / batches:>9.2f}"
                     f"{1000 * stages['other'] / batches:>8.2f}{cpu:>10}"
                     f"{decimal_size(sum(pss)) if pss else '-':>12}{'-' if others is None else f'{others:.2f}':>8}")
    return "\n".join(lines)


def print_results(args: argparse.Namespace, dataset: Any, results: dict[int, LoaderStats]) -> None:
    """The runs side by side, the recommendation, and the recommended run's full profile
    (and its trace and picture, if asked for)."""
    print(f"shmload profile {args.factory}: {len(dataset)} samples, batch_size={args.batch_size}, "
          f"{args.batches} batches per run, consumer step {args.step_ms:g} ms, "
          f"{results[args.workers[0]].cores} usable cores\n")
    print(format_comparison(results))
    pick, why = recommend(results)
    print(f"\nrecommended: num_workers={pick}: {why}.")
    warning = contention_warning(results)
    print(f"caution: {warning}.\n" if warning else "")
    print(f"profile with num_workers={pick}:\n")
    print(results[pick])
    if args.trace:
        results[pick].trace(args.trace)
        print(f"\ntrace of num_workers={pick}: {args.trace} (open it in https://ui.perfetto.dev)")
    if args.plot:
        results[pick].plot(args.plot)
        print(f"picture of num_workers={pick}: {args.plot}")


# ---------------------------------------------------------------- the command
def _check_outputs(args: argparse.Namespace) -> None:
    """Refuse, before minutes of profiling, what would fail at the end."""
    for option, path in (("--trace", args.trace), ("--plot", args.plot)):
        folder = os.path.dirname(os.path.abspath(path)) if path else None
        if folder and not os.path.isdir(folder):
            raise CommandError(f"{option} {path}: the folder {folder} does not exist; create it or choose another")
    if args.plot and importlib.util.find_spec("matplotlib") is None:
        raise CommandError("--plot needs matplotlib: pip install 'shmload[plot]' (or leave out --plot)")


def cmd_profile(args: argparse.Namespace) -> int:
    _check_outputs(args)
    dataset = load_factory(args.factory)
    print_results(args, dataset, sweep(dataset, args))
    return 0
