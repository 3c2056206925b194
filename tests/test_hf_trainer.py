"""Under the real HF Trainer (the ``hf`` extra: transformers==5.23.0, accelerate==1.15.0,
torch==2.13.0): examples/hf_trainer_train.py runs as a user runs it, stopped at a
checkpoint and resumed with ``resume_from_checkpoint``, and what the model trained on
(and its final weights) is compared with an uninterrupted run. Those tests are marked
``torch`` and skipped without transformers. The adapter's parts that need no Trainer
(shmload/integrations/hf_trainer.py) are tested in-process, without importing it."""

from __future__ import annotations

import importlib.util
import json
import os
import runpy
import sys
import types

import pytest

import shmload
from shmload.integrations import hf_trainer

from .helpers import RangeDataset, shuffled_order
from .scripts import ROOT, describe, read_jsonl, run_script, torchrun_args

pytestmark = pytest.mark.timeout(300)  # a run imports torch and transformers: ~6 s each
needs_trainer = pytest.mark.skipif(importlib.util.find_spec("transformers") is None,
                                   reason="transformers is not installed (pip install -e '.[hf]')")

SCRIPT = os.path.join("examples", "hf_trainer_train.py")
SAMPLES, BATCH = 104, 8
BATCHES = SAMPLES // BATCH  # 13 an epoch: with gradient_accumulation_steps=2, an epoch's last step has 1

# The example, with its SaveAndStop asking for the save and the stop after the first batch
# of the step after STEP (on_substep_end), in the middle of a step, instead of at its end:
# the Trainer then stops, and saves (step STEP) at the epoch's end.
STOP_IN_A_STEP = """
import sys
sys.path.insert(0, "examples")
import hf_trainer_train as example

class StopInAStep(example.SaveAndStop):
    on_substep_end, on_step_end = example.SaveAndStop.on_step_end, example.TrainerCallback.on_step_end

example.SaveAndStop = StopInAStep
sys.exit(example.main(sys.argv[1:]))
"""


def batches_by_step(step, accumulate):
    """The batches trained by the end of optimizer step ``step``."""
    per_epoch = -(-BATCHES // accumulate)
    epoch, within = divmod(step, per_epoch)
    return epoch * BATCHES + within * accumulate


def train(tmp_path, *args, command=(SCRIPT,), ranks=1, expect=0, timeout=150):
    """Run the example with its output in ``tmp_path``; its final {"global_step", "weights"}
    (or, with ``expect`` != 0, the finished process)."""
    cmd = [*command, "--output-dir", str(tmp_path / "out"), "--record", str(tmp_path / "run"),
           "--samples", str(SAMPLES), "--batch-size", str(BATCH), *args]
    if ranks > 1:
        cmd = torchrun_args(ranks, [*cmd, "--workers", "1"])
    result = run_script(cmd, timeout=timeout, OMP_NUM_THREADS="1")
    assert result.returncode == expect, describe(result)
    if expect != 0:
        return result
    reports = [line for line in result.stdout.splitlines() if line.startswith('{"global_step"')]
    assert len(reports) == 1, describe(result)  # printed by the first process only
    return json.loads(reports[0])


def seen(tmp_path, rank=0):
    """[epoch, sample ids, augmentation checksum] per batch the model trained on, in order."""
    return read_jsonl(tmp_path / f"run.rank{rank}.jsonl")


def saved_position(tmp_path, step, name="shmload_loader.json"):
    with open(tmp_path / "out" / f"checkpoint-{step}" / name) as f:
        state = json.load(f)
    return state["epoch"], state["next_batch"]


@pytest.fixture(scope="module")
def reference(tmp_path_factory):
    """Uninterrupted runs of 2 epochs, per gradient_accumulation_steps: (what was trained
    on, the final global_step and weights)."""
    runs = {}
    for accumulate in (1, 2):
        tmp = tmp_path_factory.mktemp(f"hf-trainer-ga{accumulate}")
        final = train(tmp, "--accumulate", str(accumulate))
        runs[accumulate] = (seen(tmp), final)
    return runs


# ------------------------------------------------------------ under the Trainer


@pytest.mark.torch
@needs_trainer
def test_train_sees_every_sample_once_per_epoch_in_a_new_order(reference):
    batches, final = reference[1]
    assert len(batches) == 2 * BATCHES and final["global_step"] == 2 * BATCHES
    epochs = [[i for e, ids, _ in batches if e == epoch for i in ids] for epoch in (0, 1)]
    for epoch, ids in enumerate(epochs):
        assert ids == shuffled_order(SAMPLES, epoch)  # the Trainer's epoch is shmload's
    # gradient accumulation changes the steps, not the batches: 7 steps an epoch, the last of 1 batch
    batches2, final2 = reference[2]
    assert batches2 == batches and final2["global_step"] == 2 * 7


@pytest.mark.torch
@needs_trainer
@pytest.mark.parametrize("accumulate, step", [(1, 5), (1, BATCHES + 5), (2, 3), (2, 7), (2, 7 + 3)],
                         ids=["ga1-in-epoch-0", "ga1-in-epoch-1", "ga2-in-epoch-0", "ga2-at-epoch-end",
                              "ga2-in-epoch-1"])
def test_a_run_resumed_from_a_checkpoint_trains_on_exactly_the_same_batches(tmp_path, reference, accumulate, step):
    batches, final = reference[accumulate]
    trained = batches_by_step(step, accumulate)
    stopped = train(tmp_path, "--accumulate", str(accumulate), "--checkpoint-at", str(step))
    assert stopped["global_step"] == step
    assert seen(tmp_path) == batches[:trained]
    # the position: (epoch, batches handed out); after an epoch's last batch, the next epoch's start
    assert saved_position(tmp_path, step) == divmod(trained, BATCHES)
    resumed = train(tmp_path, "--accumulate", str(accumulate), "--resume", "True")
    assert seen(tmp_path) == batches  # sample ids and augmentations, batch for batch
    assert resumed == final  # the same optimizer steps: the epoch's partial last step is stepped


@pytest.mark.torch
@needs_trainer
def test_a_checkpoint_saved_in_the_middle_of_a_step_holds_the_position_of_the_last_step(tmp_path, reference):
    """The Trainer reads all the batches of a step before training them: a stop asked for
    after the first batch of step 4 (then a save at the epoch's end, of step 3) leaves the
    loader 2 batches ahead of the checkpoint. The saved position is step 3's."""
    batches, final = reference[2]
    command = ("-c", STOP_IN_A_STEP)
    assert train(tmp_path, "--accumulate", "2", "--checkpoint-at", "3", command=command)["global_step"] == 3
    assert seen(tmp_path) == batches[:7]  # step 4's first batch was trained on, not stepped
    assert saved_position(tmp_path, 3) == (0, 6)
    assert train(tmp_path, "--accumulate", "2", "--resume", "True") == final
    assert seen(tmp_path)[7:] == batches[6:]  # step 4 again, whole


@pytest.mark.torch
@needs_trainer
def test_two_processes_under_torchrun_each_resume_their_own_share(tmp_path):
    ref = tmp_path / "ref"
    ref.mkdir()
    final = train(ref, ranks=2)
    train(tmp_path, "--checkpoint-at", "10", ranks=2)  # 7 steps an epoch: in epoch 1
    for rank in (0, 1):
        assert saved_position(tmp_path, 10, f"shmload_loader.rank{rank}.json") == (1, 3)
    assert train(tmp_path, "--resume", "True", ranks=2) == final
    shares = [seen(ref, rank) for rank in (0, 1)]
    for rank in (0, 1):
        assert seen(tmp_path, rank) == shares[rank]
    for epoch in (0, 1):
        ids = [[i for e, b, _ in share if e == epoch for i in b] for share in shares]
        assert not set(ids[0]) & set(ids[1]) and sorted(ids[0] + ids[1]) == list(range(SAMPLES))


@pytest.mark.torch
@needs_trainer
def test_ignore_data_skip_is_refused_at_the_start_of_a_run(tmp_path):
    result = train(tmp_path, "--ignore-data-skip", expect=1)
    assert "ValueError: ShmloadCheckpoint: TrainingArguments(ignore_data_skip=True)" in result.stderr
    assert "Leave ignore_data_skip at its default, False" in result.stderr
    assert not os.path.exists(tmp_path / "run.rank0.jsonl")  # refused before the first batch


@pytest.mark.torch
@needs_trainer
def test_resuming_from_a_checkpoint_without_the_loader_state_says_which_file_is_missing(tmp_path):
    train(tmp_path, "--epochs", "1", "--checkpoint-at", "5")
    missing = tmp_path / "out" / "checkpoint-5" / "shmload_loader.json"
    os.remove(missing)
    result = train(tmp_path, "--epochs", "1", "--resume", str(tmp_path / "out" / "checkpoint-5"), expect=1)
    assert f"the run resumes from step 5, but {missing} does not exist" in result.stderr


# ------------------------------------------------------------ without the Trainer


def test_importing_the_adapter_does_not_import_transformers():
    result = run_script(["-c", "import sys, shmload.integrations.hf_trainer; print(sorted("
                               "m for m in ('transformers', 'torch', 'accelerate') if m in sys.modules))"], timeout=60)
    assert result.returncode == 0 and result.stdout.strip() == "[]", describe(result)


@pytest.fixture
def without_transformers(monkeypatch):
    """Imports of torch and transformers fail, as if they were not installed."""
    for name in ("torch", "transformers"):
        monkeypatch.setitem(sys.modules, name, None)
    hf_trainer._transformers.cache_clear()
    yield
    hf_trainer._transformers.cache_clear()


@pytest.mark.pure
def test_without_transformers_the_callback_says_what_to_install(without_transformers):
    with pytest.raises(shmload.OptionalDependencyError, match=r"^ShmloadCheckpoint needs transformers .* pip "
                                                              r"install 'shmload\[hf\]' \(transformers==5.23.0"):
        hf_trainer.ShmloadCheckpoint()


@pytest.mark.pure
def test_without_transformers_the_example_says_what_to_install_and_exits_3(without_transformers, monkeypatch,
                                                                          capsys):
    monkeypatch.setattr(sys, "argv", [SCRIPT])
    with pytest.raises(SystemExit) as exit:
        runpy.run_path(os.path.join(ROOT, SCRIPT), run_name="__main__")
    assert exit.value.code == 3
    assert "pip install 'shmload[hf]'" in capsys.readouterr().err


@pytest.mark.torch
@needs_trainer
def test_an_elastic_checkpoint_of_two_processes_resumes_in_one(tmp_path):
    """--elastic: the global batch is 16 samples, 8 on each of 2 processes or 16 on 1; a
    checkpoint saved by 2 processes after step 5 resumes in 1 process on the rest of the
    global sequence of an uninterrupted run in 1 process (the same for any world)."""
    ref = tmp_path / "ref"
    ref.mkdir()
    final = train(ref, "--elastic", "--batch-size", str(2 * BATCH))
    stopped = tmp_path / "stopped"
    stopped.mkdir()
    train(stopped, "--elastic", "--checkpoint-at", "5", "--batch-size", str(BATCH), ranks=2)
    checkpoint = stopped / "out" / "checkpoint-5"
    assert sorted(p.name for p in checkpoint.glob("shmload_loader*")) == ["shmload_loader.json"]
    state = json.loads((checkpoint / "shmload_loader.json").read_text())
    assert state["sampler"]["position"] == 5 * 2 * BATCH and state["sampler"]["elastic"] is True
    os.rename(stopped / "out", tmp_path / "out")  # (the resumed run's output_dir holds the checkpoint)
    resumed = train(tmp_path, "--elastic", "--resume", "True", "--batch-size", str(2 * BATCH))
    assert resumed["global_step"] == final["global_step"]
    assert resumed["weights"] == pytest.approx(final["weights"], abs=1e-6)
    whole = seen(ref)
    head = [[e0, ids0 + ids1, s0 + s1] for (e0, ids0, s0), (_, ids1, s1) in zip(seen(stopped, 0), seen(stopped, 1))]
    for got, expected in zip(head + seen(tmp_path), whole, strict=True):
        assert got[:2] == expected[:2]
        assert got[2] == pytest.approx(expected[2], abs=1e-3)


@pytest.mark.pure
def test_the_state_file_is_per_process_when_there_are_several():
    assert hf_trainer.loader_state_file("ck") == os.path.join("ck", "shmload_loader.json")
    assert hf_trainer.loader_state_file("ck", 1, 2) == os.path.join("ck", "shmload_loader.rank1.json")
    assert hf_trainer.loader_state_file("ck", 1, 2, elastic=True) == os.path.join("ck", "shmload_loader.json")


@pytest.mark.pure
@pytest.mark.parametrize("name", ["ignore_data_skip", "enable_jit_checkpoint"])
def test_training_arguments_that_cannot_resume_exactly_are_refused(name):
    args = types.SimpleNamespace(ignore_data_skip=False, enable_jit_checkpoint=False)
    hf_trainer.check_training_args(args)
    setattr(args, name, True)
    with pytest.raises(ValueError, match=rf"^ShmloadCheckpoint: TrainingArguments\({name}=True\)"):
        hf_trainer.check_training_args(args)


def resumed_loader(next_batch):
    """A loader (no workers) whose loaded state is after ``next_batch`` batches of epoch 1."""
    loader = shmload.DataLoader(RangeDataset(40), batch_size=4, shuffle=True, seed=0)
    loader.set_epoch(1)
    epoch = iter(loader)
    for _ in range(next_batch):
        next(epoch)
    state = loader.state_dict()
    fresh = shmload.DataLoader(RangeDataset(40), batch_size=4, shuffle=True, seed=0)
    fresh.load_state_dict(state)
    return fresh, state


@pytest.mark.pure
def test_the_trainers_skip_returns_the_resumed_loader_when_the_counts_agree():
    original = []
    skip = hf_trainer._wrap_skip(lambda loader, n: original.append((loader, n)) or "rebuilt")
    assert skip.shmload_wrapped and skip("a torch loader", 3) == "rebuilt" and original == [("a torch loader", 3)]

    loader, state = resumed_loader(4)
    with pytest.raises(RuntimeError, match=r"add callbacks=\[ShmloadCheckpoint\(\)\]"):
        skip(loader, 4)  # not resumed by ShmloadCheckpoint: accelerate's rebuild would be wrong
    hf_trainer._ARMED.add(loader)
    with pytest.raises(ValueError, match=r"loader state is after batch 4 of epoch 1, but the Trainer resumes "
                                         r"the epoch after 6 batches"):
        skip(loader, 6)
    hf_trainer._ARMED.add(loader)
    assert skip(loader, 4) is loader and loader not in hf_trainer._ARMED  # once
    loader.set_epoch(1)  # as the Trainer does next
    order = shuffled_order(40, 1)
    assert [b.tolist() for b in loader] == [order[i:i + 4] for i in range(16, 40, 4)]  # batches 4 to 9


@pytest.mark.pure
def test_a_position_counts_the_batches_handed_out_beyond_the_next_one():
    assert hf_trainer.delivered_batches({"kind": "map", "next_batch": 3, "delivered_beyond": [5, 6]}) == 5
    assert hf_trainer.delivered_batches({"kind": "iterable", "streams": []}) is None
    hf_trainer.check_skip({"kind": "iterable", "epoch": 0}, 7)  # a stream's position is not checked
    hf_trainer.check_skip({"kind": "map", "epoch": 0, "next_batch": 3, "delivered_beyond": [5, 6]}, 5)


@pytest.mark.torch
@needs_trainer
def test_callbacks_out_of_order_say_so():
    """A Trainer (or a test harness) calling on_step_end or on_save before on_train_begin
    gets a RuntimeError naming what is missing, not an AttributeError on None."""
    callback = hf_trainer.ShmloadCheckpoint()
    state = types.SimpleNamespace(global_step=3)
    with pytest.raises(RuntimeError, match=r"step 3 ended, but no loader was given to the callback "
                                           r"\(was on_train_begin not called\?\)"):
        callback.on_step_end(None, state, None)
    with pytest.raises(RuntimeError, match=r"the Trainer saves step 3, but the loader's state was never taken "
                                           r"\(was on_train_begin not called\?\)"):
        callback.on_save(None, state, None)
