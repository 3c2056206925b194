"""An image folder (``root/<class>/<image>``) as a records directory (the command
``shmload pack`` is tools/pack_cmd.py).

The encoded files are stored as they are (no decode, no re-encode): packing is reading
files and writing parts, and decoding a packed sample gives exactly the pixels decoding
the file gives. Each sample has one field, ``label`` (int64, the class index, in
``ImageFolder``'s order), and the class names are kept in the metadata.
"""

from __future__ import annotations

import os
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
