"""Under real HF accelerate (the ``accelerate`` extra: accelerate==1.15.0, torch==2.13.0):
examples/accelerate_train.py runs as a user runs it, in one process and under torchrun
with two, and what it trained on is compared. Marked ``torch``; skipped without accelerate."""

from __future__ import annotations

import importlib.util

import pytest

from .scripts import describe, read_jsonl, run_script, run_scripts, torchrun_args

RUN_TIMEOUT = 150  # seconds for one run (about 5 s, most of it importing torch and accelerate)
pytestmark = [pytest.mark.torch, pytest.mark.timeout(300),
              pytest.mark.skipif(importlib.util.find_spec("accelerate") is None,
                                 reason="accelerate is not installed (pip install -e '.[accelerate]')")]

SCRIPT = "examples/accelerate_train.py"
SAMPLES, BATCH, ACCUMULATE = 90, 4, 4
BATCHES = -(-SAMPLES // BATCH)  # 23 a epoch: the last accumulation window is partial (23 % 4 == 3)


def train_args(tmp_path, record, *args, ranks=1):
    cmd = [SCRIPT, "--record", str(tmp_path / record), "--samples", str(SAMPLES), "--batch-size", str(BATCH),
           "--accumulate", str(ACCUMULATE), *args]
    return torchrun_args(ranks, cmd) if ranks > 1 else cmd


def train(tmp_path, record, *args, ranks=1, timeout=RUN_TIMEOUT):
    result = run_script(train_args(tmp_path, record, *args, ranks=ranks), timeout=timeout, OMP_NUM_THREADS="1")
    assert result.returncode == 0, describe(result)
    return result


def train_all(runs: dict) -> dict:
    """Make ``runs`` (name: train()'s arguments, one process each), AT_ONCE at a time (each a
    fresh interpreter, mostly importing torch and accelerate on one core); name: the
    finished process."""
    results = run_scripts([(train_args(*args), {"OMP_NUM_THREADS": "1"}) for args in runs.values()],
                          timeout=RUN_TIMEOUT)
    for result in results:
        assert result.returncode == 0, describe(result)
    return dict(zip(runs, results))


def rows(tmp_path, record, rank=0):
    """[epoch, ids, augmentation checksum, sync_gradients, end_of_dataloader] per batch."""
    return read_jsonl(tmp_path / f"{record}.rank{rank}.jsonl")


STOPS = {"in-epoch-0": 7, "in-epoch-1": BATCHES + 7}  # name: the batch after which a run saves its state and stops


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """The module's runs in one process, in a folder of theirs, recording to FOLDER/NAME:
    "ref", uninterrupted; "plain", --plain for one epoch; each run of STOPS, stopped after
    its batch with its state saved to FOLDER/state-NAME, then resumed from it (recording to
    the same file)."""
    tmp = tmp_path_factory.mktemp("accelerate")
    first = {"ref": (tmp, "ref"), "plain": (tmp, "plain", "--plain", "--epochs", "1")}
    for name, stop in STOPS.items():
        first[name] = (tmp, name, "--checkpoint-at", str(stop), "--checkpoint", str(tmp / f"state-{name}"))
    train_all(first)
    train_all({name: (tmp, name, "--resume", str(tmp / f"state-{name}")) for name in STOPS})
    return tmp


@pytest.fixture(scope="module")
def reference(runs):
    return rows(runs, "ref")


@pytest.mark.timeout(60 + 3 * RUN_TIMEOUT)  # (the module's runs: 3 rounds of two)
def test_accumulation_sees_the_end_of_every_epoch_and_steps_its_partial_window(reference):
    assert len(reference) == 2 * BATCHES
    for epoch in (0, 1):
        steps = [r for r in reference if r[0] == epoch]
        assert sorted(i for r in steps for i in r[1]) == list(range(SAMPLES))
        assert [r[4] for r in steps] == [False] * (BATCHES - 1) + [True]  # end_of_dataloader
        synced = [k for k, r in enumerate(steps) if r[3]]
        assert synced == [3, 7, 11, 15, 19, 22]  # every 4th batch, and the epoch's last


@pytest.mark.timeout(60 + 3 * RUN_TIMEOUT)
def test_without_the_adapter_accelerate_misses_the_end(runs):
    """What for_accelerate() is for: accelerate alone never sees a shmload loader's end."""
    steps = rows(runs, "plain")  # (--plain, one epoch)
    assert len(steps) == BATCHES and not any(r[4] for r in steps)
    assert not steps[-1][3]  # the partial window is carried into the next epoch


@pytest.mark.timeout(60 + 3 * RUN_TIMEOUT)
@pytest.mark.parametrize("name", list(STOPS))
def test_save_state_and_load_state_resume_the_loader_exactly(runs, reference, name):
    assert [r[:3] for r in rows(runs, name)] == [r[:3] for r in reference]  # the stopped run's, then the resumed's


def test_two_processes_under_torchrun_get_disjoint_covering_shares_and_see_the_end(tmp_path):
    train(tmp_path, "ddp", ranks=2, timeout=240)
    per_rank = [rows(tmp_path, "ddp", rank) for rank in (0, 1)]
    for epoch in (0, 1):
        shares = [[i for r in steps if r[0] == epoch for i in r[1]] for steps in per_rank]
        assert len(shares[0]) == len(shares[1]) == SAMPLES // 2
        assert not set(shares[0]) & set(shares[1])
        assert sorted(shares[0] + shares[1]) == list(range(SAMPLES))
        for steps in per_rank:
            ends = [r[4] for r in steps if r[0] == epoch]
            assert ends[-1] and not any(ends[:-1])


def test_the_adapter_pickles_as_the_loader_it_wraps():
    import pickle

    import shmload
    from shmload.integrations import for_accelerate
    from shmload.tools.synthetic import SyntheticRegression
    wrapped = for_accelerate(shmload.DataLoader(SyntheticRegression(12), batch_size=4, seed=3))
    copy = pickle.loads(pickle.dumps(wrapped))
    assert type(copy) is type(wrapped) and copy.loader.seed == 3 and len(copy) == 3
    assert [b["id"].tolist() for b in copy] == [b["id"].tolist() for b in wrapped]
