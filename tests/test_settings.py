"""The one list of settings (NOTE [ One list of settings ], _session/config.py): the
loader's config is derived from ``LoaderConfig``'s fields, and every keyword of
``DataLoader`` is accounted for. Tests of internals, without processes."""

import dataclasses
import inspect

import numpy as np
import pytest

import shmload
from shmload._loader.loader import _FROZEN_AFTER_INIT
from shmload._session.config import SETTINGS, LoaderConfig, read_settings

pytestmark = [pytest.mark.timeout(30), pytest.mark.pure]

# keywords that are neither a setting nor frozen: read once, or at every iter() by their own code
_OTHER_KEYWORDS = {"dataset", "shuffle", "generator", "pin_memory_device", "distributed"}

# a valid value other than the default, for every setting users may change after construction
_CHANGED = {"num_workers": 2, "collate_fn": lambda batch: batch, "prefetch_factor": 3, "timeout": 7,
            "worker_init_fn": print, "multiprocessing_context": "spawn", "in_order": False, "seed": 11,
            "output": "numpy", "slot_bytes": 4096, "max_shm_bytes": 1 << 20, "shm_backend": "posix",
            "max_worker_restarts": 2, "pin_memory": True, "split_batches": False, "batch_parts": 3,
            "max_workers": 3}
# where no other value can be told apart here: "torch" needs torch, a pinner needs CUDA
_SAME_HERE = {"output", "pin_memory"}
# meaningful with num_workers="auto" only, whose cap is the config's num_workers
_OF_AUTO = {"max_workers"}


def _field_of(attr):
    return next(f for f in dataclasses.fields(LoaderConfig) if (f.metadata.get("attr") or f.name) == attr)


def test_every_keyword_is_a_setting_frozen_or_read_once():
    keywords = set(inspect.signature(shmload.DataLoader).parameters)
    settings = set(SETTINGS)
    assert settings <= keywords, f"settings that are not keywords: {settings - keywords}"
    assert set(_FROZEN_AFTER_INIT) <= keywords
    unaccounted = keywords - settings - set(_FROZEN_AFTER_INIT) - _OTHER_KEYWORDS
    assert not unaccounted, f"keywords neither a setting, frozen nor read once: {sorted(unaccounted)}"
    changeable = settings - set(_FROZEN_AFTER_INIT)
    assert changeable == set(_CHANGED), f"give a changed value for {sorted(changeable ^ set(_CHANGED))}"


@pytest.mark.parametrize("attr", sorted(_CHANGED))
def test_setting_an_attribute_is_read_at_the_next_iter(attr):
    """Each setting, set on a built loader, is what the next epoch's config holds
    (as its converter makes it), and the other settings are unchanged."""
    workers = {"num_workers": "auto", "max_workers": 1} if attr in _OF_AUTO else {"num_workers": 1}
    loader = shmload.DataLoader(np.arange(8.0), batch_size=4, **workers)  # (no process: no iter())
    before = loader._config()
    setattr(loader, attr, _CHANGED[attr])
    after = loader._config()
    field = _field_of(attr)
    convert = field.metadata["convert"] or (lambda v: v)
    expected = convert(getattr(loader, attr))  # (multiprocessing_context is resolved to a context)
    assert getattr(after, field.name) == expected
    if attr == "multiprocessing_context":
        assert after.context.get_start_method() == "spawn"
    elif attr not in _SAME_HERE:
        assert getattr(after, field.name) != getattr(before, field.name)
    others = {f.name for f in dataclasses.fields(LoaderConfig)} - {field.name}
    if attr in _OF_AUTO:
        assert (before.num_workers, after.num_workers, after.auto_workers) == (1, 3, True)
        others.discard("num_workers")
    assert {n: getattr(after, n) for n in others} == {n: getattr(before, n) for n in others}


def test_read_settings_reads_each_field_from_its_attribute():
    loader = shmload.DataLoader(np.arange(8.0), batch_size=2, drop_last=True, timeout=3, persistent_workers=0)
    values = read_settings(loader)
    assert set(values) == {f.name for f in dataclasses.fields(LoaderConfig) if "attr" in f.metadata}
    assert values["batch_size"] == 2 and values["drop_last"] is True
    assert values["timeout"] == 3.0 and isinstance(values["timeout"], float)
    assert values["persistent_workers"] is False  # taken for its truth, as torch takes it
    assert values["collate_fn"] is None  # the default collate, written into the slot
    assert values["pinner"] is None  # pin_memory=False


def test_a_frozen_setting_cannot_be_set():
    loader = shmload.DataLoader(np.arange(8.0), batch_size=2)
    with pytest.raises(ValueError, match=r"batch_size attribute should not be set after DataLoader is initialized"):
        loader.batch_size = 3
