"""Packed records: many small files as a few large part files with a random-access index.

``write(source, out_dir)`` packs (``shmload pack IMAGE_FOLDER OUT_DIR`` for an image
folder), :class:`RecordDataset` reads, :class:`PartShuffleSampler` shuffles with
locality. The format: ``format.py`` and docs/records.md.
"""

from .format import RecordCorruptError, RecordFormatError
from .pack import pack_image_folder
from .reader import RecordDataset
from .sampler import PartShuffleSampler
from .writer import write

__all__ = ["PartShuffleSampler", "RecordCorruptError", "RecordDataset", "RecordFormatError", "pack_image_folder",
           "write"]
