"""The examples run: each as a subprocess, checked by exit status and printed output.

The torch runs are marked ``torch`` and skipped when torch is not installed. The others
hide torch from the example (an import hook in a ``-c`` wrapper), so they run
everywhere, and check that it says which torch to install and exits with status 3.

Generated images go to a temporary ``SHMLOAD_CACHE`` shared by the tests of this module
(written by the first test that needs them), never to the user's cache.
"""

from __future__ import annotations

import importlib.util
import os
import re
import subprocess

import pytest

from .scripts import describe, run_script

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
EXAMPLES = os.path.join(ROOT, "examples")
TRAIN = os.path.join(EXAMPLES, "imagefolder_train.py")
MIGRATE = os.path.join(EXAMPLES, "migrate_from_torch.py")
EXIT_NEEDS_TORCH = 3
RUN_TIMEOUT = 45  # seconds for one example run (they take 2-15 s on 2 busy cores); pytest's 60 s is the backstop


def have_torch() -> bool:
    """Is torch installed? (Found, not imported: importing it costs seconds.)"""
    try:
        return importlib.util.find_spec("torch") is not None
    except ImportError:  # an import hook hiding it, as HIDE_TORCH below
        return False


skip_without_torch = pytest.mark.skipif(not have_torch(), reason="torch is not installed")

# Runs the example at sys.argv[1] with its arguments, as `python example.py ...` would,
# with every `import torch` (and torch.*) failing as if torch were not installed.
HIDE_TORCH = """
import importlib.abc, runpy, sys

class HideTorch(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name == "torch" or name.startswith("torch."):
            raise ModuleNotFoundError(f"No module named {name!r}", name=name)
        return None

sys.meta_path.insert(0, HideTorch())
sys.argv = sys.argv[1:]
runpy.run_path(sys.argv[0], run_name="__main__")
"""


@pytest.fixture(scope="module")
def cache(tmp_path_factory) -> str:
    return str(tmp_path_factory.mktemp("shmload-cache"))


def run(args: list[str], cache: str) -> subprocess.CompletedProcess:
    return run_script(args, RUN_TIMEOUT, SHMLOAD_CACHE=cache)


@pytest.mark.torch
@skip_without_torch
@pytest.mark.timeout(60)
def test_imagefolder_train_loss_decreases(cache):
    result = run([TRAIN, "--steps", "40", "--workers", "2", "--images", "256"], cache)
    assert result.returncode == 0, describe(result)
    assert result.stderr == "", describe(result)
    steps = re.findall(r"^epoch \d+ step +(\d+)/40  loss (\d+\.\d+)$", result.stdout, re.M)
    assert [int(s) for s, _ in steps] == [1, 5, 10, 15, 20, 25, 30, 35, 40], describe(result)
    found = re.search(r"^loss decreased: (\d+\.\d+) \(mean of the first 5 steps\) -> (\d+\.\d+) "
                      r"\(mean of the last 5 steps\)$", result.stdout, re.M)
    assert found, describe(result)
    first, last = float(found.group(1)), float(found.group(2))
    assert first > 1.0 and last < first / 2, describe(result)  # 4 classes: ln 4 = 1.39 at the start
    accuracy = re.search(r"^accuracy over the last 10 steps: (\d+)%", result.stdout, re.M)
    assert accuracy and int(accuracy.group(1)) >= 60, describe(result)


@pytest.mark.torch
@skip_without_torch
@pytest.mark.timeout(60)
def test_migrate_from_torch_gives_equal_batches(cache):
    result = run([MIGRATE, "--workers", "2", "--images", "96", "--batch-size", "10"], cache)
    assert result.returncode == 0, describe(result)
    assert result.stderr == "", describe(result)
    assert re.search(r"^torch\.utils\.data\.DataLoader: 10 batches$", result.stdout, re.M), describe(result)
    assert re.search(r"^shmload\.DataLoader +: 10 batches$", result.stdout, re.M), describe(result)
    assert re.search(r"^all 10 batches equal .*: OK$", result.stdout, re.M), describe(result)


@pytest.mark.timeout(60)
@pytest.mark.parametrize("example", [TRAIN, MIGRATE], ids=os.path.basename)
def test_without_torch_the_examples_say_what_to_install(example, tmp_path):
    result = run(["-c", HIDE_TORCH, example, "--workers", "2"], str(tmp_path))
    assert result.returncode == EXIT_NEEDS_TORCH, describe(result)
    assert re.search(r"^    pip install torch==2\.13\.0$", result.stderr, re.M), describe(result)
    assert "not importable here (No module named 'torch')" in result.stderr, describe(result)
    assert "Traceback" not in result.stderr and result.stdout == "", describe(result)
    assert os.listdir(tmp_path) == []  # torch is checked before any image is written
