"""``shmload pack``: an image folder (``root/<class>/<image>``) as a records directory.

The encoded files are stored as they are (no decode, no re-encode): packing is reading
files and writing parts, and decoding a packed sample gives exactly the pixels decoding
the file gives. Each sample has one field, ``label`` (int64, the class index, in
``ImageFolder``'s order), and the class names are kept in the metadata.
"""

from __future__ import annotations

import argparse
import os
import time
from typing import Any

from ..datasets.folder import IMG_EXTENSIONS, ImageFolder
from . import format as fmt
from .writer import write


class FolderFiles:
    """An ``ImageFolder``'s files as ``(bytes, {"label": class index})``."""

    def __init__(self, folder: ImageFolder):
        self.folder = folder

    def __len__(self) -> int:
        return len(self.folder)

    def __getitem__(self, i: int) -> tuple[bytes, dict]:
        with open(self.folder.path(i), "rb") as f:
            return f.read(), {"label": int(self.folder.targets[i])}


def pack_image_folder(root: str | os.PathLike, out_dir: str | os.PathLike, *,
                      part_bytes: int = fmt.DEFAULT_PART_BYTES, workers: int = 0, progress: Any = False,
                      extensions: tuple[str, ...] = IMG_EXTENSIONS) -> str:
    """Pack the image folder ``root`` into the new records directory ``out_dir``."""
    folder = ImageFolder(root, extensions=extensions)
    return write(FolderFiles(folder), out_dir, part_bytes=part_bytes, workers=workers, classes=folder.classes,
                 progress=progress)


def _size(text: str) -> int:
    units = {"": 1, "k": 1 << 10, "kb": 1 << 10, "m": 1 << 20, "mb": 1 << 20, "g": 1 << 30, "gb": 1 << 30}
    number = text.rstrip("kKmMgGbB")
    try:
        value = int(float(number) * units[text[len(number):].lower()])
    except (ValueError, KeyError):
        raise argparse.ArgumentTypeError(f"expected a size like 256MB, 64M or 1G, got {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"expected a positive size, got {text!r}")
    return value


def add_parser(sub: Any) -> None:
    p = sub.add_parser("pack", help="pack an image folder (root/<class>/<image>) into part files with an index",
                       description="Pack IMAGE_FOLDER (root/<class>/<image>) into OUT_DIR: part files of the images' "
                                   "encoded bytes, unchanged, an index, the labels and the class names. OUT_DIR "
                                   "appears complete or not at all. Read it with shmload.records.RecordDataset.")
    p.add_argument("image_folder")
    p.add_argument("out_dir")
    p.add_argument("--part-size", type=_size, default=fmt.DEFAULT_PART_BYTES, metavar="SIZE",
                   help="target size of a part file (default 256MB)")
    p.add_argument("--workers", type=int, default=os.cpu_count() or 1,
                   help="processes writing in parallel (default: one per core)")
    p.add_argument("--quiet", action="store_true", help="no progress bar")
    p.set_defaults(run=cmd_pack)


def cmd_pack(args: argparse.Namespace) -> int:
    started = time.monotonic()
    out = pack_image_folder(args.image_folder, args.out_dir, part_bytes=args.part_size, workers=args.workers,
                            progress=not args.quiet)
    meta = fmt.read_metadata(out)
    total = sum(p["bytes"] for p in meta["parts"])
    elapsed = time.monotonic() - started
    print(f"packed {meta['samples']} images of {len(meta['classes'])} classes into {len(meta['parts'])} part(s), "
          f"{total / 2**20:.1f} MiB, in {elapsed:.1f} s: {out}")
    return 0
