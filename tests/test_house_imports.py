"""The import structure DESIGN.md sets for ``labutils/``: data flows one way, layer by layer.

* no import circle between modules;
* no import up the layers: runner (readers at the bottom) -> machine -> diagnosis -> kit -> scenarios -> lab
  -> commands, which nothing imports; the package's face (``labutils/__init__.py``) may import anything;
* no internal import inside a function, except one that defers torch, ipywidgets, IPython or nbclient (the
  module it imports brings one of them in at its top, directly or through other modules), the face's PEP 562
  look-ups, and the command line's choice of one command.

``KNOWN`` lists what this round has not yet moved, each by file and target: the test fails on a new case
and on a listed one that is gone, so the list can only shrink.
"""

from __future__ import annotations

import ast
import sys
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[1] / "labutils"
LAYERS = ["_lazy", "runner", "machine", "diagnosis", "kit", "scenarios", "lab", "commands"]
DEFERRED = {"torch", "ipywidgets", "IPython", "nbclient"}
#: (module, imported module) pairs allowed inside functions for a reason of their own
ALLOWED_INNER = {("labutils", "*"), ("labutils.commands.main", "*")}
#: what is not moved yet: ("circle" | "up" | "inner", module, imported module)
KNOWN = {
    ('inner', 'labutils.lab', 'labutils.lab.widget'),
}


def _module(path: Path) -> str:
    parts = list(path.relative_to(PACKAGE.parent).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _is_package(path: Path) -> bool:
    return path.name == "__init__.py"


def _resolve(node: ast.ImportFrom, module: str, package: bool) -> str:
    if not node.level:
        return node.module or ""
    base = module.split(".") if package else module.split(".")[:-1]
    base = base[: len(base) - (node.level - 1)]
    return ".".join(base + ([node.module] if node.module else []))


def _known_module(name: str) -> bool:
    rel = Path(*name.split("."))
    return (PACKAGE.parent / rel.with_suffix(".py")).is_file() or (PACKAGE.parent / rel / "__init__.py").is_file()


def _imports(path: Path):
    """(imported module, line, inside a function?) for every import of the module at ``path``."""
    module, package = _module(path), _is_package(path)
    tree = ast.parse(path.read_text(encoding="utf-8"))
    inner = {id(n) for f in ast.walk(tree) if isinstance(f, (ast.FunctionDef, ast.AsyncFunctionDef))
             for n in ast.walk(f)}
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = _resolve(node, module, package)
            names = [f"{base}.{a.name}" if _known_module(f"{base}.{a.name}") else base for a in node.names]
        else:
            continue
        for name in names:
            yield name, node.lineno, id(node) in inner


def _graph():
    top, inner = {}, []
    for path in sorted(PACKAGE.rglob("*.py")):
        if path.parent.name == "scenarios" and not _is_package(path):
            continue  # the scenario scripts are the learner's programs, run as files, not modules of the lab
        module = _module(path)
        top[module] = set()
        for name, line, in_function in _imports(path):
            if in_function:
                inner.append((module, name, line))
            else:
                top[module].add(name)
    return top, inner


def _layer(module: str) -> int:
    parts = module.split(".")
    return LAYERS.index(parts[1]) if len(parts) > 1 and parts[1] in LAYERS else len(LAYERS)


def _brings_deferred(name: str, top: dict, seen=None) -> bool:
    seen = set() if seen is None else seen
    if name.split(".")[0] in DEFERRED:
        return True
    if name in seen or name not in top:
        return False
    seen.add(name)
    return any(_brings_deferred(t, top, seen) for t in top[name])


def _cycles(top: dict) -> list:
    internal = {m: {t for t in ts if t in top and t != m} for m, ts in top.items()}
    index, low, stack, on, out = {}, {}, [], set(), []
    sys.setrecursionlimit(max(sys.getrecursionlimit(), 10000))

    def visit(v):
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in internal[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            group = []
            while True:
                w = stack.pop()
                on.discard(w)
                group.append(w)
                if w == v:
                    break
            if len(group) > 1:
                out.append(sorted(group))

    for v in sorted(internal):
        if v not in index:
            visit(v)
    return out


def findings() -> set:
    top, inner = _graph()
    found = set()
    for group in _cycles(top):
        found.add(("circle", group[0], " <-> ".join(group[1:])))
    edges = [(m, t) for m, ts in top.items() for t in ts] + [(m, t) for m, t, _line in inner]
    for module, t in edges:
        if module != "labutils" and t.startswith("labutils") and t in top and _layer(t) > _layer(module):
            found.add(("up", module, t))
    for module, name, _line in inner:
        if not name.startswith("labutils") or (module, "*") in ALLOWED_INNER or _brings_deferred(name, top):
            continue
        found.add(("inner", module, name))
    return found


def test_the_checker_sees_the_package():
    top, _ = _graph()
    assert "labutils.runner.isolate" in top and "labutils.runner.spec" in top["labutils.runner.isolate"]


def test_no_circle_no_upward_import_no_import_hidden_in_a_function():
    found = findings()
    new = sorted(found - KNOWN)
    gone = sorted(KNOWN - found)
    assert not new, "new import-structure problems (see the module docstring for the rules): " + repr(new)
    assert not gone, "fixed, so take them off KNOWN in tests/test_house_imports.py: " + repr(gone)


def test_the_checker_finds_a_circle_and_knows_the_layers():
    top = {"labutils.kit.a": {"labutils.kit.b"}, "labutils.kit.b": {"labutils.kit.a", "os"}, "labutils.kit.c": set()}
    assert _cycles(top) == [["labutils.kit.a", "labutils.kit.b"]]
    assert _layer("labutils.runner.spec") < _layer("labutils.diagnosis.rules") < _layer("labutils.commands.main")
    assert _brings_deferred("labutils.kit.c", {"labutils.kit.c": {"labutils.kit.d"}, "labutils.kit.d": {"torch.nn"}})
