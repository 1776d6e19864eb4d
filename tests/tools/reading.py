"""Reading time and visible assertions of the lesson notebooks: ``python tests/tools/reading.py [NOTEBOOK ...]``.

The measure of the design card: prose outside ``<details>`` blocks at 150 words a minute, plus the code a
learner sees (the source of every code cell whose input is not collapsed, ``"jupyter": {"source_hidden":
true}``) at 12 non-blank lines a minute. Assertion lines in sight are the lines of ``assert`` statements in
visible cells, as a share of the visible code lines. ``--check`` exits 1 naming every notebook over 45 minutes
or over 5%.
"""

from __future__ import annotations

import argparse
import ast
import json
import os
import re
import sys
from dataclasses import dataclass

ROOT = os.path.normpath(os.path.join(os.path.dirname(os.path.abspath(__file__)), os.pardir, os.pardir))
NOTEBOOKS = os.path.join(ROOT, "notebooks")
WORDS_PER_MINUTE, LINES_PER_MINUTE = 150, 12
MAX_MINUTES, MAX_ASSERT_SHARE = 45, 0.05

_DETAILS = re.compile(r"<details\b.*?</details>", re.S | re.I)
_ASSERT_LINE = re.compile(r"^\s*assert\b")


@dataclass
class Reading:
    path: str
    prose_words: int
    code_lines: int
    assert_lines: int

    @property
    def minutes(self) -> float:
        return self.prose_words / WORDS_PER_MINUTE + self.code_lines / LINES_PER_MINUTE

    @property
    def assert_share(self) -> float:
        return self.assert_lines / self.code_lines if self.code_lines else 0.0

    def problems(self) -> list:
        out = []
        if self.minutes > MAX_MINUTES:
            out.append(f"{self.minutes:.0f} min of reading (limit {MAX_MINUTES})")
        if self.assert_share > MAX_ASSERT_SHARE:
            out.append(f"assertions are {self.assert_share:.0%} of the visible code (limit {MAX_ASSERT_SHARE:.0%})")
        return out


def _source(cell) -> str:
    src = cell.get("source", "")
    return "".join(src) if isinstance(src, list) else src


def hidden(cell) -> bool:
    return bool(cell.get("metadata", {}).get("jupyter", {}).get("source_hidden"))


def _assert_lines(code: str) -> int:
    """Lines spanned by assert statements; IPython magics and shell lines are blanked first so the rest parses."""
    lines = code.splitlines()
    python = "\n".join("" if ln.lstrip().startswith(("%", "!")) else ln for ln in lines)
    try:
        tree = ast.parse(python)
    except SyntaxError:
        return sum(1 for ln in lines if _ASSERT_LINE.match(ln))
    spanned = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Assert):
            spanned.update(range(node.lineno, (node.end_lineno or node.lineno) + 1))
    return sum(1 for n in spanned if lines[n - 1].strip())


def measure(path: str) -> Reading:
    with open(path, encoding="utf-8") as fh:
        nb = json.load(fh)
    words = code = asserts = 0
    for cell in nb.get("cells", []):
        text = _source(cell)
        if cell.get("cell_type") == "markdown":
            words += len(_DETAILS.sub(" ", text).split())
        elif cell.get("cell_type") == "code" and not hidden(cell):
            code += sum(1 for ln in text.splitlines() if ln.strip())
            asserts += _assert_lines(text)
    return Reading(os.path.relpath(path, ROOT), words, code, asserts)


def lessons() -> list:
    out = []
    for folder in (NOTEBOOKS, os.path.join(NOTEBOOKS, "solutions")):
        out += sorted(os.path.join(folder, n) for n in os.listdir(folder) if n.endswith(".ipynb"))
    return out


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python tests/tools/reading.py", description=__doc__.splitlines()[0])
    parser.add_argument("notebooks", nargs="*", help="notebooks to measure (default: every lesson and solution)")
    parser.add_argument("--check", action="store_true", help="exit 1 if a notebook is over a limit")
    args = parser.parse_args(argv)
    paths = args.notebooks or lessons()
    for path in paths:
        if not os.path.isfile(path):
            parser.error(f"{path}: no such notebook")
    readings = [measure(p) for p in paths]
    print(f"{'notebook':58} {'words':>6} {'code':>5} {'min':>5} {'asserts':>8}")
    for r in readings:
        print(f"{r.path:58} {r.prose_words:6} {r.code_lines:5} {r.minutes:5.0f} {r.assert_share:8.1%}")
    bad = [(r, p) for r in readings for p in r.problems()]
    for r, p in bad:
        print(f"{r.path}: {p}", file=sys.stderr)
    return 1 if args.check and bad else 0


if __name__ == "__main__":
    sys.exit(main())
