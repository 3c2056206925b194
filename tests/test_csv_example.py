"""examples/csv_part_files.py: the script run as a subprocess, and its iterable source
``CsvParts`` (imported from the file) read by the loader in this process.

The in-process data: part files whose lines are ``id,2*id+1`` with ``id`` the line's
number over all files (0, 1, 2, ...), so which lines were read, and in what order, can be
told from the batches. The files have uneven lengths (one is empty, one holds a blank
line), and the first one exactly three batches of 16, so a saved position can fall at
the end of a file.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import re
import subprocess
import sys

import numpy as np
import pytest

import shmload
from shmload.testing import assert_resumes_exactly

from .scripts import describe, run_script

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
EXAMPLE = os.path.join(ROOT, "examples", "csv_part_files.py")
RUN_TIMEOUT = 45  # seconds for one run of the script; pytest's 60 s is the backstop
BATCH = 16
LENGTHS = [48, 120, 7, 88, 64, 0, 101]  # lines of part-000, part-001, ...
BLANK_AFTER = (3, 10)  # a blank line in part-003 after its 10th line


def load_example():
    spec = importlib.util.spec_from_file_location("csv_part_files", EXAMPLE)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # so that its classes pickle (spawn, forkserver)
    spec.loader.exec_module(module)
    return module


example = load_example()


@pytest.fixture(autouse=True)
def single_process(monkeypatch):
    """Not a distributed run, whatever the environment the tests run in."""
    monkeypatch.delenv("RANK", raising=False)
    monkeypatch.delenv("WORLD_SIZE", raising=False)


def write_ids(directory, lengths=LENGTHS) -> list[list[int]]:
    """Part files of lines ``id,2*id+1``; the ids of each file."""
    ids, start = [], 0
    for p, n in enumerate(lengths):
        file_ids = list(range(start, start + n))
        lines = [f"{i},{2 * i + 1}\n" for i in file_ids]
        if p == BLANK_AFTER[0]:
            lines.insert(BLANK_AFTER[1], "\n")
        with open(os.path.join(directory, f"part-{p:03d}"), "w") as f:
            f.writelines(lines)
        ids.append(file_ids)
        start += n
    return ids


def read_all(loader) -> list[np.ndarray]:
    """The x of every batch (copied), checking each batch's y against its x."""
    out = []
    for batch in loader:
        assert set(batch) == {"x", "y"}
        assert batch["x"].dtype == np.float32 and batch["x"].shape == batch["y"].shape
        np.testing.assert_array_equal(batch["y"], 2 * batch["x"] + 1)
        out.append(batch["x"].copy())
    return out


def expected_batches(ids: list[list[int]], readers: int, first_reader: int = 0, workers: int = 1) -> list[list[int]]:
    """What the loader should yield, worked out apart from the example: the workers of one
    rank are readers ``first_reader .. first_reader + workers - 1`` of ``readers``; reader r
    reads files[r::readers] one after the other, batched by BATCH (its last batch short),
    and the loader takes the workers' batches round-robin, a worker that ran out dropping out."""
    chunks = []
    for w in range(workers):
        stream = [i for file_ids in ids[first_reader + w::readers] for i in file_ids]
        chunks.append([stream[k:k + BATCH] for k in range(0, len(stream), BATCH)])
    out = []
    for k in range(max(len(c) for c in chunks)):
        out += [c[k] for c in chunks if k < len(c)]
    return out


def as_lists(batches: list[np.ndarray]) -> list[list[int]]:
    return [b.astype(np.int64).tolist() for b in batches]


# ---------------------------------------------------------------- the script
def run(args: list[str]) -> subprocess.CompletedProcess:
    """``python examples/csv_part_files.py *args``, outside any distributed job."""
    return run_script([EXAMPLE, *args], RUN_TIMEOUT, RANK=None, WORLD_SIZE=None)


def check_fit(stdout: str) -> None:
    match = re.search(r"least-squares fit: y = (-?\d+\.\d+) \* x ([+-]) (\d+\.\d+)", stdout)
    assert match, stdout
    slope, intercept = float(match[1]), float(match[3]) * (1 if match[2] == "+" else -1)
    assert abs(slope - 3) < 0.02 and abs(intercept - 1) < 0.05, stdout


@pytest.mark.parametrize("workers", [0, 2])
def test_the_script_recovers_the_line_and_reads_every_line_once(workers):
    result = run(["--workers", str(workers)])  # 8 parts of 4000 lines in a temporary directory
    assert result.returncode == 0, describe(result)
    check_fit(result.stdout)
    assert re.search(r"read 32000 lines of 8 files in \d+ batches", result.stdout), result.stdout
    assert "check: every line read exactly once (32000 lines" in result.stdout
    tmp = re.search(r"to (\S+)\n", result.stdout)[1]
    assert not os.path.exists(tmp)  # the temporary directory is removed


def test_the_script_with_more_readers_than_files(tmp_path):
    data = tmp_path / "data"
    result = run(["--dir", str(data), "--write", "3", "--lines", "2000", "--workers", "4", "--batch-size", "100"])
    assert result.returncode == 0, describe(result)
    assert sorted(os.listdir(data)) == ["part-000", "part-001", "part-002"]
    check_fit(result.stdout)
    assert "check: every line read exactly once (6000 lines" in result.stdout

    again = run(["--dir", str(data), "--workers", "2"])  # reads what is there
    assert again.returncode == 0, describe(again)
    assert "check: every line read exactly once (6000 lines" in again.stdout
    refused = run(["--dir", str(data), "--write", "2"])  # would mix with the parts there
    assert refused.returncode == 2 and "has part files already" in refused.stderr, describe(refused)


def test_the_script_names_a_malformed_line(tmp_path):
    write_ids(tmp_path)
    with open(tmp_path / "part-004", "a") as f:
        f.write("1.5;2.5\n")
    result = run(["--dir", str(tmp_path), "--workers", "2"])
    assert result.returncode == 1, describe(result)
    assert re.search(re.escape(str(tmp_path / "part-004")) + r", line 65: expected two comma-separated", result.stderr)


def test_the_check_fails_when_lines_are_read_twice(tmp_path, capsys):
    """The script's exactly-once check can fail: a source whose workers all read every file."""
    write_ids(tmp_path)

    class Unsharded(example.CsvParts):
        def my_files(self):
            return list(self.files)

    args = argparse.Namespace(workers=2, batch_size=BATCH, shuffle_buffer=0)
    assert example.read(Unsharded(str(tmp_path)), args) == 1
    assert f"the loader gave {2 * sum(LENGTHS)} lines" in capsys.readouterr().err
    assert example.read(example.CsvParts(str(tmp_path)), args) == 0


# ---------------------------------------------------------------- the source, in this process
@pytest.mark.parametrize("workers", [0, 2, 3, 9])
def test_every_line_once_in_a_deterministic_round_robin(tmp_path, workers):
    ids = write_ids(tmp_path)
    source = example.CsvParts(str(tmp_path))
    assert source.files == [f"part-{p:03d}" for p in range(len(LENGTHS))]
    runs = []
    for _ in range(2):
        with shmload.DataLoader(example.CsvParts(str(tmp_path)), batch_size=BATCH, num_workers=workers) as loader:
            runs.append(as_lists(read_all(loader)))
    everything = sorted(i for b in runs[0] for i in b)
    assert everything == list(range(sum(LENGTHS)))  # every line, once
    readers = max(1, workers)
    assert runs[0] == expected_batches(ids, readers, workers=readers)
    assert runs[1] == runs[0]
    if workers == 2:  # the round-robin interleaves the two workers' files
        assert runs[0][0] == list(range(16)) and runs[0][1] == list(range(48, 64))


@pytest.mark.pure
def test_a_loader_over_the_source_has_no_length(tmp_path):
    write_ids(tmp_path)
    loader = shmload.DataLoader(example.CsvParts(str(tmp_path)), batch_size=BATCH)
    with pytest.raises(TypeError):
        len(loader)


@pytest.mark.parametrize("workers", [0, 2])
def test_ranks_read_disjoint_shares_that_cover_every_line(tmp_path, monkeypatch, workers):
    ids = write_ids(tmp_path)
    monkeypatch.setenv("WORLD_SIZE", "2")
    got = []
    for rank in (0, 1):
        monkeypatch.setenv("RANK", str(rank))
        source = example.CsvParts(str(tmp_path))
        assert (source.rank, source.world_size) == (rank, 2)
        with shmload.DataLoader(source, batch_size=BATCH, num_workers=workers) as loader:
            batches = as_lists(read_all(loader))
        per_rank = max(1, workers)
        assert batches == expected_batches(ids, 2 * per_rank, rank * per_rank, per_rank)
        got.append([i for b in batches for i in b])
    assert got[0] and got[1]
    assert not set(got[0]) & set(got[1])
    assert sorted(got[0] + got[1]) == list(range(sum(LENGTHS)))


@pytest.mark.pure
def test_the_rank_defaults_to_0_of_1_and_is_checked(tmp_path, monkeypatch):
    write_ids(tmp_path)
    source = example.CsvParts(str(tmp_path))
    assert (source.rank, source.world_size) == (0, 1)
    monkeypatch.setenv("RANK", "1")  # without WORLD_SIZE: not a distributed run
    assert example.world() == (1, 0)
    with pytest.raises(ValueError, match=r"rank 2 is not in \[0, 1\]"):
        example.CsvParts(str(tmp_path), rank=2, world_size=2)
    empty = tmp_path / "empty"
    empty.mkdir()
    (empty / "part-000.tmp").write_text("1,2\n")  # not a part file's name
    with pytest.raises(FileNotFoundError, match="no part files"):
        example.CsvParts(str(empty))


@pytest.mark.pure
def test_the_source_resumes_by_itself(tmp_path):
    """Without the loader: 60 samples, the state, a new source continues with the rest."""
    write_ids(tmp_path)
    source = example.CsvParts(str(tmp_path))
    it = iter(source)
    head = [int(next(it)["x"]) for _ in range(60)]
    state = json.loads(json.dumps(source.state_dict()))
    it.close()
    assert state == {"reader": 0, "readers": 1, "file": 1, "name": "part-001", "line": 12}
    again = example.CsvParts(str(tmp_path))
    again.load_state_dict(state)
    rest = [int(s["x"]) for s in again]
    assert head + rest == list(range(sum(LENGTHS)))
    assert [int(s["x"]) for s in again] == list(range(sum(LENGTHS)))  # the next epoch starts over


@pytest.mark.parametrize("workers", [0, 2])
@pytest.mark.parametrize("k", [0, 3, 6, 11, 26])
def test_exact_resume_in_the_middle_of_an_epoch(tmp_path, workers, k):
    write_ids(tmp_path)
    with shmload.DataLoader(example.CsvParts(str(tmp_path)), batch_size=BATCH, num_workers=workers) as loader:
        full = read_all(loader)
    assert len(full) == 27  # both ways: 428 lines make 26 full batches and one of 12 (or two short ones)
    assert k < len(full)

    loader = shmload.DataLoader(example.CsvParts(str(tmp_path)), batch_size=BATCH, num_workers=workers)
    it = iter(loader)
    head = [next(it)["x"].copy() for _ in range(k)]
    state = json.loads(json.dumps(loader.state_dict()))
    del it
    loader.close()
    assert all(np.array_equal(a, b) for a, b in zip(head, full))
    saved = [s["state"] for s in state["streams"]]
    if k == 3 and workers == 0:  # the end of part-000: 48 lines
        assert saved == [{"reader": 0, "readers": 1, "file": 0, "name": "part-000", "line": 48}]
    if k == 6 and workers == 2:  # three batches each: worker 0 at the end of part-000
        assert saved[0] == {"reader": 0, "readers": 2, "file": 0, "name": "part-000", "line": 48}
        assert saved[1] == {"reader": 1, "readers": 2, "file": 0, "name": "part-001", "line": 48}

    resumed = shmload.DataLoader(example.CsvParts(str(tmp_path)), batch_size=BATCH, num_workers=workers)
    resumed.load_state_dict(state)
    with resumed:
        rest = read_all(resumed)
    assert len(rest) == len(full) - k
    assert all(np.array_equal(a, b) for a, b in zip(rest, full[k:]))


@pytest.mark.parametrize("workers", [0, 2])
def test_a_shuffled_read_resumes_exactly_and_still_reads_every_line_once(tmp_path, workers):
    """shuffle_buffer: each epoch reads the files in another order (stream_parts) and the
    lines through the buffer; every line once per epoch, and a resume at several points
    continues with exactly the batches of an uninterrupted run."""
    write_ids(tmp_path)

    def make_loader(num_workers, seed):
        return shmload.DataLoader(example.CsvParts(str(tmp_path)), batch_size=BATCH, num_workers=num_workers,
                                  seed=seed, shuffle_buffer=40, timeout=30)

    with make_loader(workers, 3) as loader:
        epochs = [[i for b in as_lists(read_all(loader)) for i in b] for _ in range(2)]
    assert sorted(epochs[0]) == sorted(epochs[1]) == list(range(sum(LENGTHS)))
    assert epochs[0] != epochs[1] and epochs[0] != sorted(epochs[0])
    pairs = [(0, 0), (0, 1), (1, 0)] if workers == 0 else [(2, 2)]
    assert_resumes_exactly(make_loader, stops=[2, 13, 30], epochs=2, pairs=pairs, reference_workers=workers)


def test_the_script_shuffles_and_still_reads_every_line_once():
    result = run(["--workers", "2", "--shuffle-buffer", "500"])
    assert result.returncode == 0, describe(result)
    check_fit(result.stdout)
    assert "through a shuffle buffer of 500 lines" in result.stdout
    assert "check: every line read exactly once (32000 lines" in result.stdout


@pytest.mark.parametrize("workers", [0, 2])
@pytest.mark.parametrize("bad", ["1.5;2.5", "x,1", "1,2,3", "1,nan", "1e39,1"])
def test_a_malformed_line_raises_naming_its_file_and_line(tmp_path, workers, bad):
    write_ids(tmp_path)
    with open(tmp_path / "part-003", "a") as f:
        f.write(bad + "\n")
    where = re.escape(str(tmp_path / "part-003")) + r", line 90: expected two comma-separated"  # 88 + the blank
    with shmload.DataLoader(example.CsvParts(str(tmp_path)), batch_size=BATCH, num_workers=workers) as loader:
        with pytest.raises(ValueError, match=where):
            for _ in loader:
                pass
