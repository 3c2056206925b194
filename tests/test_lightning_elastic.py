"""Elastic loading under real PyTorch Lightning (pytorch-lightning==2.6.6, torch==2.13.0):
a checkpoint saved mid-epoch by 2 DDP processes resumes with 1 and with 3 processes, and
the resumed runs train on the rest of the uninterrupted run's global sequence, sample for
sample and augmentation for augmentation (NOTE [ The global sequence ] in
shmload/_ordering/elastic.py).

Each run is tests/lightning_elastic_job.py in a subprocess of its own session: an
``elastic=True`` shmload.DataLoader of 32 samples whose ``__getitem__`` draws from
Python's, numpy's and torch's global RNGs, a global batch of G = 6 (``batch_size`` 6, 3
and 2 for 1, 2 and 3 processes), 2 epochs of 6 global batches (the last padded with 4
samples from the order's head), 1 worker per rank. Every step the ranks' batches are
gathered (``all_gather_object``) and rank 0 records the global batch. The runs:

- the reference: 2 processes, uninterrupted (12 steps);
- 2 processes stopped after step 3 of epoch 0, with Lightning's checkpoint saved there
  (``trainer.save_checkpoint`` in ``on_train_batch_end``, then ``trainer.should_stop``);
- that checkpoint resumed (``fit(ckpt_path=...)``) with 1 process (Lightning's
  single-device strategy: no process group, the loader is a world of one), and with 3.

How Lightning restores the loader (pytorch_lightning 2.6.6): the fit loop saves
``CombinedLoader._state_dicts()``, i.e. ``loader.state_dict()`` of every loader that has
``state_dict``/``load_state_dict``, under the checkpoint's
``loops.fit_loop.state_dict.combined_loader``; ``save_checkpoint`` builds it on every
rank and rank 0 writes the file. At ``fit(ckpt_path=...)`` every rank reads that one
file (``Strategy.load_checkpoint``), so every rank of the new world is given rank 0's
state: ``_FitLoop.setup_data`` -> ``_load_combined_loader_states`` ->
``loader.load_state_dict(state)``, once, before the first ``iter()``. With ``len()``
known, Lightning's fetcher reads no batch ahead, so the state saved after step k is the
global position k * G. The job reports each call, which the tests check.

Why ``strategy="ddp_fork"``: it is Lightning's DDPStrategy (gloo on the CPU, the same
process group, checkpointing and restoring) with the ranks forked from the launching
process after it imported torch and Lightning; only the launcher differs. Measured here
(2 cores, loaded by other jobs): a 3-process run takes about 8 s with ``ddp_fork``,
against 17-42 s with ``ddp``, whose launcher runs the script again for every rank, each
importing torch and Lightning (5-8 s apiece), and 17-20 s with ``ddp_spawn``, which
re-imports too and pickles the loader (that path is tested in tests/test_lightning.py).
The job passes with all three (``--strategy``). Each rank's loader is the one the script
made, inherited by the fork, as ``ddp``'s ranks make theirs before the process group
exists. The job calls ``torch.set_num_threads(1)`` so that no OpenMP pool exists before
the fork.

The runs are module-scoped fixtures, two at a time: the reference and the stopped run,
then the two resumed runs (4 Lightning runs in all, about 10 s each, most of it the
launching process importing torch and Lightning on one core). After every run no process
of its session (the ranks, their workers) may be left. Marked ``torch``; skipped without Lightning.
"""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess

import pytest

from .helpers import shuffled_order
from .scripts import describe, fail_if_left_behind, run_scripts

RUN_TIMEOUT = 120  # seconds for one Lightning run in its subprocess (about 10 s on 2 idle cores)

pytestmark = [pytest.mark.torch,
              # a test's setup may run the first two runs, then the resumed two
              pytest.mark.timeout(3 * RUN_TIMEOUT + 30),
              pytest.mark.skipif(importlib.util.find_spec("pytorch_lightning") is None,
                                 reason="pytorch-lightning is not installed (pip install -e '.[lightning]')")]

JOB = os.path.join("tests", "lightning_elastic_job.py")
SAMPLES, GLOBAL_BATCH, EPOCHS, SEED = 32, 6, 2, 7
STEPS_PER_EPOCH = -(-SAMPLES // GLOBAL_BATCH)  # 6: the last global batch is padded
PADDING = STEPS_PER_EPOCH * GLOBAL_BATCH - SAMPLES  # 4 samples from the order's head
STOP = 3  # steps before the checkpoint: mid-epoch 0


class Run:
    """One job's outcome: its record (rank 0's line per step) and its events."""

    def __init__(self, result: subprocess.CompletedProcess, record, seconds: float):
        self.result, self.seconds = result, seconds
        self.steps = []
        if os.path.exists(record):
            with open(record) as f:
                self.steps = [json.loads(line) for line in f]
        self.events = [json.loads(line[len("EVENT "):]) for line in result.stdout.splitlines()
                       if line.startswith("EVENT ")]

    def of(self, kind: str) -> list[dict]:
        return sorted((e for e in self.events if e["event"] == kind), key=lambda e: e["rank"])

    def why(self) -> str:
        return f"after {self.seconds:.1f} s: {describe(self.result)}"


def job_args(tmp, name: str, devices: int, *args: str) -> list[str]:
    """The arguments of the job with ``devices`` processes, recording to ``tmp/name.jsonl``
    (Lightning's default_root_dir: ``tmp/name``)."""
    return [JOB, "--devices", str(devices), "--root", str(tmp / name), "--record", str(tmp / f"{name}.jsonl"),
            "--samples", str(SAMPLES), "--global-batch", str(GLOBAL_BATCH), "--epochs", str(EPOCHS),
            "--workers", "1", *args]


def jobs(tmp, runs: dict) -> dict:
    """The jobs of ``runs`` (name: (devices, args)), two at a time: name: Run. Fails if one
    failed or left a process of its session behind."""
    results = run_scripts([(job_args(tmp, name, devices, *args), {"OMP_NUM_THREADS": "1"})
                           for name, (devices, args) in runs.items()], RUN_TIMEOUT)
    done = {}
    for name, result in zip(runs, results):
        run = done[name] = Run(result, tmp / f"{name}.jsonl", result.seconds)
        fail_if_left_behind(result, name, run.why())
        assert result.returncode == 0 and "Traceback" not in result.stderr, run.why()
    return done


def global_batches(steps: list) -> list:
    """[epoch, sample ids, augmentations] of each step's global batch: the ranks' slices
    concatenated in rank order, whatever the world size."""
    return [[epoch, [i for ids in slices for i in ids], [a for augs in draws for a in augs]]
            for epoch, _, _, slices, draws in steps]


def check_world(run: Run, world: int, first_step: int, last_step: int) -> None:
    """Every recorded step has ``world`` slices of G / world samples, the steps follow on
    from ``first_step``, and every rank's fit() ended at ``last_step``."""
    why = run.why()
    assert [step for _, step, _, _, _ in run.steps] == list(range(first_step, last_step)), why
    for _, _, size, slices, draws in run.steps:
        assert size == world and len(slices) == len(draws) == world, why
        assert [len(s) for s in slices] == [len(d) for d in draws] == [GLOBAL_BATCH // world] * world, why
    assert [(e["rank"], e["world"], e["step"]) for e in run.of("done")] == [(r, world, last_step)
                                                                           for r in range(world)], why


@pytest.fixture(scope="module")
def tmp(tmp_path_factory):
    return tmp_path_factory.mktemp("lightning-elastic")


@pytest.fixture(scope="module")
def first_runs(tmp) -> dict:
    """The reference and the stopped run (below), two at a time."""
    return jobs(tmp, {"reference": (2, ()),
                      "stopped": (2, ("--stop-at", str(STOP), "--checkpoint", str(tmp / "mid-epoch.ckpt")))})


@pytest.fixture(scope="module")
def reference(first_runs) -> Run:
    """2 processes, uninterrupted: the global sequence of 2 epochs."""
    run = first_runs["reference"]
    check_world(run, 2, 0, EPOCHS * STEPS_PER_EPOCH)
    assert run.of("loaded") == [], run.why()
    return run


@pytest.fixture(scope="module")
def stopped(tmp, first_runs) -> tuple[Run, str]:
    """2 processes stopped after step STOP, Lightning's checkpoint saved there."""
    checkpoint = str(tmp / "mid-epoch.ckpt")
    run = first_runs["stopped"]
    check_world(run, 2, 0, STOP)
    assert os.path.exists(checkpoint), run.why()
    return run, checkpoint


@pytest.fixture(scope="module")
def resumed(tmp, stopped) -> dict:
    """The stopped run's checkpoint resumed with 1 and with 3 processes, two at a time:
    devices: Run."""
    _, checkpoint = stopped
    runs = jobs(tmp, {f"resumed-on-{devices}": (devices, ("--resume", checkpoint)) for devices in (1, 3)})
    return {devices: runs[f"resumed-on-{devices}"] for devices in (1, 3)}


def test_the_reference_is_the_global_sequence_of_the_epochs_orders(reference):
    """Each epoch's global batches, concatenated, are the epoch's order of the samples,
    padded from its head (G and n decide it, not the world); every sample at every
    position drew its own augmentation (no two alike, the padding's repeats included)."""
    batches = global_batches(reference.steps)
    for epoch in range(EPOCHS):
        sequence = [i for e, ids, _ in batches if e == epoch for i in ids]
        order = shuffled_order(SAMPLES, epoch, seed=SEED)
        assert sequence == order + order[:PADDING], reference.why()
    draws = [tuple(a) for _, _, augs in batches for a in augs]
    assert len(draws) == EPOCHS * STEPS_PER_EPOCH * GLOBAL_BATCH and all(len(a) == 3 for a in draws)
    assert len(set(draws)) == len(draws), reference.why()


def test_a_mid_epoch_checkpoint_holds_the_global_position_the_same_on_every_rank(reference, stopped):
    run, _ = stopped
    assert run.steps == reference.steps[:STOP], run.why()  # the same ranks' slices, too
    saved = run.of("saved")
    assert [(e["rank"], e["world"], e["step"], e["epoch"]) for e in saved] == [(0, 2, STOP, 0), (1, 2, STOP, 0)]
    assert saved[0]["sampler"] == saved[1]["sampler"], run.why()
    sampler = saved[0]["sampler"]
    assert sampler["elastic"] is True and sampler["epoch"] == 0, run.why()
    assert sampler["position"] == STOP * GLOBAL_BATCH and sampler["global_batch_size"] == GLOBAL_BATCH, run.why()


@pytest.mark.parametrize("devices", [1, 3], ids=["on-1-process", "on-3-processes"])
def test_a_checkpoint_of_2_processes_resumes_the_global_sequence(reference, stopped, resumed, devices):
    """The checkpoint of 2 processes resumed with ``devices``: Lightning hands every rank
    the saved state once, and the head trained before the stop plus the resumed run's
    rest is the uninterrupted run's global sequence: ids and augmentations exactly."""
    head, _ = stopped
    rest = resumed[devices]
    check_world(rest, devices, STOP, EPOCHS * STEPS_PER_EPOCH)
    loaded = rest.of("loaded")
    assert [(e["rank"], e["world"]) for e in loaded] == [(r, devices) for r in range(devices)], rest.why()
    for state in loaded:
        assert (state["epoch"], state["position"], state["elastic"], state["global_batch_size"]) == (
            0, STOP * GLOBAL_BATCH, True, GLOBAL_BATCH), rest.why()
    expected = global_batches(reference.steps)
    assert global_batches(head.steps) == expected[:STOP], head.why()
    assert global_batches(rest.steps) == expected[STOP:], rest.why()
