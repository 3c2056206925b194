"""Under real PyTorch Lightning (the ``lightning`` extra: pytorch-lightning==2.6.6,
torch==2.13.0): examples/lightning_train.py runs as a user runs it, and what the model
trained on is compared. Marked ``torch``; skipped without Lightning."""

from __future__ import annotations

import ast
import importlib.util
import os

import pytest

from .helpers import shuffled_order
from .scripts import describe, read_jsonl, run_script

pytestmark = [pytest.mark.torch, pytest.mark.timeout(300),  # a fit() imports torch and Lightning: ~10 s
              pytest.mark.skipif(importlib.util.find_spec("pytorch_lightning") is None,
                                 reason="pytorch-lightning is not installed (pip install -e '.[lightning]')")]

SCRIPT = os.path.join("examples", "lightning_train.py")
SAMPLES, BATCH = 96, 8
STEPS_PER_EPOCH = SAMPLES // BATCH


def fit(tmp_path, record, *args, timeout=150):
    result = run_script([SCRIPT, "--record", str(tmp_path / record), "--samples", str(SAMPLES),
                         "--batch-size", str(BATCH), *args], timeout=timeout)
    assert result.returncode == 0, describe(result)
    return result


def seen(tmp_path, record, rank=0):
    return read_jsonl(tmp_path / f"{record}.rank{rank}.jsonl")


@pytest.fixture(scope="module")
def reference(tmp_path_factory):
    """An uninterrupted fit() of 2 epochs: [epoch, sample ids, augmentation checksum] per step."""
    tmp = tmp_path_factory.mktemp("lightning")
    fit(tmp, "ref", "--epochs", "2")
    return seen(tmp, "ref")


def test_fit_sees_every_sample_once_per_epoch_in_a_new_order(reference):
    assert len(reference) == 2 * STEPS_PER_EPOCH
    epochs = [[i for e, ids, _ in reference if e == epoch for i in ids] for epoch in (0, 1)]
    for ids in epochs:
        assert sorted(ids) == list(range(SAMPLES))
    assert epochs[0] != epochs[1]
    assert epochs[0] != list(range(SAMPLES))  # shuffled
    # the probe iter() Lightning makes must not use up an epoch: epoch 0 is shmload's epoch 0
    assert epochs[0] == shuffled_order(SAMPLES, 0)


@pytest.mark.parametrize("step, workers", [(5, "auto"), (STEPS_PER_EPOCH + 5, "2")],
                         ids=["in-epoch-0-auto-workers", "in-epoch-1"])
def test_a_run_resumed_from_a_mid_epoch_checkpoint_trains_on_exactly_the_same_batches(tmp_path, reference, step,
                                                                                       workers):
    """With num_workers="auto" (in epoch 0) the count may change while fit() runs, and the
    checkpoint's loader state, with the count run last, resumes exactly all the same."""
    ckpt = str(tmp_path / "mid.ckpt")
    stopped = fit(tmp_path, "run", "--epochs", "2", "--workers", workers, "--checkpoint-at", str(step),
                  "--checkpoint", ckpt)
    assert f"stopped at step {step}" in stopped.stdout
    assert seen(tmp_path, "run") == reference[:step]
    fit(tmp_path, "run", "--epochs", "2", "--workers", workers, "--resume", ckpt)
    assert seen(tmp_path, "run") == reference  # sample ids and augmentations, step for step


@pytest.mark.parametrize("every", [None, STEPS_PER_EPOCH], ids=["at-epoch-end", "on-the-epochs-last-step"])
def test_a_run_resumed_from_lightnings_usual_checkpoint_after_an_epoch_trains_on_the_same_batches(tmp_path,
                                                                                                   reference, every):
    """ModelCheckpoint(save_last=True): at the epoch's end Lightning does not restore the
    loader's state, it only calls sampler.set_epoch(1), which must move the augmentation
    seeds too; on the epoch's last step it restores a state saved after the last batch,
    which must be the next epoch's start."""
    ckpt = tmp_path / "ckpt"
    args = ["--model-checkpoint", str(ckpt)] + (["--every-n-train-steps", str(every)] if every else [])
    fit(tmp_path, "run", "--epochs", "1", *args)
    assert seen(tmp_path, "run") == reference[:STEPS_PER_EPOCH]
    fit(tmp_path, "run", "--epochs", "2", "--resume", str(ckpt / "last.ckpt"), *args)
    assert seen(tmp_path, "run") == reference


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


def test_a_sampler_without_state_dict_does_not_break_lightnings_checkpoints(tmp_path):
    """torch's DistributedSampler has no state_dict: Lightning's checkpoint (at each epoch's
    end) saves the loader's position alone, with one warning, instead of failing."""
    result = run_script(["-c", TORCH_SAMPLER_FIT, str(tmp_path)], timeout=150)
    assert result.returncode == 0, describe(result)
    warned = ast.literal_eval(result.stdout.splitlines()[-1])  # at two checkpoints: one warning
    assert len(warned) == 1 and "the sampler DistributedSampler has no state_dict" in warned[0]
    assert list((tmp_path / "checkpoints").glob("*.ckpt"))


def test_ddp_spawn_gives_each_process_a_disjoint_share_that_covers_the_dataset(tmp_path):
    fit(tmp_path, "ddp", "--epochs", "2", "--devices", "2", "--strategy", "ddp_spawn", "--workers", "1",
        timeout=240)
    ranks = [seen(tmp_path, "ddp", rank) for rank in (0, 1)]
    for epoch in (0, 1):
        shares = [[i for e, ids, _ in steps if e == epoch for i in ids] for steps in ranks]
        assert len(shares[0]) == len(shares[1]) == SAMPLES // 2
        assert not set(shares[0]) & set(shares[1])
        assert sorted(shares[0] + shares[1]) == list(range(SAMPLES))
