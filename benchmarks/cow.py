"""Copy-on-read: forked workers' memory over an epoch, names in a Python list vs a StringArray.

    python -m benchmarks.cow [--names 1000000] [--runs 3]

PyTorch issue 13246: a dataset that holds a Python list of a million file names makes
every worker's memory grow over an epoch, although no worker changes a name. A forked
worker shares its parent's pages copy-on-write, and reading ``names[i]`` writes the
string's reference count, so each page holding a name is copied the first time a worker
reads a name on it (imagefolder_scale.py's docstring says more). A
``shmload.datasets.StringArray`` keeps the names in two numpy arrays: reading one
writes only the reference counts of three objects, and the pages of the text stay shared.

Method. The same ImageNet-like relative paths (``n01440764/n01440764_10026.JPEG``) are
held once as a Python list of ``str`` and once as a StringArray, built from a generator
(no list in between), each measured alone, each built and ``gc.collect()``-ed before the
fork. A sample is ``(len(names[i]), i)``. One shuffled epoch with
``shmload.DataLoader(batch_size=256, num_workers=2, multiprocessing_context="fork",
persistent_workers=True)``; each worker's USS (the memory only it maps: what it has
copied or allocated) is read from the main process at the start, while the forked worker
waits in ``worker_init_fn`` before loading any sample, and at the end, while the
persistent worker is idle: imagefolder_scale.py's ``epoch_uss``. ``--runs`` repeats both
holdings, alternating which goes first; every run is a row.
"""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any, Callable, Iterator

from shmload.datasets import StringArray

from .host import machine
from .imagefolder_scale import BATCH_SIZE, WORKERS, epoch_uss, rounded, shmload_loader

MB = 1e6


def names(n: int) -> Iterator[str]:
    """ImageNet-like relative paths: 1,000 synset folders, file numbers as ImageNet's."""
    for i in range(n):
        synset = f"n{1_440_764 + 13_634 * (i % 1000):08d}"
        yield f"{synset}/{synset}_{(i * 7919) % 50_000 + 1}.JPEG"


class Names:
    """A map-style dataset that reads a name and returns something small."""

    def __init__(self, held: Any):
        self.names = held

    def __len__(self) -> int:
        return len(self.names)

    def __getitem__(self, index: int) -> tuple[int, int]:
        return len(self.names[index]), index


def list_bytes(held: list[str]) -> int:
    return sys.getsizeof(held) + sum(map(sys.getsizeof, held))


HOLDINGS: dict[str, tuple[Callable[[int], Any], Callable[[Any], int]]] = {
    "Python list of str": (lambda n: list(names(n)), list_bytes),
    "StringArray": (lambda n: StringArray(names(n)), lambda held: held.nbytes),
}


def one_run(holding: str, n: int) -> dict[str, Any]:
    build, size = HOLDINGS[holding]
    dataset = Names(build(n))
    held_mb = size(dataset.names) / MB
    fig = epoch_uss(shmload_loader(dataset), lambda loader: loader.close(), n)
    del dataset
    print(f"  {holding}: epoch {fig['seconds']:.1f} s, worker USS growth "
          f"{', '.join(f'{g:.1f}' for g in fig['growth_mb'])} MB", flush=True)
    return {"holding": holding, "held_mb": held_mb, **fig}


def report(args: argparse.Namespace, rows: list[dict[str, Any]]) -> None:
    m = machine(("numpy", "shmload"))
    print(f"\nmachine: {m['cpu']}, {m['cpu_count']} cores ({m['usable_cores']} usable), {m['ram_gib']} GiB RAM, "
          f"Python {m['python']}, {m['platform']}")
    print(f"\nOne shuffled epoch over {args.names:,} names, batch {BATCH_SIZE}, {WORKERS} forked persistent workers; "
          "USS per worker (worker 0 / worker 1), MB:\n")

    def per_worker(values: list[float]) -> str:
        return " / ".join(f"{v:.1f}" for v in values)

    print("| holding | names | held in main (MB) | worker USS at start | at end | growth |")
    print("|---|---:|---:|---:|---:|---:|")
    for r in rows:
        print(f"| {r['holding']} | {args.names:,} | {r['held_mb']:.1f} | {per_worker(r['uss_start_mb'])} "
              f"| {per_worker(r['uss_end_mb'])} | {per_worker(r['growth_mb'])} |")
    chars = {r["path_chars"] for r in rows}
    assert len(chars) == 1, f"the holdings disagree on the names: {chars}"
    print("\n" + json.dumps(rounded({"benchmark": "cow", "names": args.names, "machine": m, "runs": rows})))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--names", type=int, default=1_000_000, help="names held by the dataset")
    parser.add_argument("--runs", type=int, default=1, help="epochs per holding, each with fresh workers")
    args = parser.parse_args()
    if args.names < 1 or args.runs < 1:
        parser.error("need --names >= 1 and --runs >= 1")
    rows = []
    for run in range(args.runs):
        order = list(HOLDINGS) if run % 2 == 0 else list(reversed(HOLDINGS))
        for holding in order:
            rows.append(one_run(holding, args.names))
    report(args, rows)


if __name__ == "__main__":
    main()
