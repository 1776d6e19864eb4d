"""The reading path: each lesson's reading copy (notebooks/reading/, executed by tests/tools/reading_copies.py)
has its notebook's cells, and each lesson keeps the reading budget of tests/tools/reading.py (<= 45 minutes,
assertion lines <= 5% of the code in sight)."""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
TOOLS = Path(__file__).parent / "tools"


def _tool(name: str):
    spec = importlib.util.spec_from_file_location(f"lab_tool_{name}", TOOLS / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up there
    spec.loader.exec_module(module)
    return module


reading = _tool("reading")
copies = _tool("reading_copies")
REGENERATE = "python tests/tools/reading_copies.py"


def _cells(path) -> list:
    """What a reader reads: each cell's type and source (outputs, ids and metadata aside)."""
    nb = json.loads(Path(path).read_text(encoding="utf-8"))
    return [(c["cell_type"], reading._source(c)) for c in nb["cells"]]


def stale(lesson: str) -> str:
    """Why the reading copy of ``lesson`` does not match it, or '' when it does."""
    copy = Path(copies.copy_path(lesson))
    if not copy.exists():
        return "no reading copy"
    mine, theirs = _cells(lesson), _cells(copy)
    if len(mine) != len(theirs):
        return f"the copy has {len(theirs)} cells, the notebook {len(mine)}"
    for i, (a, b) in enumerate(zip(mine, theirs)):
        if a != b:
            return f"cell {i} differs"
    return ""


def test_every_reading_copy_matches_its_notebook():
    problems = [f"{Path(p).relative_to(ROOT)}: {why}" for p in reading.lessons() if (why := stale(p))]
    assert not problems, (f"{len(problems)} reading copies are missing or stale; run `{REGENERATE} NOTEBOOK` "
                          "for each:\n" + "\n".join(problems))


def test_no_reading_copy_without_its_notebook():
    lessons = {Path(copies.copy_path(p)) for p in reading.lessons()}
    orphans = [str(p.relative_to(ROOT)) for p in (ROOT / "notebooks" / "reading").rglob("*.ipynb") if p not in lessons]
    assert not orphans, f"reading copies whose notebook is gone: {orphans}"


def test_reading_copies_carry_outputs_and_say_how_they_ran():
    found = sorted((ROOT / "notebooks" / "reading").rglob("*.ipynb"))
    if not found:
        pytest.skip(f"no reading copies yet: run `{REGENERATE}`")
    for path in found:
        nb = json.loads(path.read_text(encoding="utf-8"))
        code = [c for c in nb["cells"] if c["cell_type"] == "code"]
        assert any(c.get("outputs") for c in code), f"{path.name}: an executed copy shows outputs"
        meta = nb["metadata"].get("reading_copy", {})
        assert meta.get("start_method") in ("fork", "forkserver", "spawn") and meta.get("executed"), path.name


def test_every_lesson_keeps_the_reading_budget():
    over = [f"{r.path}: {p}" for r in map(reading.measure, reading.lessons()) for p in r.problems()]
    assert not over, f"{len(over)} over the reading budget (python tests/tools/reading.py):\n" + "\n".join(over)


def test_the_measure_counts_what_a_learner_sees(tmp_path):
    nb = {"cells": [
        {"cell_type": "markdown", "metadata": {}, "source": "one two three <details>four five</details>"},
        {"cell_type": "code", "metadata": {}, "source": "x = 1\n\nassert x == 1\n%time y = 2\n"},
        {"cell_type": "code", "metadata": {"jupyter": {"source_hidden": True}}, "source": "assert x\nassert y\n"},
    ], "metadata": {}, "nbformat": 4, "nbformat_minor": 5}
    path = tmp_path / "t.ipynb"
    path.write_text(json.dumps(nb), encoding="utf-8")
    r = reading.measure(str(path))
    assert (r.prose_words, r.code_lines, r.assert_lines) == (3, 3, 1)  # <details> and hidden cells aside
    assert r.minutes == pytest.approx(3 / 150 + 3 / 12) and r.problems() == [
        "assertions are 33% of the visible code (limit 5%)"]


def test_a_copy_with_a_changed_cell_is_stale(tmp_path, monkeypatch):
    lesson = tmp_path / "notebooks" / "00_x.ipynb"
    lesson.parent.mkdir()
    cell = {"cell_type": "code", "metadata": {}, "outputs": [], "execution_count": None, "source": "print(1)\n"}
    lesson.write_text(json.dumps({"cells": [cell], "metadata": {}, "nbformat": 4, "nbformat_minor": 5}))
    monkeypatch.setattr(copies, "NOTEBOOKS", str(lesson.parent))
    monkeypatch.setattr(copies, "READING", str(lesson.parent / "reading"))
    assert stale(str(lesson)) == "no reading copy"
    copy = Path(copies.copy_path(str(lesson)))
    copy.parent.mkdir()
    ran = dict(cell, outputs=[{"output_type": "stream", "name": "stdout", "text": "1\n"}], execution_count=1)
    copy.write_text(json.dumps({"cells": [ran], "metadata": {}, "nbformat": 4, "nbformat_minor": 5}))
    assert stale(str(lesson)) == ""  # outputs and counts are the copy's own
    copy.write_text(json.dumps({"cells": [dict(ran, source="print(2)\n")], "metadata": {}, "nbformat": 4,
                                "nbformat_minor": 5}))
    assert stale(str(lesson)) == "cell 0 differs"
