"""Read a dataset split across CSV part files with a custom iterable source.

    python examples/csv_part_files.py [--dir DIR] [--write N] [--workers 2] [--batch-size 256]
                                      [--shuffle-buffer N]

The classic custom reader: two comma-separated columns of numbers, ``x,y``, one sample
per line, split across files ``part-000``, ``part-001``, ... in a directory (as Spark,
Hadoop or a sharded export write them). :class:`CsvParts` reads them as a stream (it has
``__iter__`` and no ``__getitem__``), so ``shmload.DataLoader`` gives each worker its own
copy of it, and each copy reads its own share of the files.

Sharding, by file. Every worker of every rank is one *reader*:

    reader  = rank * num_workers + worker id        (0 .. readers - 1)
    readers = world_size * num_workers

and reader ``r`` reads ``files[r::readers]``, each file from its first line to its last
(``shmload.stream_parts(files)`` makes that share; with ``--shuffle-buffer N`` the loader
shuffles: ``files`` are first put in each epoch's order, the same permutation in every
worker and on every rank, and each worker's lines go through a buffer of N).
Together the readers read every file once, and no two read the same one. Why by file,
not by line: to give reader ``r`` every ``readers``-th line, each reader would have to
read (and skip) every line of every file, and a file cannot be cut at a byte offset
without reading it to find where its lines start. So a file is the unit of work. With
fewer files than readers, some readers get none: their streams end at once and the
loader's round-robin goes on without them, which is fine, if wasteful (write at least as
many parts as readers, preferably many more, so the shares are about even). The worker
comes from ``shmload.get_worker_info()`` (None in the main process, where
``num_workers=0`` reads: one reader per rank), the rank and world size from
``shmload._ordering.distributed.world()`` (torch.distributed when initialized, else the ``RANK``
and ``WORLD_SIZE`` environment that torchrun sets), or rank 0 of 1 without either.

The loader asks each worker for a batch in turn (worker 0's first batch, worker 1's
first, ...; a worker whose files are all read drops out), so the order of the batches
is the same on every run with the same ``--workers``. Each worker batches its own
stream: the last batch of each worker may be short. Under distributed training the
ranks get different numbers of lines (the files differ): DDP needs the same number of
steps on every rank, so stop at the shortest rank's count (or use DDP's ``join()``).

``CsvParts`` has no ``__len__``: the number of lines is known only once every file has
been read, which is the work the loader is for (file sizes do not tell it). So
``len(loader)`` raises ``TypeError``, as torch's does for a stream without a length.
It has ``state_dict()``/``load_state_dict()``: where its reader is (which of its files,
and how many lines of it were read), so ``loader.state_dict()`` in the middle of an
epoch, then ``load_state_dict()`` in a new loader with the same ``num_workers``,
continues with exactly the batches that were still to come, shuffled or not.

A malformed line raises ``ValueError`` naming the file and the line number, in the
worker; the loader raises it again in the main process.

What the script does:

1. Without ``--dir``, writes ``--write`` (default 8) synthetic part files of ``--lines``
   (default 4000) lines of ``y = 3x + 1 + noise`` to a temporary directory (removed at
   the end). With ``--dir`` and ``--write N``, writes N parts there (the directory must
   not have part files yet); with ``--dir`` alone, reads the part files already there.
2. Reads every line through ``shmload.DataLoader`` with ``--workers`` workers, and
   prints the throughput and a least-squares fit of y on x (on the synthetic data:
   slope about 3, intercept about 1).
3. Checks that every line was read exactly once: the count of lines and the exact sums
   of x and of y (``math.fsum``, which does not depend on the order) equal those of a
   direct read of the same files in the main process. Exits with status 0 if so, 1 if
   not (or if a line is malformed), 2 for a command-line error.

Run it as rank 1 of 2 (``RANK=1 WORLD_SIZE=2 python examples/csv_part_files.py --dir
DIR``) to read that rank's share only; the check then covers that share. Needs numpy
and shmload only.
"""

from __future__ import annotations

import argparse
import math
import os
import re
import sys
import tempfile
import time
from typing import Any, Iterator

import numpy as np

import shmload
import shmload._ordering.distributed
from shmload._ordering.shuffle import parts_order

PART_NAME = re.compile(r"part-(\d+)(\.csv)?")  # part-000, part-001, ... (part-00000.csv too)
FLOAT32_MAX = float(np.finfo(np.float32).max)


# ---------------------------------------------------------------- the files
def part_files(directory: str) -> list[str]:
    """The names of the part files in ``directory``, in the order of their numbers."""
    found = []
    for name in os.listdir(directory):
        match = PART_NAME.fullmatch(name)
        if match and os.path.isfile(os.path.join(directory, name)):
            found.append((int(match.group(1)), name))
    return [name for _, name in sorted(found)]


def parse_line(text: str, path: str, lineno: int) -> tuple[np.float32, np.float32] | None:
    """The ``(x, y)`` of one line, or None for a blank one; a ``ValueError`` naming the
    file and the line (counted from 1) if it is not two comma-separated finite numbers."""
    if not text.strip():
        return None
    try:
        x, y = (float(field) for field in text.split(","))  # ValueError: not 2 fields, or not numbers
    except ValueError:
        x = y = math.nan
    # (nan and inf would spoil the fit and the check; beyond float32's range is inf)
    if not all(math.isfinite(v) and abs(v) <= FLOAT32_MAX for v in (x, y)):
        raise ValueError(f"{path}, line {lineno}: expected two comma-separated finite numbers x,y, "
                         f"but got {text.rstrip(chr(10))!r}")
    return np.float32(x), np.float32(y)


def write_parts(directory: str, parts: int, lines: int, seed: int = 0) -> None:
    """Write ``parts`` files of ``lines`` lines ``x,y`` with y = 3x + 1 + noise."""
    rng = np.random.default_rng(seed)
    width = max(3, len(str(parts - 1)))
    for p in range(parts):
        x = rng.uniform(-10, 10, lines)
        y = 3 * x + 1 + rng.normal(0, 0.5, lines)
        np.savetxt(os.path.join(directory, f"part-{p:0{width}d}"), np.column_stack([x, y]),
                   fmt="%.6f", delimiter=",")


def world() -> tuple[int, int]:
    """(world size, rank): torch.distributed's or the RANK/WORLD_SIZE environment's,
    else a single process, rank 0 of 1."""
    try:
        size, rank, _ = shmload._ordering.distributed.world()
    except RuntimeError:  # neither is set: not a distributed run
        return 1, 0
    return size, rank


# ---------------------------------------------------------------- the source
class _Cursor:
    """Where one iteration is: ``file`` indexes the reader's own files, ``line`` is the
    number of lines of that file read (and handed out) so far."""

    def __init__(self, reader: int, readers: int, files: list[str], file: int = 0, line: int = 0):
        self.reader, self.readers, self.files, self.file, self.line = reader, readers, files, file, line


class CsvParts:
    """The lines ``x,y`` of the part files in ``directory``, each sample a dict
    ``{"x": np.float32, "y": np.float32}``, sharded by file across the workers of every
    rank (see the module's docstring). ``rank``/``world_size`` default to
    :func:`world`'s, read when the source is made (in the main process)."""

    def __init__(self, directory: str, rank: int | None = None, world_size: int | None = None):
        self.directory = os.fspath(directory)
        self.files = part_files(self.directory)  # listed once, here: every worker gets the same list
        if not self.files:
            raise FileNotFoundError(f"no part files (part-000, part-001, ...) in {self.directory}")
        if rank is None or world_size is None:
            found_size, found_rank = world()
            world_size = found_size if world_size is None else world_size
            rank = found_rank if rank is None else rank
        if not 0 <= rank < world_size:
            raise ValueError(f"rank {rank} is not in [0, {world_size - 1}] (world size {world_size})")
        self.rank, self.world_size = int(rank), int(world_size)
        self._cursor: _Cursor | None = None  # the running iteration's position
        self._resume: dict | None = None  # from load_state_dict(), for the next iter()

    def reader(self) -> tuple[int, int]:
        """(this reader's id, the number of readers): from the worker reading this copy
        (``shmload.get_worker_info()``) and the rank."""
        info = shmload.get_worker_info()
        workers, worker = (1, 0) if info is None else (info.num_workers, info.id)
        return self.rank * workers + worker, self.world_size * workers

    def my_files(self) -> list[str]:
        """The files this reader reads this epoch (maybe none), in the order it reads them:
        ``files[reader::readers]``, of the epoch's order of ``files`` when the loader
        shuffles (``shmload.stream_parts``)."""
        return shmload.stream_parts(self.files, rank=self.rank, world_size=self.world_size)

    def __iter__(self) -> Iterator[dict[str, Any]]:
        # Not a generator function: the position must be taken now, not at the first next()
        # (the loader calls load_state_dict(), then iter(), then state_dict() after each batch).
        reader, readers = self.reader()
        cursor = _Cursor(reader, readers, self.my_files())
        state, self._resume = self._resume, None
        if state is not None:
            self._check_state(state, cursor)
            cursor.file, cursor.line = state["file"], state["line"]
        self._cursor = cursor
        return self._read(cursor)

    def _read(self, cursor: _Cursor) -> Iterator[dict[str, Any]]:
        files = cursor.files
        while cursor.file < len(files):
            path = os.path.join(self.directory, files[cursor.file])
            skip = cursor.line  # lines read before a resume
            with open(path, encoding="utf-8") as f:
                for lineno, text in enumerate(f, 1):
                    if lineno <= skip:
                        continue
                    cursor.line = lineno  # counted before the yield: the state after it says "read"
                    sample = parse_line(text, path, lineno)
                    if sample is not None:
                        yield {"x": sample[0], "y": sample[1]}
            cursor.file, cursor.line = cursor.file + 1, 0

    # ------------------------------------------------------------ resume
    def state_dict(self) -> dict:
        """Where this copy's reader is: which of its files (``file``, an index into
        ``my_files()``, and its ``name``) and how many of its lines were read."""
        if self._resume is not None:
            return dict(self._resume)  # loaded, not iterated yet
        cursor = self._cursor or _Cursor(*self.reader(), self.my_files())
        files = cursor.files
        return {"reader": cursor.reader, "readers": cursor.readers, "file": cursor.file,
                "name": files[cursor.file] if cursor.file < len(files) else None, "line": cursor.line}

    def load_state_dict(self, state: dict) -> None:
        """Make the next ``iter()`` continue where ``state`` (from :meth:`state_dict`) was."""
        missing = [k for k in ("reader", "readers", "file", "name", "line") if k not in state]
        if missing:
            raise ValueError(f"CsvParts.load_state_dict: the state has no {', '.join(missing)}: {state!r}")
        self._resume = dict(state)

    def _check_state(self, state: dict, cursor: _Cursor) -> None:
        reader, readers = cursor.reader, cursor.readers
        if (state["reader"], state["readers"]) != (reader, readers):
            raise ValueError(f"CsvParts: the state was saved by reader {state['reader']} of {state['readers']}, "
                             f"but this is reader {reader} of {readers}: resume with the same number of "
                             "workers and ranks")
        files = cursor.files
        name = files[state["file"]] if 0 <= state["file"] < len(files) else None
        if name != state["name"]:
            raise ValueError(f"CsvParts: the state was saved at {state['name']} (file {state['file']} of reader "
                             f"{reader}), which is {name} now: the part files in {self.directory} changed")

    def __repr__(self) -> str:
        return (f"CsvParts({self.directory!r}: {len(self.files)} part files, rank {self.rank} of "
                f"{self.world_size})")


# ---------------------------------------------------------------- the check
def read_directly(source: CsvParts, files: list[str]) -> tuple[int, float, float]:
    """(lines, sum of x, sum of y) of ``files``, read here, without the loader."""
    xs: list[float] = []
    ys: list[float] = []
    for name in files:
        path = os.path.join(source.directory, name)
        with open(path, encoding="utf-8") as f:
            for lineno, text in enumerate(f, 1):
                sample = parse_line(text, path, lineno)
                if sample is not None:
                    xs.append(float(sample[0]))
                    ys.append(float(sample[1]))
    return len(xs), math.fsum(xs), math.fsum(ys)


def rank_files(source: CsvParts, num_workers: int, shuffled: bool, epoch: int = 0) -> list[str]:
    """The files the readers of this rank read in ``epoch``, with ``num_workers`` workers:
    the rank's readers' shares of the files, in the epoch's order if the loader shuffles
    (``stream_parts`` seeds that order by the loader's seed, or 0 when none is given as
    here, and the epoch: the same on every rank)."""
    workers = max(1, num_workers)
    readers = source.world_size * workers
    order = source.files
    if shuffled:
        order = [source.files[i] for i in parts_order(len(source.files), 0, epoch).tolist()]
    mine = {name for w in range(workers) for name in order[source.rank * workers + w::readers]}
    return [name for name in source.files if name in mine]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--dir", help="the directory of part files (default: a temporary one, written and removed)")
    parser.add_argument("--write", type=int, metavar="N",
                        help="write N synthetic part files first (default 8 without --dir, none with it)")
    parser.add_argument("--lines", type=int, default=4000, help="lines per written part file (default 4000)")
    parser.add_argument("--workers", type=int, default=2, help="loader worker processes (default 2)")
    parser.add_argument("--batch-size", type=int, default=256)
    parser.add_argument("--seed", type=int, default=0, help="seed of the synthetic data's noise (default 0)")
    parser.add_argument("--shuffle-buffer", type=int, default=0, metavar="N",
                        help="shuffle the files and, through a buffer of N lines per worker, the lines "
                             "(default 0: in file order)")
    args = parser.parse_args()
    if args.write is not None and args.write < 1:
        parser.error("--write should be at least 1")
    if args.lines < 1 or args.batch_size < 1 or args.workers < 0 or args.shuffle_buffer < 0:
        parser.error("--lines and --batch-size should be at least 1, --workers and --shuffle-buffer at least 0")
    if args.dir is not None and args.write is not None and os.path.isdir(args.dir) and part_files(args.dir):
        parser.error(f"{args.dir} has part files already: leave out --write to read them, or write elsewhere")

    with tempfile.TemporaryDirectory(prefix="shmload-csv-") as tmp:
        directory = args.dir if args.dir is not None else tmp
        parts = args.write if args.write is not None else (8 if args.dir is None else 0)
        if parts:
            os.makedirs(directory, exist_ok=True)
            write_parts(directory, parts, args.lines, args.seed)
            print(f"wrote {parts} part files of {args.lines} lines of y = 3x + 1 + noise to {directory}")
        try:
            return read(CsvParts(directory), args)
        except (FileNotFoundError, ValueError) as exc:  # no part files, a malformed line
            print(f"error: {exc}", file=sys.stderr)
            return 1


def read(source: CsvParts, args: argparse.Namespace) -> int:
    workers = max(1, args.workers)
    readers = source.world_size * workers
    shuffled = args.shuffle_buffer > 1
    print(f"{source}; {workers} reader(s) per rank ({args.workers} workers), {readers} in all; "
          f"reader r reads files[r::{readers}]"
          + (f" of each epoch's order of files, through a shuffle buffer of {args.shuffle_buffer} lines"
             if shuffled else ""))

    xs, ys, batches = [], [], 0
    start = time.perf_counter()
    with shmload.DataLoader(source, batch_size=args.batch_size, num_workers=args.workers,
                            shuffle_buffer=args.shuffle_buffer) as loader:
        for batch in loader:
            # batch["x"], batch["y"]: float32 [B] (B = batch size, less for a worker's last
            # batch), views into shared memory: copied, since they are kept.
            xs.append(batch["x"].copy())
            ys.append(batch["y"].copy())
            batches += 1
    elapsed = time.perf_counter() - start
    x = np.concatenate(xs) if xs else np.zeros(0, np.float32)
    y = np.concatenate(ys) if ys else np.zeros(0, np.float32)
    files = rank_files(source, args.workers, shuffled)
    nbytes = sum(os.path.getsize(os.path.join(source.directory, name)) for name in files)
    print(f"read {len(x)} lines of {len(files)} files in {batches} batches in {elapsed:.2f} s "
          f"({len(x) / elapsed:,.0f} lines/s, {nbytes / elapsed / 1e6:.1f} MB/s)")

    if len(x) >= 2:
        design = np.column_stack([x.astype(np.float64), np.ones(len(x))])
        (slope, intercept), *_ = np.linalg.lstsq(design, y.astype(np.float64), rcond=None)
        print(f"least-squares fit: y = {slope:.4f} * x {'+' if intercept >= 0 else '-'} {abs(intercept):.4f}")

    expected = read_directly(source, files)
    got = (len(x), math.fsum(x.tolist()), math.fsum(y.tolist()))
    if got != expected:
        print(f"NOT every line was read exactly once: the loader gave {got[0]} lines, sum x {got[1]!r}, sum y "
              f"{got[2]!r}; the files hold {expected[0]} lines, sum x {expected[1]!r}, sum y {expected[2]!r}",
              file=sys.stderr)
        return 1
    print(f"check: every line read exactly once ({expected[0]} lines; the sums of x and y equal a direct read's)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
