"""ImageFolder at ImageNet scale: scan time, memory of the file list, and workers' memory growth.

    python -m benchmarks.imagefolder_scale [--files 1300000] [--classes 1000] [--no-torch]

Why the file list's representation matters. A forked worker shares its parent's memory
copy-on-write: a page is copied, and becomes the worker's own memory, the first time
either process *writes* to it. CPython writes to every object it merely reads: taking
``samples[i]`` increments and then decrements the reference count of the ``(path,
label)`` tuple and of the path string, and the count sits in the object's header. A
worker that reads a list of a million (path, label) tuples in random order therefore
writes, sooner or later, to every page holding a tuple or a string, and each worker ends
up with its own copy of the whole list, even though it never changes a path (the memory
growth users report against PyTorch's DataLoader; torchvision's ``DatasetFolder`` keeps
exactly such a list). ``shmload.datasets.ImageFolder`` keeps the same list as three
numpy arrays (path bytes, offsets, labels): reading an entry touches the reference counts
of the three array objects only, and the pages with the paths stay shared.

Method.

1. Tree: an ImageNet-shaped folder of *empty* files (``--classes`` folders named like
   synsets, ``n01440764``; ``--files`` files named like ``n01440764_10026.JPEG``),
   created once with one ``mknod`` system call per file under ``benchmarks/.cache/``
   (gitignored). A marker file next to it records that the creation finished and how
   long it took. The files are never opened.
2. Scan: ``ImageFolder(root)`` against a torchvision-style scan (``torchvision``'s
   ``make_dataset``: ``os.walk`` sorted, a Python list of ``(path, label)`` tuples) written
   here. The first scan of each in this process is reported, then the median of 3 more,
   alternating which goes first. The page cache cannot be dropped without root, so every
   figure is warm-cache (the first one possibly less so, unless the tree was just created).
   The memory of each representation in the main process is measured in a separate,
   untimed scan under ``tracemalloc`` (which slows allocation): bytes still allocated after
   the scan ("retained", per entry) and the peak during it. tracemalloc counts requested
   bytes; pymalloc rounds small objects up to 16 bytes, so the real footprint of the
   list of tuples is a few percent larger.
3. Workers: one shuffled epoch over every index with ``shmload.DataLoader(batch_size=256,
   num_workers=2, multiprocessing_context='fork', persistent_workers=True)``, for
   ``ImageFolder(root, loader=len)`` (a sample is the length of its path and the label)
   and for a torchvision-style dataset over the list of tuples (``__getitem__`` returns
   ``len(path), label``); optionally the list of tuples through torch's DataLoader too.
   Each worker's USS (memory only it maps: what it has copied or allocated itself) is read
   with psutil from the main process: at the start of the epoch while the worker waits in
   ``worker_init_fn`` (forked, not a sample loaded yet), and at the end, while the
   persistent worker is idle. The datasets are built and ``gc.collect()``-ed before the
   fork, as in a training script that built its dataset long before. ``PIL.Image`` is
   imported before the fork as well: ``ImageFolder.__getitem__`` imports it (for its error
   types) and a worker importing it itself would count a few MB that are not the file list.
"""

from __future__ import annotations

import argparse
import gc
import json
import multiprocessing as mp
import os
import random
import stat
import statistics
import threading
import time
import tracemalloc
from pathlib import Path
from typing import Any, Callable

import psutil

import shmload
from shmload.datasets import IMG_EXTENSIONS, ImageFolder

from .host import machine, versions
from .workloads import CACHE_DIR

MB = 1e6
BATCH_SIZE = 256
WORKERS = 2
SCAN_REPEATS = 3


# ---------------------------------------------------------------- the tree
def tree_root(files: int, classes: int) -> Path:
    return CACHE_DIR / f"imagenet-empty-{files}x{classes}"


def ensure_tree(files: int, classes: int) -> dict[str, Any]:
    """The tree, created if its marker is missing (an interrupted creation is resumed)."""
    root = tree_root(files, classes)
    marker = root.with_name(root.name + ".done")
    if marker.exists():
        return json.loads(marker.read_text()) | {"created_in_this_run": False}
    rng = random.Random(0)
    # Synset ids in ImageNet's range (n01440764 .. n15075141); file numbers as ImageNet's
    # (mostly 4 or 5 digits, not contiguous). Deterministic, so a resumed creation makes the
    # same names.
    synsets = [f"n{i:08d}" for i in sorted(rng.sample(range(1_440_764, 15_075_142), classes))]
    base, extra = divmod(files, classes)
    mode = stat.S_IFREG | 0o644
    start = time.perf_counter()
    for c, synset in enumerate(synsets):
        count = base + (c < extra)
        folder = root / synset
        folder.mkdir(parents=True, exist_ok=True)
        dir_fd = os.open(folder, os.O_RDONLY | os.O_DIRECTORY)
        try:
            for number in rng.sample(range(1, max(50_000, 2 * count)), count):
                try:
                    os.mknod(f"{synset}_{number}.JPEG", mode, dir_fd=dir_fd)  # an empty file, one system call
                except FileExistsError:
                    pass  # resuming an interrupted creation
        finally:
            os.close(dir_fd)
    info = {"files": files, "classes": classes, "created_s": round(time.perf_counter() - start, 2),
            "created_at": time.strftime("%Y-%m-%d %H:%M:%S")}
    marker.write_text(json.dumps(info) + "\n")
    return info | {"created_in_this_run": True}


# ---------------------------------------------------------------- the torchvision-style list
def torchvision_scan(root: str) -> list[tuple[str, int]]:
    """torchvision.datasets.folder: ``find_classes`` and ``make_dataset``, as written there."""
    classes = sorted(entry.name for entry in os.scandir(root) if entry.is_dir())
    class_to_idx = {cls_name: i for i, cls_name in enumerate(classes)}
    instances = []
    for target_class in sorted(class_to_idx.keys()):
        class_index = class_to_idx[target_class]
        target_dir = os.path.join(root, target_class)
        for dirpath, _, fnames in sorted(os.walk(target_dir, followlinks=True)):
            for fname in sorted(fnames):
                path = os.path.join(dirpath, fname)
                if path.lower().endswith(IMG_EXTENSIONS):
                    instances.append((path, class_index))
    return instances


class TupleListDataset:
    """A torchvision ``DatasetFolder`` whose loader returns the path's length: the file list
    is a Python list of (str path, int label) tuples."""

    def __init__(self, root: str):
        self.samples = torchvision_scan(root)

    def __len__(self) -> int:
        return len(self.samples)

    def __getitem__(self, index: int) -> tuple[int, int]:
        path, target = self.samples[index]
        return len(path), target


def path_length(path: str) -> int:
    """ImageFolder's ``loader``: touches the path only (the files are empty, never opened)."""
    return len(path)


# ---------------------------------------------------------------- 2. scanning
def scan_figures(root: str, n: int) -> dict[str, dict[str, Any]]:
    builders: dict[str, Callable[[], Any]] = {"imagefolder": lambda: ImageFolder(root),
                                              "tuples": lambda: torchvision_scan(root)}

    def timed(name: str) -> float:
        gc.collect()
        start = time.perf_counter()
        result = builders[name]()
        seconds = time.perf_counter() - start
        assert len(result) == n, (name, len(result), n)
        del result  # freed outside the timed region
        return seconds

    out: dict[str, dict[str, Any]] = {name: {"warm_s": []} for name in builders}
    for name in builders:
        out[name]["first_s"] = timed(name)
        print(f"  first scan, {name}: {out[name]['first_s']:.2f} s", flush=True)
    for run in range(SCAN_REPEATS):
        for name in (builders if run % 2 else reversed(list(builders))):  # alternate which goes first
            out[name]["warm_s"].append(timed(name))
    for name, builder in builders.items():
        gc.collect()
        tracemalloc.start()
        result = builder()
        retained, peak = tracemalloc.get_traced_memory()
        tracemalloc.stop()
        del result
        fig = out[name]
        fig.update(warm_median_s=statistics.median(fig["warm_s"]), retained_bytes=retained, peak_bytes=peak,
                   bytes_per_entry=retained / n)
        print(f"  {name}: warm {fig['warm_median_s']:.2f} s (median of {SCAN_REPEATS}), retained "
              f"{retained / MB:.1f} MB ({retained / n:.1f} B/entry), peak {peak / MB:.1f} MB", flush=True)
    return out


# ---------------------------------------------------------------- 3. workers' memory
def uss(pid: int) -> int:
    return psutil.Process(pid).memory_full_info().uss


class HoldAtStart:
    """``worker_init_fn``: report this worker's pid and wait until the main process has read
    its memory, so that the start figure is taken before the worker loads any sample.
    Inherited by fork (never pickled)."""

    def __init__(self, ctx: Any):
        self.pids = ctx.SimpleQueue()
        self.go = ctx.Event()

    def __call__(self, worker_id: int) -> None:
        self.pids.put(os.getpid())
        self.go.wait(timeout=120)


def epoch_uss(make_loader: Callable[[HoldAtStart], Any], close: Callable[[Any], None], n: int) -> dict[str, Any]:
    """One epoch of ``make_loader(worker_init_fn)``; each worker's USS before and after it."""
    gc.collect()
    hold = HoldAtStart(mp.get_context("fork"))
    start: dict[int, int] = {}

    def read_start() -> None:
        try:
            for _ in range(WORKERS):
                pid = hold.pids.get()
                start[pid] = uss(pid)
        finally:
            hold.go.set()

    reader = threading.Thread(target=read_start, name="uss-at-start", daemon=True)
    reader.start()
    loader = make_loader(hold)
    try:
        t0 = time.perf_counter()
        samples = chars = 0
        for lengths, labels in loader:
            samples += len(labels)
            chars += int(lengths.sum())
        seconds = time.perf_counter() - t0
        reader.join()
        end = {pid: uss(pid) for pid in start}  # the persistent workers are idle now
    finally:
        close(loader)
    assert samples == n, (samples, n)
    pids = sorted(start)
    return {"seconds": seconds, "path_chars": chars, "pids": pids,
            "uss_start_mb": [start[p] / MB for p in pids], "uss_end_mb": [end[p] / MB for p in pids],
            "growth_mb": [(end[p] - start[p]) / MB for p in pids]}


def shmload_loader(dataset: Any) -> Callable[[HoldAtStart], Any]:
    return lambda hold: shmload.DataLoader(dataset, batch_size=BATCH_SIZE, num_workers=WORKERS, shuffle=True,
                                           multiprocessing_context="fork", persistent_workers=True, seed=0,
                                           worker_init_fn=hold)


def torch_loader(dataset: Any) -> Callable[[HoldAtStart], Any]:
    import torch

    return lambda hold: torch.utils.data.DataLoader(dataset, batch_size=BATCH_SIZE, num_workers=WORKERS, shuffle=True,
                                                    multiprocessing_context="fork", persistent_workers=True,
                                                    worker_init_fn=hold, generator=torch.Generator().manual_seed(0))


def close_torch(loader: Any) -> None:
    iterator = getattr(loader, "_iterator", None)  # persistent workers live in the loader's iterator
    if iterator is not None:
        iterator._shutdown_workers()


def worker_figures(root: str, n: int, with_torch: bool) -> dict[str, dict[str, Any]]:
    from PIL import Image  # noqa: F401  (see the module doc)

    out = {}
    dataset: Any = ImageFolder(root, loader=path_length)
    out["shmload + ImageFolder (numpy)"] = epoch_uss(shmload_loader(dataset), lambda loader: loader.close(), n)
    del dataset
    dataset = TupleListDataset(root)
    out["shmload + list of tuples"] = epoch_uss(shmload_loader(dataset), lambda loader: loader.close(), n)
    if with_torch:
        out[f"torch {versions(['torch'])['torch']} + list of tuples"] = epoch_uss(torch_loader(dataset), close_torch, n)
    for name, fig in out.items():
        print(f"  {name}: epoch {fig['seconds']:.1f} s, worker USS growth "
              f"{', '.join(f'{g:.1f}' for g in fig['growth_mb'])} MB", flush=True)
    chars = {fig["path_chars"] for fig in out.values()}
    assert len(chars) == 1, f"the datasets disagree on the paths: {chars}"
    return out


# ---------------------------------------------------------------- report
def report(args: argparse.Namespace, tree: dict[str, Any], scan: dict, workers: dict) -> None:
    m = machine(("numpy", "torch", "shmload"))
    n = args.files
    print(f"\nmachine: {m['cpu']}, {m['cpu_count']} cores ({m['usable_cores']} usable), {m['ram_gib']} GiB RAM, "
          f"Python {m['python']}, {m['platform']}")
    print(f"tree: {n:,} empty files in {args.classes:,} class folders, created in {tree['created_s']:.1f} s "
          f"({'in this run' if tree['created_in_this_run'] else 'cached, ' + tree['created_at']})\n")

    labels = {"imagefolder": "`shmload.datasets.ImageFolder` (numpy arrays)",
              "tuples": "torchvision-style list of (path, label)"}
    print("| file list | first scan (s) | warm scan (s, median of 3) | retained (MB) | bytes/entry "
          "| peak during scan (MB) |")
    print("|---|---:|---:|---:|---:|---:|")
    for key, fig in scan.items():
        print(f"| {labels[key]} | {fig['first_s']:.2f} | {fig['warm_median_s']:.2f} | {fig['retained_bytes'] / MB:.1f} "
              f"| {fig['bytes_per_entry']:.1f} | {fig['peak_bytes'] / MB:.1f} |")

    def per_worker(values: list[float]) -> str:
        return " / ".join(f"{v:.1f}" for v in values)

    print(f"\nOne shuffled epoch over {n:,} indices, batch {BATCH_SIZE}, {WORKERS} forked persistent workers; "
          f"USS per worker (worker 0 / worker 1), MB:\n")
    print("| dataset + loader | epoch (s) | USS at start | USS at end | growth | mean growth |")
    print("|---|---:|---:|---:|---:|---:|")
    for name, fig in workers.items():
        print(f"| {name} | {fig['seconds']:.1f} | {per_worker(fig['uss_start_mb'])} | {per_worker(fig['uss_end_mb'])} "
              f"| {per_worker(fig['growth_mb'])} | {statistics.mean(fig['growth_mb']):.1f} |")

    result = {"benchmark": "imagefolder_scale", "files": n, "classes": args.classes, "machine": m, "tree": tree,
              "scan": scan, "workers": workers}
    print("\n" + json.dumps(rounded(result)))


def rounded(value: Any) -> Any:
    """``value`` with its floats rounded to 4 digits, for the JSON line."""
    if isinstance(value, float):
        return round(value, 4)
    if isinstance(value, dict):
        return {k: rounded(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [rounded(v) for v in value]
    return value


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--files", type=int, default=1_300_000, help="files in the tree (ImageNet's train set: 1.28M)")
    parser.add_argument("--classes", type=int, default=1000, help="class folders")
    parser.add_argument("--no-torch", action="store_true", help="skip the torch DataLoader reference run")
    args = parser.parse_args()
    if not 0 < args.classes <= args.files:
        parser.error("need 0 < --classes <= --files")

    print(f"tree: {tree_root(args.files, args.classes)}", flush=True)
    tree = ensure_tree(args.files, args.classes)
    state = "created" if tree["created_in_this_run"] else "cached"
    print(f"  {state}: {tree['created_s']:.1f} s to create", flush=True)
    root = str(tree_root(args.files, args.classes))
    print("scanning", flush=True)
    scan = scan_figures(root, args.files)
    print("one epoch per loader", flush=True)
    with_torch = not args.no_torch and versions(["torch"])["torch"] is not None
    workers = worker_figures(root, args.files, with_torch)
    report(args, tree, scan, workers)


if __name__ == "__main__":
    main()
