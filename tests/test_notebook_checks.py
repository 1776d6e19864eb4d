"""A check of the checks: a lesson whose demonstration stops demonstrating must make its notebook fail.

Each test executes a copy of one notebook in a real Jupyter kernel (nbclient) with one cell's source
replaced, and only the cells that lesson needs (its setup, the runs its check reads, the check itself). It
then requires the run to stop with an ``AssertionError`` raised by the expected assertion of the expected
cell: a ``NameError`` from a skipped cell, a failing setup or any other cell would not count, and neither
would a notebook that passes. Three ways of disabling a demonstration (issue 20, item 4):

* 00: the broken script made healthy (no truncated record): the Verify cell must refuse ``native_crash``;
* 01: the crash moved to another cause (the decoder calls ``abort()`` instead of reading address 0): the
  cell that teaches the three places of a segfault must refuse a worker that died of SIGABRT;
* 04: the fix made a no-op (Fix A keeps the per-worker cache): the Verify cell must refuse a "fixed" run
  that the memory limit killed.

The kernel inherits ``LABUTILS_START_METHOD`` from the pytest pass (``--lab-start-method``).
"""

from __future__ import annotations

import os
import re
from pathlib import Path

import pytest

nbformat = pytest.importorskip("nbformat")
nbclient = pytest.importorskip("nbclient")
from nbclient.exceptions import CellExecutionError  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
NOTEBOOKS = ROOT / "notebooks"


def _cell(nb, starts: str) -> int:
    """Index of the one code cell whose source starts with ``starts``."""
    hits = [i for i, c in enumerate(nb.cells) if c.cell_type == "code" and c.source.lstrip().startswith(starts)]
    assert len(hits) == 1, f"{starts!r} matches cells {hits}: the notebook changed, update this test"
    return hits[0]


def run_disabled(name: str, keep: list, replace: dict, timeout: int = 300) -> CellExecutionError:
    """Execute the cells of notebook ``name`` that start with the texts in ``keep`` (in the notebook's order),
    after replacing (old, new) text pairs in ``replace[start]``; return the error that stopped it."""
    nb = nbformat.read(NOTEBOOKS / name, as_version=4)
    chosen = sorted(_cell(nb, k) for k in keep)
    for start, pairs in replace.items():
        cell = nb.cells[_cell(nb, start)]
        for old, new in pairs:
            assert old in cell.source, f"{old!r} is not in the cell {start!r}: update this test"
            cell.source = cell.source.replace(old, new)
    nb.cells = [nb.cells[i] for i in chosen]
    env_path = os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH", "")) if p)
    old_path = os.environ.get("PYTHONPATH")
    os.environ["PYTHONPATH"] = env_path
    try:
        client = nbclient.NotebookClient(nb, timeout=timeout, kernel_name="python3", allow_errors=False,
                                         resources={"metadata": {"path": str(NOTEBOOKS)}})
        with pytest.raises(CellExecutionError) as info:
            client.execute()
    finally:
        if old_path is None:
            os.environ.pop("PYTHONPATH", None)
        else:
            os.environ["PYTHONPATH"] = old_path
    return info.value


def require_failure(err: CellExecutionError, cell_start: str, assertion: str) -> None:
    """The notebook stopped in the cell that starts with ``cell_start``, on an AssertionError from the line
    holding ``assertion``."""
    text = re.sub(r"\x1b\[[0-9;]*m", "", str(err))  # the kernel's traceback is coloured
    assert err.ename == "AssertionError", f"stopped by {err.ename}, not by a check: {text[-2000:]}"
    source = text.split("------------------", 2)[1] if "------------------" in text else text
    assert source.strip().startswith(cell_start), f"stopped in another cell:\n{source[:400]}"
    failing = [ln for ln in text.splitlines() if re.match(r"\s*-+>\s*\d+ ", ln)]  # IPython's "---> 16 ..."
    assert failing and assertion in failing[-1], f"stopped on another line: {failing}"


def test_00_fails_when_the_broken_script_is_healthy():
    err = run_disabled(
        "00_start_here.ipynb",
        keep=["%load_ext labutils", "%%isolate -o broken", 'assert broken.cause == "native_crash"'],
        replace={"%%isolate -o broken": [('RECORDS[1] = b""  # a truncated record', "")]})
    require_failure(err, 'assert broken.cause == "native_crash"', 'assert broken.cause == "native_crash"')


def test_01_fails_when_the_crash_has_another_cause():
    err = run_disabled(
        "01_read_the_error.ipynb",
        keep=["%load_ext labutils", "%%isolate -o broken_native",
              'assert broken_native.cause == "native_crash"'],
        replace={"%%isolate -o broken_native": [
            ("ctypes.string_at(0)  # what the C code does: read address 0 -> SIGSEGV",
             "__import__('os').abort()  # a failed assert() in C instead: SIGABRT")]})
    require_failure(err, 'assert broken_native.cause == "native_crash"', "w.signal == signal.SIGSEGV")


def test_04_fails_when_the_fix_is_a_no_op():
    err = run_disabled(
        "04_memory_and_oom.ipynb",
        keep=["%load_ext labutils", "%%isolate -o oom ", "limit = oom.memory_limit", "record = limit.get",
              "%%isolate -o oom_fixed", "# A. The OOM kill: a worker"],
        replace={"%%isolate -o oom_fixed": [
            ("    def __init__(self, n=2000):\n        self.n = n\n",
             "    def __init__(self, n=2000):\n        self.n = n\n        self._cache = {}\n"),
            ("        return idx, torch.full((3, 224, 224), float(idx))",
             "        return self._cache.setdefault(idx, (idx, torch.full((3, 224, 224), float(idx))))")]})
    require_failure(err, "# A. The OOM kill: a worker", "assert oom_fixed.ok")
