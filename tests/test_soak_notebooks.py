"""tests/soak_notebooks.py: counts a cell that fails every second run, ignores skipped cells, and holds
an expected exception to its marker (a tiny notebook in a temporary folder, two runs, fork)."""

import json
import os
import subprocess
import sys
from pathlib import Path

SOAK = Path(__file__).with_name("soak_notebooks.py")


def _code(source: str) -> dict:
    return {"cell_type": "code", "execution_count": None, "metadata": {}, "outputs": [], "source": source}


FLAKY = """from pathlib import Path
counter = Path("runs.txt")
n = int(counter.read_text()) if counter.exists() else 0
counter.write_text(str(n + 1))
assert n % 2 == 1, f"run {n} of this cell fails on purpose"
"""


def _notebook(folder: Path) -> Path:
    nb = {"cells": [{"cell_type": "markdown", "metadata": {}, "source": "# tiny"},
                    _code("x = 1"),
                    _code(FLAKY),
                    _code("# NBVAL_SKIP\nraise SystemError('a skipped cell is not run')"),
                    _code("# NBVAL_RAISES_EXCEPTION\nraise ValueError('expected')"),
                    _code("assert x == 1")],
          "metadata": {"kernelspec": {"display_name": "Python 3", "language": "python", "name": "python3"}},
          "nbformat": 4, "nbformat_minor": 5}
    path = folder / "tiny.ipynb"
    path.write_text(json.dumps(nb), encoding="utf-8")
    return path


def test_a_cell_that_fails_every_second_run_is_counted_once_in_two(tmp_path):
    path = _notebook(tmp_path)
    done = subprocess.run([sys.executable, str(SOAK), "--runs", "2", str(path)], capture_output=True, text=True,
                          timeout=180, env={**os.environ, "PYTHONPATH": os.environ.get("PYTHONPATH", "")})
    assert done.returncode == 1, done.stdout + done.stderr
    out = done.stdout
    assert "run 1/2" in out and "run 2/2" in out, out
    assert "cell 2: failed 1/2" in out, out
    assert "AssertionError: run 0 of this cell fails on purpose" in out, out
    assert "cell 3" not in out and "cell 4" not in out and "cell 5" not in out, out
    assert "total: 1 failing cell(s), 1 failure(s) in 2 notebook run(s)" in out, out
    assert (tmp_path / "runs.txt").read_text() == "2", "each run runs in the notebook's folder"


def test_bad_options_are_one_line_each(tmp_path):
    done = subprocess.run([sys.executable, str(SOAK), "--runs", "0", "--start-method", "sideways",
                           str(tmp_path / "missing.ipynb")], capture_output=True, text=True, timeout=60)
    assert done.returncode == 2
    assert done.stderr.splitlines() == [
        "soak_notebooks: --runs 0: give 1 or more",
        "soak_notebooks: --start-method 'sideways': use one of fork, forkserver, spawn",
        f"soak_notebooks: {tmp_path / 'missing.ipynb'}: no such notebook"]
