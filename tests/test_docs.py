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
