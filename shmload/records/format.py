"""The packed-records format, version 1: what is in a records directory and how to check it.

A records directory holds (docs/records.md specifies every byte):

- ``part-00000``, ``part-00001``, ...: the samples' bytes, back to back, no framing.
- ``index.npy``: one row per sample, a NumPy ``.npy`` file of the structured dtype
  :data:`INDEX_DTYPE`: the part number, the byte offset in it, the length, and the
  CRC-32 of the sample's bytes.
- ``field-<name>.npy``: one ``.npy`` array per named fixed-size field (a label, ...),
  whose first dimension is the sample.
- ``records.json``: the metadata (format name and version, the sample count, every
  part's size and CRC-32, the fields, the class names). Written last: a directory
  without it is not a dataset.

Everything is readable with ``numpy.load(..., mmap_mode="r")``, ``json`` and ``mmap``.
"""

from __future__ import annotations

import json
import os
from typing import Any

import numpy as np

from ..errors import RecordCorruptError, RecordFormatError  # noqa: F401  (raised here, defined with the rest)

FORMAT = "shmload-records"
VERSION = 1
METADATA = "records.json"
INDEX = "index.npy"
INDEX_DTYPE = np.dtype([("part", "<u4"), ("offset", "<u8"), ("length", "<u8"), ("crc32", "<u4")])
DEFAULT_PART_BYTES = 256 << 20


def part_name(number: int) -> str:
    return f"part-{number:05d}"


def field_file(name: str) -> str:
    return f"field-{name}.npy"


def check_field_name(name: Any) -> str:
    if not isinstance(name, str) or not name or not all(c.isalnum() or c in "_-" for c in name):
        raise ValueError(f"a field name should be a non-empty string of letters, digits, '_' and '-' (it names a "
                         f"file), but got {name!r}")
    return name


def read_metadata(path: str) -> dict:
    """The directory's metadata, checked: a clear error for anything that is not a
    version-1 records directory."""
    meta_path = os.path.join(path, METADATA)
    if not os.path.isdir(path):
        raise FileNotFoundError(f"RecordDataset: {path!r} is not a directory")
    try:
        with open(meta_path, encoding="utf-8") as f:
            meta = json.load(f)
    except FileNotFoundError:
        partial = " (a '.partial' directory is what an interrupted `shmload pack` leaves: pack again)" \
            if ".partial" in os.path.basename(os.path.normpath(path)) else ""
        raise RecordFormatError(f"{path!r} is not a records directory: it has no {METADATA}{partial}") from None
    except ValueError as exc:
        raise RecordFormatError(f"{meta_path!r} is not valid JSON: {exc}") from None
    if not isinstance(meta, dict) or meta.get("format") != FORMAT:
        raise RecordFormatError(f"{meta_path!r} does not describe a {FORMAT} directory")
    if meta.get("version") != VERSION:
        raise RecordFormatError(f"{path!r} is {FORMAT} version {meta.get('version')!r}; this shmload reads "
                                f"version {VERSION}")
    return meta


def write_metadata(path: str, meta: dict) -> None:
    tmp = os.path.join(path, METADATA + ".tmp")
    with open(tmp, "w", encoding="utf-8") as f:
        json.dump(meta, f, indent=1)
        f.write("\n")
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, os.path.join(path, METADATA))
