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

from . import synthetic
from .datasets import ImageFolder
from .loader import DataLoader
from .transforms import train_pipeline


def cmd_demo(args: argparse.Namespace) -> int:
    root = synthetic.demo_folder(args.images, progress=True)
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


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("demo", help="load a built-in synthetic image folder and show where the time goes",
                       description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--images", type=int, default=synthetic.DEMO_IMAGES,
                   help=f"JPEGs in the demo folder (default {synthetic.DEMO_IMAGES}; written once)")
    p.add_argument("--workers", type=int, default=None, help="num_workers (default: the usable cores)")
    p.add_argument("--batch-size", type=int, default=64)
    p.add_argument("--size", type=int, default=224, help="output size (default 224)")
    p.add_argument("--output", choices=["uint8-hwc", "float32-chw"], default="uint8-hwc")
    p.add_argument("--epochs", type=int, default=1)
    p.set_defaults(run=cmd_demo)
