"""The README is executable documentation: its quick start runs, and CI runs its test command."""

import os
import re
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def readme() -> str:
    with open(os.path.join(ROOT, "README.md")) as f:
        return f.read()


def test_the_quick_start_runs(tmp_path):
    code = re.search(r"```python\n(import numpy as np\nimport shmload.*?)```", readme(), re.S).group(1)
    script = tmp_path / "quickstart.py"
    script.write_text(code)
    result = subprocess.run([sys.executable, str(script)], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert result.returncode == 0 and result.stderr == "", result.stderr


def test_ci_runs_the_readmes_test_command():
    commands = re.findall(r"```bash\n(.*?)\n```", readme(), re.S)
    test_command = next(c for c in commands if "pytest" in c)
    with open(os.path.join(ROOT, ".ci", "run")) as f:
        assert test_command in f.read().splitlines()


def test_ci_runs_the_readmes_torch_and_trainer_test_command():
    commands = re.findall(r"```bash\n(.*?)\n```", readme(), re.S)
    torch_command = next(c for c in commands if "pytest -m torch" in c)
    assert "torch,lightning,accelerate,hf" in torch_command
    with open(os.path.join(ROOT, ".ci", "run")) as f:
        assert torch_command in f.read().splitlines()


def test_every_test_the_reliability_doc_cites_exists():
    with open(os.path.join(ROOT, "docs", "reliability.md")) as f:
        doc = f.read()
    cited = set(re.findall(r"`(?:tests/test_\w+\.py::)?(test_\w+)`", doc))
    defined = set()
    for name in os.listdir(os.path.join(ROOT, "tests")):
        if name.startswith("test_") and name.endswith(".py"):
            with open(os.path.join(ROOT, "tests", name)) as f:
                defined.update(re.findall(r"^def (test_\w+)\(", f.read(), re.M))
    assert len(cited) > 30
    assert cited <= defined, f"docs/reliability.md cites tests that do not exist: {sorted(cited - defined)}"
