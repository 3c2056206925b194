"""Under real HF accelerate (the ``accelerate`` extra: accelerate==1.15.0, torch==2.13.0):
examples/accelerate_train.py runs as a user runs it, in one process and under torchrun
with two, and what it trained on is compared. Marked ``torch``; skipped without accelerate."""

from __future__ import annotations

import importlib.util

import pytest

from .scripts import describe, read_jsonl, run_script, torchrun_args

pytestmark = [pytest.mark.torch, pytest.mark.timeout(300),
              pytest.mark.skipif(importlib.util.find_spec("accelerate") is None,
                                 reason="accelerate is not installed (pip install -e '.[accelerate]')")]

SCRIPT = "examples/accelerate_train.py"
SAMPLES, BATCH, ACCUMULATE = 90, 4, 4
BATCHES = -(-SAMPLES // BATCH)  # 23 a epoch: the last accumulation window is partial (23 % 4 == 3)


def train(tmp_path, record, *args, ranks=1, timeout=150):
    cmd = [SCRIPT, "--record", str(tmp_path / record), "--samples", str(SAMPLES), "--batch-size", str(BATCH),
           "--accumulate", str(ACCUMULATE), *args]
    if ranks > 1:
        cmd = torchrun_args(ranks, cmd)
    result = run_script(cmd, timeout=timeout, OMP_NUM_THREADS="1")
    assert result.returncode == 0, describe(result)
    return result


def rows(tmp_path, record, rank=0):
    """[epoch, ids, augmentation checksum, sync_gradients, end_of_dataloader] per batch."""
    return read_jsonl(tmp_path / f"{record}.rank{rank}.jsonl")


@pytest.fixture(scope="module")
def reference(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("accelerate")
    train(tmp, "ref")
    return rows(tmp, "ref")


def test_accumulation_sees_the_end_of_every_epoch_and_steps_its_partial_window(reference):
    assert len(reference) == 2 * BATCHES
    for epoch in (0, 1):
        steps = [r for r in reference if r[0] == epoch]
        assert sorted(i for r in steps for i in r[1]) == list(range(SAMPLES))
        assert [r[4] for r in steps] == [False] * (BATCHES - 1) + [True]  # end_of_dataloader
        synced = [k for k, r in enumerate(steps) if r[3]]
        assert synced == [3, 7, 11, 15, 19, 22]  # every 4th batch, and the epoch's last


def test_without_the_adapter_accelerate_misses_the_end(tmp_path):
    """What for_accelerate() is for: accelerate alone never sees a shmload loader's end."""
    train(tmp_path, "plain", "--plain", "--epochs", "1")
    steps = rows(tmp_path, "plain")
    assert len(steps) == BATCHES and not any(r[4] for r in steps)
    assert not steps[-1][3]  # the partial window is carried into the next epoch


@pytest.mark.parametrize("stop", [7, BATCHES + 7], ids=["in-epoch-0", "in-epoch-1"])
def test_save_state_and_load_state_resume_the_loader_exactly(tmp_path, reference, stop):
    state = str(tmp_path / "state")
    train(tmp_path, "run", "--checkpoint-at", str(stop), "--checkpoint", state)
    train(tmp_path, "run", "--resume", state)
    assert [r[:3] for r in rows(tmp_path, "run")] == [r[:3] for r in reference]


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
