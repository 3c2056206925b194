"""``shmload demo``: the main job on built-in data, for a first look.

Writes (once) a cached folder of synthetic ~500x375 JPEGs, loads it with
``ImageFolder`` and the fused ``train_pipeline`` (decode, random-resized-crop to 224,
flip, straight into shared memory) for ``--epochs`` epochs, and prints images/s, the
consumer's stall and the profiler's account of where the time went.
"""

from __future__ import annotations

import argparse
import os
import time

from .._loader.loader import DataLoader
from ..datasets import ImageFolder
from ..errors import CommandError
from ..transforms import train_pipeline
from . import synthetic
from .args import counted


def cmd_demo(args: argparse.Namespace) -> int:
    try:
        root = synthetic.demo_folder(args.images, progress=True)
    except OSError as e:
        raise CommandError(f"could not write the demo's images into {synthetic.cache_dir()}: {e}; set SHMLOAD_CACHE "
                           f"to a writable folder with room for them (about 55 kB an image)") from e
    dataset = ImageFolder(root, transform=train_pipeline(args.size, args.output))
    workers = args.workers if args.workers is not None else len(os.sched_getaffinity(0))
    print(f"shmload demo: {len(dataset)} JPEGs (~{synthetic.DEMO_SIZE[0]}x{synthetic.DEMO_SIZE[1]}, "
          f"{len(dataset.classes)} classes) in {root}")
    print(f"ImageFolder + train_pipeline({args.size}, {args.output!r}), batch_size={args.batch_size}, "
          f"num_workers={workers}\n")
    started = time.perf_counter()
    with DataLoader(dataset, batch_size=args.batch_size, shuffle=True, num_workers=workers,
                    persistent_workers=True, seed=0) as loader:
        first = None
        images = 0
        for epoch in range(args.epochs):
            epoch_start, epoch_images = time.perf_counter(), 0
            for batch, labels in loader:
                if first is None:
                    first = time.perf_counter() - started
                    loader.reset_stats()  # the window starts once workers are up
                    continue
                epoch_images += len(labels)
            images += epoch_images
            print(f"epoch {epoch}: {epoch_images / (time.perf_counter() - epoch_start):,.0f} images/s")
        stats = loader.stats()
    shape = f"[{args.batch_size}, " + ", ".join(map(str, batch.shape[1:])) + f"] {batch.dtype}"
    print(f"\nfirst batch after {first:.2f} s; then {images / stats.duration:,.0f} images/s "
          f"({shape} batches), the consumer waited {stats.stall_fraction:.0%} of the time\n")
    print(stats)
    return 0


DESCRIPTION = """\
Load a built-in folder of synthetic photos the way a training job would, and
show where the time goes.

The first run writes --images synthetic ~500x375 JPEGs (10 classes) into
$SHMLOAD_CACHE (default ~/.cache/shmload; about 110 MB for 2,000 images,
written once). Then it loads them with ImageFolder and the fused train_pipeline
(decode at reduced size, random-resized-crop, flip, written straight into
shared memory) for --epochs epochs, and prints images/s, the time to the first
batch, how long the consumer waited for data, and the profile: each worker's
time per stage and a diagnosis.
"""


def add_parser(sub: argparse._SubParsersAction) -> argparse.ArgumentParser:
    cores = len(os.sched_getaffinity(0))
    p = sub.add_parser("demo", help="load a built-in synthetic image folder and show where the time goes",
                       description=DESCRIPTION)
    p.add_argument("--images", type=counted(1, "images"), default=synthetic.DEMO_IMAGES, metavar="N",
                   help=f"synthetic JPEGs in the demo folder, written once (default: {synthetic.DEMO_IMAGES})")
    p.add_argument("--workers", type=counted(0, "worker processes"), default=None, metavar="N",
                   help=f"worker processes loading the images; 0 loads in this process (default: one per usable "
                        f"core, here {cores})")
    p.add_argument("--batch-size", type=counted(1, "images per batch"), default=64, metavar="N",
                   help="images per batch (default: 64)")
    p.add_argument("--size", type=counted(1, "pixels"), default=224, metavar="PIXELS",
                   help="side of the square images the pipeline outputs, in pixels (default: 224)")
    p.add_argument("--output", choices=["uint8-hwc", "float32-chw"], default="uint8-hwc",
                   help="pixel format of a batch: uint8-hwc is uint8 [batch, size, size, 3], 4x fewer bytes; "
                        "float32-chw is normalized float32 [batch, 3, size, size], as a model takes it "
                        "(default: uint8-hwc)")
    p.add_argument("--epochs", type=counted(1, "epochs"), default=1, metavar="N",
                   help="passes over the folder (default: 1)")
    p.set_defaults(run=cmd_demo)
    return p
