"""Migrating from torch's DataLoader: change one line, get the same batches.

    python examples/migrate_from_torch.py [--workers 2] [--batch-size 16] [--images 192]

The same map-style dataset (a folder of JPEGs, ``shmload.datasets.ImageFolder`` with a
deterministic transform: ``Resize`` + ``CenterCrop`` to ``[3, 64, 64]`` uint8) is loaded
once with ``torch.utils.data.DataLoader`` and once with ``shmload.DataLoader``, with the
same arguments and the same shuffled order, and every batch is compared: images and
labels must be equal, tensor for tensor. The folder is written once (later runs reuse
it) by ``shmload.tools.synthetic.image_folder`` under ``shmload.tools.synthetic.cache_dir()``.

The change, in your training script::

    loader = torch.utils.data.DataLoader(dataset, batch_size=16, sampler=order, num_workers=2)
    loader = shmload.DataLoader(dataset, batch_size=16, sampler=order, num_workers=2, output="torch")

``output="torch"`` yields ``torch.Tensor``s (``torch.from_numpy`` over the shared-memory
batch, no copy); leave it out to receive numpy arrays. A batch stays valid while you hold
it: to keep one past the loop (a replay buffer, a list of batches), keep ``t.clone()``.

Exit status: 0 when all batches are equal, 1 when one differs. Without torch there is
nothing to compare against: the example prints the command to install it
(``pip install torch==2.13.0``) and exits with status 3.
"""

from __future__ import annotations

import argparse
import os
import sys

import shmload
from shmload.datasets import ImageFolder
from shmload.tools.synthetic import cache_dir, image_folder
from shmload.transforms import CenterCrop, Compose, Resize, ToCHW

TORCH_PIN = "torch==2.13.0"
EXIT_NEEDS_TORCH = 3


def import_torch():
    """torch, or None after telling the user how to install it."""
    try:
        import torch
        import torch.utils.data
    except ImportError as exc:
        print(f"This example compares shmload.DataLoader with torch.utils.data.DataLoader, and torch is not "
              f"importable here ({exc}).\nInstall it with:\n\n    pip install {TORCH_PIN}\n\n"
              "(the version shmload is tested with; in a checkout of shmload: pip install -e '.[torch]'). A "
              f"CPU-only build is enough:\n\n    pip install {TORCH_PIN} --index-url "
              "https://download.pytorch.org/whl/cpu",
              file=sys.stderr)
        return None
    return torch


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--workers", type=int, default=2, help="worker processes, for both loaders (default 2)")
    parser.add_argument("--batch-size", type=int, default=16)
    parser.add_argument("--images", type=int, default=192, help="images in the generated folder (default 192)")
    args = parser.parse_args()

    torch = import_torch()
    if torch is None:
        return EXIT_NEEDS_TORCH

    root = image_folder(os.path.join(cache_dir(), "examples", f"photos-{args.images}-500x375"),
                        count=args.images, size=(500, 375), classes=4)
    # A deterministic transform: both loaders must produce the same pixels. (Random
    # augmentations are seeded differently by the two loaders: torch seeds each worker,
    # shmload each batch, so that its batches do not depend on num_workers.)
    dataset = ImageFolder(root, transform=Compose([Resize(72), CenterCrop(64), ToCHW()]))

    # The same shuffled order for both: an explicit sampler (any iterable of indices).
    # With shuffle=True each loader would draw its own permutation.
    order = torch.randperm(len(dataset), generator=torch.Generator().manual_seed(0)).tolist()

    # ---- before: torch's DataLoader --------------------------------------------------
    loader = torch.utils.data.DataLoader(dataset, batch_size=args.batch_size, sampler=order,
                                         num_workers=args.workers)
    expected = [(images, labels) for images, labels in loader]  # ordinary tensors: safe to keep

    # ---- after: the one-line change --------------------------------------------------
    loader = shmload.DataLoader(dataset, batch_size=args.batch_size, sampler=order,
                                num_workers=args.workers, output="torch")
    equal = 0
    with loader:  # optional: close() on exit stops the workers and releases the shared memory now
        for k, (images, labels) in enumerate(loader):
            # images: uint8 [B, 3, 64, 64], labels: int64 [B], tensors over shared memory
            if k >= len(expected):
                print(f"shmload yielded more batches than torch's {len(expected)}", file=sys.stderr)
                return 1
            want_images, want_labels = expected[k]
            if images.dtype != want_images.dtype or labels.dtype != want_labels.dtype:
                print(f"batch {k}: dtypes differ: {images.dtype}/{labels.dtype} against torch's "
                      f"{want_images.dtype}/{want_labels.dtype}", file=sys.stderr)
                return 1
            if not (torch.equal(images, want_images) and torch.equal(labels, want_labels)):
                print(f"batch {k} differs from torch's DataLoader", file=sys.stderr)
                return 1
            equal += 1

    if equal != len(expected):
        print(f"shmload yielded {equal} batches, torch {len(expected)}", file=sys.stderr)
        return 1
    shape = "x".join(map(str, expected[0][0].shape))
    print(f"dataset: {len(dataset)} images of {len(dataset.classes)} classes, batches of {shape} uint8")
    print(f"torch.utils.data.DataLoader: {len(expected)} batches")
    print(f"shmload.DataLoader         : {equal} batches")
    print(f"all {equal} batches equal (images and labels, same dtypes, same shuffled order): OK")
    return 0


if __name__ == "__main__":
    sys.exit(main())
