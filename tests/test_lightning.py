"""Under real PyTorch Lightning (the ``lightning`` extra: pytorch-lightning==2.6.6,
torch==2.13.0): examples/lightning_train.py runs as a user runs it, and what the model
trained on is compared. Marked ``torch``; skipped without Lightning."""

from __future__ import annotations

import ast
import importlib.util
import os
import subprocess
from pathlib import Path
from typing import NamedTuple

import pytest

from .helpers import shuffled_order
from .scripts import AT_ONCE, describe, read_jsonl, run_script, run_scripts

RUN_TIMEOUT = 150  # seconds for one fit() (about 8 s, most of it importing torch and Lightning)
pytestmark = [pytest.mark.torch, pytest.mark.timeout(300),
              pytest.mark.skipif(importlib.util.find_spec("pytorch_lightning") is None,
                                 reason="pytorch-lightning is not installed (pip install -e '.[lightning]')")]

SCRIPT = os.path.join("examples", "lightning_train.py")
SAMPLES, BATCH = 96, 8
STEPS_PER_EPOCH = SAMPLES // BATCH


def fit_args(folder, *args):
    """The arguments of a fit() of the example recording to ``folder / "run"``."""
    return [SCRIPT, "--record", str(folder / "run"), "--samples", str(SAMPLES), "--batch-size", str(BATCH), *args]


def fit(tmp_path, *args, timeout=RUN_TIMEOUT):
    result = run_script(fit_args(tmp_path, *args), timeout=timeout)
    assert result.returncode == 0, describe(result)
    return result


def seen(folder, rank=0):
    return read_jsonl(folder / f"run.rank{rank}.jsonl")


# ---------------------------------------------------------------- the runs in one process
# Every fit() in one process is made by one of two module fixtures, AT_ONCE at a time (each
# is a fresh interpreter, as a user runs it, and is mostly importing torch and Lightning on
# one core): first_runs, the runs that start from nothing, then resumed_runs, the runs that
# resume a checkpoint of a first run, in its folder. The tests check what they did.

class Done(NamedTuple):
    """A run made: its folder, the finished process, and the steps it trained on as it ended
    ([epoch, sample ids, augmentation checksum] per step, as recorded to FOLDER/run)."""
    folder: Path
    result: subprocess.CompletedProcess
    trained: list


def run_all(runs: dict) -> dict:
    """Make ``runs`` (name: (folder, the script's arguments)), AT_ONCE at a time; name: Done."""
    results = run_scripts([(args, {}) for _, args in runs.values()], timeout=RUN_TIMEOUT)
    done = {}
    for (name, (folder, _)), result in zip(runs.items(), results):
        assert result.returncode == 0, describe(result)
        done[name] = Done(folder, result, seen(folder) if (folder / "run.rank0.jsonl").exists() else [])
    return done


def timeout(runs: int):
    """pytest-timeout for a test whose fixtures may make ``runs`` runs first (a run
    overrunning is killed, and reported, by its own time-out before this one)."""
    return pytest.mark.timeout(60 + -(-runs // AT_ONCE) * RUN_TIMEOUT)


# name: (step, --workers) of the runs stopped at a mid-epoch checkpoint, then resumed
MID_EPOCH = {"in-epoch-0-auto-workers": (5, "auto"), "in-epoch-1": (STEPS_PER_EPOCH + 5, "2")}
# name: the arguments of the runs that save Lightning's usual checkpoint in epoch 0, then resume it
USUAL = {"at-epoch-end": (), "on-the-epochs-last-step": ("--every-n-train-steps", str(STEPS_PER_EPOCH))}
FIRST_RUNS, RESUMED_RUNS = 1 + len(MID_EPOCH) + len(USUAL) + 1, len(MID_EPOCH) + len(USUAL)


@pytest.fixture(scope="module")
def first_runs(tmp_path_factory) -> dict:
    """The runs that start from nothing: "reference", an uninterrupted fit() of 2 epochs;
    ("stopped", NAME), stopped at the mid-epoch checkpoint of MID_EPOCH[NAME]; ("usual",
    NAME), 1 epoch with Lightning's ModelCheckpoint(save_last=True) of USUAL[NAME]; "torch
    sampler", TORCH_SAMPLER_FIT (its default_root_dir the folder)."""
    def folder(name):
        return tmp_path_factory.mktemp(f"lightning-{name}")

    f = folder("reference")
    runs = {"reference": (f, fit_args(f, "--epochs", "2"))}
    for name, (step, workers) in MID_EPOCH.items():
        f = folder(f"stopped-{name}")
        runs["stopped", name] = (f, fit_args(f, "--epochs", "2", "--workers", workers, "--checkpoint-at", str(step),
                                             "--checkpoint", str(f / "mid.ckpt")))
    for name, args in USUAL.items():
        f = folder(f"usual-{name}")
        runs["usual", name] = (f, fit_args(f, "--epochs", "1", "--model-checkpoint", str(f / "ckpt"), *args))
    f = folder("torch-sampler")
    runs["torch sampler"] = (f, ["-c", TORCH_SAMPLER_FIT, str(f)])
    assert len(runs) == FIRST_RUNS
    return run_all(runs)


@pytest.fixture(scope="module")
def resumed_runs(first_runs) -> dict:
    """The first runs' checkpoints resumed to the end of epoch 1, each in its first run's
    folder (recording after it): ("stopped", NAME) with the same --workers, ("usual", NAME)
    with the same ModelCheckpoint."""
    runs = {}
    for name, (_, workers) in MID_EPOCH.items():
        f = first_runs["stopped", name].folder
        runs["stopped", name] = (f, fit_args(f, "--epochs", "2", "--workers", workers, "--resume", str(f / "mid.ckpt")))
    for name, args in USUAL.items():
        f = first_runs["usual", name].folder
        runs["usual", name] = (f, fit_args(f, "--epochs", "2", "--resume", str(f / "ckpt" / "last.ckpt"),
                                           "--model-checkpoint", str(f / "ckpt"), *args))
    assert len(runs) == RESUMED_RUNS
    return run_all(runs)


@pytest.fixture(scope="module")
def reference(first_runs):
    """An uninterrupted fit() of 2 epochs: [epoch, sample ids, augmentation checksum] per step."""
    return first_runs["reference"].trained


@timeout(FIRST_RUNS)
def test_fit_sees_every_sample_once_per_epoch_in_a_new_order(reference):
    assert len(reference) == 2 * STEPS_PER_EPOCH
    epochs = [[i for e, ids, _ in reference if e == epoch for i in ids] for epoch in (0, 1)]
    for ids in epochs:
        assert sorted(ids) == list(range(SAMPLES))
    assert epochs[0] != epochs[1]
    assert epochs[0] != list(range(SAMPLES))  # shuffled
    # the probe iter() Lightning makes must not use up an epoch: epoch 0 is shmload's epoch 0
    assert epochs[0] == shuffled_order(SAMPLES, 0)


@timeout(FIRST_RUNS + RESUMED_RUNS)
@pytest.mark.parametrize("name", list(MID_EPOCH))
def test_a_run_resumed_from_a_mid_epoch_checkpoint_trains_on_exactly_the_same_batches(first_runs, resumed_runs,
                                                                                       reference, name):
    """With num_workers="auto" (in epoch 0) the count may change while fit() runs, and the
    checkpoint's loader state, with the count run last, resumes exactly all the same."""
    step, _ = MID_EPOCH[name]
    stopped = first_runs["stopped", name]
    assert f"stopped at step {step}" in stopped.result.stdout
    assert stopped.trained == reference[:step]
    assert resumed_runs["stopped", name].trained == reference  # sample ids and augmentations, step for step


@timeout(FIRST_RUNS + RESUMED_RUNS)
@pytest.mark.parametrize("name", list(USUAL))
def test_a_run_resumed_from_lightnings_usual_checkpoint_after_an_epoch_trains_on_the_same_batches(first_runs,
                                                                                                   resumed_runs,
                                                                                                   reference, name):
    """ModelCheckpoint(save_last=True): at the epoch's end Lightning does not restore the
    loader's state, it only calls sampler.set_epoch(1), which must move the augmentation
    seeds too; on the epoch's last step it restores a state saved after the last batch,
    which must be the next epoch's start."""
    assert first_runs["usual", name].trained == reference[:STEPS_PER_EPOCH]
    assert resumed_runs["usual", name].trained == reference


TORCH_SAMPLER_FIT = """
import sys, warnings
sys.path.insert(0, "examples")
import pytorch_lightning as pl, torch, shmload
from shmload.tools.synthetic import SyntheticRegression
import lightning_train as example
dataset = SyntheticRegression(32)
sampler = torch.utils.data.DistributedSampler(dataset, num_replicas=1, rank=0, seed=0)
loader = shmload.DataLoader(dataset, batch_size=8, sampler=sampler, seed=0, output="torch")
with warnings.catch_warnings(record=True) as caught:
    warnings.simplefilter("always")
    pl.Trainer(max_epochs=2, accelerator="cpu", devices=1, logger=False, enable_progress_bar=False,
               enable_model_summary=False, default_root_dir=sys.argv[1]).fit(example.Regression(), loader)
print([str(w.message)[:90] for w in caught if issubclass(w.category, shmload.ShmloadWarning)])
"""


@timeout(FIRST_RUNS)
def test_a_sampler_without_state_dict_does_not_break_lightnings_checkpoints(first_runs):
    """torch's DistributedSampler has no state_dict: Lightning's checkpoint (at each epoch's
    end) saves the loader's position alone, with one warning, instead of failing."""
    done = first_runs["torch sampler"]
    result = done.result
    warned = ast.literal_eval(result.stdout.splitlines()[-1])  # at two checkpoints: one warning
    assert len(warned) == 1 and "the sampler DistributedSampler has no state_dict" in warned[0]
    assert list((done.folder / "checkpoints").glob("*.ckpt"))


def test_ddp_spawn_gives_each_process_a_disjoint_share_that_covers_the_dataset(tmp_path):
    fit(tmp_path, "--epochs", "2", "--devices", "2", "--strategy", "ddp_spawn", "--workers", "1",
        timeout=240)
    ranks = [seen(tmp_path, rank) for rank in (0, 1)]
    for epoch in (0, 1):
        shares = [[i for e, ids, _ in steps if e == epoch for i in ids] for steps in ranks]
        assert len(shares[0]) == len(shares[1]) == SAMPLES // 2
        assert not set(shares[0]) & set(shares[1])
        assert sorted(shares[0] + shares[1]) == list(range(SAMPLES))
