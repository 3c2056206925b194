"""``shmload pack``: the command line of :func:`shmload.records.pack_image_folder`."""

from __future__ import annotations

import argparse
import os
import time
from typing import Any

from .._core._units import decimal_size
from ..errors import CommandError
from ..records import format as fmt
from ..records.pack import pack_image_folder
from .args import counted


def _size(text: str) -> int:
    units = {"": 1, "k": 1 << 10, "kb": 1 << 10, "kib": 1 << 10, "m": 1 << 20, "mb": 1 << 20, "mib": 1 << 20,
             "g": 1 << 30, "gb": 1 << 30, "gib": 1 << 30}
    number = text.rstrip("kKmMgGiIbB")
    try:
        value = int(float(number) * units[text[len(number):].lower()])
    except (ValueError, KeyError):
        raise argparse.ArgumentTypeError(f"expected a size like 256M, 64MiB or 1G, got {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"expected a positive size, got {text!r}")
    return value


DESCRIPTION = """\
Pack an image folder into a records directory: a few large part files holding
the images' encoded bytes, unchanged, with an index, the labels and the class
names. Opening a million images then maps a few files instead of listing a
million.

IMAGE_FOLDER is laid out as IMAGE_FOLDER/<class name>/<image file>, as for
ImageFolder. OUT_DIR appears complete or not at all. Read it with
shmload.records.RecordDataset.

example:
  shmload pack /data/train /data/train.records --part-size 256M
"""


def add_parser(sub: Any) -> argparse.ArgumentParser:
    cores = os.cpu_count() or 1
    p = sub.add_parser("pack", help="pack an image folder (root/<class>/<image>) into part files with an index",
                       description=DESCRIPTION)
    p.add_argument("image_folder", metavar="IMAGE_FOLDER",
                   help="the folder to pack: one subfolder per class, holding that class's images")
    p.add_argument("out_dir", metavar="OUT_DIR", help="the records directory to create; it must not exist yet")
    p.add_argument("--part-size", type=_size, default=fmt.DEFAULT_PART_BYTES, metavar="SIZE",
                   help="target size of each part file, in bytes or with a suffix K, M or G, which count in "
                        "powers of 1024: 256M is 256 MiB (default: 256M)")
    p.add_argument("--workers", type=counted(0, "processes"), default=cores, metavar="N",
                   help=f"processes reading and writing in parallel; 0 packs in this process (default: one per "
                        f"core, here {cores})")
    p.add_argument("--quiet", action="store_true",
                   help="no progress bar (by default one is drawn on stderr, with the rate)")
    p.set_defaults(run=cmd_pack)
    return p


def _check_paths(image_folder: str, out_dir: str) -> None:
    """Refuse, with the fix, what the user can correct before anything is written."""
    if not os.path.exists(image_folder):
        raise CommandError(f"the image folder {image_folder!r} does not exist; give the folder that holds one "
                           "subfolder per class")
    if not os.path.isdir(image_folder):
        raise CommandError(f"{image_folder!r} is a file; give the folder that holds one subfolder per class")
    if os.path.lexists(out_dir):
        raise CommandError(f"{out_dir!r} exists already; a records directory is written whole into a new path: "
                           "remove it or give another OUT_DIR")


def cmd_pack(args: argparse.Namespace) -> int:
    _check_paths(args.image_folder, args.out_dir)
    started = time.monotonic()
    try:
        out = pack_image_folder(args.image_folder, args.out_dir, part_bytes=args.part_size, workers=args.workers,
                                progress=not args.quiet)
    except (FileNotFoundError, NotADirectoryError) as e:  # ImageFolder's: no class folders, no images
        raise CommandError(str(e).removeprefix("ImageFolder: ")) from None
    except OSError as e:
        raise CommandError(f"packing stopped: {e}; OUT_DIR was not written: fix what is named (a file that cannot "
                           "be read, a folder that cannot be written, a full disk) and pack again") from e
    meta = fmt.read_metadata(out)
    total = sum(p["bytes"] for p in meta["parts"])
    elapsed = time.monotonic() - started
    print(f"packed {meta['samples']} images of {len(meta['classes'])} classes into {len(meta['parts'])} part(s), "
          f"{decimal_size(total)}, in {elapsed:.1f} s: {out}")
    return 0
