"""Inside a worker, as in torch's DataLoader: one intra-op thread (torch ops in forked
workers do not hang), and random, numpy and torch seeded per worker before
worker_init_fn. Skipped without torch. Module-level datasets: spawn workers import them.
The expected seeds are computed with the internal ``shmload._ordering.seeding``, on
purpose."""

import random

import numpy as np
import pytest

import shmload
from shmload import DataLoader
from shmload._ordering import seeding

from .helpers import RangeDataset

torch = pytest.importorskip("torch")
F = pytest.importorskip("torch.nn.functional")
pytestmark = pytest.mark.torch

SEED = 7
_init_draws = None  # what worker_init_fn saw, in the worker


@pytest.fixture
def parent_used_thread_pool():
    """The hanging case: the test process has run a parallel torch op before forking."""
    before = torch.get_num_threads()
    torch.set_num_threads(2)
    F.conv1d(torch.randn(1, 4, 200_000), torch.randn(8, 4, 9))
    torch.mm(torch.randn(512, 512), torch.randn(512, 512))
    yield
    torch.set_num_threads(before)


class Conv(RangeDataset):
    def __getitem__(self, i):
        x = torch.full((1, 1, 24_000), float(i))
        return F.conv1d(x, torch.ones(1, 1, 3)).numpy()


class Threads(RangeDataset):
    def __getitem__(self, i):
        return torch.get_num_threads()


def three_threads(worker_id):
    torch.set_num_threads(3)


def record_draws(worker_id):
    global _init_draws
    _init_draws = {"id": worker_id, "random": random.random(), "numpy": float(np.random.random()),
                   "torch": torch.rand(1).item(), "initial_seed": torch.initial_seed(),
                   "torch_info_seed": torch.utils.data.get_worker_info().seed,
                   "info_seed": shmload.get_worker_info().seed}


class InitDraws(RangeDataset):
    def __getitem__(self, i):
        return dict(_init_draws)


class InitialSeed(RangeDataset):
    def __getitem__(self, i):
        return torch.initial_seed()


class Randn(RangeDataset):
    def __getitem__(self, i):
        return torch.randn(4) + i


def test_torch_ops_in_forked_workers_do_not_hang_after_the_parent_used_the_thread_pool(parent_used_thread_pool):
    expected = [b.copy() for b in DataLoader(Conv(8), batch_size=2, num_workers=0)]
    loader = DataLoader(Conv(8), batch_size=2, num_workers=2, multiprocessing_context="fork", timeout=20)
    got = [b.copy() for b in loader]
    assert len(got) == 4 and all(np.array_equal(a, b) for a, b in zip(expected, got))


def test_workers_run_torch_on_one_thread_unless_worker_init_fn_raises_it(parent_used_thread_pool):
    default = list(DataLoader(Threads(4), batch_size=None, num_workers=2, timeout=20))
    raised = list(DataLoader(Threads(4), batch_size=None, num_workers=2, timeout=20, worker_init_fn=three_threads))
    assert default == [1] * 4 and raised == [3] * 4


@pytest.mark.parametrize("context", ["fork", "spawn"])
def test_worker_init_fn_sees_rngs_seeded_per_worker_as_torch_does(context):
    torch.manual_seed(0)  # a forked worker would otherwise start with this state, in every worker
    loader = DataLoader(InitDraws(8), batch_size=None, num_workers=2, seed=SEED, worker_init_fn=record_draws,
                        multiprocessing_context=context, timeout=20)
    by_worker = {d["id"]: d for d in loader}
    assert set(by_worker) == {0, 1}
    for name in ("random", "numpy", "torch"):
        assert by_worker[0][name] != by_worker[1][name], name
    for wid, d in by_worker.items():
        # torch's contract: the worker's seed is base seed + id, and it is torch's initial seed
        assert d["initial_seed"] == d["torch_info_seed"] == SEED + wid
        assert d["info_seed"] == SEED  # shmload's WorkerInfo.seed: the loader's base seed
        assert d["random"] == random.Random(SEED + wid).random()
        assert d["torch"] == torch.rand(1, generator=torch.Generator().manual_seed(SEED + wid)).item()


def test_a_sample_holding_torch_initial_seed_is_batchable():
    seed = 3
    # the test means something only if some batch's 64-bit seed has its top bit set
    assert any(seeding.batch_seed(seed, 0, p) >= 2**63 for p in range(16))
    runs = [[b.copy() for b in DataLoader(InitialSeed(16), batch_size=1, seed=seed, num_workers=w, timeout=20)]
            for w in (0, 2)]
    assert [len(r) for r in runs] == [16, 16]
    assert all(np.array_equal(a, b) for a, b in zip(*runs))
    values = [int(b[0]) for b in runs[0]]
    assert values == [seeding.batch_seed(seed, 0, p) & (2**63 - 1) for p in range(16)]


@pytest.mark.parametrize("context", ["fork", "spawn"])
def test_torch_randn_batches_are_identical_for_any_num_workers(context):
    runs = [[b.copy() for b in DataLoader(Randn(12), batch_size=4, seed=SEED, num_workers=w, timeout=20,
                                          multiprocessing_context=context if w else None)]
            for w in (0, 2)]
    assert [len(r) for r in runs] == [3, 3]
    assert all(np.array_equal(a, b) for a, b in zip(*runs))
    assert len({r.tobytes() for r in runs[0]}) == 3
