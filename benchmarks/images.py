"""ImageFolder + ``train_pipeline`` against torch's DataLoader with the usual PIL pipeline.

    python -m benchmarks.images [--quick] [--runs N] [--epochs E] [--repeats R]

Two synthetic folders of photo-like JPEGs (``shmload.tools.synthetic.image_folder``, written
once into benchmarks/.cache): (a) ~500x375, ImageNet's typical size, 1,500 images;
(b) ~1600x1200, "large photos", 300 images. On each:

* **torch**: ``torch.utils.data.DataLoader`` over a torchvision-style folder dataset whose
  sample is the usual PIL pipeline, written out here since torchvision is not a
  dependency: ``Image.open(path).convert("RGB")``, RandomResizedCrop(224) (torchvision's
  ``get_params`` rules, ``img.crop(box).resize((224, 224), BILINEAR)``), a random
  horizontal flip (``transpose``), ``np.asarray``; torch's default collate.
* **shmload**: ``shmload.DataLoader`` over
  ``ImageFolder(root, transform=train_pipeline(224, "uint8-hwc"))``: the crop box drawn
  first, the JPEG decoded at 1/2, 1/4 or 1/8 size when the crop allows (reduced decode),
  crop + resize in one call, and the flip written straight into the batch's
  shared-memory slot (the defaults: exact decoding, fast decode off).

Both: batch 64, shuffled, 2 workers, fork, persistent workers, uint8 [64, 224, 224, 3]
batches. Every file is read once beforehand so the page cache is warm.

**Loaders.** Each (folder, loader) runs in a fresh process (``--child``), so the loaders
share no memory or imports (shmload's workers would otherwise seed torch per batch, as
they do when torch is imported). In it: the first epoch is the warm-up (worker start-up
included), then ``--epochs`` timed epochs; a run's rate is images over the timed
epochs' wall time. ``--runs`` runs are interleaved in ABBA order (torch then shmload,
then shmload then torch, ...) so slow drift of a shared machine hits both alike; the
figure is the median over runs, with the range. The ratio is shmload's median over
torch's; targets: >= 1.2 on (a), >= 2 on (b).

**One core.** The same pipelines with no loader and no workers, over a fixed subset of
the folder spread over its classes, with ``random`` seeded identically (so both draw
the same crop boxes): the torch-style per-sample function, and ``train_pipeline``
applied to ``Image.open(path)`` followed by ``np.asarray`` of the result or by
``write_into`` a batch row (what the loader does; the batch is reused, as a slot is).
Each pass runs in a fresh process that runs only that pipeline (a warm-up of 4 images,
then the pass); ``--repeats`` passes each, in ABBA order, median. Measured under two
settings of glibc's malloc, because the torch-style pipeline's speed depends on them:
it allocates and frees several full-size images per sample (decoded, ``convert``'s
copy, the crop), above malloc's mmap threshold or at the top of its heap, so each may
land on fresh pages (page faults and zeroing; the minor faults per image are
reported). "default": glibc as a process starts (its thresholds then move with what
was freed before, so a process's history changes the figure: that is why each pass has
a process of its own). "pinned": the mmap threshold fixed at its maximum (32 MiB) and
trimming off (``GLIBC_TUNABLES``): no fresh pages, each pipeline's CPU cost alone. The
loaders' workers sit somewhere between, depending on what they allocated before; the
efficiency column of the loader table (loader images/s over 2 x one core) uses the
pinned rate. Then one pass of each pipeline split into stages (decode, crop/resize,
flip, to-array, collate; the shmload stages replicate ``train_pipeline`` step by step
with its own helpers), under both settings, to show where the time and the faults go.
torch's collate stacks into a new shared-memory tensor in the worker; here ``np.stack``
into a new anonymous mapping stands in for it.

**Quality.** Mean absolute pixel difference (0-255) between ``train_pipeline`` outputs
(``np.asarray(pending)``) for the same image and the same random draws (``random.seed``
set identically), with one option toggled: (i) reduced decode on vs off on folder (b)
(fast decode off in both); (ii) fast decode on vs off on folder (a) (reduced decode off
in both); also, per folder, the defaults (reduced on, fast off) against exact full decoding (both
off), and exact ``train_pipeline`` against the torch-style reference pipeline. The mean
is over all pixels of all compared images; "changed" counts the images whose output
differs at all (reduced decode only applies when the crop is >= 2x the output).

Prints the machine, one table per folder, the targets; writes everything as JSON to
benchmarks/results/images-<time>.json. torch is optional: without it the torch side is
skipped (and said so) and the rest is still measured. ``--quick`` (small folders, one
run, one timed epoch) finishes in well under a minute and is a smoke test: it asserts
nothing about speed.
"""

from __future__ import annotations

import argparse
import datetime
import itertools
import json
import mmap
import os
import random
import resource
import statistics
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Iterator

import numpy as np

from . import host
from .host import child_result, children_cpu_seconds
from .workloads import CACHE_DIR, thread_env

ROOT = Path(__file__).resolve().parent.parent
RESULTS = Path(__file__).resolve().parent / "results"
BATCH_SIZE = 64
WORKERS = 2
SIZE = 224
LOADERS = ("torch", "shmload")
SEED = 1234


@dataclass(frozen=True)
class Folder:
    key: str
    title: str
    size: tuple[int, int]   # (width, height), each image within +-10%
    count: int
    quick_count: int
    sample: int             # images in the one-core and quality passes (full mode)
    quick_sample: int
    goal: float             # shmload images/s over torch's

    def images(self, quick: bool) -> int:
        return self.quick_count if quick else self.count

    def subset(self, quick: bool) -> int:
        return self.quick_sample if quick else self.sample

    def root(self, quick: bool) -> Path:
        w, h = self.size
        return CACHE_DIR / f"images-{w}x{h}-{self.images(quick)}"


FOLDERS = (
    Folder("a", "ImageNet-size", (500, 375), 1500, 128, 300, 24, 1.2),
    Folder("b", "large photos", (1600, 1200), 300, 32, 100, 8, 2.0),
)


# ---------------------------------------------------------------- the torch-style pipeline
def crop_box(width: int, height: int) -> tuple[int, int, int, int]:
    """torchvision's ``RandomResizedCrop.get_params`` (scale 0.08-1, ratio 3/4-4/3) on
    Python's ``random``: (left, top, width, height)."""
    from shmload.transforms.params import resized_crop_box
    return resized_crop_box(width, height)


def torch_style_sample(path: str) -> np.ndarray:
    """The usual PIL pipeline: decode, RandomResizedCrop(224), random flip, array."""
    from PIL import Image

    with Image.open(path) as f:
        img = f.convert("RGB")
    left, top, w, h = crop_box(*img.size)
    img = img.crop((left, top, left + w, top + h)).resize((SIZE, SIZE), Image.BILINEAR)
    if random.random() < 0.5:
        img = img.transpose(Image.FLIP_LEFT_RIGHT)
    return np.asarray(img)


def list_images(root: str) -> list[tuple[str, int]]:
    """(path, label) of every JPEG in ``root/<class>/``, torchvision's order (sorted
    classes, sorted files); the same order as ``shmload.datasets.ImageFolder``."""
    classes = sorted(e.name for e in os.scandir(root) if e.is_dir())
    return [(os.path.join(root, c, name), label) for label, c in enumerate(classes)
            for name in sorted(os.listdir(os.path.join(root, c))) if name.lower().endswith(".jpg")]


class TorchStyleFolder:
    """torchvision's ``ImageFolder`` with the usual transform: ``(uint8 [224, 224, 3], label)``."""

    def __init__(self, root: str):
        self.samples = list_images(root)

    def __len__(self) -> int:
        return len(self.samples)

    def __getitem__(self, i: int) -> tuple[np.ndarray, int]:
        path, label = self.samples[i]
        return torch_style_sample(path), label


# ---------------------------------------------------------------- one loader, in a child process
def epoch(loader: Any) -> tuple[int, int, float, float]:
    """Images, batches, wall seconds and seconds to the first batch of one epoch."""
    images = batches = 0
    first = 0.0
    t0 = time.perf_counter()
    for images_batch, labels in loader:
        if batches == 0:
            first = time.perf_counter() - t0
            shape, dtype = tuple(images_batch.shape[1:]), str(images_batch.dtype)
            if shape != (SIZE, SIZE, 3) or "uint8" not in dtype:
                raise AssertionError(f"unexpected batch: {shape} {dtype}")
        images += len(labels)
        batches += 1
    return images, batches, time.perf_counter() - t0, first


def make_loader(name: str, root: str) -> tuple[Any, Callable[[], None], str]:
    """The loader, a function that stops its workers, and a description."""
    if name == "torch":
        import torch
        import torch.utils.data

        loader = torch.utils.data.DataLoader(TorchStyleFolder(root), batch_size=BATCH_SIZE, shuffle=True,
                                             num_workers=WORKERS, persistent_workers=True,
                                             multiprocessing_context="fork")

        def close() -> None:
            iterator = getattr(loader, "_iterator", None)  # the persistent workers live here
            if iterator is not None:
                iterator._shutdown_workers()
            loader._iterator = None
        return loader, close, f"torch {torch.__version__} DataLoader, PIL pipeline, default collate"
    import shmload
    from shmload.datasets import ImageFolder
    from shmload.transforms import train_pipeline

    loader = shmload.DataLoader(ImageFolder(root, transform=train_pipeline(SIZE, "uint8-hwc")),
                                batch_size=BATCH_SIZE, shuffle=True, num_workers=WORKERS, persistent_workers=True,
                                multiprocessing_context="fork", seed=0)
    version = getattr(shmload, "__version__", "?")
    return loader, loader.close, f"shmload {version} DataLoader, ImageFolder + train_pipeline"


def run_child(name: str, root: str, epochs: int) -> dict[str, Any]:
    """One run: build the loader, a warm-up epoch, ``epochs`` timed epochs."""
    if name == "torch":
        try:
            import torch.utils.data  # noqa: F401
        except Exception as exc:  # ImportError, or a broken install failing on import
            return {"skipped": f"torch is not importable here ({type(exc).__name__}: {exc})".splitlines()[0]}
    t0 = time.perf_counter()
    loader, close, description = make_loader(name, root)
    try:
        warm_images, _, warm_s, first = epoch(loader)
        first += time.perf_counter() - t0 - warm_s  # from constructing the loader
        cpu0, main0 = children_cpu_seconds(), time.process_time()
        timed = [epoch(loader) for _ in range(epochs)]
        cpu1, main1 = children_cpu_seconds(), time.process_time()
    finally:
        close()
    expected = len(loader.dataset)
    if any(e[0] != expected for e in [(warm_images,), *timed]):
        raise AssertionError(f"{name}: epochs of {[warm_images] + [e[0] for e in timed]} images, expected {expected}")
    images = sum(e[0] for e in timed)
    seconds = sum(e[2] for e in timed)
    return {"description": description, "images_per_s": images / seconds, "images": images, "seconds": seconds,
            "epoch_seconds": [e[2] for e in timed], "batches_per_epoch": timed[0][1],
            "warmup_images": warm_images, "warmup_seconds": warm_s, "first_batch_seconds": first,
            "main_cpu_ms_per_image": 1e3 * (main1 - main0) / images,
            "workers_cpu_ms_per_image": None if cpu0 is None or cpu1 is None else 1e3 * (cpu1 - cpu0) / images}


def spawn_child(child_args: list[str], env: dict[str, str], timeout: float) -> dict[str, Any]:
    """``python -m benchmarks.images --child ...`` in a fresh process: its JSON result."""
    return child_result("benchmarks.images", child_args, env, timeout)


def spawn_loader(name: str, root: Path, epochs: int, timeout: float) -> dict[str, Any]:
    return spawn_child([name, "--root", str(root), "--epochs", str(epochs)], os.environ | thread_env(), timeout)


# ---------------------------------------------------------------- one core, no loader
# glibc's malloc, as configured by the parent for the one-core child processes:
# "default" as a fresh process has it; "pinned": mmap threshold fixed at its maximum
# (32 MiB) and trimming off, so freed memory stays in the heap and no pipeline pays for
# fresh pages: the pipeline's CPU cost alone.
MALLOC_REGIMES = {"default": "",
                  "pinned": "glibc.malloc.mmap_threshold=33554432:glibc.malloc.trim_threshold=4294967296"}


def fresh_batch() -> np.ndarray:
    """A batch-sized uint8 array on a new anonymous mapping (not malloc's: freeing it
    leaves malloc's thresholds alone), zero pages until written."""
    m = mmap.mmap(-1, BATCH_SIZE * SIZE * SIZE * 3)
    return np.frombuffer(m, dtype=np.uint8).reshape(BATCH_SIZE, SIZE, SIZE, 3)


def shmload_asarray(pipe: Any) -> Callable[[str], np.ndarray]:
    from PIL import Image

    def run(path: str) -> np.ndarray:
        with Image.open(path) as img:
            return np.asarray(pipe(img))
    return run


def shmload_row(pipe: Any) -> Callable[[str], None]:
    from PIL import Image

    batch = fresh_batch()
    batch.fill(0)  # touched once, as a reused slot is
    position = itertools.count()

    def run(path: str) -> None:
        with Image.open(path) as img:
            pending = pipe(img)
        pending.write_into(batch[next(position) % BATCH_SIZE])
    return run


def minor_faults() -> int:
    return resource.getrusage(resource.RUSAGE_SELF).ru_minflt


def rate(fn: Callable[[str], Any], paths: list[str]) -> tuple[float, float]:
    """Images/s of ``fn`` over ``paths`` in this process (``random`` seeded first), and
    minor page faults per image."""
    random.seed(SEED)
    f0 = minor_faults()
    t0 = time.perf_counter()
    for path in paths:
        fn(path)
    seconds = time.perf_counter() - t0
    return len(paths) / seconds, (minor_faults() - f0) / len(paths)


PIPELINES = ("torch-style", "shmload-asarray", "shmload-row")


def make_pipeline(name: str) -> Callable[[str], Any]:
    from shmload.transforms import train_pipeline

    if name == "torch-style":
        return torch_style_sample
    pipe = train_pipeline(SIZE, "uint8-hwc")
    return shmload_asarray(pipe) if name == "shmload-asarray" else shmload_row(pipe)


class Stages:
    """Seconds and minor page faults per stage, summed over images."""

    def __init__(self) -> None:
        self.seconds: dict[str, float] = {}
        self.faults: dict[str, int] = {}
        self.t, self.f = 0.0, 0

    def start(self) -> None:
        self.t, self.f = time.perf_counter(), minor_faults()

    def lap(self, stage: str) -> None:
        now, faults = time.perf_counter(), minor_faults()
        self.seconds[stage] = self.seconds.get(stage, 0.0) + now - self.t
        self.faults[stage] = self.faults.get(stage, 0) + faults - self.f
        self.t, self.f = now, faults

    def per_image(self, images: int) -> dict[str, Any]:
        ms = {stage: 1e3 * s / images for stage, s in self.seconds.items()}
        ms["total"] = sum(ms.values())
        faults = {stage: f / images for stage, f in self.faults.items()}
        faults["total"] = sum(faults.values())
        return {"ms": ms, "faults": faults}


def torch_style_stages(paths: list[str]) -> dict[str, Any]:
    """``torch_style_sample`` step by step; the collate stacks every 64 into a new
    anonymous mapping, as torch's collate stacks into a new shared-memory segment."""
    from PIL import Image

    random.seed(SEED)
    st, rows = Stages(), []
    for path in paths:
        st.start()
        f = Image.open(path)
        f.load()
        st.lap("decode")
        img = f.convert("RGB")  # a copy: the file is already RGB
        f.close()
        st.lap("convert")
        left, top, w, h = crop_box(*img.size)
        img = img.crop((left, top, left + w, top + h))
        st.lap("crop")
        img = img.resize((SIZE, SIZE), Image.BILINEAR)
        st.lap("resize")
        if random.random() < 0.5:
            img = img.transpose(Image.FLIP_LEFT_RIGHT)
        st.lap("flip")
        rows.append(np.asarray(img))
        st.lap("to-array")
        if len(rows) == BATCH_SIZE:
            st.start()
            np.stack(rows, out=fresh_batch())
            st.lap("collate")
            rows = []
    return st.per_image(len(paths))


def shmload_stages(paths: list[str]) -> dict[str, Any]:
    """``train_pipeline`` + ``write_into`` step by step, with its own helpers; the rows
    are those of one reused batch, as a reused slot's."""
    from PIL import Image

    from shmload.transforms import train_pipeline
    from shmload.transforms.decode import prepare
    from shmload.transforms.fused import PendingImage

    pipe = train_pipeline(SIZE, "uint8-hwc")
    batch = fresh_batch()
    batch.fill(0)
    random.seed(SEED)
    st = Stages()
    for k, path in enumerate(paths):
        st.start()
        img = Image.open(path)
        left, top, w, h = crop_box(*img.size)
        img, box = prepare(img, (left, top, left + w, top + h), SIZE, SIZE, pipe.reduced_decode, pipe.fast_decode)
        img.load()
        st.lap("decode")
        small = img.resize((SIZE, SIZE), pipe.resample, box=box)
        img.close()
        st.lap("crop+resize")
        pending = PendingImage(pipe, small, random.random() < pipe.flip_p)
        pending.write_into(batch[k % BATCH_SIZE])
        st.lap("flip+write row")
    return st.per_image(len(paths))


STAGED: dict[str, Callable[[list[str]], dict[str, Any]]] = {"torch-style": torch_style_stages,
                                                            "shmload": shmload_stages}


def subset_paths(root: str, subset: int) -> list[str]:
    """``subset`` of the folder's images, spread over its classes."""
    paths = [p for p, _ in list_images(root)]
    return paths[::max(1, len(paths) // subset)][:subset]


def run_one_core(root: str, subset: int, what: str) -> dict[str, Any]:
    """In a (child) process of its own: one pass of pipeline ``what`` after a warm-up of
    4 images, or with ``what`` = "stages:<name>" one pass split into stages."""
    paths = subset_paths(root, subset)
    if what.startswith("stages:"):
        staged = STAGED[what.split(":", 1)[1]]
        staged(paths[:4])
        return staged(paths)
    fn = make_pipeline(what)
    rate(fn, paths[:4])
    images_per_s, faults = rate(fn, paths)
    return {"images_per_s": images_per_s, "faults_per_image": faults}


def spawn_one_core(root: Path, subset: int, what: str, regime: str, timeout: float) -> dict[str, Any]:
    env = os.environ | thread_env()
    if MALLOC_REGIMES[regime]:
        env["GLIBC_TUNABLES"] = ":".join(filter(None, (env.get("GLIBC_TUNABLES"), MALLOC_REGIMES[regime])))
    return spawn_child(["one-core", what, "--root", str(root), "--subset", str(subset)], env, timeout)


def one_core(root: Path, subset: int, repeats: int, timeout: float) -> dict[str, Any]:
    """Per malloc setting: every pipeline's rate (median of ``repeats`` fresh processes,
    in ABBA order) and the stage split of each."""
    out: dict[str, Any] = {"repeats": repeats}
    for regime in MALLOC_REGIMES:
        runs: dict[str, list[dict[str, Any]]] = {name: [] for name in PIPELINES}
        for rep in range(repeats):
            for name in (PIPELINES if rep % 2 == 0 else tuple(reversed(PIPELINES))):
                runs[name].append(spawn_one_core(root, subset, name, regime, timeout))
        stages = {name: spawn_one_core(root, subset, f"stages:{name}", regime, timeout) for name in STAGED}
        errors = [r["error"] for rr in [*runs.values(), list(stages.values())] for r in rr if "error" in r]
        if errors:
            out[regime] = {"error": errors[0], "runs": runs, "stages": stages}
            continue
        rates = {name: {"images_per_s": statistics.median(r["images_per_s"] for r in rr),
                        "runs": [r["images_per_s"] for r in rr],
                        "faults_per_image": statistics.median(r["faults_per_image"] for r in rr)}
                 for name, rr in runs.items()}
        out[regime] = {"rates": rates, "stages": stages}
    return out


# ---------------------------------------------------------------- quality
def mean_abs_diff(paths: list[str], make_a: Callable[[str], np.ndarray],
                  make_b: Callable[[str], np.ndarray]) -> dict[str, Any]:
    """Mean |a - b| over all pixels; per image, ``random`` is seeded the same for a and b."""
    per_image = []
    for k, path in enumerate(paths):
        random.seed(SEED + k)
        a = make_a(path).astype(np.int16)
        random.seed(SEED + k)
        b = make_b(path).astype(np.int16)
        per_image.append(float(np.abs(a - b).mean()))
    changed = [d for d in per_image if d > 0]
    return {"mean_abs_diff": statistics.fmean(per_image), "images": len(per_image), "changed": len(changed),
            "mean_abs_diff_changed": statistics.fmean(changed) if changed else 0.0,
            "max_image_mean_abs_diff": max(per_image)}


def fused(**options: bool) -> Callable[[str], np.ndarray]:
    from shmload.transforms import train_pipeline
    return shmload_asarray(train_pipeline(SIZE, "uint8-hwc", **options))


def quality(folder: Folder, paths: list[str]) -> dict[str, dict[str, Any]]:
    exact = fused(reduced_decode=False, fast_decode=False)
    out = {}
    if folder.key == "b":
        out["reduced vs full decode (fast off)"] = mean_abs_diff(paths, fused(reduced_decode=True, fast_decode=False),
                                                                 exact)
    if folder.key == "a":
        out["fast vs exact decode (reduced off)"] = mean_abs_diff(paths, fused(reduced_decode=False, fast_decode=True),
                                                                  exact)
    out["defaults (reduced on, fast off) vs both off"] = mean_abs_diff(paths, fused(), exact)
    out["both off vs torch-style reference"] = mean_abs_diff(paths, exact, torch_style_sample)
    return out


# ---------------------------------------------------------------- the run
def machine() -> dict[str, Any]:
    m = host.machine(("numpy", "Pillow", "torch", "shmload"))
    try:
        from PIL import features
        turbo = " (turbo)" if features.check_feature("libjpeg_turbo") else ""
        m["versions"]["libjpeg"] = f"{features.version('jpg')}{turbo}"
    except Exception:
        m["versions"]["libjpeg"] = None
    return m


def warm_page_cache(root: Path) -> int:
    total = 0
    for path, _ in list_images(str(root)):
        with open(path, "rb") as f:
            total += len(f.read())
    return total


def runs_order(runs: int) -> Iterator[tuple[int, str]]:
    """ABBA: torch, shmload; shmload, torch; ..."""
    for run in range(runs):
        for name in (LOADERS if run % 2 == 0 else tuple(reversed(LOADERS))):
            yield run, name


def summarize(runs: list[dict[str, Any]]) -> dict[str, Any] | None:
    ok = [r["images_per_s"] for r in runs if "images_per_s" in r]
    if not ok:
        return None
    return {"images_per_s": statistics.median(ok), "min": min(ok), "max": max(ok), "runs": len(ok)}


def stage_line(stages: dict[str, Any]) -> str:
    """``decode 1.08, ...``: ms per image, with minor page faults per image where there are any."""
    return ", ".join(f"{k} {ms:.2f}" + (f" ({stages['faults'][k]:.0f} faults)" if stages["faults"][k] >= 1 else "")
                     for k, ms in stages["ms"].items())


def print_folder(folder: Folder, data: dict[str, Any]) -> None:
    m = data["meta"]
    one = data["one_core"]
    pinned = one["pinned"].get("rates")
    print(f"\n### ({folder.key}) {folder.title}: {m['images']} JPEGs of ~{folder.size[0]}x{folder.size[1]} "
          f"({m['mean_file_kb']:.0f} KB each), batch {BATCH_SIZE}, {WORKERS} workers\n")
    print("| loader | images/s [runs' range] | vs torch | vs 2 x one-core rate (pinned malloc) | 1st batch s "
          "| main CPU ms/image | workers CPU ms/image |")
    print("|---|---|---|---|---|---|---|")
    torch_med = (data["loaders"].get("torch") or {}).get("images_per_s")
    for name, core in (("torch", "torch-style"), ("shmload", "shmload-row")):
        s = data["loaders"].get(name)
        if s is None:
            why = data["skipped"].get(name) or "; ".join(r.get("error", "?") for r in data["runs"][name])
            print(f"| {name} | {'skipped' if name in data['skipped'] else 'failed'}: {why} | | | | | |")
            continue
        runs = [r for r in data["runs"][name] if "images_per_s" in r]
        first = statistics.median(r["first_batch_seconds"] for r in runs)
        main_cpu = statistics.median(r["main_cpu_ms_per_image"] for r in runs)
        w = [r["workers_cpu_ms_per_image"] for r in runs if r["workers_cpu_ms_per_image"] is not None]
        workers_cpu = f"{statistics.median(w):.2f}" if w else "-"
        vs_torch = f"{s['images_per_s'] / torch_med:.2f}x" if torch_med else "-"
        vs_core = f"{s['images_per_s'] / (WORKERS * pinned[core]['images_per_s']):.2f}" if pinned else "-"
        print(f"| {name} | {s['images_per_s']:.0f} [{s['min']:.0f}..{s['max']:.0f}] | {vs_torch} | {vs_core} "
              f"| {first:.2f} | {main_cpu:.2f} | {workers_cpu} |")

    print(f"\nOne core, no loader ({m['subset']} images; median of {one['repeats']} fresh processes in ABBA order; "
          "minor page faults per image in brackets):")
    print(f"  {'':<42} {'default malloc':^31} {'pinned malloc':^31}")
    for name, label in (("torch-style", "torch-style per-sample function"),
                        ("shmload-asarray", "train_pipeline + np.asarray"),
                        ("shmload-row", "train_pipeline + write_into a batch row")):
        cells = []
        for regime in MALLOC_REGIMES:
            rates = one[regime].get("rates")
            if rates is None:
                cells.append(f"{'error':>26}")
                continue
            r = rates[name]["images_per_s"]
            cells.append(f"{r:6.0f}/s {1e3 / r:6.2f} ms [{rates[name]['faults_per_image']:4.0f}] "
                         f"{r / rates['torch-style']['images_per_s']:4.2f}x")
        print(f"  {label:<42} " + " ".join(cells))
    for regime, result in one.items():
        if regime in MALLOC_REGIMES and "error" in result:
            print(f"  {regime} malloc: {result['error']}")
    print("Stages, ms per image (one pass each):")
    for regime in MALLOC_REGIMES:
        if "error" not in one[regime]:
            for name, stages in one[regime]["stages"].items():
                print(f"  {regime:<8} {name:<12} {stage_line(stages)}")
    print("Quality, mean |difference| in 0-255 levels, same image and crop:")
    for label, q in data["quality"].items():
        print(f"  {label:<36} {q['mean_abs_diff']:.3f}  ({q['changed']}/{q['images']} images changed, "
              f"{q['mean_abs_diff_changed']:.3f} over those; worst image {q['max_image_mean_abs_diff']:.3f})")


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--quick", action="store_true", help="small folders, one run, one timed epoch: a smoke test")
    p.add_argument("--runs", type=int, default=None, help="interleaved runs per loader (default 5; 1 with --quick)")
    p.add_argument("--epochs", type=int, default=None, help="timed epochs per run (default 2; 1 with --quick)")
    p.add_argument("--repeats", type=int, default=None, help="one-core passes per pipeline (default 3; 1 with --quick)")
    p.add_argument("--child-timeout", type=float, default=600.0, help="seconds before a run is killed")
    p.add_argument("--out", type=Path, default=None, help="JSON (default benchmarks/results/images-<time>.json)")
    p.add_argument("--child", nargs="+", help=argparse.SUPPRESS)  # torch | shmload | one-core WHAT
    p.add_argument("--root", help=argparse.SUPPRESS)
    p.add_argument("--subset", type=int, help=argparse.SUPPRESS)
    p.add_argument("--child-out", type=Path, help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    args.runs = args.runs or (1 if args.quick else 5)
    args.epochs = args.epochs or (1 if args.quick else 2)
    args.repeats = args.repeats or (1 if args.quick else 3)
    if min(args.runs, args.epochs, args.repeats) < 1:
        p.error("--runs, --epochs and --repeats must be at least 1")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.child:
        kind, *what = args.child
        result = run_one_core(args.root, args.subset, what[0]) if kind == "one-core" else \
            run_child(kind, args.root, args.epochs)
        args.child_out.write_text(json.dumps(result))
        return 0
    from shmload.tools.synthetic import image_folder

    t_start = time.perf_counter()
    stamp = datetime.datetime.now().strftime("%Y%m%d-%H%M%S")
    out = args.out or RESULTS / f"images-{stamp}{'-quick' if args.quick else ''}.json"
    m = machine()
    v = m["versions"]
    print(f"machine: {m['cpu']}, {m['cpu_count']} CPUs ({m['usable_cores']} usable), {m['ram_gib']} GiB, "
          f"{m['platform']}, python {m['python']}; " + ", ".join(f"{k} {val}" for k, val in v.items()))
    print(f"config: batch {BATCH_SIZE}, {WORKERS} workers, fork, persistent workers, output {SIZE}x{SIZE}x3 uint8; "
          f"{args.runs} run(s) ABBA, a warm-up epoch + {args.epochs} timed epoch(s) each"
          + ("; --quick: a smoke test, the figures mean nothing" if args.quick else ""))
    data: dict[str, Any] = {"machine": m, "config": {k: (str(val) if isinstance(val, Path) else val)
                                                     for k, val in vars(args).items()
                                                     if k not in ("child", "child_out", "root", "subset")},
                            "batch_size": BATCH_SIZE, "workers": WORKERS, "size": SIZE, "folders": {}}
    for folder in FOLDERS:
        root = folder.root(args.quick)
        t0 = time.perf_counter()
        image_folder(root, folder.images(args.quick), folder.size, classes=10, progress=True)
        made = time.perf_counter() - t0
        nbytes = warm_page_cache(root)
        count = len(list_images(str(root)))
        data["folders"][folder.key] = {
            "meta": {"title": folder.title, "root": str(root), "images": count, "size": folder.size,
                     "mean_file_kb": nbytes / count / 1e3, "generate_seconds": made, "goal": folder.goal,
                     "subset": min(count, folder.subset(args.quick))},
            "runs": {name: [] for name in LOADERS}, "skipped": {}}
        print(f"folder ({folder.key}) {folder.title}: {count} images, {nbytes / 1e6:.0f} MB in {root}"
              f"{f' (written in {made:.0f} s)' if made > 1 else ''}")

    print("loaders:")
    skipped: dict[str, str] = {}
    for run, name in runs_order(args.runs):
        for folder in FOLDERS:
            entry = data["folders"][folder.key]
            if name in skipped:
                entry["skipped"][name] = skipped[name]
                continue
            result = spawn_loader(name, Path(entry["meta"]["root"]), args.epochs, args.child_timeout)
            entry["runs"][name].append(result)
            if "skipped" in result:
                skipped[name] = entry["skipped"][name] = result["skipped"]
                print(f"  {name}: SKIPPED, {result['skipped']}; the torch side is left out, "
                      "shmload and the one-core rates are still measured", flush=True)
                continue
            line = f"{result['images_per_s']:7.0f} images/s" if "images_per_s" in result else result["error"]
            print(f"  run {run + 1} ({folder.key}) {name:<8} {line}", flush=True)

    print("one core, quality:", flush=True)
    for folder in FOLDERS:
        entry = data["folders"][folder.key]
        entry["loaders"] = {name: summarize(entry["runs"][name]) for name in LOADERS}
        root, subset = Path(entry["meta"]["root"]), entry["meta"]["subset"]
        entry["one_core"] = one_core(root, subset, args.repeats, args.child_timeout)
        entry["quality"] = quality(folder, subset_paths(str(root), subset))
        print(f"  ({folder.key}) done", flush=True)

    for folder in FOLDERS:
        print_folder(folder, data["folders"][folder.key])
    print("\n### Targets\n")
    for folder in FOLDERS:
        loaders = data["folders"][folder.key]["loaders"]
        if loaders["torch"] is None or loaders["shmload"] is None:
            print(f"- [not measured] ({folder.key}) {folder.title}: shmload / torch DataLoader images/s "
                  f"(goal >= {folder.goal}): {'torch skipped' if 'torch' in skipped else 'a loader failed'}")
            continue
        ratio = loaders["shmload"]["images_per_s"] / loaders["torch"]["images_per_s"]
        data["folders"][folder.key]["ratio"] = ratio
        status = "quick" if args.quick else ("met" if ratio >= folder.goal else "MISSED")
        print(f"- [{status}] ({folder.key}) {folder.title}: shmload / torch DataLoader images/s: {ratio:.2f} "
              f"(goal >= {folder.goal})")
    data["elapsed_seconds"] = time.perf_counter() - t_start
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(data, indent=1, default=float) + "\n")
    print(f"\nJSON: {out}\ntotal {data['elapsed_seconds']:.0f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
