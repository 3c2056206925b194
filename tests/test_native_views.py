"""The main process's views of a batch in C (``_core/_views.c``) against ``np.ndarray``, which
the Python path of ``layout.views_in`` calls: the same arrays (shape, dtype, strides,
flags, bytes, the owner as base) wherever the compiled function builds them, and a
decline (None, nothing made) wherever it would have to guess, the Python code then
giving its result or its error. Then through the public API: the batches a loader
yields are the same with and without it.
"""

from __future__ import annotations

import os

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import shmload
from shmload._batching import layout
from shmload._core import native as native_mod

from .helpers import assert_holds_nothing

pytestmark = [pytest.mark.timeout(120)]
views = getattr(native_mod.native, "views", None)
needs_views = pytest.mark.skipif(views is None, reason=f"no compiled core: {native_mod.DESCRIPTION}")

DTYPES = [np.dtype(t) for t in ("u1", "<i2", ">i4", "<f4", ">f8", "c16", "?", "S5", "<U3", "M8[ms]")] + [
    np.dtype([("a", "<i4"), ("b", "u1")]), np.dtype([("a", "<i4"), ("b", "u1")], align=True)]


def python_views(leaves, owner):
    """The Python path's values (layout.views_in), or the exception it raises."""
    try:
        return [value if shape is None else np.ndarray(shape, value, owner, offset) if offset >= 0
                else owner[:0].view(value).reshape(shape) for shape, value, offset in leaves]
    except Exception as exc:  # noqa: BLE001 - the error is what is compared
        return exc


def assert_same_array(got, want, owner):
    assert type(got) is np.ndarray
    assert (got.shape, got.dtype, got.strides) == (want.shape, want.dtype, want.strides)
    assert got.base is owner and want.base is owner
    assert got.__array_interface__["data"] == want.__array_interface__["data"]
    assert {k: got.flags[k] for k in ("C", "F", "O", "W", "A")} == {k: want.flags[k] for k in ("C", "F", "O", "W", "A")}
    assert got.tobytes() == want.tobytes()


@st.composite
def recipes(draw):
    """An owner and a recipe over it: leaves within it, past its end, zero-size, objects."""
    size = draw(st.integers(0, 512))
    owner = np.frombuffer(bytearray(os.urandom(size)), np.uint8)
    if draw(st.booleans()):
        owner = owner.copy()
        owner.flags.writeable = draw(st.booleans())
    leaves = []
    for _ in range(draw(st.integers(0, 4))):
        if draw(st.integers(0, 5)) == 0:
            leaves.append((None, draw(st.sampled_from(["label", 7, None, b"x"])), 0))
            continue
        dtype = draw(st.sampled_from(DTYPES))
        shape = tuple(draw(st.lists(st.integers(0, 6), max_size=3)))
        nbytes = dtype.itemsize * int(np.prod(shape))
        offset = -1 if not nbytes else draw(st.integers(0, size + 8))  # (as layout._recipe writes them)
        leaves.append((shape, dtype, offset))
    return owner, tuple(leaves)


@pytest.mark.pure
@needs_views
@settings(max_examples=int(os.environ.get("SHMLOAD_DRAWN_EXAMPLES", "150")), deadline=None,
          suppress_health_check=[HealthCheck.too_slow])
@given(drawn=recipes())
def test_drawn_recipes_give_np_ndarrays_or_decline(drawn):
    owner, leaves = drawn
    want = python_views(leaves, owner)
    got = views(leaves, owner)
    if got is None:  # declined: only where Python raises, or builds a leaf from owner[:0]
        assert isinstance(want, Exception) or any(offset < 0 for shape, _, offset in leaves if shape is not None)
        return
    assert not isinstance(want, Exception), f"built what np.ndarray refuses ({want!r})"
    assert len(got) == len(want)
    for g, w in zip(got, want):
        if isinstance(w, np.ndarray):
            assert_same_array(g, w, owner)
        else:
            assert g is w


@pytest.mark.pure
@needs_views
def test_a_leaf_one_byte_past_the_end_is_declined_and_python_raises():
    owner = np.zeros(64, np.uint8)
    fits, past = ((4, 4), np.dtype("<f4"), 0), ((4, 4), np.dtype("<f4"), 1)
    assert_same_array(views((fits,), owner)[0], np.ndarray(*fits[:2], owner, 0), owner)
    assert views((fits, past), owner) is None
    with pytest.raises(TypeError, match="buffer is too small"):
        np.ndarray(past[0], past[1], owner, past[2])


@pytest.mark.pure
@needs_views
@pytest.mark.parametrize("owner", [np.zeros(64, np.int16)[:32].view(np.uint8)[::2], np.zeros((8, 8), np.uint8),
                                   np.zeros(16, np.int32)], ids=["strided", "2-d", "not-bytes"])
def test_an_owner_that_is_not_contiguous_bytes_is_declined(owner):
    assert views((((2,), np.dtype("u1"), 0),), owner) is None


@pytest.mark.pure
@needs_views
@pytest.mark.parametrize("leaf", [((2,), "u1", 0), ([2], np.dtype("u1"), 0), ((-1,), np.dtype("u1"), 0),
                                  ((True,), np.dtype("u1"), 0), ((2,), np.dtype("u1"), 1.0), ((2,), np.dtype("u1")),
                                  ((1 << 62, 1 << 62), np.dtype("u1"), 0), ((2,), np.dtype("u1"), 1 << 70)],
                         ids=["dtype-name", "shape-list", "negative", "bool-dim", "float-offset", "pair", "overflow",
                              "huge-offset"])
def test_entries_it_would_have_to_guess_at_are_declined(leaf):
    assert views(((None, "kept", 0), leaf), np.zeros(64, np.uint8)) is None


@pytest.mark.pure
@needs_views
def test_views_hold_no_references():
    owner = np.zeros(4096, np.uint8)
    dtype, label = np.dtype("<f4"), object()
    leaves = (((256, 4), dtype, 0), (None, label, 0), ((256,), np.dtype("<i8"), 4096 - 2048))

    def run():
        made = views(leaves, owner)
        assert made is not None and made[1] is label and made[0].base is owner
        assert views(leaves + (((8,), dtype, 4090),), owner) is None  # (a partly made list, freed)

    assert_holds_nothing(run, [owner, dtype, label, leaves], rounds=2000)


class Tiny:
    def __init__(self, n=512):
        self.rows = np.arange(n * 6, dtype=np.float32).reshape(n, 6)

    def __len__(self):
        return len(self.rows)

    def __getitem__(self, i):
        return {"x": self.rows[i], "y": i, "tag": f"s{i % 3}"}


@needs_views
def test_a_loaders_batches_are_the_same_without_the_compiled_views(monkeypatch):
    kw = dict(batch_size=32, num_workers=2, shuffle=True, seed=5, timeout=30)
    made = []

    def counted(leaves, owner):
        made.append(views(leaves, owner))
        return made[-1]

    monkeypatch.setattr(layout, "_compiled_views", counted)
    with shmload.DataLoader(Tiny(), **kw) as loader:
        compiled = [{k: np.array(v) if isinstance(v, np.ndarray) else v for k, v in b.items()} for b in loader]
    monkeypatch.setattr(layout, "_compiled_views", None)
    with shmload.DataLoader(Tiny(), **kw) as loader:
        python = [{k: np.array(v) if isinstance(v, np.ndarray) else v for k, v in b.items()} for b in loader]
    assert len(compiled) == len(python) == len(made) == 16 and None not in made  # (built, not declined)
    for a, b in zip(compiled, python):
        assert a.keys() == b.keys()
        for k in a:
            if isinstance(a[k], np.ndarray):
                assert a[k].dtype == b[k].dtype and a[k].shape == b[k].shape and a[k].tobytes() == b[k].tobytes()
            else:
                assert a[k] == b[k]
