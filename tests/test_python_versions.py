"""tests/tools/python_versions.py: its options, its reading of nbval's JUnit report, its table, and one real run of
a two-cell notebook (one cell passes, one fails) under this venv's own Python."""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parent
_spec = importlib.util.spec_from_file_location("python_versions", HERE / "tools" / "python_versions.py")
pv = importlib.util.module_from_spec(_spec)
sys.modules["python_versions"] = pv  # dataclasses look their module up by name
_spec.loader.exec_module(pv)

THIS_VENV = sys.prefix  # the suite runs in a venv (.venv, or one of the pyenv venvs)


def _one_line_error(capsys, argv) -> str:
    assert pv.main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1, err
    return err


def test_missing_venv_is_one_line(capsys, tmp_path):
    err = _one_line_error(capsys, ["--venv", str(tmp_path / "nope")])
    assert "--venv" in err and "no such folder" in err


def test_folder_without_python_is_not_a_venv(capsys, tmp_path):
    err = _one_line_error(capsys, ["--venv", str(tmp_path)])
    assert "not a venv" in err


def test_no_venv_given(capsys):
    assert "at least one venv" in _one_line_error(capsys, [])


@pytest.mark.parametrize("value", ["bogus", "fork,threads"])
def test_bad_start_method_names_the_allowed_ones(capsys, value):
    err = _one_line_error(capsys, ["--venv", THIS_VENV, "--start-method", value])
    assert "--start-method" in err and "fork, forkserver, spawn" in err


def test_start_methods_are_split_and_deduplicated():
    args = pv.parse_args(["--venv", THIS_VENV, "--start-method", "spawn,fork", "--start-method", "fork",
                          "notebooks/00_*.ipynb"])
    assert args.start_method == ["spawn", "fork"]
    assert [p.name for p in args.notebooks] == ["00_start_here.ipynb"]
    assert args.venv[0].version == "%d.%d.%d" % sys.version_info[:3]


def test_default_is_every_notebook_and_solution_under_fork():
    args = pv.parse_args(["--venv", THIS_VENV])
    assert args.start_method == ["fork"]
    names = [p.relative_to(pv.ROOT).as_posix() for p in args.notebooks]
    assert "notebooks/08_main_module_and_guard.ipynb" in names
    assert "notebooks/solutions/08_main_module_and_guard_solutions.ipynb" in names
    lessons = [p for p in (pv.ROOT / "notebooks").rglob("*.ipynb") if "reading" not in p.parts]  # not the copies
    assert len(names) == len(lessons)


@pytest.mark.parametrize("argv, words", [
    (["notebooks/99_*.ipynb"], "no notebook"),
    (["--timeout", "0"], "--timeout"),
    (["--wrap", "/no/such/cpuslot"], "--wrap"),
])
def test_other_bad_options(capsys, argv, words):
    assert words in _one_line_error(capsys, ["--venv", THIS_VENV, *argv])


def test_error_line_is_the_exception_without_colour():
    traceback = ("\n\x1b[31m---------------------------------------------------------\x1b[39m\n"
                 "\x1b[31mAssertionError\x1b[39m                 Traceback (most recent call last)\n"
                 "Cell \x1b[32mIn[5]\x1b[39m, line 3\n      1 x = 1\n----> 3 assert x == 2, 'expected 2'\n\n"
                 "\x1b[31mAssertionError\x1b[39m: expected 2\nsecond line of the message\n")
    assert pv.error_line(traceback) == "AssertionError: expected 2"
    quoting = ("AssertionError     Traceback (most recent call last)\n----> 5 assert ok, msg\n\n"
               "AssertionError: Caught RuntimeError in DataLoader worker process 0.\n"
               "Original Traceback (most recent call last):\n"
               "  File x\nRuntimeError: Cannot re-initialize CUDA in forked subprocess.\n")
    assert pv.error_line(quoting) == "AssertionError: Caught RuntimeError in DataLoader worker process 0."
    bare = "AssertionError   Traceback\n      1 x = 1\n----> 2 assert x == 2\n      3 y = 3\n\nAssertionError: \n"
    assert pv.error_line(bare) == "AssertionError at 2 assert x == 2"
    for arrow in ("--->", "->", "------>"):  # IPython 8.x draws "--->" (the 04 failure on 3.12 had it)
        assert pv.error_line(bare.replace("---->", arrow)) == "AssertionError at 2 assert x == 2"
    assert pv.error_line(bare.replace("---->", "")) == "AssertionError"  # no arrow: nothing made up
    assert pv.error_line("_pickle.PicklingError: Can't pickle <function f>") == \
        "_pickle.PicklingError: Can't pickle <function f>"
    assert pv.error_line("Notebook cell execution failed\nCell 3: Timeout of 240 seconds exceeded executing cell") \
        == "Cell 3: Timeout of 240 seconds exceeded executing cell"


def _junit(cases: str, time: str = "12.5") -> str:
    return (f'<?xml version="1.0"?><testsuites><testsuite name="pytest" errors="0" failures="1" tests="3" '
            f'time="{time}">{cases}</testsuite></testsuites>')


def test_from_junit_names_the_first_failing_cell_and_its_index():
    nb = "notebooks/08_main_module_and_guard.ipynb"
    cells = json.loads((pv.ROOT / nb).read_text())["cells"]
    code = [i for i, c in enumerate(cells) if c["cell_type"] == "code"]
    report = _junit('<testcase classname="x" name="Cell 0" time="1"/>'
                    '<testcase classname="x" name="Cell 2" time="1"><failure message="x">'
                    'Notebook cell execution failed\nCell 2: Cell execution caused an exception\n\nInput:\n...\n'
                    'Traceback:\n#x1B[31mValueError#x1B[39m: boom</failure></testcase>'
                    '<testcase classname="x" name="Cell 3" time="1"><failure message="y">KeyError: 1</failure>'
                    '</testcase>')
    result = pv.from_junit(report, nb, "3.13.0", "fork", 1, "", 99.0)
    assert not result.passed
    assert result.cell == f"Cell 2 (cells[{code[2]}])"
    assert result.error == "ValueError: boom"
    assert result.seconds == 12.5  # pytest's own time, not the wall time with the CPU lock's wait


def test_from_junit_session_failure_without_a_failing_cell():
    output = "...\nlabutils: 2 file(s) in /dev/shm made by this session's processes are still there; the session fails"
    result = pv.from_junit(_junit('<testcase classname="x" name="Cell 0" time="1"/>'), "nb.ipynb", "3.12.1",
                           "fork", 1, output, 3.0)
    assert not result.passed and result.cell == "" and "/dev/shm" in result.error
    passed = pv.from_junit(_junit('<testcase classname="x" name="Cell 0" time="1"/>'), "nb.ipynb", "3.12.1",
                           "fork", 0, "", 3.0)
    assert passed.passed and passed.error == ""
    crashed = pv.from_junit("", "nb.ipynb", "3.12.1", "fork", 4, "ERROR: usage: pytest ...", 0.5)
    assert not crashed.passed and crashed.error == "ERROR: usage: pytest ..."


def test_table_columns_and_markdown():
    results = [pv.Result("notebooks/a.ipynb", "3.13.0", "fork", True, seconds=4.04),
               pv.Result("notebooks/b.ipynb", "3.12.1", "spawn", False, "Cell 1 (cells[3])", "KeyError: 'a|b'", 7.0)]
    text = pv.table(results).splitlines()
    assert text[0].split("  ")[0] == "notebook" and "first failing cell" in text[0]
    assert text[1].split()[:4] == ["notebooks/a.ipynb", "3.13.0", "fork", "passed"] and text[1].endswith("4.0")
    assert "FAILED" in text[2] and "cells[3]" in text[2] and text[2].endswith("7.0")
    md = pv.table(results, markdown=True).splitlines()
    assert md[0].startswith("| notebook | Python |") and set(md[1]) <= set("|- ")
    assert "KeyError: 'a\\|b'" in md[3]  # a | in an error does not split the Markdown row
    assert pv.summary(results) == ("2 runs, 1 failed (Python 3.13.0: 1 passed, 0 failed; "
                                   "Python 3.12.1: 0 passed, 1 failed)")


def test_a_real_run_reports_the_failing_cell(tmp_path, capsys):
    """Two tiny notebooks through the real pytest + nbval + lab plugin of this venv: one passes, one fails."""
    def notebook(name, sources):
        cells = [{"cell_type": "markdown", "metadata": {}, "source": "# t"}] + [
            {"cell_type": "code", "execution_count": None, "metadata": {}, "outputs": [], "source": s}
            for s in sources]
        path = tmp_path / name
        path.write_text(json.dumps({"cells": cells, "metadata": {}, "nbformat": 4, "nbformat_minor": 5}))
        return str(path)

    good = notebook("good.ipynb", ["x = 1"])
    bad = notebook("bad.ipynb", ["import multiprocessing as mp\nimport labutils\nm = mp.get_start_method()",
                                 "assert m == 'nope', m"])
    rc = pv.main(["--venv", THIS_VENV, "--start-method", "spawn", "--json", str(tmp_path / "r.json"), good, bad])
    out = capsys.readouterr().out
    assert rc == 1, out
    results = json.loads((tmp_path / "r.json").read_text())
    assert [r["passed"] for r in results] == [True, False]
    assert results[1]["cell"] == "Cell 1 (cells[2])"
    assert results[1]["error"] == "AssertionError: spawn"  # the kernel ran under the start method asked for
    assert "1 failed" in out.splitlines()[-1]
