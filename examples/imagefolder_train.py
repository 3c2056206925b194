"""Train a small CNN on a folder of JPEGs, loaded by shmload's workers.

    python examples/imagefolder_train.py [--steps 60] [--workers 2] [--batch-size 32]

What it does:

1. Writes (once; later runs reuse it) a small ImageFolder of synthetic photo-like JPEGs,
   ``<cache>/examples/colours-.../<class>/*.jpg``, where ``<cache>`` is
   ``shmload.tools.synthetic.cache_dir()`` (``$SHMLOAD_CACHE``, else ``~/.cache/shmload``).
   Each image is a random photo-like texture tinted with its class's colour (red, green,
   blue, yellow), so the label can be learnt from the pixels. (The folders of
   ``shmload.tools.synthetic.image_folder`` assign classes round-robin to images drawn
   independently of them: fine for measuring a loader, nothing to learn.)
2. Loads it with ``shmload.datasets.ImageFolder`` and the fused
   ``shmload.transforms.train_pipeline(64, output="float32-chw")``: each worker decodes
   the JPEG at a reduced size, random-resized-crops, flips and normalizes it straight into
   the batch's shared-memory slot.
3. Trains a tiny CNN on the CPU with torch. ``output="torch"`` makes every batch a
   ``torch.Tensor`` made by ``torch.from_numpy`` over the slot: no copy between the
   workers and the model. The slot is reused once the batch's tensors are gone, i.e.
   right after the step (autograd's saved input is freed by ``backward()``).

It prints the loss every few steps and exits with status 0 when the mean loss of the
last 5 steps is below that of the first 5, else with status 1. The run is reproducible,
and gives the same losses for any ``--workers`` (0 included): the loader seeds the
augmentations per batch, not per worker.

Needs torch. Without it the example prints the command to install it
(``pip install torch==2.13.0``, the version shmload's ``torch`` extra pins) and exits
with status 3, not 0: nothing was trained, and a script or CI job running the example
should notice. 3 is told apart from a failure (1) and a command-line error (2).
"""

from __future__ import annotations

import argparse
import os
import sys
import time

import numpy as np

import shmload
from shmload.datasets import ImageFolder
from shmload.tools.synthetic import cache_dir, photo
from shmload.transforms import train_pipeline

TORCH_PIN = "torch==2.13.0"
EXIT_NEEDS_TORCH = 3

# class folder name -> its colour (RGB)
COLOURS = {"blue": (40, 60, 230), "green": (40, 200, 60), "red": (225, 40, 40), "yellow": (235, 215, 40)}
TINT = 0.45  # share of the class colour in each pixel; the rest is the photo-like texture


def import_torch():
    """torch, or None after telling the user how to install it."""
    try:
        import torch
    except ImportError as exc:
        print(f"This example trains a model with torch, which is not importable here ({exc}).\n"
              f"Install it with:\n\n    pip install {TORCH_PIN}\n\n"
              "(the version shmload is tested with; in a checkout of shmload: pip install -e '.[torch]'). A "
              f"CPU-only build is enough:\n\n    pip install {TORCH_PIN} --index-url "
              "https://download.pytorch.org/whl/cpu",
              file=sys.stderr)
        return None
    return torch


# ---------------------------------------------------------------- the data
def _write_class_images(job: tuple[str, str, int, int, int, int]) -> None:
    from PIL import Image

    folder, name, start, stop, width, height = job
    colour = np.array(COLOURS[name], np.float32)
    for k in range(start, stop):
        rng = np.random.default_rng(k)
        texture = photo(rng, width, height).astype(np.float32)
        pixels = (1 - TINT) * texture + TINT * colour
        Image.fromarray(pixels.astype(np.uint8)).save(os.path.join(folder, name, f"img{k:05d}.jpg"), quality=90)


def colour_folder(images: int, size: tuple[int, int] = (320, 240)) -> str:
    """Write ``images`` JPEGs (about ``size``, width x height) in one folder per colour
    under the cache directory once, and return the folder. Written into a temporary
    folder and renamed, so an interrupted run never leaves a partial folder behind."""
    import multiprocessing
    import shutil
    import tempfile

    root = os.path.join(cache_dir(), "examples", f"colours-{images}-{size[0]}x{size[1]}-v1")
    if os.path.isdir(root):
        return root
    os.makedirs(os.path.dirname(root), exist_ok=True)
    tmp = tempfile.mkdtemp(prefix=os.path.basename(root) + ".partial-", dir=os.path.dirname(root))
    try:
        names = sorted(COLOURS)
        for name in names:
            os.makedirs(os.path.join(tmp, name))
        jobs = []
        for c, name in enumerate(names):  # image k (drawn from seed k) of class c: k in [lo, hi)
            lo, hi = c * images // len(names), (c + 1) * images // len(names)
            jobs += [(tmp, name, s, min(s + 32, hi), *size) for s in range(lo, hi, 32)]
        print(f"writing {images} synthetic JPEGs to {root} (once) ...", flush=True)
        with multiprocessing.get_context("fork").Pool(min(len(os.sched_getaffinity(0)), 4)) as pool:
            pool.map(_write_class_images, jobs)
        try:
            os.rename(tmp, root)
        except OSError:  # another run finished it first
            if not os.path.isdir(root):
                raise
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return root


# ---------------------------------------------------------------- the training
def make_model(torch, classes: int):
    nn = torch.nn
    return nn.Sequential(
        nn.Conv2d(3, 16, 3, stride=2, padding=1), nn.ReLU(),   # 64 -> 32
        nn.Conv2d(16, 32, 3, stride=2, padding=1), nn.ReLU(),  # 32 -> 16
        nn.Conv2d(32, 32, 3, stride=2, padding=1), nn.ReLU(),  # 16 -> 8
        nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(32, classes))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--steps", type=int, default=60, help="optimizer steps (default 60)")
    parser.add_argument("--workers", type=int, default=2, help="loader worker processes (default 2)")
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--images", type=int, default=384, help="images in the generated folder (default 384)")
    parser.add_argument("--size", type=int, default=64, help="training crop size (default 64)")
    args = parser.parse_args()
    if args.steps < 10:
        parser.error("--steps should be at least 10 (the loss is compared over the first and last 5 steps)")
    if args.images < args.batch_size:
        parser.error("--images should be at least --batch-size")

    torch = import_torch()  # before writing any data: without torch there is nothing to do
    if torch is None:
        return EXIT_NEEDS_TORCH
    torch.manual_seed(0)  # the model's initial weights; the loader's seed is below
    # Leave the cores the workers decode on to them: torch's default (a thread per core)
    # competes with the workers, and its spinning threads make every step slower.
    torch.set_num_threads(max(1, len(os.sched_getaffinity(0)) - args.workers))

    root = colour_folder(args.images)
    dataset = ImageFolder(root, transform=train_pipeline(args.size, output="float32-chw"))
    print(f"dataset: {len(dataset)} images of {len(dataset.classes)} classes {dataset.classes} in {root}")

    model = make_model(torch, len(dataset.classes))
    optimizer = torch.optim.Adam(model.parameters(), lr=3e-3)
    loss_fn = torch.nn.CrossEntropyLoss()

    losses, correct, seen = [], 0, 0
    start = time.perf_counter()
    with shmload.DataLoader(dataset, batch_size=args.batch_size, shuffle=True, drop_last=True,
                            num_workers=args.workers, persistent_workers=True, seed=0,
                            output="torch") as loader:
        epoch = 0
        while len(losses) < args.steps:
            for images, labels in loader:
                # images: float32 [B, 3, size, size], labels: int64 [B]; torch tensors over
                # the batch's shared-memory slot (torch.from_numpy), not copies.
                logits = model(images)
                loss = loss_fn(logits, labels)
                optimizer.zero_grad()
                loss.backward()
                optimizer.step()
                losses.append(loss.item())
                step = len(losses)
                if step > args.steps - 10:  # accuracy over the last 10 steps (on training batches)
                    correct += int((logits.argmax(1) == labels).sum())
                    seen += len(labels)
                if step == 1 or step % 5 == 0 or step == args.steps:
                    print(f"epoch {epoch} step {step:4d}/{args.steps}  loss {loss.item():.4f}", flush=True)
                if step == args.steps:
                    break
            epoch += 1
        elapsed = time.perf_counter() - start
        stats = loader.stats(memory=False)

    first, last = float(np.mean(losses[:5])), float(np.mean(losses[-5:]))
    print(f"{args.steps} steps of {args.batch_size} images in {elapsed:.1f} s "
          f"({args.steps * args.batch_size / elapsed:.0f} images/s, {args.workers} workers); "
          f"the training loop waited for data {stats.stall_fraction:.0%} of the time")
    print(f"accuracy over the last 10 steps: {correct / seen:.0%} (chance: {1 / len(dataset.classes):.0%})")
    if last < first:
        print(f"loss decreased: {first:.4f} (mean of the first 5 steps) -> {last:.4f} (mean of the last 5 steps)")
        return 0
    print(f"loss did NOT decrease: {first:.4f} (first 5 steps) -> {last:.4f} (last 5 steps)", file=sys.stderr)
    return 1


if __name__ == "__main__":
    sys.exit(main())
