"""Every reference to a design note names a note that exists.

The tricky rules are written once in the code, as notes, and comments and docs point at
them by title: the word NOTE, then the title in square brackets with a space inside
each bracket. A note is defined in shmload/ where a comment or docstring line begins
with it (after a ``#``, if any) and goes on with nothing but the line's end or a full
stop; every other occurrence is a reference, in shmload/, tests/, docs/, README.md,
benchmarks/ and examples/, its title possibly running over a line break (a comment's
``#`` continuing it). A note renamed or removed leaves its references pointing nowhere:
each is named here, file:line. Read from the files, no process started.
"""

from __future__ import annotations

import os
import re

import pytest

pytestmark = pytest.mark.pure

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
WHERE = ("shmload", "tests", "docs", "README.md", "benchmarks", "examples")

# NOTE, then its title in brackets: on one line, or NOTE at a line's end and the title on
# the next; the title may itself run over lines. Any title, however written, is a
# reference, so an abbreviated one is caught as well as a misspelt one.
REFERENCE = re.compile(r"\bNOTE(?:[ \t]*\n[ \t]*(?:#[ \t]*)?|[ \t]+)\[\s*(.{1,200}?)\s*\]", re.S)
DEFINITION = re.compile(r"^[ \t]*(?:#[ \t]*)?NOTE \[ (.+?) \](?:\.|[ \t]*$)", re.M)


def _title(text: str) -> str:
    """A title as one line: line breaks, and the ``#`` of a comment continuing it, are
    one space."""
    return " ".join(re.sub(r"\n[ \t]*(?:#[ \t]*)?", " ", text).split())


def _line(text: str, at: int) -> int:
    return text.count("\n", 0, at) + 1


def _files(top: str):
    path = os.path.join(ROOT, top)
    if os.path.isfile(path):
        yield path
        return
    for folder, dirs, names in os.walk(path):
        dirs[:] = sorted(d for d in dirs if not d.startswith((".", "__pycache__")))
        for name in sorted(names):
            if name.endswith((".py", ".md")):
                yield os.path.join(folder, name)


def _read(path: str) -> str:
    with open(path, encoding="utf-8") as f:
        return f.read()


def definitions(text: str) -> list[tuple[int, str]]:
    """(line, title) of each note ``text`` defines."""
    return [(_line(text, m.start()), _title(m.group(1))) for m in DEFINITION.finditer(text)]


def references(text: str) -> list[tuple[int, str]]:
    """(line, title) of each note ``text`` names, its definitions included."""
    return [(_line(text, m.start()), _title(m.group(1))) for m in REFERENCE.finditer(text)]


def defined() -> dict[str, list[str]]:
    """Each title defined in shmload/ -> where (file:line)."""
    out: dict[str, list[str]] = {}
    for path in _files("shmload"):
        for line, title in definitions(_read(path)):
            out.setdefault(title, []).append(f"{os.path.relpath(path, ROOT)}:{line}")
    return out


def referred() -> list[tuple[str, str]]:
    """(file:line, title) of every reference in the places WHERE names."""
    return [(f"{os.path.relpath(path, ROOT)}:{line}", title)
            for top in WHERE for path in _files(top) for line, title in references(_read(path))]


def test_every_note_referred_to_is_defined():
    notes, refs = defined(), referred()
    assert len(notes) > 20 and len(refs) > 100  # (the rules still find them)
    dangling = [f"{where}: {title!r}" for where, title in refs if title not in notes]
    assert not dangling, "references to notes that are not defined in shmload/:\n" + "\n".join(dangling)


def test_each_note_is_defined_once():
    twice = {title: places for title, places in defined().items() if len(places) > 1}
    assert not twice, f"notes defined in more than one place: {twice}"


def test_the_rules_tell_definitions_from_references_over_line_breaks():
    note = "NOTE"  # (written apart, so that this file holds no reference of its own)
    text = "\n".join([
        f"# {note} [ A rule ]",                               # 1: a comment's definition
        f"{note} [ Another rule ]. What it says.",            # 2: a docstring's, a full stop after
        f"    x = 1  # as {note} [ A rule ] says",            # 3: a reference after code
        f"# {note} [ A rule ] (file.py): a reference",        # 4: at a line's start, but goes on
        f"(see {note} [ A rule",                              # 5: a title over a line break,
        "    # that wraps ], and",                            #    the comment's # left out
        f"the {note}",                                        # 7: NOTE at a line's end
        "    [ Another rule ] too; abbreviated:",
        f"{note} [ A rule ...]",                              # 9: no space before its bracket
    ])
    assert definitions(text) == [(1, "A rule"), (2, "Another rule")]
    assert references(text) == [(1, "A rule"), (2, "Another rule"), (3, "A rule"), (4, "A rule"),
                                (5, "A rule that wraps"), (7, "Another rule"), (9, "A rule ...")]
