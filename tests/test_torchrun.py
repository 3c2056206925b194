"""examples/ddp_train.py under a real ``torchrun --nproc-per-node=2``: DDP on the CPU
(gloo over loopback), one shmload.DataLoader with 2 workers per rank.

The job runs as a subprocess in its own session, killed as a group if it overruns; after
it, no process of that session may be left (torchrun reaps its ranks, each rank closes
its loader's workers). The checks are read from the JSON report rank 0 writes, and
recomputed here from the raw index lists rather than trusted.

Marked ``torch`` and skipped without torch, except the last test, which hides torch from
the example and checks that it says what to install.
"""

from __future__ import annotations

import importlib.util
import json
import os
import re
import subprocess

import pytest

from .scripts import describe, fail_if_left_behind, run_script, torchrun_args
from .test_examples import EXIT_NEEDS_TORCH, HIDE_TORCH

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DDP_TRAIN = os.path.join(ROOT, "examples", "ddp_train.py")
JOB_TIMEOUT = 90  # seconds for one torchrun job (about 6 s on 2 idle cores, most of it importing torch)
EPOCHS = 4


def have_torch() -> bool:
    """Is torch installed? (Found, not imported: importing it costs seconds.)"""
    try:
        return importlib.util.find_spec("torch") is not None
    except ImportError:  # an import hook hiding it
        return False


skip_without_torch = pytest.mark.skipif(
    not have_torch(), reason="torch is not installed (pip install torch==2.13.0): the job runs torchrun and DDP")


def run(args: list[str]) -> subprocess.CompletedProcess:
    """``python *args`` (run_script), and fail if a process of its session (torchrun, the
    ranks, their workers) is still alive after it exited."""
    result = run_script(args, JOB_TIMEOUT, OMP_NUM_THREADS="1")
    fail_if_left_behind(result, str(args))
    return result


def torchrun(*example_args: str) -> subprocess.CompletedProcess:
    return run(torchrun_args(2, [DDP_TRAIN, *example_args]))



def check_report(report: dict, result: subprocess.CompletedProcess, world_size: int, samples: int) -> None:
    why = f"report: { {k: v for k, v in report.items() if k != 'indices_epoch0'} }\n{describe(result)}"
    assert report["world_size"] == world_size and report["samples"] == samples, why
    assert report["workers"] == 2 and report["epochs"] == EPOCHS, why

    # The shards of epoch 0: equal sizes, together the whole dataset, overlapping only in
    # the padding torch's rules add (the head of the order repeated up to a multiple of
    # the world size): ceil(samples / world) * world - samples samples, seen twice.
    shards = report["indices_epoch0"]
    per_rank = -(-samples // world_size)
    padding = per_rank * world_size - samples
    assert len(shards) == world_size, why
    assert [len(s) for s in shards] == [per_rank] * world_size, why
    assert all(s == sorted(s) for s in shards), why
    union = set().union(*map(set, shards))
    assert union == set(range(samples)), f"indices never seen: {sorted(set(range(samples)) - union)}\n{why}"
    assert sum(map(len, shards)) - len(union) == padding, why
    assert report["padding"] == padding and len(report["repeated_epoch0"]) == padding, why
    if padding == 0:
        assert all(not set(a) & set(b) for i, a in enumerate(shards) for b in shards[i + 1:]), why

    # DDP: rank 0's initial weights broadcast, then the same averaged gradient on every rank
    assert report["params_match_at_start"] is True, why
    assert report["params_match"] is True and report["max_param_diff"] == 0, why
    # the model learnt: 4 classes (ln 4 = 1.39 untrained), linearly separable
    assert len(report["losses"]) == EPOCHS, why
    assert report["last_loss"] < report["first_loss"] * 0.7, why
    assert report["checks"] == dict.fromkeys(report["checks"], True) and report["ok"] is True, why


def epoch_lines(stdout: str) -> list[tuple[int, int, int]]:
    """(rank, world size, epoch) of each rank's per-epoch loss line."""
    found = re.findall(r"^\[rank (\d+)/(\d+)\] epoch (\d+): loss \d+\.\d+ over \d+ batches \(\d+ samples\)$",
                       stdout, re.M)
    return sorted((int(r), int(w), int(e)) for r, w, e in found)


@pytest.mark.torch
@skip_without_torch
@pytest.mark.timeout(110)
@pytest.mark.parametrize("samples", [1001, 1000], ids=["padded", "divisible"])
def test_torchrun_two_ranks_ddp(samples, tmp_path):
    report_path = tmp_path / "report.json"
    result = torchrun("--samples", str(samples), "--workers", "2", "--epochs", str(EPOCHS),
                      "--report", str(report_path))
    assert result.returncode == 0, describe(result)
    assert "Traceback" not in result.stderr, describe(result)
    assert epoch_lines(result.stdout) == [(r, 2, e) for r in range(2) for e in range(EPOCHS)], describe(result)
    assert re.search(r"^all checks passed in \d+\.\d s$", result.stdout, re.M), describe(result)
    assert report_path.exists(), describe(result)
    check_report(json.loads(report_path.read_text()), result, world_size=2, samples=samples)


@pytest.mark.torch
@skip_without_torch
@pytest.mark.timeout(60)
def test_without_torchrun_it_trains_as_a_world_of_one(tmp_path):
    report_path = tmp_path / "report.json"
    result = run([DDP_TRAIN, "--samples", "301", "--workers", "2", "--epochs", str(EPOCHS),
                  "--report", str(report_path)])
    assert result.returncode == 0, describe(result)
    assert result.stderr == "", describe(result)
    assert epoch_lines(result.stdout) == [(0, 1, e) for e in range(EPOCHS)], describe(result)
    check_report(json.loads(report_path.read_text()), result, world_size=1, samples=301)


@pytest.mark.timeout(60)
def test_without_torch_ddp_train_says_what_to_install(tmp_path):
    report_path = tmp_path / "report.json"
    result = run(["-c", HIDE_TORCH, DDP_TRAIN, "--workers", "2", "--report", str(report_path)])
    assert result.returncode == EXIT_NEEDS_TORCH, describe(result)
    assert re.search(r"^    pip install torch==2\.13\.0$", result.stderr, re.M), describe(result)
    assert "not importable here (No module named 'torch')" in result.stderr, describe(result)
    assert "Traceback" not in result.stderr and result.stdout == "", describe(result)
    assert not report_path.exists()
