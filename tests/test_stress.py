"""Randomized fault schedules, many in a row: worker kills at random batches, exceptions
at random indices, early breaks, varying sample sizes (a concatenating collate_fn: the ring grows), persistent or
not. After every schedule: no hang (every blocking call has a timeout), nothing leaked,
and every delivered batch equal to what the single-process loader yields.

The default run does ``SHMLOAD_STRESS_ROUNDS`` schedules (40, about 10 s); a long run, e.g.
``SHMLOAD_STRESS_ROUNDS=500 python -m pytest tests/test_stress.py``, scales its time-out.
"""

from __future__ import annotations

import hashlib
import os
import random
import re
import warnings

import pytest

from shmload import DataLoader, ShmloadWarning

from .conftest import assert_nothing_new, snapshot
from .helpers import FaultyDataset, concat_collate

ROUNDS = int(os.environ.get("SHMLOAD_STRESS_ROUNDS", "40"))


def digest(batch) -> str:
    rows, labels = batch
    return hashlib.sha1(rows.tobytes() + str(rows.shape).encode() + labels.tobytes()).hexdigest()


def outcomes(loader, stop_after: int | None):
    """Per position: ('ok', digest) or ('error', type name, the dataset index named)."""
    out, it = [], iter(loader)
    while stop_after is None or len(out) < stop_after:
        try:
            batch = next(it)
        except StopIteration:
            break
        except ValueError as exc:
            named = re.search(r"bad sample \d+", str(exc))
            out.append(("error", type(exc).__name__, named.group(0) if named else str(exc)))
            continue
        out.append(("ok", digest(batch)))
        del batch
    del it
    return out


def schedule(rng: random.Random, marker_dir) -> dict:
    n = rng.randint(8, 80)
    batch_size = rng.randint(1, 6)
    positions = n // batch_size or 1
    return dict(
        n=n, batch_size=batch_size, vary=rng.choice([1, 1, 3000]),
        fail_at=rng.sample(range(n), rng.randint(0, 2)),
        die_at=rng.sample(range(n), rng.randint(0, 1)),
        workers=rng.randint(1, 2), shuffle=rng.random() < 0.5, seed=rng.randint(0, 1000),
        persistent=rng.random() < 0.5, in_order=True,
        stop_after=rng.choice([None, None, rng.randint(1, positions)]),
        method="spawn" if rng.random() < 0.08 else "fork", marker_dir=str(marker_dir))


def run_schedule(s: dict) -> tuple[int, int]:
    """Run one schedule; returns (errors delivered, workers restarted)."""
    ds = FaultyDataset(s["n"], s["vary"], s["fail_at"], s["die_at"], s["marker_dir"])
    # varying sizes: a user collate concatenates the rows, so batch sizes vary and the ring grows
    common = dict(batch_size=s["batch_size"], shuffle=s["shuffle"], seed=s["seed"],
                  collate_fn=concat_collate if s["vary"] > 1 else None)
    expected = outcomes(DataLoader(ds, **common), None)
    loader = DataLoader(ds, num_workers=s["workers"], persistent_workers=s["persistent"], timeout=30,
                        multiprocessing_context=s["method"], max_worker_restarts=len(s["die_at"]), **common)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always", ShmloadWarning)
        try:
            got = outcomes(loader, s["stop_after"])
            assert got == expected[:len(got)], f"schedule {s}: delivered batches differ from the single process"
            assert s["stop_after"] is not None or len(got) == len(expected)
            if s["persistent"]:  # the next epoch after a break or a restart is whole and right
                loader.set_epoch(0)
                assert outcomes(loader, None) == expected, f"schedule {s}: second epoch differs"
        finally:
            loader.close()
    deaths = [w for w in caught if issubclass(w.category, ShmloadWarning)]
    assert len(deaths) <= len(s["die_at"]), f"schedule {s}: {[str(w.message) for w in deaths]}"
    return sum(1 for o in got if o[0] == "error"), len(deaths)


@pytest.mark.timeout(max(100, 8 * ROUNDS))
def test_random_fault_schedules(tmp_path):
    rng = random.Random(int(os.environ.get("SHMLOAD_STRESS_SEED", "20261121")))
    before = snapshot()
    errors = restarts = 0
    for k in range(ROUNDS):
        marker_dir = tmp_path / f"round-{k}"
        marker_dir.mkdir()
        s = schedule(rng, marker_dir)
        e, r = run_schedule(s)
        errors, restarts = errors + e, restarts + r
        assert_nothing_new(before, f"schedule {s}")
    print(f"{ROUNDS} schedules: {errors} errors delivered at their batch, {restarts} workers killed and replaced")
    if ROUNDS >= 12:  # the schedules must really exercise the faults
        assert errors > 0 and restarts > 0

