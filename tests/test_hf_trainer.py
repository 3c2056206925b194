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
import shutil
import subprocess
import sys
import types
from pathlib import Path
from typing import NamedTuple

import pytest

import shmload
from shmload.integrations import hf_trainer

from .helpers import RangeDataset, shuffled_order
from .scripts import AT_ONCE, ROOT, describe, read_jsonl, run_script, run_scripts, torchrun_args

RUN_TIMEOUT = 150  # seconds for one run (about 7 s, most of it importing torch and transformers)
pytestmark = pytest.mark.timeout(300)
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

# The example, with its SaveAndStop also saving a checkpoint (and going on) after each of
# the steps in the first argument ("5" or "3,7"), before the save and the stop after STEP.
SAVE_ON_THE_WAY = """
import sys
sys.path.insert(0, "examples")
import hf_trainer_train as example

class SaveOnTheWay(example.SaveAndStop):
    def on_step_end(self, args, state, control, **kwargs):
        if state.global_step in EARLIER:
            control.should_save = True
        super().on_step_end(args, state, control, **kwargs)

EARLIER = {int(step) for step in sys.argv.pop(1).split(",")}
example.SaveAndStop = SaveOnTheWay
sys.exit(example.main(sys.argv[1:]))
"""

# Per gradient_accumulation_steps, the checkpoints the resume tests start from: one stopped
# run saves them all, stopping after the last (7 optimizer steps an epoch with 2: step 7
# ends epoch 0 with a step of 1 batch).
STOPS = {1: (5, BATCHES + 5), 2: (3, 7, 7 + 3)}


def batches_by_step(step, accumulate):
    """The batches trained by the end of optimizer step ``step``."""
    per_epoch = -(-BATCHES // accumulate)
    epoch, within = divmod(step, per_epoch)
    return epoch * BATCHES + within * accumulate


def train_args(tmp_path, *args, command=(SCRIPT,), ranks=1):
    """The arguments of a run of the example with its output in ``tmp_path``."""
    cmd = [*command, "--output-dir", str(tmp_path / "out"), "--record", str(tmp_path / "run"),
           "--samples", str(SAMPLES), "--batch-size", str(BATCH), *args]
    return torchrun_args(ranks, [*cmd, "--workers", "1"]) if ranks > 1 else cmd


def outcome(result, expect=0):
    """A finished run's final {"global_step", "weights"} (or, with ``expect`` != 0, the
    finished process)."""
    assert result.returncode == expect, describe(result)
    if expect != 0:
        return result
    reports = [line for line in result.stdout.splitlines() if line.startswith('{"global_step"')]
    assert len(reports) == 1, describe(result)  # printed by the first process only
    return json.loads(reports[0])


def train(tmp_path, *args, command=(SCRIPT,), ranks=1, expect=0, timeout=RUN_TIMEOUT):
    """Run the example with its output in ``tmp_path``; its :func:`outcome`."""
    result = run_script(train_args(tmp_path, *args, command=command, ranks=ranks), timeout=timeout,
                        OMP_NUM_THREADS="1")
    return outcome(result, expect)


def seen(tmp_path, rank=0):
    """[epoch, sample ids, augmentation checksum] per batch the model trained on, in order."""
    return read_jsonl(tmp_path / f"run.rank{rank}.jsonl")


def saved_position(tmp_path, step, name="shmload_loader.json"):
    with open(tmp_path / "out" / f"checkpoint-{step}" / name) as f:
        state = json.load(f)
    return state["epoch"], state["next_batch"]


def saved_step(tmp_path, step):
    """The global_step of the Trainer's own state in the checkpoint folder of ``step``."""
    with open(tmp_path / "out" / f"checkpoint-{step}" / "trainer_state.json") as f:
        return json.load(f)["global_step"]


# ------------------------------------------------------------ the runs under the Trainer
# Every run of the example in one process is made by one of two module fixtures, AT_ONCE
# at a time (each is a fresh interpreter, as a user runs it, and is mostly importing torch
# and transformers on one core): first_runs, the runs that start from nothing, then
# resumed_runs, the runs that resume a checkpoint of a first run, each in a folder of its
# own. The tests check what they did.


class Run(NamedTuple):
    """A run to make: its folder (--output-dir FOLDER/out, --record FOLDER/run), its
    arguments, the command (the example, or a wrapper of it), its expected exit status, and
    its processes (more than one: under torchrun)."""
    folder: Path
    args: tuple[str, ...]
    command: tuple[str, ...] = (SCRIPT,)
    expect: int = 0
    ranks: int = 1


class Done(NamedTuple):
    """A run made: its folder, its :func:`outcome`, and the batches it trained on as it
    ended (:func:`seen`; None where it recorded none)."""
    folder: Path
    outcome: dict | subprocess.CompletedProcess
    trained: list | None


def train_all(runs: dict) -> dict:
    """Make ``runs`` (name: Run), AT_ONCE at a time; name: Done."""
    results = run_scripts([(train_args(run.folder, *run.args, command=run.command, ranks=run.ranks),
                            {"OMP_NUM_THREADS": "1"}) for run in runs.values()], timeout=RUN_TIMEOUT)
    return {name: Done(run.folder, outcome(result, run.expect),
                       seen(run.folder) if os.path.exists(run.folder / "run.rank0.jsonl") else None)
            for (name, run), result in zip(runs.items(), results)}


def waves(runs: int) -> int:
    return -(-runs // AT_ONCE)


FIRST_RUNS, RESUMED_RUNS = 6, 7  # (the fixtures below make these many)


def timeout(*counts: int):
    """pytest-timeout for a test that may make (or its fixtures make) batches of ``counts``
    runs, AT_ONCE at a time (a run overrunning is killed, and reported, by its own time-out
    before this one)."""
    return pytest.mark.timeout(60 + sum(waves(n) for n in counts) * RUN_TIMEOUT)


@pytest.fixture(scope="module")
def first_runs(tmp_path_factory) -> dict:
    """The runs that start from nothing: ("reference", GA), uninterrupted, 2 epochs, per
    gradient_accumulation_steps GA; ("stopped", GA), stopped after the last step of
    STOPS[GA] with a checkpoint saved after each (SAVE_ON_THE_WAY); "stopped in a step"
    (STOP_IN_A_STEP, GA 2, step 3); "ignore_data_skip", refused (exit status 1)."""
    def folder(name):
        return tmp_path_factory.mktemp(f"hf-trainer-{name}")

    runs = {}
    for accumulate, steps in STOPS.items():
        runs["reference", accumulate] = Run(folder(f"reference-ga{accumulate}"), ("--accumulate", str(accumulate)))
        runs["stopped", accumulate] = Run(folder(f"stopped-ga{accumulate}"),
                                          ("--accumulate", str(accumulate), "--checkpoint-at", str(steps[-1])),
                                          command=("-c", SAVE_ON_THE_WAY, ",".join(map(str, steps[:-1]))))
    runs["stopped in a step"] = Run(folder("stopped-in-a-step"), ("--accumulate", "2", "--checkpoint-at", "3"),
                                    command=("-c", STOP_IN_A_STEP))
    runs["ignore_data_skip"] = Run(folder("ignore-data-skip"), ("--ignore-data-skip",), expect=1)
    assert len(runs) == FIRST_RUNS
    return train_all(runs)


@pytest.fixture(scope="module")
def resumed_runs(tmp_path_factory, first_runs) -> dict:
    """The runs that resume a checkpoint of a first run, each in a folder of its own that
    holds a copy of that checkpoint alone (``--resume True`` picks it) and of the batches
    trained up to it: (GA, STEP) for each step of STOPS[GA]; "stopped in a step"; and
    "missing state", from the checkpoint of step 5 (GA 1) without its shmload_loader.json
    (refused: exit status 1)."""
    def copy(name, done, step, batches):
        folder = tmp_path_factory.mktemp(f"hf-trainer-resumed-{name}")
        checkpoint = f"checkpoint-{step}"
        shutil.copytree(done.folder / "out" / checkpoint, folder / "out" / checkpoint)
        with open(folder / "run.rank0.jsonl", "w") as f:
            f.writelines(json.dumps(batch) + "\n" for batch in done.trained[:batches])
        return folder

    runs = {}
    for accumulate, steps in STOPS.items():
        for step in steps:
            folder = copy(f"ga{accumulate}-{step}", first_runs["stopped", accumulate], step,
                          batches_by_step(step, accumulate))
            runs[accumulate, step] = Run(folder, ("--accumulate", str(accumulate), "--resume", "True"))
    in_a_step = first_runs["stopped in a step"]
    runs["stopped in a step"] = Run(copy("in-a-step", in_a_step, 3, len(in_a_step.trained)),
                                    ("--accumulate", "2", "--resume", "True"))
    missing = copy("missing-state", first_runs["stopped", 1], 5, batches_by_step(5, 1)) / "out" / "checkpoint-5"
    os.remove(missing / "shmload_loader.json")
    runs["missing state"] = Run(missing.parent.parent, ("--resume", str(missing)), expect=1)
    assert len(runs) == RESUMED_RUNS
    return train_all(runs)


@pytest.fixture(scope="module")
def reference(first_runs):
    """Per gradient_accumulation_steps: (what the uninterrupted run trained on, its final
    global_step and weights)."""
    return {accumulate: (first_runs["reference", accumulate].trained, first_runs["reference", accumulate].outcome)
            for accumulate in STOPS}


# ------------------------------------------------------------ under the Trainer


@pytest.mark.torch
@needs_trainer
@timeout(FIRST_RUNS)
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
@timeout(FIRST_RUNS, RESUMED_RUNS)
@pytest.mark.parametrize("accumulate, step", [(1, 5), (1, BATCHES + 5), (2, 3), (2, 7), (2, 7 + 3)],
                         ids=["ga1-in-epoch-0", "ga1-in-epoch-1", "ga2-in-epoch-0", "ga2-at-epoch-end",
                              "ga2-in-epoch-1"])
def test_a_run_resumed_from_a_checkpoint_trains_on_exactly_the_same_batches(first_runs, resumed_runs, reference,
                                                                            accumulate, step):
    batches, final = reference[accumulate]
    stopped, last = first_runs["stopped", accumulate], STOPS[accumulate][-1]
    assert stopped.outcome["global_step"] == last
    assert stopped.trained == batches[:batches_by_step(last, accumulate)]
    # the checkpoint of step `step` (saved on the way, or before the stop) and its position:
    # (epoch, batches handed out); after an epoch's last batch, the next epoch's start
    trained = batches_by_step(step, accumulate)
    assert saved_step(stopped.folder, step) == step
    assert saved_position(stopped.folder, step) == divmod(trained, BATCHES)
    resumed = resumed_runs[accumulate, step]
    assert resumed.trained == batches  # (the batches up to the checkpoint, then the resumed run's)
    assert resumed.outcome == final  # the same optimizer steps: the epoch's partial last step is stepped


@pytest.mark.torch
@needs_trainer
@timeout(FIRST_RUNS, RESUMED_RUNS)
def test_a_checkpoint_saved_in_the_middle_of_a_step_holds_the_position_of_the_last_step(first_runs, resumed_runs,
                                                                                         reference):
    """The Trainer reads all the batches of a step before training them: a stop asked for
    after the first batch of step 4 (then a save at the epoch's end, of step 3) leaves the
    loader 2 batches ahead of the checkpoint. The saved position is step 3's."""
    batches, final = reference[2]
    stopped = first_runs["stopped in a step"]  # (STOP_IN_A_STEP)
    assert stopped.outcome["global_step"] == 3
    assert stopped.trained == batches[:7]  # step 4's first batch was trained on, not stepped
    assert saved_position(stopped.folder, 3) == (0, 6)
    resumed = resumed_runs["stopped in a step"]
    assert resumed.outcome == final
    assert resumed.trained[7:] == batches[6:]  # step 4 again, whole


@pytest.mark.torch
@needs_trainer
@timeout(2, 1)
def test_two_processes_under_torchrun_each_resume_their_own_share(tmp_path):
    ref = tmp_path / "ref"
    ref.mkdir()
    final = train_all({"reference": Run(ref, (), ranks=2),  # (and the stopped run, two at a time)
                       "stopped": Run(tmp_path, ("--checkpoint-at", "10"), ranks=2)})["reference"].outcome
    for rank in (0, 1):  # 7 steps an epoch: stopped in epoch 1
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
@timeout(FIRST_RUNS)
def test_ignore_data_skip_is_refused_at_the_start_of_a_run(first_runs):
    refused = first_runs["ignore_data_skip"]  # (--ignore-data-skip)
    assert "ValueError: ShmloadCheckpoint: TrainingArguments(ignore_data_skip=True)" in refused.outcome.stderr
    assert "Leave ignore_data_skip at its default, False" in refused.outcome.stderr
    assert not os.path.exists(refused.folder / "run.rank0.jsonl")  # refused before the first batch


@pytest.mark.torch
@needs_trainer
@timeout(FIRST_RUNS, RESUMED_RUNS)
def test_resuming_from_a_checkpoint_without_the_loader_state_says_which_file_is_missing(resumed_runs):
    refused = resumed_runs["missing state"]  # (resumed_runs removed the file from its copy of checkpoint-5)
    missing = refused.folder / "out" / "checkpoint-5" / "shmload_loader.json"
    assert not missing.exists()
    assert f"the run resumes from step 5, but {missing} does not exist" in refused.outcome.stderr


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
@timeout(2, 1)
def test_an_elastic_checkpoint_of_two_processes_resumes_in_one(tmp_path):
    """--elastic: the global batch is 16 samples, 8 on each of 2 processes or 16 on 1; a
    checkpoint saved by 2 processes after step 5 resumes in 1 process on the rest of the
    global sequence of an uninterrupted run in 1 process (the same for any world)."""
    ref, stopped = tmp_path / "ref", tmp_path / "stopped"
    ref.mkdir()
    stopped.mkdir()
    final = train_all({"reference": Run(ref, ("--elastic", "--batch-size", str(2 * BATCH))),  # (two at a time)
                       "stopped": Run(stopped, ("--elastic", "--checkpoint-at", "5", "--batch-size", str(BATCH)),
                                      ranks=2)})["reference"].outcome
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
