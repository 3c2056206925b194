"""The default collate's cached plan (NOTE [ The cached plan ], collate.py), without processes:
tests of internals (``shmload._batching.collate``).

A batch planned against the cached plan must give exactly what planning it from scratch
gives (the same layout, the same written bytes), and a batch the cache declines must
raise exactly the reference path's CollateError.
"""

from __future__ import annotations

import collections

import numpy as np
import pytest

from shmload._batching.collate import StackPlans, build_local, plan_stack
from shmload.errors import CollateError

pytestmark = [pytest.mark.timeout(30), pytest.mark.pure]

Point = collections.namedtuple("Point", "x y")


def rows(n, start=0, width=8, dtype=np.float32):
    return [(np.arange(width, dtype=dtype) + i, i) for i in range(start, start + n)]


def same_batch(a, b):
    if isinstance(a, np.ndarray):
        return isinstance(b, np.ndarray) and a.dtype == b.dtype and a.shape == b.shape and np.array_equal(a, b)
    if isinstance(a, dict):
        return type(a) is type(b) and a.keys() == b.keys() and all(same_batch(a[k], b[k]) for k in a)
    if isinstance(a, (list, tuple)):
        return type(a) is type(b) and len(a) == len(b) and all(map(same_batch, a, b))
    return a == b


SAMPLES = {
    "tuple": lambda i: (np.full(4, i, np.float32), i),
    "dict": lambda i: {"x": np.full((2, 3), i, np.int16), "y": float(i), "name": f"s{i}"},
    "namedtuple": lambda i: Point(np.full(3, i, np.uint8), [i, str(i)]),
    "nested": lambda i: [(np.full(2, i, np.float64), True), {"k": i}],
    "0-d": lambda i: (np.array(i, np.int32), np.float32(i)),
    "wide rows": lambda i: (np.full(2000, i, np.float32), i),  # over the join's row limit
}


@pytest.mark.parametrize("kind", SAMPLES)
def test_a_cached_plan_builds_what_planning_from_scratch_builds(kind):
    plans = StackPlans()
    make = SAMPLES[kind]
    for start in (0, 16, 32, 48):
        samples = [make(i) for i in range(start, start + 16)]
        cached = build_local(plans.plan(samples, list(range(start, start + 16))))
        fresh = build_local(plan_stack(samples, list(range(start, start + 16))))
        assert same_batch(cached, fresh)


def test_the_cache_is_used_and_gives_the_same_layout_object():
    plans = StackPlans()
    first = plans.plan(rows(16), None)
    second = plans.plan(rows(16, 16), None)
    assert second.layout is first.layout  # what the worker numbers without comparing (wire.LayoutIds)
    other = plans.plan(rows(5, 40), None)  # a short last batch: its own plan
    assert other.layout.leaves[0].shape == (5, 8)


BAD = {
    "shape": lambda s: s.__setitem__(5, (np.zeros(9, np.float32), 5)),
    "2-d row of the same bytes": lambda s: s.__setitem__(5, (np.zeros((8, 1), np.float32), 5)),
    "dtype of the same size": lambda s: s.__setitem__(5, (np.zeros(8, np.int32), 5)),
    "structure": lambda s: s.__setitem__(5, (np.zeros(8, np.float32),)),
    "longer structure": lambda s: s.__setitem__(5, (np.zeros(8, np.float32), 5, 6)),
    "every sample longer": lambda s: s.__setitem__(slice(None), [(a, i, i) for a, i in s]),
    "container": lambda s: s.__setitem__(5, [np.zeros(8, np.float32), 5]),
    "label type": lambda s: s.__setitem__(5, (np.zeros(8, np.float32), "5")),
    "int beyond int64": lambda s: s.__setitem__(5, (np.zeros(8, np.float32), 2**70)),
    "None": lambda s: s.__setitem__(5, None),
}


@pytest.mark.parametrize("bad", BAD)
def test_a_batch_the_cache_declines_fails_or_succeeds_exactly_as_from_scratch(bad):
    plans = StackPlans()
    plans.plan(rows(16), list(range(16)))  # cached
    samples = rows(16, 16)
    BAD[bad](samples)
    indices = list(range(16, 32))

    def outcome(plan_fn):
        try:
            return "ok", build_local(plan_fn(samples, indices))
        except CollateError as exc:
            return "error", str(exc)

    got, want = outcome(plans.plan), outcome(plan_stack)
    assert got[0] == want[0]
    if got[0] == "error":
        assert got[1] == want[1]
        assert "dataset index 21" in got[1] or str(2**70) in got[1]  # names the sample, or the value
    else:
        assert same_batch(got[1], want[1])


def test_holds_names_only_a_cached_plans_own_layout():
    plans = StackPlans()
    first = plans.plan(rows(16), None)
    assert plans.holds(first.layout)
    assert not plans.holds(plan_stack(rows(16), None).layout)  # an equal layout, another object
    named = plans.plan([(np.zeros(2), f"s{i}") for i in range(4)], None)  # an object leaf: built per batch
    assert not plans.holds(named.layout)


def test_promotion_is_never_cached_and_still_promotes():
    plans = StackPlans()
    samples = [(np.zeros(2, np.float32), i) for i in range(8)]
    samples[3] = (np.zeros(2, np.float64), 3)
    batch = build_local(plans.plan(samples, None))
    assert batch[0].dtype == np.float64
    assert not plans._cached


def test_rows_that_are_not_contiguous_are_written_all_the_same():
    base = np.arange(16 * 16, dtype=np.float32).reshape(16, 16)
    plans = StackPlans()
    plans.plan([(base[i, ::2].copy(), i) for i in range(16)], None)
    samples = [(base[i, ::2], i) for i in range(16)]  # strided views: no buffer for bytes.join
    batch = build_local(plans.plan(samples, None))
    assert np.array_equal(batch[0], base[:, ::2])
