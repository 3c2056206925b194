"""Packed records (``shmload.records``) against separate files: loading, opening, packing.

    python -m benchmarks.records [--quick] [--runs N] [--epochs E]

**Data.** The suite's ``jpeg`` workload: photo-like synthetic JPEGs of ~500x375 (+-10%),
quality 90, ~55 KB each, 10 classes (``shmload.tools.synthetic.image_folder``, the folder (a) of
benchmarks/images.py, written once into benchmarks/.cache/images-500x375-<count>):
2,000 images (--quick: 256). At the start of every invocation the folder is packed with
``pack_image_folder`` into a fresh records directory (removed at the end) with
``part_bytes`` = 8 MiB, so that the ~108 MB give ~13 parts and ``PartShuffleSampler`` has
parts to shuffle (ImageNet at the default 256 MiB would have ~550). Every 16th sample's
bytes and label are checked to be its file's.

**1. Loading.** ``shmload.DataLoader``, batch 64, 2 workers, fork, ``seed=0``, uint8
[64, 224, 224, 3] batches, over (files) ``ImageFolder(root, transform=T)`` or (records)
``RecordDataset(dir, transform=T, image=True)``, shuffle=True, for three pipelines T:

* ``fused``: ``train_pipeline(224, "uint8-hwc")`` (reduced-size decode, crop + resize in
  one call, flip written straight into the batch's slot);
* ``default``: ``Compose([RandomResizedCrop(224), RandomHorizontalFlip(), np.asarray])``
  from ``shmload.transforms`` (unfused: an array per sample, copied into the batch;
  ``RandomResizedCrop`` still decodes at reduced size when the crop allows);
* ``torch-style``: the usual torchvision PIL pipeline of benchmarks/images.py
  (``torch_style_sample``: full decode, ``convert("RGB")``, crop, resize, flip,
  ``np.asarray``), as ``ImageFolder(root, loader=torch_style_sample)`` and as
  ``RecordDataset(dir, transform=lambda b: torch_style_sample(io.BytesIO(b)))`` (what
  ``image=True`` does, then the same function).

Plus, records with the fused pipeline: ``sampler=PartShuffleSampler(ds, window=4)``
instead of shuffle=True, and ``verify=False`` (no per-sample CRC-32: what the check costs).
And the torch-style pair again with glibc's malloc "pinned" (images.py's
``MALLOC_REGIMES``: mmap threshold fixed at 32 MiB, no trimming): that pipeline allocates
and frees several full-size images per sample, and with glibc's default, history-dependent
thresholds they may land on fresh pages each time (page faults, system time; see
benchmarks/images.py), which can differ between the two datasets for reasons that have
nothing to do with storage. The pinned pair shows the pipeline's cost without that.

Each configuration runs in a fresh process (``--child``): an untimed warm-up epoch, then
``--epochs`` timed epochs with a warm page cache and as many with a cold one, the two
states in ABBA order (warm first in odd runs, cold first in even ones). **Cold**: before
each cold epoch the pages of every image file (files) or of every part, the index and
the field files (records) are dropped from the page cache with ``os.fsync`` then
``os.posix_fadvise(fd, 0, 0, POSIX_FADV_DONTNEED)`` (no root needed; DONTNEED keeps dirty
pages, hence the fsync), and ``mincore(2)`` (through ctypes) confirms what is left: the
"resident after drop" column. A cold epoch starts with nothing of the data cached and ends with all of it
cached. DONTNEED cannot drop pages that a process has mapped, and a worker keeps its
parts mapped, so the workers are **not persistent**: every epoch forks its workers anew
(in every configuration alike; the fork and start are a few tens of ms of a ~3 s epoch).
The storage here is a virtual disk whose host may cache it: "cold" means cold for this
machine's page cache. A rate is images over the state's epochs' wall time; workers' CPU
is ``getrusage(RUSAGE_CHILDREN)`` around the epoch (the workers exit and are reaped at
the epoch's end), system time in brackets. ``--runs`` runs (default 5); the configurations'
order is reversed in every other run (ABBA); figures are medians over runs, with the range.
The ratio is records over files for the same pipeline and cache state.

A raw-read pass (no decoding, no loader, one thread, a fresh process per run) gives the
storage side alone: every sample's bytes once in a shuffled order, CRC-32 computed over
them (to touch them alike), as ``open``/``read``/``close`` of each file or as
``RecordDataset(verify=False).data(i)`` (a view of the mapped part), warm and cold.

**2. Opening.** ``RecordDataset(path)`` of a records directory with a 1,000,000-entry index
(--quick: 20,000): 8-byte samples with an int64 ``label`` field, written once with
``records.write`` into benchmarks/.cache/records-tiny-<n> and regenerated when missing
(or unreadable by this shmload). Against ``ImageFolder(root)`` scanning the empty-file
ImageNet-shaped tree of benchmarks/imagefolder_scale.py (its ``ensure_tree``: 1,300,000
files in 1,000 class folders, created once, ~40 s; --quick: 20,000 files): the scan is
linear in the files, so a last column scales it to the records' count (the records'
own figure there is as measured: opening them does not grow with the count).
Each opening runs in a fresh process (imports done before the clock starts): the
construction and then the first sample (``ds[n // 2]``: for records the index row, the
part's mapping and the CRC; for the folder, ``loader=`` reading the (empty) file), then
both again in the same process ("warm": a second dataset object). Records are also opened
with the directory's pages dropped first (fadvise, as above: "page cache dropped"). The
folder's directory entries and inodes cannot be dropped that way (that needs
``/proc/sys/vm/drop_caches``, machine-wide, not done here), so its figures are with the
dentry/inode caches warm: a real cold scan of a million files is slower still. Median of
``--runs`` (at least 3) fresh processes per kind, the kinds in ABBA order.

**3. Packing.** ``pack_image_folder(root, out, part_bytes=8 MiB, workers=W)`` for W = 0
(in process) and 2 (a fork pool), the input warm (read beforehand) or cold (dropped),
in ABBA order, median of ``--runs``; images/s and MB/s of input. The parts are written
into the page cache (the writer fsyncs only ``records.json``); after each pack its output
is fsync'ed (untimed) and removed, so writeback does not spill into the next run.

Prints the machine, the tables, and a final JSON line with everything. ``--quick`` (256
images, a 20,000-entry index and tree, one run, one epoch per state) is a smoke test
that finishes in well under a minute once its data exist: it asserts nothing about speed.
"""

from __future__ import annotations

import argparse
import ctypes
import ctypes.util
import io
import json
import mmap
import os
import resource
import shutil
import statistics
import sys
import tempfile
import time
import zlib
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterable, Iterator

import numpy as np

from .host import child_result
from .imagefolder_scale import ensure_tree, tree_root
from .images import (
    BATCH_SIZE,
    FOLDERS,
    MALLOC_REGIMES,
    SIZE,
    WORKERS,
    epoch,
    list_images,
    machine,
    torch_style_sample,
    warm_page_cache,
)
from .workloads import CACHE_DIR, thread_env

ROOT = Path(__file__).resolve().parent.parent
MB = 1e6
PART_BYTES = 8 << 20
WINDOW = 4
JPEG = FOLDERS[0]           # images.py's folder (a): ~500x375, the jpeg workload's size
IMAGES = {False: 2000, True: 256}
INDEX_ENTRIES = {False: 1_000_000, True: 20_000}
TREE = {False: (1_300_000, 1000), True: (20_000, 1000)}


def jpeg_root(quick: bool) -> Path:
    w, h = JPEG.size
    return CACHE_DIR / f"images-{w}x{h}-{IMAGES[quick]}"


# ---------------------------------------------------------------- the page cache
_libc = ctypes.CDLL(ctypes.util.find_library("c"), use_errno=True)
_libc.mmap.restype = ctypes.c_void_p
_libc.mmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.c_long]
_libc.munmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t]
_libc.mincore.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_void_p]
PAGE = os.sysconf("SC_PAGE_SIZE")


def drop(paths: Iterable[str]) -> None:
    """Drop the files' pages from the page cache: ``fsync`` first (a page not yet written
    back is dirty, and DONTNEED keeps dirty pages: a file just written, such as a fresh
    pack, would stay cached), then ``POSIX_FADV_DONTNEED`` (drops clean, unmapped pages)."""
    for path in paths:
        fd = os.open(path, os.O_RDONLY)
        try:
            os.fsync(fd)
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        finally:
            os.close(fd)


def resident(paths: Iterable[str]) -> tuple[int, int]:
    """(pages in the page cache, pages) over the files, with ``mincore`` on a fresh
    mapping of each (mapping a file does not read it)."""
    cached = total = 0
    for path in paths:
        fd = os.open(path, os.O_RDONLY)
        try:
            size = os.fstat(fd).st_size
            if not size:
                continue
            pages = (size + PAGE - 1) // PAGE
            addr = _libc.mmap(None, size, mmap.PROT_READ, mmap.MAP_SHARED, fd, 0)
            if addr in (None, ctypes.c_void_p(-1).value):
                raise OSError(ctypes.get_errno(), f"mmap of {path} failed")
            try:
                vec = (ctypes.c_ubyte * pages)()
                if _libc.mincore(ctypes.c_void_p(addr), size, vec) != 0:
                    raise OSError(ctypes.get_errno(), f"mincore of {path} failed")
                cached += sum(v & 1 for v in bytes(vec))
            finally:
                _libc.munmap(ctypes.c_void_p(addr), size)
            total += pages
        finally:
            os.close(fd)
    return cached, total


def resident_fraction(paths: list[str]) -> float:
    cached, total = resident(paths)
    return cached / total if total else 0.0


def records_files(path: str) -> list[str]:
    """Every file of a records directory but the metadata: parts, index, fields."""
    return sorted(str(p) for p in Path(path).iterdir() if p.name != "records.json")


def part_files(path: str) -> list[str]:
    return sorted(str(p) for p in Path(path).glob("part-*"))


def fsync_tree(path: str) -> None:
    for p in Path(path).iterdir():
        fd = os.open(p, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)


# ---------------------------------------------------------------- 1. the loader configurations
@dataclass(frozen=True)
class Config:
    key: str
    source: str            # "files" | "records"
    pipeline: str          # "fused" | "default" | "torch-style"
    sampler: str = "shuffle"   # "shuffle" (shuffle=True) | "parts" (PartShuffleSampler)
    verify: bool = True    # records: the per-sample CRC-32
    malloc: str = "default"    # glibc malloc of the child: images.MALLOC_REGIMES

    @property
    def label(self) -> str:
        extra = [f"PartShuffleSampler(window={WINDOW})"] if self.sampler == "parts" else []
        extra += [] if self.verify else ["verify=False"]
        extra += [] if self.malloc == "default" else [f"{self.malloc} malloc"]
        name = "ImageFolder (files)" if self.source == "files" else "RecordDataset"
        return name + (f", {', '.join(extra)}" if extra else "")

    @property
    def base(self) -> str:
        """The files configuration a records one is compared with."""
        return f"files/{self.pipeline}" + ("" if self.malloc == "default" else f"/{self.malloc}-malloc")


PIPELINES = ("fused", "default", "torch-style")
CONFIGS = tuple(Config(f"{source}/{p}", source, p) for p in PIPELINES for source in ("files", "records")) + (
    Config("records/fused/parts", "records", "fused", sampler="parts"),
    Config("records/fused/no-verify", "records", "fused", verify=False),
    Config("files/torch-style/pinned-malloc", "files", "torch-style", malloc="pinned"),
    Config("records/torch-style/pinned-malloc", "records", "torch-style", malloc="pinned"),
)
BY_KEY = {c.key: c for c in CONFIGS}


def torch_style_bytes(data: np.ndarray) -> np.ndarray:
    """images.py's torch-style sample on a record's bytes (``image=True`` then the same)."""
    return torch_style_sample(io.BytesIO(data))


def make_transform(pipeline: str) -> Any:
    from shmload.transforms import Compose, RandomHorizontalFlip, RandomResizedCrop, train_pipeline

    if pipeline == "fused":
        return train_pipeline(SIZE, "uint8-hwc")
    return Compose([RandomResizedCrop(SIZE), RandomHorizontalFlip(), np.asarray])


def make_dataset(cfg: Config, root: str, records: str) -> tuple[Any, list[str]]:
    """The dataset and the files a cold epoch drops."""
    from shmload.datasets import ImageFolder
    from shmload.records import RecordDataset

    if cfg.source == "files":
        ds = ImageFolder(root, loader=torch_style_sample) if cfg.pipeline == "torch-style" else \
            ImageFolder(root, transform=make_transform(cfg.pipeline))
        return ds, [ds.path(i) for i in range(len(ds))]
    if cfg.pipeline == "torch-style":
        ds = RecordDataset(records, transform=torch_style_bytes, verify=cfg.verify)
    else:
        ds = RecordDataset(records, transform=make_transform(cfg.pipeline), image=True, verify=cfg.verify)
    return ds, records_files(records)


def children_cpu() -> tuple[float, float]:
    r = resource.getrusage(resource.RUSAGE_CHILDREN)
    return r.ru_utime, r.ru_stime


def run_loader(key: str, root: str, records: str, epochs: int, cold_first: bool) -> dict[str, Any]:
    """In a fresh process: a warm-up epoch, then ``epochs`` warm and ``epochs`` cold ones."""
    import shmload
    from shmload.records import PartShuffleSampler

    cfg = BY_KEY[key]
    ds, files = make_dataset(cfg, root, records)
    data_files = files if cfg.source == "files" else part_files(records)
    sampler = PartShuffleSampler(ds, window=WINDOW, seed=0) if cfg.sampler == "parts" else None
    loader = shmload.DataLoader(ds, batch_size=BATCH_SIZE, shuffle=sampler is None, sampler=sampler,
                                num_workers=WORKERS, multiprocessing_context="fork", persistent_workers=False, seed=0)
    out: dict[str, Any] = {"label": cfg.label, "samples": len(ds), "files_dropped": len(files),
                           "data_bytes": sum(os.path.getsize(p) for p in data_files)}
    try:
        warm = epoch(loader)
        out["warmup_seconds"] = warm[2]
        states = ("cold", "warm") if cold_first else ("warm", "cold")
        for state in states:
            ep = []
            for _ in range(epochs):
                left = None
                if state == "cold":
                    drop(files)
                    left = resident_fraction(data_files)
                u0, s0 = children_cpu()
                m0 = time.process_time()
                images, batches, seconds, first = epoch(loader)
                m1 = time.process_time()
                u1, s1 = children_cpu()
                if images != len(ds):
                    raise AssertionError(f"{key}: an epoch of {images} images, expected {len(ds)}")
                ep.append({"images": images, "seconds": seconds, "first_batch_seconds": first,
                           "workers_user_s": u1 - u0, "workers_sys_s": s1 - s0, "main_cpu_s": m1 - m0,
                           "resident_after_drop": left})
            images = sum(e["images"] for e in ep)
            out[state] = {"images_per_s": images / sum(e["seconds"] for e in ep), "epochs": ep,
                          "workers_cpu_ms_per_image": 1e3 * sum(e["workers_user_s"] + e["workers_sys_s"] for e in ep)
                          / images,
                          "workers_sys_ms_per_image": 1e3 * sum(e["workers_sys_s"] for e in ep) / images,
                          "main_cpu_ms_per_image": 1e3 * sum(e["main_cpu_s"] for e in ep) / images,
                          "resident_after_drop": max((e["resident_after_drop"] for e in ep), default=None)
                          if state == "cold" else None}
    finally:
        loader.close()
    return out


def run_raw(root: str, records: str, cold_first: bool) -> dict[str, Any]:
    """In a fresh process: every sample's bytes once, shuffled, no decode, one thread."""
    from shmload.records import RecordDataset

    paths = [p for p, _ in list_images(root)]
    order = np.random.default_rng(0).permutation(len(paths)).tolist()

    def files() -> int:
        total = 0
        for i in order:
            with open(paths[i], "rb") as f:
                data = f.read()
            zlib.crc32(data)
            total += len(data)
        return total

    def recs() -> int:
        # A dataset of its own per pass, closed after it: pages this process has mapped
        # cannot be dropped, so a mapping left open would keep the next cold pass warm.
        ds = RecordDataset(records, verify=False)
        total = 0
        for i in order:
            view = ds.data(i)
            zlib.crc32(view)
            total += len(view)
        del view
        ds.close()
        return total

    out: dict[str, Any] = {}
    for state in (("cold", "warm") if cold_first else ("warm", "cold")):
        for name, fn, to_drop in (("files", files, paths), ("records", recs, records_files(records))):
            left = None
            if state == "cold":
                drop(to_drop)
                left = resident_fraction(to_drop)
            t0 = time.perf_counter()
            nbytes = fn()
            seconds = time.perf_counter() - t0
            out[f"{name}/{state}"] = {"samples_per_s": len(order) / seconds, "mb_per_s": nbytes / seconds / MB,
                                      "resident_after_drop": left}
    return out


# ---------------------------------------------------------------- 2. opening
class TinySource:
    """Sample i: 8 bytes (i, little-endian) and the label i % 1000."""

    def __init__(self, n: int):
        self.n = n

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> tuple[bytes, dict]:
        return i.to_bytes(8, "little"), {"label": i % 1000}


def ensure_index(n: int) -> tuple[Path, float | None]:
    """The cached records directory of ``n`` tiny samples, written if missing or
    unreadable; and the seconds its writing took (None: cached)."""
    from shmload.records import RecordDataset, RecordFormatError, write

    path = CACHE_DIR / f"records-tiny-{n}"
    if path.exists():
        try:
            if len(RecordDataset(path)) == n:
                return path, None
        except (RecordFormatError, OSError, ValueError, KeyError):
            pass
        shutil.rmtree(path)
    t0 = time.perf_counter()
    write(TinySource(n), path, workers=WORKERS)
    seconds = time.perf_counter() - t0
    fsync_tree(str(path))
    return path, seconds


def read_file(path: str) -> bytes:
    with open(path, "rb") as f:
        return f.read()


def run_open(kind: str, path: str) -> dict[str, Any]:
    """In a fresh process (imports done first): construct, first sample; again."""
    import PIL.Image  # noqa: F401  (ImageFolder.__getitem__ imports it for its error types: not timed)

    from shmload.datasets import ImageFolder
    from shmload.records import RecordDataset

    def build() -> Any:
        return RecordDataset(path) if kind == "records" else ImageFolder(path, loader=read_file)

    out: dict[str, Any] = {}
    for which in ("first", "second"):
        t0 = time.perf_counter()
        ds = build()
        t1 = time.perf_counter()
        sample = ds[len(ds) // 2]
        t2 = time.perf_counter()
        if kind == "records" and int.from_bytes(sample[0].tobytes(), "little") != len(ds) // 2:
            raise AssertionError(f"records: sample {len(ds) // 2} holds {sample[0].tobytes()!r}")
        out[which] = {"construct_s": t1 - t0, "sample_s": t2 - t1}
        out["entries"] = len(ds)
        del sample, ds
    return out


OPEN_KINDS = ("records-dropped", "records", "imagefolder")


# ---------------------------------------------------------------- children
def spawn(child: list[str], timeout: float, malloc: str = "default") -> dict[str, Any]:
    """``python -m benchmarks.records --child ...`` in a fresh process: its JSON result."""
    env = os.environ | thread_env()
    if MALLOC_REGIMES[malloc]:
        env["GLIBC_TUNABLES"] = ":".join(filter(None, (env.get("GLIBC_TUNABLES"), MALLOC_REGIMES[malloc])))
    return child_result("benchmarks.records", child, env, timeout)


def child_main(args: argparse.Namespace) -> int:
    kind, *rest = args.child
    if kind == "loader":
        result = run_loader(rest[0], args.root, args.records, args.epochs, args.cold_first)
    elif kind == "raw":
        result = run_raw(args.root, args.records, args.cold_first)
    else:
        result = run_open(rest[0], args.path)
    args.child_out.write_text(json.dumps(result))
    return 0


def abba(items: tuple, runs: int) -> Iterator[tuple[int, Any]]:
    for run in range(runs):
        for item in (items if run % 2 == 0 else tuple(reversed(items))):
            yield run, item


def med(values: list[float]) -> dict[str, float]:
    return {"median": statistics.median(values), "min": min(values), "max": max(values), "n": len(values)}


# ---------------------------------------------------------------- the three parts
def check_pack(root: str, records: str) -> None:
    """The packed samples are the files' bytes, with the files' labels."""
    from shmload.records import RecordDataset

    ds = RecordDataset(records)
    images = list_images(root)
    if len(ds) != len(images):
        raise AssertionError(f"{len(ds)} records for {len(images)} files")
    for i in range(0, len(images), max(1, len(images) // 16)):
        path, label = images[i]
        data, got = ds[i]
        if data.tobytes() != read_file(path) or got != label:
            raise AssertionError(f"record {i} differs from {path}")
    del data
    ds.close()


def loading(root: str, records: str, args: argparse.Namespace) -> dict[str, Any]:
    runs: dict[str, list[dict[str, Any]]] = {c.key: [] for c in CONFIGS}
    raw: list[dict[str, Any]] = []
    for run, key in abba(tuple(BY_KEY) + ("raw",), args.runs):
        cold_first = run % 2 == 1
        if key == "raw":
            result = spawn(["raw", "--root", root, "--records", records] + ["--cold-first"] * cold_first,
                           args.child_timeout)
            raw.append(result)
            print(f"  run {run + 1} raw reads: " + (result.get("error") or ", ".join(
                f"{k} {v['mb_per_s']:.0f} MB/s" + ("" if v["resident_after_drop"] is None else
                                                   f" ({100 * v['resident_after_drop']:.1f}% resident after drop)")
                for k, v in result.items())), flush=True)
            continue
        result = spawn(["loader", key, "--root", root, "--records", records, "--epochs", str(args.epochs)]
                       + ["--cold-first"] * cold_first, args.child_timeout, BY_KEY[key].malloc)
        runs[key].append(result)
        line = result.get("error") or (f"warm {result['warm']['images_per_s']:5.0f}, cold "
                                       f"{result['cold']['images_per_s']:5.0f} images/s (resident after drop "
                                       f"{100 * result['cold']['resident_after_drop']:.1f}%)")
        print(f"  run {run + 1} {key:<34} {line}", flush=True)
    summary: dict[str, Any] = {}
    for key, rr in runs.items():
        ok = [r for r in rr if "error" not in r]
        if not ok:
            summary[key] = {"error": rr[0]["error"] if rr else "no run"}
            continue
        summary[key] = {state: {
            "images_per_s": med([r[state]["images_per_s"] for r in ok]),
            "workers_cpu_ms_per_image": statistics.median(r[state]["workers_cpu_ms_per_image"] for r in ok),
            "workers_sys_ms_per_image": statistics.median(r[state]["workers_sys_ms_per_image"] for r in ok),
            "main_cpu_ms_per_image": statistics.median(r[state]["main_cpu_ms_per_image"] for r in ok),
            "resident_after_drop": max(r[state]["resident_after_drop"] for r in ok) if state == "cold" else None,
        } for state in ("warm", "cold")}
    raw_ok = [r for r in raw if "error" not in r]
    raw_summary = {k: {"mb_per_s": statistics.median(r[k]["mb_per_s"] for r in raw_ok),
                       "samples_per_s": statistics.median(r[k]["samples_per_s"] for r in raw_ok),
                       "resident_after_drop": None if k.endswith("/warm") else
                       max(r[k]["resident_after_drop"] for r in raw_ok)}
                   for k in (raw_ok[0] if raw_ok else {})}
    return {"runs": runs, "summary": summary, "raw_runs": raw, "raw": raw_summary}


def opening(quick: bool, runs: int, timeout: float) -> dict[str, Any]:
    n = INDEX_ENTRIES[quick]
    index, wrote = ensure_index(n)
    files, classes = TREE[quick]
    tree = ensure_tree(files, classes)
    folder = str(tree_root(files, classes))
    print(f"  records index: {n:,} entries in {index}" + (f" (written in {wrote:.1f} s)" if wrote else " (cached)"))
    print(f"  tree: {files:,} empty files in {classes:,} folders, {folder} "
          + ("(created now)" if tree["created_in_this_run"] else "(cached)"), flush=True)
    results: dict[str, list[dict[str, Any]]] = {k: [] for k in OPEN_KINDS}
    for run, kind in abba(OPEN_KINDS, max(3, runs)):
        if kind == "records-dropped":
            every = [str(p) for p in index.iterdir()]
            drop(every)
            left = resident_fraction(every)
            result = spawn(["open", "records", "--path", str(index)], timeout) | {"resident_after_drop": left}
        else:
            result = spawn(["open", "records" if kind == "records" else "imagefolder",
                            "--path", str(index) if kind == "records" else folder], timeout)
        results[kind].append(result)
        if "error" in result:
            print(f"  run {run + 1} {kind}: {result['error']}", flush=True)
    summary: dict[str, Any] = {}
    for kind, rr in results.items():
        ok = [r for r in rr if "error" not in r]
        if not ok:
            summary[kind] = {"error": rr[0]["error"]}
            continue
        summary[kind] = {"entries": ok[0]["entries"], **{
            f"{which}_{what}": med([r[which][what] for r in ok])
            for which in ("first", "second") for what in ("construct_s", "sample_s")}}
        if kind == "records-dropped":
            summary[kind]["resident_after_drop"] = max(r["resident_after_drop"] for r in ok)
    return {"index": str(index), "index_entries": n, "index_written_s": wrote, "tree": str(folder),
            "tree_files": files, "runs": results, "summary": summary}


def packing(root: str, runs: int) -> dict[str, Any]:
    from shmload.records import pack_image_folder

    paths = [p for p, _ in list_images(root)]
    nbytes = sum(os.path.getsize(p) for p in paths)
    configs = ((0, "warm"), (WORKERS, "warm"), (0, "cold"), (WORKERS, "cold"))
    times: dict[str, list[float]] = {f"{w}/{c}": [] for w, c in configs}
    with tempfile.TemporaryDirectory(prefix=".pack-", dir=CACHE_DIR) as tmp:
        for run, (workers, cache) in abba(configs, runs):
            if cache == "warm":
                warm_page_cache(Path(root))
            else:
                drop(paths)
            out = os.path.join(tmp, f"out-{run}-{workers}-{cache}")
            t0 = time.perf_counter()
            pack_image_folder(root, out, part_bytes=PART_BYTES, workers=workers)
            times[f"{workers}/{cache}"].append(time.perf_counter() - t0)
            fsync_tree(out)
            shutil.rmtree(out)
    summary = {k: {"seconds": med(v), "images_per_s": len(paths) / statistics.median(v),
                   "mb_per_s": nbytes / statistics.median(v) / MB} for k, v in times.items()}
    return {"images": len(paths), "bytes": nbytes, "summary": summary}


# ---------------------------------------------------------------- report
def rng(fig: dict[str, float], fmt: str = ".0f") -> str:
    return f"{fig['median']:{fmt}} [{fig['min']:{fmt}}..{fig['max']:{fmt}}]"


def print_loading(data: dict[str, Any], meta: dict[str, Any], args: argparse.Namespace) -> None:
    s = data["summary"]
    print(f"\n### 1. Loading {meta['images']:,} JPEGs of ~500x375 ({meta['mean_kb']:.0f} KB each, "
          f"{meta['bytes'] / MB:.0f} MB; records: {meta['parts']} parts of <= {PART_BYTES >> 20} MiB), batch "
          f"{BATCH_SIZE}, {WORKERS} workers, images/s, median [range] of {args.runs} run(s), {args.epochs} epoch(s) "
          "per state each\n")
    print("| pipeline | dataset | warm images/s | records/files | cold images/s | records/files "
          "| workers CPU ms/image warm (sys) | cold (sys) | resident after drop |")
    print("|---|---|---:|---:|---:|---:|---:|---:|---:|")
    for cfg in CONFIGS:
        fig = s[cfg.key]
        if "error" in fig:
            print(f"| {cfg.pipeline} | {cfg.label} | failed: {fig['error']} | | | | | | |")
            continue
        base = s.get(cfg.base, {})
        cells = []
        for state in ("warm", "cold"):
            rate = fig[state]["images_per_s"]
            ratio = "" if cfg.source == "files" or "error" in base else \
                f"{rate['median'] / base[state]['images_per_s']['median']:.2f}"
            cells += [rng(rate), ratio]
        cpu = [f"{fig[st]['workers_cpu_ms_per_image']:.2f} ({fig[st]['workers_sys_ms_per_image']:.2f})"
               for st in ("warm", "cold")]
        left = fig["cold"]["resident_after_drop"]
        print(f"| {cfg.pipeline} | {cfg.label} | {' | '.join(cells)} | {' | '.join(cpu)} | {100 * left:.1f}% |")
    raw = data["raw"]
    if raw:
        print(f"\nRaw reads, no decode, one thread, every sample once in a shuffled order, CRC-32 over the bytes "
              f"(median of {len([r for r in data['raw_runs'] if 'error' not in r])}):\n")
        print("| source | warm MB/s | warm samples/s | cold MB/s | cold samples/s | resident after drop |")
        print("|---|---:|---:|---:|---:|---:|")
        for name, label in (("files", "open/read/close per file"), ("records", "RecordDataset.data(i), mmap")):
            w, c = raw[f"{name}/warm"], raw[f"{name}/cold"]
            print(f"| {label} | {w['mb_per_s']:.0f} | {w['samples_per_s']:.0f} | {c['mb_per_s']:.0f} "
                  f"| {c['samples_per_s']:.0f} | {100 * c['resident_after_drop']:.1f}% |")


def print_opening(data: dict[str, Any]) -> None:
    s = data["summary"]
    n = data["index_entries"]
    print(f"\n### 2. Opening: RecordDataset with a {n:,}-entry index vs ImageFolder scanning "
          f"{data['tree_files']:,} empty files (fresh process each; ms, median [range] of "
          f"{len(data['runs']['records'])})\n")
    print("| opening | entries | construct, 1st in process | 1st sample | construct, 2nd in process | sample "
          f"| 1st construct at {n:,} entries |")
    print("|---|---:|---:|---:|---:|---:|---:|")
    labels = {"records-dropped": "RecordDataset, page cache dropped",
              "records": "RecordDataset, page cache warm",
              "imagefolder": "ImageFolder scan (dentries warm)"}
    for kind in OPEN_KINDS:
        fig = s[kind]
        if "error" in fig:
            print(f"| {labels[kind]} | failed: {fig['error']} | | | | | |")
            continue
        ms = {k: {kk: vv * 1e3 if kk != "n" else vv for kk, vv in v.items()} for k, v in fig.items()
              if isinstance(v, dict)}
        f = ".1f" if kind == "imagefolder" else ".2f"
        at_n = ms["first_construct_s"]["median"] * (n / fig["entries"] if kind == "imagefolder" else 1)
        print(f"| {labels[kind]} | {fig['entries']:,} | {rng(ms['first_construct_s'], f)} | "
              f"{rng(ms['first_sample_s'], '.2f')} | {rng(ms['second_construct_s'], f)} | "
              f"{rng(ms['second_sample_s'], '.2f')} | {at_n:{f}} |")
    if "resident_after_drop" in s.get("records-dropped", {}):
        left = s["records-dropped"]["resident_after_drop"]
        print(f"\n(records directory resident after the drop: {100 * left:.1f}%)")


def print_packing(data: dict[str, Any], runs: int) -> None:
    print(f"\n### 3. Packing {data['images']:,} JPEGs ({data['bytes'] / MB:.0f} MB) with pack_image_folder, "
          f"part_bytes {PART_BYTES >> 20} MiB (median [range] of {runs})\n")
    print("| workers | input | seconds | images/s | MB/s |")
    print("|---:|---|---:|---:|---:|")
    for key, fig in data["summary"].items():
        workers, cache = key.split("/")
        print(f"| {workers} | {cache} | {rng(fig['seconds'], '.2f')} | {fig['images_per_s']:.0f} "
              f"| {fig['mb_per_s']:.0f} |")


def rounded(value: Any) -> Any:
    if isinstance(value, float):
        return round(value, 6)
    if isinstance(value, dict):
        return {k: rounded(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [rounded(v) for v in value]
    return value


# ---------------------------------------------------------------- main
def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--quick", action="store_true", help="256 images, a 20,000-entry index, one run: a smoke test")
    p.add_argument("--runs", type=int, default=None, help="runs per configuration (default 5; 1 with --quick)")
    p.add_argument("--epochs", type=int, default=None, help="timed epochs per cache state and run (default 1)")
    p.add_argument("--child-timeout", type=float, default=600.0, help="seconds before a child is killed")
    p.add_argument("--child", nargs="+", help=argparse.SUPPRESS)  # loader KEY | raw | open KIND
    p.add_argument("--root", help=argparse.SUPPRESS)
    p.add_argument("--records", help=argparse.SUPPRESS)
    p.add_argument("--path", help=argparse.SUPPRESS)
    p.add_argument("--cold-first", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--child-out", type=Path, help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    args.runs = args.runs or (1 if args.quick else 5)
    args.epochs = args.epochs or 1
    if min(args.runs, args.epochs) < 1:
        p.error("--runs and --epochs must be at least 1")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.child:
        return child_main(args)
    from shmload.records import pack_image_folder
    from shmload.tools.synthetic import image_folder

    t_start = time.perf_counter()
    m = machine()
    print(f"machine: {m['cpu']}, {m['cpu_count']} CPUs ({m['usable_cores']} usable), {m['ram_gib']} GiB, "
          f"{m['platform']}, python {m['python']}; " + ", ".join(f"{k} {v}" for k, v in m["versions"].items()))
    print(f"config: batch {BATCH_SIZE}, {WORKERS} workers (fork, not persistent), {SIZE}x{SIZE}x3 uint8, "
          f"{args.runs} run(s) ABBA, a warm-up epoch + {args.epochs} warm and {args.epochs} cold epoch(s) each"
          + ("; --quick: a smoke test, the figures mean little" if args.quick else ""), flush=True)

    root = jpeg_root(args.quick)
    image_folder(root, IMAGES[args.quick], JPEG.size, classes=10, progress=True)
    nbytes = warm_page_cache(root)
    count = len(list_images(str(root)))
    # The probe: does fadvise drop pages here? (resident fraction of the folder after a drop)
    paths = [p for p, _ in list_images(str(root))]
    before = resident_fraction(paths)
    drop(paths)
    after = resident_fraction(paths)
    warm_page_cache(root)
    print(f"folder: {count} images, {nbytes / MB:.0f} MB in {root}; fadvise probe: {100 * before:.0f}% of its pages "
          f"cached, {100 * after:.1f}% after POSIX_FADV_DONTNEED", flush=True)
    if after > 0.05:
        print("  WARNING: fadvise does not drop pages here: the 'cold' figures are not cold", flush=True)

    result: dict[str, Any] = {"benchmark": "records", "quick": args.quick, "runs": args.runs, "epochs": args.epochs,
                              "batch_size": BATCH_SIZE, "workers": WORKERS, "size": SIZE, "part_bytes": PART_BYTES,
                              "window": WINDOW, "fadvise_probe": {"before": before, "after": after}}
    with tempfile.TemporaryDirectory(prefix=".records-", dir=CACHE_DIR) as tmp:
        records = os.path.join(tmp, "jpeg")
        t0 = time.perf_counter()
        pack_image_folder(root, records, part_bytes=PART_BYTES, workers=0)
        parts = len(part_files(records))
        fsync_tree(records)  # written back now, not during the first measurements
        check_pack(str(root), records)
        print(f"packed into {parts} parts in {time.perf_counter() - t0:.1f} s: {records}", flush=True)
        meta = {"images": count, "bytes": nbytes, "mean_kb": nbytes / count / 1e3, "parts": parts, "root": str(root)}
        result["data"] = meta

        print("1. loading:", flush=True)
        result["loading"] = loading(str(root), records, args)
        print("3. packing:", flush=True)
        result["packing"] = packing(str(root), args.runs)
    print("2. opening:", flush=True)
    result["opening"] = opening(args.quick, args.runs, args.child_timeout)

    print_loading(result["loading"], meta, args)
    print_opening(result["opening"])
    print_packing(result["packing"], args.runs)
    result["elapsed_seconds"] = time.perf_counter() - t_start
    result["machine"] = m
    print(f"\ntotal {result['elapsed_seconds']:.0f} s")
    print(json.dumps(rounded(result)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
