"""The shape of ``labutils/`` that issue "a house you can read" set: no module over 600 lines, no function
over 80 lines, no function with more than 8 parameters unless they are the fields of a spec object.

The one function with more is ``run_isolated``, the public entry point the notebooks call with keywords;
its keywords are exactly those :class:`labutils.runner.spec.RunSpec` validates (``spec.KEYWORDS``), which
is checked here too, so the two cannot drift apart.
"""

from __future__ import annotations

import ast
import inspect
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[1] / "labutils"
MAX_MODULE_LINES, MAX_FUNCTION_LINES, MAX_PARAMETERS = 600, 80, 8
MODULES = sorted(PACKAGE.rglob("*.py"))


def _functions(path: Path):
    tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
    for node in ast.walk(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            a = node.args
            names = [x.arg for x in (*a.posonlyargs, *a.args, *a.kwonlyargs)]
            if names and names[0] in ("self", "cls"):
                names = names[1:]
            yield node, names


def _name(path: Path) -> str:
    return path.relative_to(PACKAGE.parent).as_posix()


def test_the_package_has_modules_to_check():
    assert len(MODULES) > 20 and (PACKAGE / "runner" / "isolate.py") in MODULES


@pytest.mark.parametrize("path", MODULES, ids=_name)
def test_module_and_its_functions_keep_the_house_limits(path):
    lines = len(path.read_text(encoding="utf-8").splitlines())
    assert lines <= MAX_MODULE_LINES, f"{_name(path)}: {lines} lines (at most {MAX_MODULE_LINES}): split it"
    from labutils.runner import spec

    too_long, too_many = [], []
    for node, names in _functions(path):
        length = node.end_lineno - node.lineno + 1
        if length > MAX_FUNCTION_LINES:
            too_long.append(f"{node.name} (line {node.lineno}): {length} lines")
        if len(names) > MAX_PARAMETERS and set(names) - {"code"} != set(spec.KEYWORDS):
            too_many.append(f"{node.name} (line {node.lineno}): {len(names)} parameters")
    assert not too_long, f"{_name(path)}: functions over {MAX_FUNCTION_LINES} lines: {too_long}"
    assert not too_many, f"{_name(path)}: more than {MAX_PARAMETERS} parameters, not a spec's fields: {too_many}"


def test_run_isolated_takes_exactly_what_its_spec_validates():
    from labutils.runner import spec
    from labutils.runner.isolate import run_isolated

    params = inspect.signature(run_isolated).parameters
    assert list(params)[0] == "code"
    given = {name: p.default for name, p in params.items() if name != "code"}
    assert given == spec.KEYWORDS  # same names, same defaults: RunSpec.build checks every one of them
    assert all(p.kind is inspect.Parameter.KEYWORD_ONLY for name, p in params.items() if name != "code")
