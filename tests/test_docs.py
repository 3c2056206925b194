"""The README and docs/ are executable documentation, read as Markdown, not as text.

A small reader (``read_markdown``) follows CommonMark's rules for what matters here:
fenced code blocks (an opening fence, its info string, the closing fence), ATX and
setext headings, inline code spans, and inline and reference links. On top of it: the
README's quick start runs; CI runs the README's test commands; every fence closes;
every ``python`` block parses; every relative link reaches its file and its heading;
the documented ``DataLoader`` signature and argument table are the loader's. Each
checker is first shown a mistake it must catch, so none can pass by reading nothing.
"""

from __future__ import annotations

import ast
import inspect
import os
import re
import subprocess
import sys
from typing import NamedTuple

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
README_MAX_CHARS = 8_000  # issue 34: a newcomer's page; the rest lives in docs/


def doc_paths() -> list[str]:
    """README.md and every docs/*.md, relative to the repository's root."""
    docs = sorted(f for f in os.listdir(os.path.join(ROOT, "docs")) if f.endswith(".md"))
    return ["README.md"] + [os.path.join("docs", f) for f in docs]


def read(path: str) -> str:
    with open(os.path.join(ROOT, path), encoding="utf-8") as f:
        return f.read()


def readme() -> str:
    return read("README.md")


# --- a Markdown reader ------------------------------------------------------------------

FENCE = re.compile(r" {0,3}(`{3,}|~{3,})(.*)$")
ATX_HEADING = re.compile(r" {0,3}(#{1,6})(?:[ \t]+(.*?))?(?:[ \t]+#+)?[ \t]*$")
SETEXT_UNDERLINE = re.compile(r" {0,3}(=+|-+)[ \t]*$")
CODE_SPAN = re.compile(r"(?<!`)(`+)(?!`)((?:(?!\n[ \t]*\n).)+?)(?<!`)\1(?!`)", re.S)
INLINE_LINK = re.compile(r"!?\[((?:[^\[\]]|\[[^\[\]]*\])*)\]\(\s*(<[^>]*>|[^\s()]*)(?:\s+\"[^\"]*\")?\s*\)")
LINK_DEFINITION = re.compile(r"^ {0,3}\[([^\]]+)\]:[ \t]*(<[^>]*>|\S+)", re.M)


class Block(NamedTuple):
    line: int  # of the opening fence, 1-based
    info: str  # the info string's first word: "python", "bash", "" ...
    code: str


class Markdown(NamedTuple):
    prose: str  # the text with every fenced block's lines (fences included) blanked
    blocks: list[Block]
    unclosed: int | None  # the line of a fence that never closes, else None


def read_markdown(text: str) -> Markdown:
    """Fenced code blocks by CommonMark's rules: up to 3 spaces before the fence; a
    backtick fence's info string holds no backtick (else the line is prose with a code
    span); a closing fence is the opening's character, at least as many, and nothing
    else on its line (a "``` text" line does not close, and everything after it renders
    as code). An unclosed block runs to the end, as CommonMark renders it. Indented code
    blocks are not recognised: these docs use fences, and a 4-space line after a blank
    one inside a list is a paragraph of the item."""
    prose, blocks = [], []
    opened = None  # (line, fence, info, code lines)
    for number, line in enumerate(text.splitlines(), 1):
        m = FENCE.match(line)
        if opened is None:
            if m and not (m.group(1)[0] == "`" and "`" in m.group(2)):
                opened = (number, m.group(1), m.group(2).strip().split(" ")[0], [])
                prose.append("")
            else:
                prose.append(line)
            continue
        prose.append("")
        fence = opened[1]
        if m and m.group(1)[0] == fence[0] and len(m.group(1)) >= len(fence) and not m.group(2).strip():
            blocks.append(Block(opened[0], opened[2], "\n".join(opened[3]) + "\n"))
            opened = None
        else:
            opened[3].append(line)
    if opened is not None:
        blocks.append(Block(opened[0], opened[2], "\n".join(opened[3]) + "\n"))
    return Markdown("\n".join(prose), blocks, opened[0] if opened else None)


def _blank_code_spans(prose: str) -> str:
    """Code spans' contents as spaces, so that neither a link nor a heading is read in
    them; their backticks stay and line numbers hold."""
    return CODE_SPAN.sub(lambda m: m.group(1) + re.sub(r"[^\n]", " ", m.group(2)) + m.group(1), prose)


def headings(prose: str) -> list[str]:
    """The headings' texts, ATX (``## x``) and setext (``x`` over ``---``), in order."""
    found, previous = [], ""
    for line in prose.splitlines():
        atx = ATX_HEADING.match(line)
        if atx:
            found.append(atx.group(2) or "")
        elif SETEXT_UNDERLINE.match(line) and previous.strip() and not previous.lstrip().startswith(("|", "-", "*", ">")):
            found.append(previous.strip())
        previous = "" if atx else line
    return found


def slug(heading: str) -> str:
    """The anchor GitHub gives a heading: its text without markup, lowercased, every
    character but letters, digits, "_", "-" and spaces dropped, spaces made "-"."""
    text = re.sub(r"!?\[([^\]]*)\]\([^)]*\)", r"\1", heading)  # a link is its text
    text = re.sub(r"<[^>]+>", "", text)  # inline HTML
    return re.sub(r"[^\w\- ]", "", text.strip().lower()).replace(" ", "-")


def anchors(prose: str) -> set[str]:
    """Every heading's anchor; a repeated slug gets "-1", "-2", ... as on GitHub."""
    seen: dict[str, int] = {}
    result = set()
    for heading in headings(prose):
        base = slug(heading)
        n = seen.get(base, 0)
        seen[base] = n + 1
        result.add(base if n == 0 else f"{base}-{n}")
    return result


def links(prose: str) -> list[tuple[int, str]]:
    """(line, target) of every inline link and image and every link reference
    definition outside code."""
    text = _blank_code_spans(prose)
    found = [(m.start(), m.group(2)) for m in INLINE_LINK.finditer(text)]
    found += [(m.start(), m.group(2)) for m in LINK_DEFINITION.finditer(text)]
    return [(text.count("\n", 0, at) + 1, target.strip("<>")) for at, target in sorted(found)]


def broken_links(path: str, root: str = ROOT) -> list[str]:
    """Relative links of the Markdown file ``path`` (under ``root``) whose file does not
    exist, or whose ``#anchor`` names no heading of its Markdown file."""
    with open(os.path.join(root, path), encoding="utf-8") as f:
        own = read_markdown(f.read()).prose
    broken = []
    for line, target in links(own):
        if re.match(r"[A-Za-z][A-Za-z0-9+.-]*:|//", target):  # https:, mailto: ...: not ours to check
            continue
        file, _, anchor = target.partition("#")
        resolved = os.path.normpath(os.path.join(os.path.dirname(path), file)) if file else path
        where = f"{path}:{line}: ({target})"
        if not os.path.exists(os.path.join(root, resolved)):
            broken.append(f"{where} no file {resolved}")
        elif anchor and resolved.endswith(".md"):
            with open(os.path.join(root, resolved), encoding="utf-8") as f:
                if anchor not in anchors(read_markdown(f.read()).prose):
                    broken.append(f"{where} no heading in {resolved} has the anchor #{anchor}")
    return broken


def python_block_error(code: str) -> str | None:
    """Why a ``python`` block does not parse, else None. A block of signatures (lines
    ``name(arg=default, *, ...)``, possibly dotted, possibly wrapped) parses as the
    ``def`` of each."""
    try:
        ast.parse(code)
        return None
    except SyntaxError as error:
        first = f"line {error.lineno}: {error.msg}"
    signatures = re.split(r"\n(?=[\w.]+\()", code.strip())
    if all(re.match(r"[\w.]+\(", s) for s in signatures):
        try:
            for s in signatures:
                ast.parse("def f" + s[s.index("("):].rstrip() + ": ...")
            return None
        except SyntaxError:
            pass
    return first


# --- the reader reads, and the checks catch what they are for ----------------------------


@pytest.mark.pure
def test_the_reader_finds_fences_headings_and_links():
    assert read_markdown("```bash\nx\n``` and text\n## Heading\n").unclosed == 1  # (the README's old mistake)
    assert read_markdown("````\n```\n````\n").unclosed is None
    assert read_markdown("Some ```inline``` code\n").blocks == []
    md = read_markdown("# T\n\n```python\nx = 1\n# not a heading\n[no](link.md)\n```\n"
                       "~~~\n```\n~~~\nText `[no](code.md)` and [yes](a.md#b).\n\nSub\n---\n")
    assert [(b.line, b.info, b.code) for b in md.blocks] == [(3, "python", "x = 1\n# not a heading\n[no](link.md)\n"),
                                                           (8, "", "```\n")]
    assert md.unclosed is None
    assert headings(md.prose) == ["T", "Sub"]
    assert links(md.prose) == [(11, "a.md#b")]
    assert links("![chart](img/c.png) [def]: <other.md#x>\n[ref]: docs/x.md\n") == [(1, "img/c.png"), (2, "docs/x.md")]
    assert slug("Hardening 3: threads, interrupts, ring bounds, torch's last differences (issue 32)") == \
        "hardening-3-threads-interrupts-ring-bounds-torchs-last-differences-issue-32"
    assert slug("Shuffling a stream: `shuffle_buffer=N` and `stream_parts()`") == \
        "shuffling-a-stream-shuffle_buffern-and-stream_parts"
    assert anchors("## A\n\n## A\n") == {"a", "a-1"}


@pytest.mark.pure
def test_a_broken_link_is_found(tmp_path):
    (tmp_path / "docs").mkdir()
    (tmp_path / "docs" / "b.md").write_text("# B\n\n## Kept section\n")
    (tmp_path / "docs" / "a.md").write_text(
        "# A\n[ok](b.md#kept-section) [ok](#a) [ok](https://example.com/x.md)\n"
        "[file](c.md) [anchor](b.md#gone) [own](#nowhere)\n`[in code](d.md)`\n")
    assert broken_links("docs/a.md", str(tmp_path)) == [
        "docs/a.md:3: (c.md) no file docs/c.md",
        "docs/a.md:3: (b.md#gone) no heading in docs/b.md has the anchor #gone",
        "docs/a.md:3: (#nowhere) no heading in docs/a.md has the anchor #nowhere",
    ]


@pytest.mark.pure
def test_a_python_block_that_does_not_parse_is_found():
    assert python_block_error("for x in y:\n    print(x)\n") is None
    assert python_block_error("f(a, b=1, *,\n  c=2)\nmod.g(x, *, y=0)\n") is None  # signatures
    assert python_block_error("f(a, b=1, *,\n  c=2)\nprint(\n") is not None
    assert python_block_error("x = = 1\n") == "line 1: invalid syntax"


# --- the docs ------------------------------------------------------------------------------


@pytest.mark.pure
def test_every_code_fence_in_the_docs_closes():
    for path in doc_paths():
        unclosed = read_markdown(read(path)).unclosed
        assert unclosed is None, f"{path}:{unclosed}: this code fence never closes; everything after it renders as code"


@pytest.mark.pure
def test_every_python_block_in_the_docs_parses():
    checked = 0
    for path in doc_paths():
        for block in read_markdown(read(path)).blocks:
            if block.info in ("python", "py"):
                error = python_block_error(block.code)
                assert error is None, f"{path}: the python block opened on line {block.line}: {error}"
                checked += 1
    assert checked >= 15


@pytest.mark.pure
def test_every_relative_link_in_the_docs_resolves():
    broken = [b for path in doc_paths() for b in broken_links(path)]
    assert not broken, "\n".join(broken)


@pytest.mark.pure
def test_the_readme_is_short_and_links_every_doc():
    text = readme()
    assert len(text) <= README_MAX_CHARS, f"README.md has {len(text)} characters; move detail into docs/"
    linked = {target.partition("#")[0] for _, target in links(read_markdown(text).prose)}
    unlinked = [p for p in doc_paths()[1:] if p not in linked]
    assert not unlinked, f"README.md links no {unlinked}"


def test_the_quick_start_runs(tmp_path):
    code = next(b.code for b in read_markdown(readme()).blocks
                if b.info == "python" and b.code.startswith("import numpy as np\nimport shmload"))
    script = tmp_path / "quickstart.py"
    script.write_text(code)
    result = subprocess.run([sys.executable, str(script)], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert result.returncode == 0 and result.stderr == "", result.stderr


def _readme_commands() -> list[str]:
    return [b.code.rstrip("\n") for b in read_markdown(readme()).blocks if b.info == "bash"]


@pytest.mark.pure
def test_ci_runs_the_readmes_test_command():
    test_command = next(c for c in _readme_commands() if "pytest" in c)
    assert test_command in read(os.path.join(".ci", "run")).splitlines()


@pytest.mark.pure
def test_ci_runs_the_readmes_torch_and_trainer_test_command():
    torch_command = next(c for c in _readme_commands() if "pytest -m torch" in c)
    assert "torch,lightning,accelerate,hf" in torch_command
    assert torch_command in read(os.path.join(".ci", "run")).splitlines()


@pytest.mark.pure
def test_every_test_the_reliability_doc_cites_exists():
    cited = set(re.findall(r"`(?:tests/test_\w+\.py::)?(test_\w+)`", read(os.path.join("docs", "reliability.md"))))
    defined = set()
    for name in os.listdir(os.path.join(ROOT, "tests")):
        if name.startswith("test_") and name.endswith(".py"):
            defined.update(re.findall(r"^def (test_\w+)\(", read(os.path.join("tests", name)), re.M))
    assert len(cited) > 30
    assert cited <= defined, f"docs/reliability.md cites tests that do not exist: {sorted(cited - defined)}"


# --- the loader's signature and arguments, as documented -------------------------------------


def _documented_signatures(text: str) -> list[str]:
    """Every ``DataLoader(dataset, batch_size=1, ...)`` in ``text`` (the signature with
    every default), without spaces, up to its closing parenthesis."""
    found = []
    for m in re.finditer(r"DataLoader\(dataset,\s*batch_size=1,", text):
        depth = 0
        for end in range(m.start(), len(text)):
            depth += {"(": 1, ")": -1}.get(text[end], 0)
            if text[end] == ")" and depth == 0:
                break
        found.append(re.sub(r"\s+", "", text[m.start():end + 1]).replace("'", '"'))
    return found


def _loaders_signature() -> str:
    from shmload import DataLoader

    parts, star = [], False
    for p in inspect.signature(DataLoader).parameters.values():
        if p.kind is p.KEYWORD_ONLY and not star:
            parts.append("*")
            star = True
        parts.append(p.name if p.default is p.empty else f"{p.name}={p.default!r}")
    return ("DataLoader(" + ",".join(parts) + ")").replace("'", '"')


@pytest.mark.pure
def test_the_documented_signatures_are_the_loaders():
    assert _documented_signatures("x DataLoader(dataset, batch_size=1,\n  f=(1, 2), *, g='a') y") == \
        ['DataLoader(dataset,batch_size=1,f=(1,2),*,g="a")']
    actual = _loaders_signature()
    api_blocks = [b.code for b in read_markdown(read(os.path.join("docs", "api.md"))).blocks if b.info == "python"]
    assert any(_documented_signatures(code) for code in api_blocks), "docs/api.md shows no DataLoader signature"
    for path in doc_paths():
        for documented in _documented_signatures(read(path)):
            assert documented == actual, f"{path}: a DataLoader signature that is not the loader's:\n{documented}"


def _table_rows(prose: str, header: list[str]) -> list[list[str]]:
    """The cells of each body row of the table whose header row is ``header``."""
    rows, inside = [], False
    for line in prose.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")] if line.lstrip().startswith("|") else None
        if cells is None:
            inside = False
        elif cells == header:
            inside = True
        elif inside and not all(re.fullmatch(r":?-+:?", c) for c in cells):
            rows.append(cells)
    return rows


@pytest.mark.pure
def test_the_api_docs_argument_table_has_a_row_for_each_argument_and_no_other():
    rows = _table_rows("| argument | meaning |\n|---|---|\n| `a`, `b` | x |\n| `c` | y |\n\n| `d` | z |\n",
                       ["argument", "meaning"])
    assert rows == [["`a`, `b`", "x"], ["`c`", "y"]]
    from shmload import DataLoader

    rows = _table_rows(read_markdown(read(os.path.join("docs", "api.md"))).prose, ["argument", "meaning"])
    documented = [name for cells in rows for name in re.findall(r"`(\w+)`", cells[0])]
    parameters = list(inspect.signature(DataLoader).parameters)
    assert sorted(documented) == sorted(parameters), (
        f"docs/api.md's argument table: missing {sorted(set(parameters) - set(documented))}, "
        f"not arguments {sorted(set(documented) - set(parameters))}, rows {len(documented)} for {len(parameters)}")


_DOTTED = re.compile(r"`(shmload(?:\.\w+)+)")


def unresolved_names(text: str) -> list[str]:
    """The ``shmload.a.b`` names in code spans of ``text`` that do not import: the longest
    module prefix is imported, the rest looked up as attributes."""
    import importlib

    missing = []
    for name in sorted(set(_DOTTED.findall(text))):
        parts = name.split(".")
        for cut in range(len(parts), 0, -1):
            try:
                obj = importlib.import_module(".".join(parts[:cut]))
            except ImportError:
                continue
            try:
                for attr in parts[cut:]:
                    obj = getattr(obj, attr)
            except AttributeError:
                missing.append(name)
            break
        else:
            missing.append(name)
    return missing


@pytest.mark.pure
def test_a_name_that_does_not_import_is_found():
    assert unresolved_names("`shmload.DataLoader` and `shmload.shuffle.parts_order(n)`, `shmload.nope`") == [
        "shmload.nope", "shmload.shuffle.parts_order"]


@pytest.mark.pure
def test_every_shmload_name_the_docs_give_imports():
    """A name a user copies from the docs (``shmload.records.RecordDataset``) must import
    as written: the layers moved modules, and a doc naming an old path misleads."""
    found = {path: unresolved_names(read(path)) for path in doc_paths()}
    assert not any(found.values()), {os.path.relpath(p, ROOT): names for p, names in found.items() if names}


_CITED = re.compile(r"tests/(test_\w+\.py)(?:::(test_\w+))?")


@pytest.mark.pure
def test_every_test_file_and_test_the_docs_cite_exists():
    """``tests/test_x.py`` and ``tests/test_x.py::test_y`` in the docs, the README and the
    benchmarks: the file exists and defines that test (tests move between files by
    behaviour; a citation must follow)."""
    wrong = []
    paths = doc_paths() + [os.path.join("benchmarks", f) for f in os.listdir(os.path.join(ROOT, "benchmarks"))
                           if f.endswith(".py")]
    for path in paths:
        for file, name in _CITED.findall(read(path)):
            full = os.path.join(ROOT, "tests", file)
            if not os.path.exists(full):
                wrong.append(f"{path}: tests/{file} does not exist")
            elif name and not re.search(rf"^(?:async )?def {name}\b", read(os.path.join("tests", file)), re.M):
                wrong.append(f"{path}: tests/{file} defines no {name}")
    assert not wrong, "\n".join(wrong)
