"""Write a records directory: from any indexable source, in parallel, all or nothing.

Why all or nothing: a pack of ImageNet takes long enough to be interrupted. Everything is
written into a sibling directory ``OUT.partial-<random>``, the metadata last, every file
fsynced, and the finished directory is renamed to ``OUT`` in one ``rename``: ``OUT`` either does not
exist or is complete. An interrupted pack leaves only the ``.partial`` directory (an
exception removes it; a SIGKILL cannot), which no reader mistakes for a dataset.

Why in parallel: reading a million small files is bound by the file system's per-file
latency and by one core's ``read`` calls. Worker ``k`` of ``W`` writes the ``k``-th
contiguous share of the samples into its own parts; the parts are numbered in order
afterwards, so the result does not depend on ``W`` except where the shares end (each
share's last part may be smaller than the target).
"""

from __future__ import annotations

import itertools
import multiprocessing
import os
import secrets
import shutil
import sys
import time
import zlib
from typing import Any, Callable, Iterable, Iterator, NamedTuple

import numpy as np

from .._version import __version__
from . import format as fmt


class FieldSpec(NamedTuple):
    name: str
    dtype: str
    shape: tuple[int, ...]


class _Share(NamedTuple):
    """What one worker wrote: its parts (temporary names, sizes, CRCs) and its index rows
    (with part numbers local to the share) and field values."""

    parts: list[tuple[str, int, int]]
    index_rows: np.ndarray  # (not ``index``, which would hide tuple.index)
    fields: dict[str, np.ndarray]


def split_sample(item: Any, position: int) -> tuple[Any, dict]:
    """A source's item as (bytes-like, fields): bytes, or ``(bytes, {name: value})``."""
    if isinstance(item, tuple) and len(item) == 2 and isinstance(item[1], dict):
        data, fields = item
    else:
        data, fields = item, {}
    if isinstance(data, np.ndarray):
        if data.dtype != np.uint8 or data.ndim != 1:
            raise TypeError(f"records.write: sample {position}'s data is an array of dtype {data.dtype} and shape "
                            f"{data.shape}, expected bytes or a 1-D uint8 array")
        data = np.ascontiguousarray(data)
    elif not isinstance(data, (bytes, bytearray, memoryview)):
        raise TypeError(f"records.write: sample {position} is a {type(data).__name__}, expected bytes (or a 1-D uint8 "
                        "array), or a tuple (bytes, {field name: value})")
    return data, fields


def infer_fields(fields: dict) -> list[FieldSpec]:
    specs = []
    for name, value in fields.items():
        fmt.check_field_name(name)
        arr = np.asarray(value)
        if arr.dtype == object or arr.dtype.kind in "USV":
            raise TypeError(f"records.write: field {name!r} is {type(value).__name__} {value!r}; fields are numbers "
                            "or fixed-size numeric arrays (store strings in the data, or a class index)")
        specs.append(FieldSpec(name, arr.dtype.newbyteorder("<").str, tuple(arr.shape)))
    return specs


def _indexed(source: Any, start: int, stop: int) -> Iterator[tuple[int, Any]]:
    for i in range(start, stop):
        yield i, source[i]


def _write_share(items: Iterable[tuple[int, Any]], capacity: int, tmp_dir: str, share: int, part_bytes: int,
                 specs: list[FieldSpec], advance: Callable[[int], None] | None = None) -> _Share:
    """Write ``items`` ((position, sample) pairs) into this share's parts. ``capacity``:
    the number expected (the arrays grow if more come, as from an iterable source).
    ``advance(n)`` is told every 64 samples written, for the progress bar."""
    capacity = max(1, capacity)
    index = np.zeros(capacity, fmt.INDEX_DTYPE)
    fields = {s.name: np.zeros((capacity,) + s.shape, s.dtype) for s in specs}
    parts: list[tuple[str, int, int]] = []
    f = None
    name = ""
    size = crc = 0
    done = 0
    try:
        for k, (i, item) in enumerate(items):
            if k == len(index):
                index = np.resize(index, 2 * k)
                fields = {key: np.resize(arr, (2 * k,) + arr.shape[1:]) for key, arr in fields.items()}
            data, values = split_sample(item, i)
            if set(values) != set(fields):
                raise ValueError(f"records.write: sample {i} has fields {sorted(values)}, but sample 0 has "
                                 f"{sorted(fields)}: every sample needs the same fields")
            for field, value in values.items():
                try:
                    fields[field][k] = value
                except (ValueError, TypeError) as exc:
                    spec = next(s for s in specs if s.name == field)
                    raise ValueError(f"records.write: field {field!r} of sample {i} is {value!r}, expected "
                                     f"{spec.dtype} of shape {spec.shape} like sample 0's ({exc})") from None
            n = memoryview(data).nbytes
            if f is None or (size and size + n > part_bytes):
                if f is not None:
                    _close_synced(f)
                    parts.append((name, size, crc))
                name = os.path.join(tmp_dir, f"share{share:05d}-{len(parts):05d}")
                f = open(name, "wb")
                size = crc = 0
            sample_crc = zlib.crc32(data)
            f.write(data)
            index[k] = (len(parts), size, n, sample_crc)
            crc = zlib.crc32(data, crc)
            size += n
            done += 1
            if advance is not None and done % 64 == 0:
                advance(64)
        if f is not None:
            _close_synced(f)
            f = None
            parts.append((name, size, crc))
    finally:
        if f is not None:
            f.close()
        if advance is not None and done % 64:
            advance(done % 64)
    return _Share(parts, index[:done], {key: arr[:done] for key, arr in fields.items()})


def _close_synced(f: Any) -> None:
    """Close a written file after its data reached the disk: the final rename must not
    publish a directory whose parts a power cut could still lose."""
    f.flush()
    os.fsync(f.fileno())
    f.close()


def _sync_file(path: str) -> None:
    with open(path, "rb") as f:
        os.fsync(f.fileno())


_pool_counter: Any = None


def _init_pool(counter: Any) -> None:
    global _pool_counter
    _pool_counter = counter


def _add_to_pool_counter(n: int) -> None:
    with _pool_counter.get_lock():
        _pool_counter.value += n


def _pool_share(args: tuple) -> _Share:
    source, start, stop, tmp_dir, share, part_bytes, specs = args  # (a job of _write_shares)
    return _write_share(_indexed(source, start, stop), stop - start, tmp_dir, share, part_bytes, specs,
                        advance=_add_to_pool_counter)


def write(source: Any, out_dir: str | os.PathLike, *, part_bytes: int = fmt.DEFAULT_PART_BYTES, workers: int = 0,
          classes: list[str] | None = None, progress: bool | Callable[[int, int], None] = False,
          multiprocessing_context: Any = None) -> str:
    """Pack ``source`` into a new records directory ``out_dir``; returns its path.

    ``source`` is a dataset (indexable, with ``len()``) or an iterable; each sample is
    its bytes (``bytes``, ``bytearray``, ``memoryview`` or a 1-D uint8 array), or
    ``(bytes, {name: value})`` with the same named fixed-size numeric fields for every
    sample (an int label, a float array of a fixed shape). An iterable is written by
    this process (it cannot be split without reading it). Samples are written as they are (JPEG bytes stay
    JPEG). Parts are cut before ``part_bytes`` would be exceeded (a larger sample gets a
    part of its own). ``workers`` > 0 writes in that many processes. ``classes`` (names)
    is kept in the metadata. ``progress``: True draws a bar on stderr, or a function
    ``progress(done, total)``.

    ``out_dir`` must not exist: it appears complete, in one rename, or not at all.
    """
    out_dir = os.path.abspath(os.fspath(out_dir))
    if os.path.lexists(out_dir):
        raise FileExistsError(f"records.write: {out_dir!r} exists already; a records directory is written whole, "
                              "into a new path (remove the old one first)")
    if not isinstance(part_bytes, int) or part_bytes < 1:
        raise ValueError(f"part_bytes should be a positive integer, but got part_bytes={part_bytes!r}")
    if not isinstance(workers, int) or workers < 0:
        raise ValueError(f"workers should be a non-negative integer, but got workers={workers!r}")
    if hasattr(source, "__getitem__") and hasattr(source, "__len__"):
        total = len(source)
        specs = infer_fields(split_sample(source[0], 0)[1]) if total else []
    else:
        if workers:
            raise ValueError(f"records.write: workers={workers}, but an iterable source (a "
                             f"{type(source).__name__}) is read by one process: pass workers=0, or a dataset")
        iterator = iter(source)
        first = next(iterator, _END)
        specs = infer_fields(split_sample(first, 0)[1]) if first is not _END else []
        total = len(source) if hasattr(source, "__len__") else 0  # for the progress bar only
        source = _Stream(itertools.chain([first], iterator) if first is not _END else iter(()), total)
    parent = os.path.dirname(out_dir)
    os.makedirs(parent, exist_ok=True)
    tmp_dir = os.path.join(parent, f".{os.path.basename(out_dir)}.partial-{secrets.token_hex(4)}")
    os.mkdir(tmp_dir)
    try:
        shares = _write_shares(source, total, tmp_dir, part_bytes, specs, workers, progress, multiprocessing_context)
        _finish(shares, tmp_dir, total, specs, classes)
        os.rename(tmp_dir, out_dir)
        _sync_dir(parent)  # the rename itself
    except BaseException:
        shutil.rmtree(tmp_dir, ignore_errors=True)
        raise
    return out_dir


def _sync_dir(path: str) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _write_shares(source: Any, total: int, tmp_dir: str, part_bytes: int, specs: list[FieldSpec], workers: int,
                  progress: Any, context: Any) -> list[_Share]:
    report = _Progress(total, progress)
    if type(source) is _Stream or workers == 0 or total < 2:
        items = enumerate(source.items) if type(source) is _Stream else _indexed(source, 0, total)
        share = _write_share(items, total, tmp_dir, 0, part_bytes, specs, report.advance)
        report.close()
        return [share]
    workers = min(workers, total)
    bounds = np.linspace(0, total, workers + 1).astype(int).tolist()
    ctx = context if hasattr(context, "Pool") else multiprocessing.get_context(context)
    counter = ctx.Value("q", 0)
    jobs = [(source, bounds[k], bounds[k + 1], tmp_dir, k, part_bytes, specs) for k in range(workers)]
    with ctx.Pool(workers, initializer=_init_pool, initargs=(counter,)) as pool:
        pending = pool.map_async(_pool_share, jobs)
        while not pending.ready():
            pending.wait(0.2)
            report.update(counter.value)
        shares = pending.get()
    report.update(total)
    report.close()
    return shares


def _finish(shares: list[_Share], tmp_dir: str, total: int, specs: list[FieldSpec], classes: list[str] | None) -> None:
    """Number the parts in order, join the index and fields, write the metadata last."""
    parts_meta: list[dict[str, Any]] = []
    index_parts = []
    for share in shares:
        first = len(parts_meta)
        for tmp_name, size, crc in share.parts:
            name = fmt.part_name(len(parts_meta))
            os.rename(tmp_name, os.path.join(tmp_dir, name))
            parts_meta.append({"name": name, "bytes": size, "crc32": crc})
        rows = share.index_rows.copy()
        rows["part"] += first
        index_parts.append(rows)
    index = np.concatenate(index_parts) if index_parts else np.zeros(0, fmt.INDEX_DTYPE)
    np.save(os.path.join(tmp_dir, fmt.INDEX), index)
    _sync_file(os.path.join(tmp_dir, fmt.INDEX))
    for spec in specs:
        values = np.concatenate([share.fields[spec.name] for share in shares])
        np.save(os.path.join(tmp_dir, fmt.field_file(spec.name)), values)
        _sync_file(os.path.join(tmp_dir, fmt.field_file(spec.name)))
    meta = {"format": fmt.FORMAT, "version": fmt.VERSION, "samples": len(index), "parts": parts_meta,
            "fields": [{"name": s.name, "dtype": s.dtype, "shape": list(s.shape)} for s in specs],
            "classes": list(classes) if classes is not None else None,
            "created_by": f"shmload {__version__}", "created_at": time.strftime("%Y-%m-%dT%H:%M:%S%z")}
    fmt.write_metadata(tmp_dir, meta)


_END = object()


class _Stream(NamedTuple):
    """An iterable source, its first item put back."""

    items: Iterator[Any]
    total: int


class _Progress:
    def __init__(self, total: int, progress: Any):
        self.total, self.fn = total, progress if callable(progress) else None
        self.bar = progress is True
        self.started = time.monotonic()
        self._last = -1.0
        self._shown = -1
        self._written = 0  # counted in this process (advance); workers count in a shared Value

    def advance(self, n: int) -> None:
        self._written += n
        self.update(self._written)

    def update(self, done: int) -> None:
        now = time.monotonic()
        if done == self._shown or (now - self._last < 0.2 and done < self.total):
            return
        self._last, self._shown = now, done
        if self.fn is not None:
            self.fn(done, self.total)
        if self.bar:
            filled = int(30 * done / max(1, self.total))
            rate = done / max(1e-9, now - self.started)
            sys.stderr.write(f"\r[{'#' * filled}{'.' * (30 - filled)}] {done}/{self.total} samples, {rate:,.0f}/s  ")
            sys.stderr.flush()

    def close(self) -> None:
        if self.bar:
            sys.stderr.write("\n")
