"""examples/elastic_ddp.py under real torchrun jobs (gloo, CPU): elastic loading gives one
global sequence of batches, augmentations included, for 1, 2 or 3 ranks and 0, 1 or 2
workers, and a checkpoint saved by one world size resumes it on another.

Six jobs, each run once and only when a test first needs it (the four that depend on no
other, two at a time, when the first of them is), shared by the tests:

- one per world size W = 1, 2, 3 (``--standalone --nproc-per-node=W``), ``--workers 0 1 2``:
  all the epochs from the start, once per worker count, in the same ranks;
- a chain on one checkpoint: 2 ranks stop after step 2 (in epoch 0), 3 ranks resume it and
  stop after step 8 (in epoch 1), 1 rank resumes that to the end (epoch 2): that one is
  ``python examples/elastic_ddp.py``, a world of one without torchrun, as its docstring
  shows (and a torchrun agent's import of torch less).

Each job runs in a session of its own, killed as a whole if it overruns (or the test is
interrupted); after it, no process of that session may be left. The checks are
recomputed from the raw JSON report (each rank's slice of each global batch) and the
checkpoint file, not taken from the example: every world and worker count gives the
uninterrupted sequence of world 1 with no workers, compared exactly (floats included),
and that sequence holds every sample once per epoch (padding aside) with the
augmentations of its global position. Marked ``torch``, except the two tests at the end,
which hide torch from the example (it checks its arguments first).
"""

from __future__ import annotations

import json
import os
import random
import re
import subprocess

import numpy as np
import pytest

from shmload._ordering.seeding import sample_seed

from .scripts import ROOT, describe, fail_if_left_behind, run_script, run_scripts, torchrun_args
from .test_examples import EXIT_NEEDS_TORCH, HIDE_TORCH
from .test_torchrun import skip_without_torch

EXAMPLE = os.path.join(ROOT, "examples", "elastic_ddp.py")
JOB_TIMEOUT = 60  # seconds for one torchrun job (6-12 s on 2 busy cores, most of it importing torch)
SAMPLES, GLOBAL_BATCH, EPOCHS, SEED = 50, 12, 3, 7
BATCHES = -(-SAMPLES // GLOBAL_BATCH)  # global batches per epoch: 5, the last padded with 10 samples
WORKERS = (0, 1, 2)
# The chain: (world size, workers, --stop-after) of each job, all on one checkpoint (world
# size None: plain python, a world of one without torchrun).
CHAIN = {"stop2": (2, 2, 2), "resume3": (3, 1, 8), "resume1": (None, 0, None)}


def timeout(jobs: int):
    """pytest-timeout for a test that may have to run ``jobs`` rounds of torchrun jobs
    first (one job, or two at a time: Jobs.get); a job overrunning is killed, and reported,
    by the job's own time-out before this one."""
    return pytest.mark.timeout(30 + jobs * JOB_TIMEOUT)


class Job:
    def __init__(self, result: subprocess.CompletedProcess, report: dict, checkpoint: dict | None, seconds: float):
        self.result, self.report, self.checkpoint, self.seconds = result, report, checkpoint, seconds


def command(world: int | None, *args: str) -> list[str]:
    """``torchrun --standalone --nproc-per-node=world examples/elastic_ddp.py *args`` (world
    None: ``python examples/elastic_ddp.py *args``), as run_script's arguments."""
    return torchrun_args(world, [EXAMPLE, *args]) if world else [EXAMPLE, *args]


class Jobs:
    """The module's jobs, each run when first asked for (the chain's in its order), in a
    session of its own, importing this checkout's shmload: the session is killed if the
    job overruns or the test is interrupted, and the test fails if the job leaves a process
    behind. The jobs that depend on none (the worlds and the chain's first) run two at a
    time, all of them when the first is asked for: a torchrun job leaves a core idle while
    its launcher imports torch."""

    INDEPENDENT = ("world1", "world2", "world3", next(iter(CHAIN)))

    def __init__(self, folder):
        self.folder = folder
        self.done: dict[str, Job] = {}

    def get(self, name: str) -> Job:
        if name not in self.done:
            names = [n for n in self.INDEPENDENT if n not in self.done] if name in self.INDEPENDENT else [name]
            if name in CHAIN and list(CHAIN).index(name):  # resumes the job before it
                self.get(list(CHAIN)[list(CHAIN).index(name) - 1])
            results = run_scripts([(command(*self._job(n)), {"OMP_NUM_THREADS": "1"}) for n in names], JOB_TIMEOUT)
            for n, result in zip(names, results):
                fail_if_left_behind(result, f"the job {n}")
                self.done[n] = self._read(n, result)
        return self.done[name]

    def world(self, size: int) -> Job:
        return self.get(f"world{size}")

    def _job(self, name: str) -> tuple:
        """The world size of the job ``name`` (None: without torchrun), then its arguments."""
        common = ["--samples", str(SAMPLES), "--global-batch", str(GLOBAL_BATCH), "--epochs", str(EPOCHS),
                  "--seed", str(SEED), "--report", str(self.folder / f"{name}.json")]
        if name.startswith("world"):
            return int(name[5:]), *common, "--workers", *map(str, WORKERS)
        world, workers, stop = CHAIN[name]
        args = ["--workers", str(workers), "--checkpoint", str(self.folder / "checkpoint.json")]
        return world, *common, *args, *(["--stop-after", str(stop)] if stop else [])

    def _read(self, name: str, result: subprocess.CompletedProcess) -> Job:
        checkpoint = self.folder / "checkpoint.json"
        assert result.returncode == 0, describe(result)
        assert "Traceback" not in result.stderr, describe(result)
        with open(self.folder / f"{name}.json") as f:
            report = json.load(f)
        saved = None
        if not name.startswith("world"):
            with open(checkpoint) as f:
                saved = json.load(f)  # (the next job of the chain overwrites it)
        assert not os.path.exists(f"{checkpoint}.tmp"), describe(result)
        return Job(result, report, saved, result.seconds)


@pytest.fixture(scope="module")
def jobs(tmp_path_factory) -> Jobs:
    return Jobs(tmp_path_factory.mktemp("elastic"))


# ---------------------------------------------------------------- reading a report
def global_batches(report: dict, run: int = 0) -> list[tuple]:
    """(epoch, step, indices, augmentations) of each global batch of run ``run``: the ranks'
    slices concatenated in rank order, each checked to be its share of the global batch."""
    world = report["world_size"]
    assert report["global_batch"] == GLOBAL_BATCH and report["samples"] == SAMPLES, report
    out = []
    for b in report["runs"][run]["batches"]:
        why = f"global batch {b['step']} of {world} rank(s): {b['indices']}"
        assert len(b["indices"]) == len(b["augmentations"]) == world, why
        assert [len(s) for s in b["indices"]] == [GLOBAL_BATCH // world] * world, why
        assert [len(s) for s in b["augmentations"]] == [GLOBAL_BATCH // world] * world, why
        indices = [i for s in b["indices"] for i in s]
        augmentations = [tuple(a) for s in b["augmentations"] for a in s]
        out.append((b["epoch"], b["step"], indices, augmentations))
    return out


def steps(batches: list[tuple]) -> list[tuple[int, int]]:
    return [(epoch, step) for epoch, step, _, _ in batches]


def check_the_global_sequence(batches: list[tuple]) -> None:
    """The uninterrupted sequence, checked from its values alone: every epoch's order holds
    each sample once, then the padding repeats its head; the epochs' orders differ; each
    sample's augmentations are those of its global position (seeding.sample_seed: random's
    and numpy's recomputed here; torch's is a float32 in [0, 1))."""
    assert steps(batches) == [(e, e * BATCHES + k + 1) for e in range(EPOCHS) for k in range(BATCHES)]
    orders = []
    for epoch in range(EPOCHS):
        order = [i for e, _, indices, _ in batches if e == epoch for i in indices]
        augmentations = [a for e, _, _, augs in batches if e == epoch for a in augs]
        assert len(order) == BATCHES * GLOBAL_BATCH
        assert sorted(order[:SAMPLES]) == list(range(SAMPLES)), f"epoch {epoch}: {order}"
        assert order[SAMPLES:] == order[:len(order) - SAMPLES], f"epoch {epoch}: the padding is not the head: {order}"
        for position, (r, n, t) in enumerate(augmentations):
            seed = sample_seed(SEED, epoch, position)
            assert r == random.Random(seed).random(), (epoch, position)
            assert n == np.random.RandomState(seed & 0xFFFFFFFF).rand(), (epoch, position)
            assert 0 <= t < 1 and t == float(np.float32(t)), (epoch, position, t)
        # (a padded sample is augmented anew: its position is not its first one's)
        assert augmentations[SAMPLES:] != augmentations[:len(order) - SAMPLES]
        orders.append(order)
    assert len({tuple(o) for o in orders}) == EPOCHS, "the epochs have the same order"


# ---------------------------------------------------------------- the tests
@pytest.mark.torch
@skip_without_torch
@pytest.mark.parametrize("world", [1, 2, 3])
@timeout(2)
def test_every_world_and_worker_count_gives_one_sequence(jobs, world):
    reference = global_batches(jobs.world(1).report)  # 1 rank, no workers
    if world == 1:
        check_the_global_sequence(reference)
    job = jobs.world(world)
    assert job.report["world_size"] == world, job.report.keys()
    assert [r["workers"] for r in job.report["runs"]] == list(WORKERS)
    for run, workers in enumerate(WORKERS):
        got = global_batches(job.report, run)
        assert steps(got) == steps(reference), (world, workers)
        for mine, wanted in zip(got, reference):  # exactly: indices, and the augmentations' floats
            assert mine == wanted, f"{world} rank(s), {workers} workers, global batch {mine[1]}:\n{mine}\n{wanted}"


@pytest.mark.torch
@skip_without_torch
@timeout(3)
def test_stopped_on_two_ranks_resumed_on_three(jobs):
    reference = global_batches(jobs.world(1).report)
    head, rest = jobs.get("stop2"), jobs.get("resume3")
    assert head.report["world_size"] == 2 and rest.report["world_size"] == 3
    first, second = head.report["runs"][0], rest.report["runs"][0]
    assert (first["first_step"], first["stopped"], second["first_step"], second["stopped"]) == (0, True, 2, True)
    # what the stopped job left: 2 global batches of epoch 0 consumed, by both ranks together
    saved = head.checkpoint
    assert saved["step"] == 2, saved
    loader = saved["loader"]
    assert loader["epoch"] == 0 and loader["sampler"]["epoch"] == 0, loader
    assert loader["sampler"]["position"] == 2 * GLOBAL_BATCH and loader["sampler"]["global_batch_size"] == GLOBAL_BATCH, loader
    assert loader["sampler"]["elastic"] is True and loader["seed"] == SEED, loader
    delivered = global_batches(head.report) + global_batches(rest.report)
    assert steps(delivered) == steps(reference[:8])
    assert delivered == reference[:8]


@pytest.mark.torch
@skip_without_torch
@timeout(4)
def test_stopped_on_three_ranks_resumed_on_one(jobs):
    reference = global_batches(jobs.world(1).report)
    chain = [jobs.get(name) for name in CHAIN]
    saved = chain[1].checkpoint  # 3 ranks stopped after step 8: 3 global batches into epoch 1
    assert saved["step"] == 8 and saved["loader"]["epoch"] == 1, saved
    assert saved["loader"]["sampler"]["position"] == 3 * GLOBAL_BATCH, saved
    last = chain[2].report["runs"][0]
    assert chain[2].report["world_size"] == 1 and (last["first_step"], last["stopped"]) == (8, False)
    delivered = [b for job in chain for b in global_batches(job.report)]
    assert steps(delivered) == steps(reference)
    assert delivered == reference
    # and the job ended: its checkpoint is the start of the epoch after the last, where a rerun does nothing
    saved = chain[2].checkpoint
    assert saved["step"] == EPOCHS * BATCHES and saved["loader"]["epoch"] == EPOCHS, saved
    assert saved["loader"]["sampler"]["position"] == 0, saved


@pytest.mark.torch
@skip_without_torch
@timeout(4)
def test_epochs_go_on_after_a_resume(jobs):
    """A resumed job goes on to the next epochs (set_epoch), and they are the uninterrupted
    run's: 3 ranks resumed in epoch 0 and went into epoch 1; 1 rank resumed in epoch 1 and
    ran all of epoch 2."""
    reference = global_batches(jobs.world(1).report)
    resumed3, resumed1 = (global_batches(jobs.get(name).report) for name in ("resume3", "resume1"))
    assert [e for e, *_ in resumed3] == [0, 0, 0, 1, 1, 1]
    assert [e for e, *_ in resumed1] == [1, 1] + [2] * BATCHES
    assert [b for b in resumed3 if b[0] == 1] == reference[BATCHES:BATCHES + 3]
    assert [b for b in resumed1 if b[0] == 2] == reference[2 * BATCHES:]


@pytest.mark.timeout(60)
def test_a_global_batch_the_world_size_does_not_divide_is_refused():
    # WORLD_SIZE as torchrun sets it; the arguments are checked before torch is needed
    result = run_script(["-c", HIDE_TORCH, EXAMPLE, "--global-batch", "10"], 45, WORLD_SIZE="3", RANK="0")
    assert result.returncode == 2, describe(result)
    assert re.search(r"error: --global-batch 10 is not divisible by the world size 3: each rank loads an equal "
                     r"slice of every global batch\.", result.stderr), describe(result)
    assert "Traceback" not in result.stderr and result.stdout == "", describe(result)


@pytest.mark.timeout(60)
def test_without_torch_elastic_ddp_says_what_to_install(tmp_path):
    report = tmp_path / "report.json"
    result = run_script(["-c", HIDE_TORCH, EXAMPLE, "--workers", "2", "--report", str(report)], 45)
    assert result.returncode == EXIT_NEEDS_TORCH, describe(result)
    assert re.search(r"^    pip install torch==2\.13\.0$", result.stderr, re.M), describe(result)
    assert "not importable here (No module named 'torch')" in result.stderr, describe(result)
    assert "Traceback" not in result.stderr and result.stdout == "", describe(result)
    assert not report.exists()
