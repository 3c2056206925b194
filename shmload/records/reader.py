"""Read a records directory as a map-style dataset, straight from the page cache.

The index and the fields are ``np.load(..., mmap_mode="r")`` arrays and every part is
one read-only ``mmap``: opening a dataset of a million samples reads the metadata and
maps three files, no directory scan (0.65 ms, against 1.9 s to scan 1.3M files). A
sample is a view of its part's mapping, so the bytes reach your code without a copy, and all workers and all
ranks on a node share those pages (forked workers inherit the mappings; spawned ones
map the same files again). Nothing per sample lives in Python objects, so forked workers
do not copy pages by touching reference counts (see ``datasets/folder.py``).

Checks: at open, that the index has a row per sample and every part has the size the
metadata says (a truncated part is named); at each read, that the sample lies inside
its part, and (``verify=True``, the default) that its CRC-32 is the one recorded
(a flipped bit is named with its part, sample and offset). :meth:`RecordDataset.verify`
checks every part's CRC-32 at once.
"""

from __future__ import annotations

import io
import mmap
import os
import zlib
from typing import Any, Callable, Sequence

import numpy as np

from . import format as fmt


class RecordDataset:
    """A records directory (``shmload.records.write``, ``shmload pack``) as a map-style dataset.

    ``dataset[i]`` is ``(data, field, ...)`` with the fields in the order they were
    written (just ``data`` if there are none), like ``ImageFolder``'s ``(image,
    label)``. ``data`` is the sample's bytes as a read-only uint8 array viewing the
    mapped part; with ``image=True`` a PIL image opened on them (not decoded yet: the
    reduced-size decoding of ``shmload.transforms`` still applies); then
    ``transform(data)`` if given (Pillow reads from a ``BytesIO``, which copies the
    encoded bytes once: 1.4 µs for 54 KB). ``verify`` checks each sample's CRC-32 as it
    is read (zlib: 3.6 GB/s here, 15 µs for a 54 KB JPEG against ~2 ms of decoding and
    transforms; no measurable cost in ``benchmarks/records.py``).
    """

    def __init__(self, path: str | os.PathLike, transform: Callable | None = None, image: bool = False,
                 verify: bool = True):
        self.path = os.path.abspath(os.fspath(path))
        self.transform, self.image, self.verify_samples = transform, image, verify
        meta = fmt.read_metadata(self.path)
        self.metadata = meta
        self.classes: list[str] | None = meta.get("classes")
        self.class_to_idx = {c: i for i, c in enumerate(self.classes)} if self.classes is not None else None
        self.field_names = [f["name"] for f in meta["fields"]]
        self._part_sizes = [int(p["bytes"]) for p in meta["parts"]]
        self._load()

    def _load(self) -> None:
        """Map the index and fields, and check that the pieces hold together."""
        meta, n = self.metadata, int(self.metadata["samples"])
        index = np.load(os.path.join(self.path, fmt.INDEX), mmap_mode="r")
        if index.dtype != fmt.INDEX_DTYPE or index.shape != (n,):
            raise fmt.RecordFormatError(f"{os.path.join(self.path, fmt.INDEX)!r} holds {index.shape} rows of "
                                        f"{index.dtype}, expected ({n},) rows of {fmt.INDEX_DTYPE} "
                                        f"({meta['samples']} samples)")
        self.index = index
        self.fields: dict[str, np.ndarray] = {}
        for spec in meta["fields"]:
            arr = np.load(os.path.join(self.path, fmt.field_file(spec["name"])), mmap_mode="r")
            if arr.shape != (n, *spec["shape"]) or arr.dtype != np.dtype(spec["dtype"]):
                raise fmt.RecordFormatError(f"field {spec['name']!r} holds {arr.shape} of {arr.dtype}, expected "
                                            f"{(n, *spec['shape'])} of {spec['dtype']}")
            self.fields[spec["name"]] = arr
        for number, expected in enumerate(self._part_sizes):
            name = fmt.part_name(number)
            try:
                size = os.stat(os.path.join(self.path, name)).st_size
            except FileNotFoundError:
                raise fmt.RecordFormatError(f"part {name} of {self.path!r} is missing") from None
            if size != expected:
                raise fmt.RecordFormatError(f"part {name} of {self.path!r} has {size} bytes, but {expected} were "
                                            f"written: it is {'truncated' if size < expected else 'longer'}")
        self._maps: list[mmap.mmap | None] = [None] * len(self._part_sizes)

    @property
    def decodes_images(self) -> bool:
        """Whether samples are images to decode (``image=True``): what the profiler reads to
        name the stage (profiler/stats.py)."""
        return bool(self.image)

    def __len__(self) -> int:
        return len(self.index)

    # ------------------------------------------------------------ reading
    def _part(self, number: int) -> mmap.mmap:
        m = self._maps[number]
        if m is None:
            with open(os.path.join(self.path, fmt.part_name(number)), "rb") as f:
                size = self._part_sizes[number]
                m = mmap.mmap(f.fileno(), size, access=mmap.ACCESS_READ) if size else mmap.mmap(-1, 1)
            self._maps[number] = m
        return m

    def data(self, i: int) -> np.ndarray:
        """Sample ``i``'s bytes: a read-only uint8 view of its part, checked."""
        n = len(self.index)
        if not -n <= i < n:
            raise IndexError(f"RecordDataset index {i} is out of range for {n} samples")
        i = int(i) % n if n else i
        part, offset, length, crc = self.index[i]
        part, offset, length = int(part), int(offset), int(length)
        if part >= len(self._part_sizes) or offset + length > self._part_sizes[part]:
            raise fmt.RecordCorruptError(
                f"sample {i} of {self.path!r} is recorded at part {part}, bytes {offset}..{offset + length}, outside "
                f"the part ({self._part_sizes[part] if part < len(self._part_sizes) else 'no such part'}): the index "
                "is corrupt")
        view = np.frombuffer(self._part(part), np.uint8, length, offset)
        if self.verify_samples and zlib.crc32(view.data) != int(crc):
            raise fmt.RecordCorruptError(
                f"sample {i} of {self.path!r} is corrupt: its bytes {offset}..{offset + length} in part "
                f"{fmt.part_name(part)} have CRC-32 {zlib.crc32(view.data):08x}, but {int(crc):08x} was written")
        return view

    def __getitem__(self, i: int) -> Any:
        data: Any = self.data(i)
        if self.image:
            from PIL import Image

            data = Image.open(io.BytesIO(data))
        if self.transform is not None:
            data = self.transform(data)
        if not self.fields:
            return data
        return (data, *(self._field_value(arr[i]) for arr in self.fields.values()))

    def __getitems__(self, indices: Sequence[int]) -> list:
        """A whole batch: the fields gathered with one ``take`` per field."""
        idx = np.asarray(indices, dtype=np.int64)
        if len(idx) and (idx.min() < -len(self) or idx.max() >= len(self)):
            bad = idx[(idx < -len(self)) | (idx >= len(self))][0]
            raise IndexError(f"RecordDataset index {bad} is out of range for {len(self)} samples")
        columns = [np.take(arr, idx, axis=0) for arr in self.fields.values()]
        out = []
        for k, i in enumerate(idx.tolist()):
            data: Any = self.data(i)
            if self.image:
                from PIL import Image

                data = Image.open(io.BytesIO(data))
            if self.transform is not None:
                data = self.transform(data)
            out.append((data, *(self._field_value(col[k]) for col in columns)) if columns else data)
        return out

    @staticmethod
    def _field_value(value: Any) -> Any:
        return value.item() if isinstance(value, np.generic) else np.array(value)

    # ------------------------------------------------------------ checks
    def verify(self) -> None:
        """Check every part's CRC-32 against the metadata (reads every byte once)."""
        for number, part in enumerate(self.metadata["parts"]):
            crc = zlib.crc32(self._part(number)) if part["bytes"] else 0
            if crc != part["crc32"]:
                raise fmt.RecordCorruptError(f"part {part['name']} of {self.path!r} is corrupt: CRC-32 {crc:08x}, but "
                                             f"{part['crc32']:08x} was written")

    def part_of(self) -> np.ndarray:
        """Each sample's part number (for locality-aware samplers)."""
        return np.asarray(self.index["part"])

    # ------------------------------------------------------------ processes
    def __getstate__(self) -> dict:
        """Pickled for spawn/forkserver workers: the path and options, not the mappings."""
        state = self.__dict__.copy()
        for key in ("index", "fields", "_maps"):
            state.pop(key)
        return state

    def __setstate__(self, state: dict) -> None:
        self.__dict__.update(state)
        self._load()

    def close(self) -> None:
        for k, m in enumerate(self._maps):
            if m is not None:
                try:
                    m.close()
                except BufferError:  # a view of it is still alive: the mapping goes with it
                    pass
                self._maps[k] = None

    def __repr__(self) -> str:
        return (f"RecordDataset({self.path!r}: {len(self)} samples in {len(self._part_sizes)} parts, fields "
                f"{self.field_names})")
