"""The package's plan, checked: private packages by layer, each importing only the
layers below it, the public subpackages without back-references, no import cycle, and
no module, class or function too long to hold in mind.

Read from the source (every ``import`` and ``from ... import``, those inside functions
included; those under ``if TYPE_CHECKING:`` only name types and are left out), so a
module that would break the plan fails here before anyone imports it.
"""

from __future__ import annotations

import ast
import os
import re

import pytest

pytestmark = pytest.mark.pure

ROOT = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "shmload")

# Lowest first: a private layer imports only layers before it (docs/architecture.md,
# "The layers"). errors.py and _version.py sit with _core at the bottom; the profiler's
# counters and figures are read by every layer above, and read nothing of theirs.
LAYERS = ["_core", "profiler", "_batching", "_transport", "_ordering", "_loading", "_session", "_loader"]
BOTTOM = {"errors", "_version", "_core"}
# What the public subpackages may not import: the layers a user's dataset or a tool sits
# on import nothing of those built on them.
NOT_FROM = {
    "profiler": {"datasets", "transforms", "records", "tools", "integrations", "testing"},
    "transforms": {"datasets", "records", "profiler", "tools", "integrations"},
    "datasets": {"records", "profiler", "tools", "integrations"},
    "records": {"profiler", "tools", "integrations"},
}


def _module(path: str) -> str:
    rel = os.path.relpath(path, os.path.dirname(ROOT))[:-3].replace(os.sep, ".")
    return rel[: -len(".__init__")] if rel.endswith(".__init__") else rel


def _exists(name: str) -> bool:
    base = os.path.join(os.path.dirname(ROOT), *name.split("."))
    return os.path.isfile(base + ".py") or os.path.isfile(os.path.join(base, "__init__.py"))


def _type_checking_nodes(tree: ast.AST) -> set[int]:
    skip = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            skip.update(id(n) for n in ast.walk(node))
    return skip


def imports() -> dict[str, set[str]]:
    """Each module of the package -> the modules of the package it imports."""
    out: dict[str, set[str]] = {}
    for folder, _, files in os.walk(ROOT):
        for f in files:
            if not f.endswith(".py"):
                continue
            path = os.path.join(folder, f)
            name = _module(path)
            package = name if f == "__init__.py" else name.rsplit(".", 1)[0]
            with open(path) as source:
                tree = ast.parse(source.read())
            skip = _type_checking_nodes(tree)
            found = set()
            for node in ast.walk(tree):
                if id(node) in skip:
                    continue
                if isinstance(node, ast.ImportFrom):
                    if node.level:
                        parts = package.split(".")
                        base = ".".join(parts[: len(parts) - node.level + 1])
                        target = f"{base}.{node.module}" if node.module else base
                    else:
                        target = node.module or ""
                    if not target.startswith("shmload"):
                        continue
                    # (from a package, a name may be a module of it)
                    subs = [f"{target}.{a.name}" for a in node.names if _exists(f"{target}.{a.name}")]
                    found.update(subs or [target])
                elif isinstance(node, ast.Import):
                    found.update(a.name for a in node.names if a.name.startswith("shmload"))
            out[name] = found - {name}
    return out


def _part(name: str) -> str:
    """The top-level part of the package a module belongs to: a layer, a public
    subpackage, or the module itself."""
    parts = name.split(".")
    return parts[1] if len(parts) > 1 else "shmload"


def test_each_private_layer_imports_only_the_layers_below_it():
    wrong = []
    for source, targets in imports().items():
        a = _part(source)
        if a not in LAYERS:
            continue
        for target in targets:
            b = _part(target)
            if b == a or b in BOTTOM:
                continue
            if b not in LAYERS or LAYERS.index(b) > LAYERS.index(a):
                wrong.append(f"{source} imports {target}")
    assert not wrong, "imports up the layers (or into the public packages):\n" + "\n".join(sorted(wrong))


def test_the_public_subpackages_have_no_back_references():
    wrong = [f"{source} imports {target}" for source, targets in imports().items() for target in targets
             if _part(target) in NOT_FROM.get(_part(source), ())]
    assert not wrong, "\n".join(sorted(wrong))


def test_no_import_cycle():
    graph = imports()
    cycles, index, low, stack, on = [], {}, {}, [], set()

    def visit(v: str) -> None:  # Tarjan's strongly connected components
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in graph.get(v, ()):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                cycles.append(sorted(comp))

    for v in list(graph):
        if v not in index:
            visit(v)
    assert not cycles, f"import cycles: {cycles}"


@pytest.mark.parametrize("source,target,expected", [("shmload._session.session", "shmload._loader.config", False),
                                                    ("shmload._loader.loader", "shmload._core._platform", True)])
def test_the_rule_itself(source, target, expected):
    a, b = _part(source), _part(target)
    assert (b in BOTTOM or LAYERS.index(b) <= LAYERS.index(a)) is expected


# What a reader can hold in mind (issue 34): past these a module holds two ideas. The
# limits are lines, docstrings and comments included, as a reader meets them.
MAX_MODULE, MAX_CLASS, MAX_FUNCTION = 400, 350, 60


def sizes() -> list[tuple[str, str, int, int]]:
    """(kind, where, lines, limit) of every module, class and function over its limit."""
    over = []
    for folder, _, files in os.walk(ROOT):
        for f in sorted(files):
            if not f.endswith(".py"):
                continue
            path = os.path.join(folder, f)
            with open(path) as source:
                text = source.read()
            where = os.path.relpath(path, os.path.dirname(ROOT))
            if text.count("\n") > MAX_MODULE:
                over.append(("module", where, text.count("\n"), MAX_MODULE))
            for node in ast.walk(ast.parse(text)):
                kind, limit = (("class", MAX_CLASS) if isinstance(node, ast.ClassDef) else
                               ("function", MAX_FUNCTION) if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef))
                               else (None, 0))
                if kind is not None and node.end_lineno - node.lineno + 1 > limit:
                    over.append((kind, f"{where}:{node.lineno} {node.name}", node.end_lineno - node.lineno + 1, limit))
    return over


def test_no_module_class_or_function_is_too_long():
    over = sizes()
    assert not over, "\n".join(f"{kind} {where}: {n} lines, over {limit}" for kind, where, n, limit in over)


# Names of files that are not ours: a user's script in an example.
_NOT_OURS = {"mydata.py", "script.py", "_train.py"}


def test_every_file_the_docs_and_docstrings_name_exists():
    """"(ring.py)" in a docstring or a doc names one file of the repository: a module
    renamed or split (iterable.py into sources.py and stream.py) must take its
    references with it."""
    repo = os.path.dirname(ROOT)
    ours = set()  # a bare name is a module of the package or a test (others are named with their folder)
    for top in (ROOT, os.path.join(repo, "tests")):
        ours.update(f for _, _, files in os.walk(top) for f in files if f.endswith(".py"))
    ours.update(f for f in os.listdir(repo) if f.endswith(".py"))  # (setup.py)
    named = re.compile(r"(?<![\w/.-])([A-Za-z_]\w*\.py)\b")
    texts = [os.path.join(repo, "README.md")] + [os.path.join(repo, "docs", f)
                                                 for f in os.listdir(os.path.join(repo, "docs")) if f.endswith(".md")]
    texts += [os.path.join(folder, f) for folder, _, files in os.walk(ROOT) for f in files if f.endswith(".py")]
    missing = []
    for path in texts:
        with open(path, encoding="utf-8") as f:
            for n, line in enumerate(f, 1):
                missing += [f"{os.path.relpath(path, repo)}:{n} {name}" for name in named.findall(line)
                            if name not in ours and name not in _NOT_OURS]
    assert not missing, "\n".join(missing)
