"""shmload.testing: the contract checks users run on their own datasets and loaders pass
what keeps the contract and fail, with a message naming the problem, what breaks it."""

from __future__ import annotations

import subprocess
import sys
import textwrap

import numpy as np
import pytest

from shmload import DataLoader, DeferredArray
from shmload.datasets import ArrayDataset
from shmload.testing import assert_resumes_exactly, check_deferred_array

from .helpers import TIMEOUT, RampArray

pytestmark = pytest.mark.timeout(60)


# ---------------------------------------------------------------- assert_resumes_exactly
def numbers():
    """40 samples of a numpy-backed dataset: 10 batches of 4 an epoch."""
    return ArrayDataset(np.arange(120, dtype=np.float32).reshape(40, 3), np.arange(40))


def make_loader(num_workers, seed):
    return DataLoader(numbers(), batch_size=4, shuffle=True, num_workers=num_workers, seed=seed, timeout=TIMEOUT)


def test_a_plain_loader_resumes_exactly():
    assert_resumes_exactly(make_loader, stops=[3, 13], workers=(0, 2))


def test_a_loader_that_ignores_the_loaded_state_fails():
    def forgetful(num_workers, seed):
        loader = make_loader(num_workers, seed)
        loader.load_state_dict = lambda state: None  # starts over, with its own seed
        return loader

    with pytest.raises(AssertionError, match=r"^resumed after 3 batches, saved with num_workers=0, resumed with 2: "
                                             r"20 batches, expected 17$"):
        assert_resumes_exactly(forgetful, stops=[3], pairs=[(0, 2)])


class Unseeded:
    """Samples from fresh OS entropy: no two runs alike, whatever the loader's seed."""

    def __len__(self):
        return 12

    def __getitem__(self, i):
        return np.random.default_rng().random(2)


@pytest.mark.pure
def test_a_dataset_the_seed_does_not_govern_fails():
    def make(num_workers, seed):
        return DataLoader(Unseeded(), batch_size=4, num_workers=num_workers, seed=seed, timeout=TIMEOUT)

    with pytest.raises(AssertionError, match=r"^the first 1 batches differ \(num_workers=0\)$"):
        assert_resumes_exactly(make, stops=[1], pairs=[(0, 0)])


@pytest.mark.pure
def test_resumed_batches_that_differ_are_named():
    """The resumed loader continues at the right place, but its dataset's values differ."""
    def drifting(num_workers, seed):
        data = np.arange(40) + (seed == 12345)  # the seed assert_resumes_exactly resumes with
        return DataLoader(ArrayDataset(data), batch_size=4, shuffle=True, num_workers=num_workers, seed=seed,
                          timeout=TIMEOUT)

    with pytest.raises(AssertionError, match=r"^resumed after 3 batches, saved with num_workers=0, resumed with 0: "
                                             r"batch 3 differs$"):
        assert_resumes_exactly(drifting, stops=[3], pairs=[(0, 0)])


@pytest.mark.pure
def test_misused_arguments_fail_before_anything_runs():
    built = []

    def counting(num_workers, seed):
        built.append(num_workers)
        return make_loader(num_workers, seed)

    with pytest.raises(AssertionError, match=r"in_order=False checks one epoch: epochs must be 1, not 2"):
        assert_resumes_exactly(counting, stops=[3], epochs=2, in_order=False)
    assert built == []
    with pytest.raises(AssertionError, match=r"^the save points must lie inside the run$"):
        assert_resumes_exactly(counting, stops=[10], epochs=1)
    assert built == [0]  # only the reference, which is closed


# ---------------------------------------------------------------- check_deferred_array
class Filled(DeferredArray):
    """A [3, 4] uint8 array of one byte value (such as a sentinel's)."""

    def __init__(self, byte, shape=(3, 4)):
        self.byte, self.shape, self.dtype = byte, shape, np.dtype(np.uint8)

    def write_into(self, out):
        out[...] = self.byte


@pytest.mark.pure
@pytest.mark.parametrize("value", [
    RampArray(5),  # tests/helpers.py
    ArrayDataset(np.arange(20.0).reshape(10, 2), np.arange(10)).__getitems__([7, 1, 3]).batch[0],
    ArrayDataset(np.arange(20.0).reshape(10, 2), np.arange(10)).__getitems__([]).batch[1],  # 0 rows
    Filled(0xA5), Filled(0x5A),  # a value equal to one of the sentinels is written all the same
    Filled(7, shape=()),  # 0-d
], ids=["ramp", "rows", "no-rows", "sentinel-1", "sentinel-2", "0-d"])
def test_a_correct_deferred_array_passes(value):
    assert check_deferred_array(value) is None


class OneUnwritten(RampArray):
    def write_into(self, out):
        full = np.empty_like(out)
        super().write_into(full)
        out.reshape(-1)[:-1] = full.reshape(-1)[:-1]  # all but the last element


class KeepsOut(RampArray):
    def write_into(self, out):
        super().write_into(out)
        self.out = out


class KeepsView(RampArray):
    def write_into(self, out):
        super().write_into(out)
        self.row = out[1]


class ObjectDtype(RampArray):
    def __init__(self):
        self.shape, self.dtype = (2,), np.dtype(object)


class NegativeShape(RampArray):
    def __init__(self):
        self.shape, self.dtype = (3, -1), np.dtype(np.float32)


class Reshapes(RampArray):
    def write_into(self, out):
        out.shape = (out.size,)
        out[...] = 1


class NotDeferred:
    shape, dtype = (2,), np.dtype(np.float32)

    def write_into(self, out):
        out[...] = 0


@pytest.mark.pure
@pytest.mark.parametrize("value, message", [
    (OneUnwritten(0), r"^OneUnwritten\.write_into left 1 of 12 elements of out unwritten \(the first at index "
                      r"\(2, 3\)\): write every element"),
    (KeepsOut(0), r"^KeepsOut\.write_into kept out after returning"),
    (KeepsView(0), r"^KeepsView\.write_into kept a view of out after returning"),
    (ObjectDtype(), r"^ObjectDtype\.dtype is object: expected a plain \(non-object\) dtype"),
    (NegativeShape(), r"^NegativeShape\.shape is \(3, -1\): expected a tuple of non-negative ints"),
    (Reshapes(0), r"^Reshapes\.write_into changed out \(its shape from \(3, 4\) to \(12,\)\)"),
    (NotDeferred(), r"^NotDeferred is not a shmload\.DeferredArray"),
], ids=["unwritten", "keeps-out", "keeps-view", "object-dtype", "negative-shape", "reshapes", "not-deferred"])
def test_a_deferred_array_that_breaks_the_contract_fails(value, message):
    with pytest.raises(AssertionError, match=message):
        check_deferred_array(value)


@pytest.mark.pure
def test_the_name_given_is_used_in_messages():
    with pytest.raises(AssertionError, match=r"^image\.write_into left 1 of 12"):
        check_deferred_array(OneUnwritten(0), name="image")


def test_the_checks_fail_under_python_O():
    """They raise AssertionError themselves: ``python -O`` strips assert statements."""
    code = textwrap.dedent("""
        import numpy as np
        from shmload import DeferredArray
        from shmload.testing import check_deferred_array

        class Half(DeferredArray):
            shape, dtype = (4,), np.dtype(np.int32)
            def write_into(self, out):
                out[:2] = 1

        try:
            check_deferred_array(Half())
        except AssertionError as exc:
            print(exc)
    """)
    done = subprocess.run([sys.executable, "-O", "-c", code], capture_output=True, text=True, timeout=50)
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith("Half.write_into left 2 of 4 elements of out unwritten (the first at index (2,))")
