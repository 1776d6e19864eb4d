"""Repository rules that keep the lab usable: clean notebooks, one skeleton, bounded requirements, lint."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
# The lessons and their solutions; notebooks/reading/ (executed reading copies, tests/test_reading.py) is not
# among them: its copies carry outputs on purpose.
NOTEBOOKS = sorted((ROOT / "notebooks").glob("[0-9][0-9]*_*.ipynb"))
SOLUTIONS = sorted((ROOT / "notebooks" / "solutions").glob("*.ipynb"))
EXPECTED = ["00_start_here", "01_read_the_error", "02_spawn_and_pickling", "03_corrupt_data",
            "04_memory_and_oom", "04b_copy_on_read", "05_shared_memory", "06_file_descriptors", "07_hangs_and_timeouts",
            "08_main_module_and_guard", "09_interactive_lab", "10_production_loader",
            "10b_recommended_loader", "11_cuda_and_accelerators",
            "12_distributed_torchrun", "13_libraries_you_load_with"]
SKELETON = ["## Setup", "## Reproduce", "## Read the evidence", "## Fix", "## Verify", "## Summary",
            "## Exercises"]


def cells(path: Path) -> list:
    return json.loads(path.read_text(encoding="utf-8"))["cells"]


def source(cell: dict) -> str:
    src = cell.get("source", "")
    return "".join(src) if isinstance(src, list) else src


def test_every_planned_notebook_exists():
    assert [p.stem for p in NOTEBOOKS] == EXPECTED


def test_reading_copies_are_exempt_from_the_no_outputs_rule_and_nothing_else_is():
    reading = ROOT / "notebooks" / "reading"
    everything = {p for p in (ROOT / "notebooks").rglob("*.ipynb") if ".ipynb_checkpoints" not in p.parts}
    everything -= set(reading.rglob("*.ipynb"))
    assert everything == set(NOTEBOOKS + SOLUTIONS), sorted(map(str, everything ^ set(NOTEBOOKS + SOLUTIONS)))


@pytest.mark.parametrize("path", NOTEBOOKS + SOLUTIONS, ids=lambda p: p.name)
def test_notebook_is_stored_without_outputs(path):
    for i, cell in enumerate(cells(path)):
        if cell["cell_type"] == "code":
            assert not cell.get("outputs"), f"{path.name} cell {i} carries outputs: strip them"
            assert cell.get("execution_count") is None, f"{path.name} cell {i} has an execution count"


@pytest.mark.parametrize("path", NOTEBOOKS + SOLUTIONS, ids=lambda p: p.name)
def test_notebook_code_follows_house_rules(path):
    for i, cell in enumerate(cells(path)):
        if cell["cell_type"] != "code":
            continue
        text = source(cell)
        assert "sys.path" not in text, f"{path.name} cell {i}: import labutils as a package, no sys.path"
        assert not text.rstrip().endswith(";"), f"{path.name} cell {i} ends with ';'"
        for line in text.splitlines():
            if "NBVAL_" in line and line.lstrip().startswith("#"):
                assert re.fullmatch(r"\s*# NBVAL_[A-Z_]+", line), (
                    f"{path.name} cell {i}: nbval marker must stand alone on its line: {line!r}")


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.name)
def test_notebook_follows_the_skeleton(path):
    headings = [ln.strip() for c in cells(path) if c["cell_type"] == "markdown"
                for ln in source(c).splitlines() if ln.startswith("## ")]
    found = [h for h in headings if any(h.startswith(s) for s in SKELETON)]
    order = [next(s for s in SKELETON if h.startswith(s)) for h in found]
    missing = [s for s in SKELETON if s not in order]
    assert not missing, f"{path.name} lacks sections {missing}"
    firsts = [order.index(s) for s in SKELETON]
    assert firsts == sorted(firsts), f"{path.name}: sections out of order: {order}"
    assert source(cells(path)[0]).startswith("# "), f"{path.name} must open with a title cell"


MAX_CODE_LINES = 40
# "### You will learn", "**You will learn**", "You will learn:", "You will learn to:" all read the same
LEARN_LINE = re.compile(r"^(#{1,4}\s+)?(\*\*)?You will learn( to)?:?(\*\*)?:?$", re.I)


@pytest.mark.parametrize("path", NOTEBOOKS + SOLUTIONS, ids=lambda p: p.name)
def test_no_code_cell_is_over_40_lines(path):
    """A learner reads a cell at a glance: a longer one is split, or its plumbing moves into labutils."""
    long = [(i, len(source(c).splitlines())) for i, c in enumerate(cells(path))
            if c["cell_type"] == "code" and len(source(c).splitlines()) > MAX_CODE_LINES
            and not source(c).startswith("%%writefile")]  # a lesson's own script, written out and shown
    assert not long, f"{path.name}: code cells over {MAX_CODE_LINES} lines (cell index, lines): {long}"


def learn_bullets(text: str):
    """The bullets under a "You will learn" line in ``text`` (:data:`LEARN_LINE`), or None without one:
    every line after it (blank lines right after it skipped) up to a blank line or the end of the cell."""
    lines = text.splitlines()
    at = [i for i, ln in enumerate(lines) if LEARN_LINE.match(ln.strip())]
    if not at:
        return None
    rest = lines[at[0] + 1:]
    while rest and not rest[0].strip():
        rest = rest[1:]
    block = []
    for line in rest:
        if not line.strip():
            break
        block.append(line)
    return block


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.name)
def test_notebook_opens_with_three_lines_of_what_you_will_learn(path):
    """The title cell holds a "You will learn" line and then exactly three one-line bullets (``- ...``)."""
    first = cells(path)[0]
    bullets = learn_bullets(source(first)) if first["cell_type"] == "markdown" else None
    assert bullets is not None, f"{path.name}: the title cell has no 'You will learn' line"
    assert len(bullets) == 3 and all(b.startswith("- ") and b[2:].strip() for b in bullets), (
        f"{path.name}: 'You will learn' is followed by exactly three one-line bullets '- ...', "
        f"then a blank line or the end of the cell; found {bullets}")


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.name)
def test_notebook_ends_with_a_summary_before_its_exercises(path):
    """The lesson's last section is ``## Summary`` (with text), and only ``## Exercises`` comes after it (and,
    last of all, an optional ``## Checks`` section: the lab's proof of itself, collapsed, for the test run)."""
    sections = []  # (heading, text of the section)
    for c in cells(path):
        for line in source(c).splitlines() if c["cell_type"] == "markdown" else []:
            if line.startswith("## "):
                sections.append([line.strip(), ""])
            elif sections:
                sections[-1][1] += line.strip()
        if c["cell_type"] == "code" and sections:
            sections[-1][1] += source(c).strip()
    while sections and sections[-1][0].startswith("## Checks"):
        sections.pop()
    names = [h for h, _ in sections]
    assert names[-2:] == ["## Summary", "## Exercises"], (
        f"{path.name}: the last two sections must be '## Summary' then '## Exercises'; they are {names[-2:]}")
    assert sections[-2][1], f"{path.name}: '## Summary' is empty"


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.name)
def test_exercises_have_a_solutions_notebook(path):
    sol = ROOT / "notebooks" / "solutions" / f"{path.stem}_solutions.ipynb"
    assert sol.exists(), f"{path.name} has exercises; write {sol.relative_to(ROOT)}"


def test_requirements_are_bounded_and_explained():
    lines = (ROOT / "requirements.txt").read_text().splitlines()
    assert lines[-1].strip() == "-e .", "requirements.txt ends with -e . (labutils, data_gen)"
    for i, line in enumerate(lines):
        if not line.strip() or line.startswith("#") or line.strip() == "-e .":
            continue
        assert re.search(r"(==|<=|<|~=)", line), f"requirements.txt: {line!r} needs an upper bound"
        j = i - 1
        while j >= 0 and lines[j].strip() and not lines[j].startswith("#"):
            j -= 1  # a block of requirements shares the comment above it
        assert j >= 0 and lines[j].startswith("#"), f"requirements.txt: {line!r} needs a comment saying who needs it"
    torch = next(ln for ln in lines if ln.startswith("torch"))
    assert torch.startswith("torch==2.13."), "torch stays pinned to the local CPU wheel's release"


def test_readme_has_the_two_commands():
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    assert "pip install -r requirements.txt" in readme and "jupyter lab" in readme
    assert "\npytest\n" in readme
    assert "python -m labutils tour" in readme


def test_ruff_is_clean():
    ruff = shutil.which("ruff") or str(Path(sys.executable).with_name("ruff"))
    if not Path(ruff).exists():
        pytest.skip("ruff is not installed in this environment (it is in requirements.txt)")
    done = subprocess.run([ruff, "check", "--no-cache", str(ROOT)], capture_output=True, text=True)
    assert done.returncode == 0, done.stdout + done.stderr


def test_the_you_will_learn_form_reads_as_documented():
    good = "# 05 · Title\n\nIntro.\n\n### You will learn\n\n- one\n- two\n- three\n\nMore text."
    assert learn_bullets(good) == ["- one", "- two", "- three"]
    assert learn_bullets("# T\n\n### You will learn\n- one\n  wrapped\n- two\n- three") == [
        "- one", "  wrapped", "- two", "- three"]  # a wrapped bullet is a fourth line: rejected by the rule
    assert learn_bullets("# T\n\nWhat you will do:\n- one") is None
    assert learn_bullets("# T\n**You will learn**\n- a\n- b\n- c") == ["- a", "- b", "- c"]
    assert learn_bullets("# T\nYou will learn to:\n- a\n- b\n- c") == ["- a", "- b", "- c"]
    assert learn_bullets("# T\n**You will learn:** a sentence that runs on;\nand on.") is None
