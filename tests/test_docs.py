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


def _unclosed_fence(text: str) -> int | None:
    """The line (1-based) of a code fence that never closes, by CommonMark's rules: a
    closing fence is the opening's character, at least as many, and nothing else on its
    line (a "``` text" line does not close, and everything after it renders as code)."""
    opened = None  # (line, character, length)
    for number, line in enumerate(text.splitlines(), 1):
        m = re.match(r" {0,3}(`{3,}|~{3,})(.*)$", line)
        if not m:
            continue
        fence, rest = m.groups()
        if opened is None:
            if not (fence[0] == "`" and "`" in rest):
                opened = (number, fence[0], len(fence))
        elif fence[0] == opened[1] and len(fence) >= opened[2] and not rest.strip():
            opened = None
    return opened[0] if opened else None


def test_every_code_fence_in_the_docs_closes():
    paths = ["README.md"] + [os.path.join("docs", f) for f in sorted(os.listdir(os.path.join(ROOT, "docs")))
                             if f.endswith(".md")]
    assert _unclosed_fence("```bash\nx\n``` and text\n## Heading\n") == 1  # (the README's old mistake)
    assert _unclosed_fence("````\n```\n````\n") is None
    for path in paths:
        with open(os.path.join(ROOT, path)) as f:
            assert _unclosed_fence(f.read()) is None, f"{path}: the code fence opened on that line never closes"


def _documented_signature(text: str) -> str:
    """The ``DataLoader(...)`` signature in ``text`` (the one with every default), without spaces."""
    start = re.search(r"DataLoader\(dataset,\s*batch_size=1,", text).start()
    depth, end = 0, start
    for end in range(start, len(text)):
        depth += {"(": 1, ")": -1}.get(text[end], 0)
        if text[end] == ")" and depth == 0:
            break
    return re.sub(r"\s+", "", text[start:end + 1]).replace("'", '"')


def test_the_documented_signatures_are_the_loaders():
    import inspect

    from shmload import DataLoader

    parts, star = [], False
    for p in inspect.signature(DataLoader).parameters.values():
        if p.kind is p.KEYWORD_ONLY and not star:
            parts.append("*")
            star = True
        parts.append(p.name if p.default is p.empty else f"{p.name}={p.default!r}")
    actual = ("DataLoader(" + ",".join(parts) + ")").replace("'", '"')
    with open(os.path.join(ROOT, "docs", "api.md")) as f:
        api = f.read()
    assert _documented_signature(api) == actual, "docs/api.md's DataLoader signature is not the loader's"
    for p in inspect.signature(DataLoader).parameters:  # and its argument table has a row for each
        assert re.search(rf"^\| `[^|]*\b{p}\b[^|]*` \|", api, re.M), f"docs/api.md's argument table lacks {p}"
