"""tests/tools/soak_notebooks.py: counts a cell that fails every second run, ignores skipped cells, and holds
an expected exception to its marker; ``--jobs 2`` runs two notebooks at once, never one notebook twice at
once, and the totals add up over both (two tiny notebooks in temporary folders, two runs each, fork)."""

import json
import os
import subprocess
import sys
from pathlib import Path

SOAK = Path(__file__).parent / "tools" / "soak_notebooks.py"


def _code(source: str) -> dict:
    return {"cell_type": "code", "execution_count": None, "metadata": {}, "outputs": [], "source": source}


FLAKY = """from pathlib import Path
counter = Path("runs.txt")
n = int(counter.read_text()) if counter.exists() else 0
counter.write_text(str(n + 1))
assert n % 2 == 1, f"run {n} of this cell fails on purpose"
"""


# A run holds its folder's "busy" file from its first cell to its last: a second run of the same notebook
# at the same time would fail its first cell (FileExistsError). Run k of notebook a and run k of notebook b
# wait for each other (up to 60 s): with --jobs 2 they meet at once, one at a time they never would.
HOLD = """import os, time
from pathlib import Path
open("busy", "x").close()
me, other = ("a", "b") if Path.cwd().name == "a" else ("b", "a")
k = len(list(Path("..").glob(me + "-*")))
Path(f"../{me}-{k}").touch()
deadline = time.monotonic() + 60
while not Path(f"../{other}-{k}").exists() and time.monotonic() < deadline:
    time.sleep(0.05)
together = Path(f"../{other}-{k}").exists()
x = 1"""
RELEASE = """os.remove("busy")
assert together, "the other notebook's run never ran beside this one"
assert x == 1"""


def _notebook(folder: Path, flaky: bool = True) -> Path:
    folder.mkdir()
    nb = {"cells": [{"cell_type": "markdown", "metadata": {}, "source": "# tiny"},
                    _code(HOLD),
                    _code(FLAKY if flaky else "y = 2"),
                    _code("# NBVAL_SKIP\nraise SystemError('a skipped cell is not run')"),
                    _code("# NBVAL_RAISES_EXCEPTION\nraise ValueError('expected')"),
                    _code(RELEASE)],
          "metadata": {"kernelspec": {"display_name": "Python 3", "language": "python", "name": "python3"}},
          "nbformat": 4, "nbformat_minor": 5}
    path = folder / "tiny.ipynb"
    path.write_text(json.dumps(nb), encoding="utf-8")
    return path


def test_a_cell_that_fails_every_second_run_is_counted_once_in_two(tmp_path):
    flaky, steady = _notebook(tmp_path / "a"), _notebook(tmp_path / "b", flaky=False)
    done = subprocess.run([sys.executable, str(SOAK), "--runs", "2", "--jobs", "2", str(flaky), str(steady)],
                          capture_output=True, text=True, timeout=180,
                          env={**os.environ, "PYTHONPATH": os.environ.get("PYTHONPATH", "")})
    assert done.returncode == 1, done.stdout + done.stderr
    out = done.stdout
    assert sorted(ln.split(":")[0] for ln in out.splitlines() if ln.startswith("run ")) == [
        f"run {r}/2 {p}" for r in (1, 2) for p in sorted([str(flaky), str(steady)])], out
    assert [ln.strip() for ln in out.splitlines() if ln.strip().startswith("cell ")] == ["cell 2: failed 1/2"], out
    assert "AssertionError: run 0 of this cell fails on purpose" in out, out
    assert "    -> cell 2: AssertionError: run 0 of this cell fails on purpose" in out, out  # said as it happened
    assert f"{steady}: 0 failing cell(s)" in out, out
    assert "total: 1 failing cell(s), 1 failure(s) in 4 notebook run(s), 1 of them with a failing cell" in out, out
    assert (tmp_path / "a" / "runs.txt").read_text() == "2", "each run runs in the notebook's folder"
    assert sorted(p.name for p in tmp_path.glob("[ab]-*")) == ["a-0", "a-1", "b-0", "b-1"]


def test_bad_options_are_one_line_each(tmp_path):
    done = subprocess.run([sys.executable, str(SOAK), "--runs", "0", "--start-method", "sideways",
                           str(tmp_path / "missing.ipynb")], capture_output=True, text=True, timeout=60)
    assert done.returncode == 2
    assert done.stderr.splitlines() == [
        "soak_notebooks: --runs 0: give 1 or more",
        "soak_notebooks: --start-method 'sideways': use one of fork, forkserver, spawn",
        f"soak_notebooks: {tmp_path / 'missing.ipynb'}: no such notebook"]


# The kernel writes its pid and starts an isolated run that would sleep two minutes; the run writes its own
# pid once it is going. The test SIGTERMs the soak while that run is in flight.
IN_FLIGHT = """import os
from pathlib import Path
import labutils
Path("kernel.pid").write_text(str(os.getpid()))
labutils.run_isolated(code=f"import os, time\\nopen({str(Path.cwd() / 'run.pid')!r}, 'w').write(str(os.getpid()))\\n"
                           "time.sleep(120)", timeout=300)"""


def test_sigterm_stops_every_kernel_and_removes_what_their_runs_left(tmp_path):
    import signal
    import time

    import psutil

    folder, tmp = tmp_path / "nb", tmp_path / "tmp"
    folder.mkdir()
    tmp.mkdir()
    nb = {"cells": [_code(IN_FLIGHT)], "metadata": {"kernelspec": {"display_name": "Python 3",
          "language": "python", "name": "python3"}}, "nbformat": 4, "nbformat_minor": 5}
    path = folder / "in_flight.ipynb"
    path.write_text(json.dumps(nb), encoding="utf-8")
    soak = subprocess.Popen([sys.executable, str(SOAK), "--runs", "1", str(path)], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, env={**os.environ, "TMPDIR": str(tmp)})
    try:
        deadline = time.monotonic() + 120
        while not (folder / "run.pid").exists() and time.monotonic() < deadline and soak.poll() is None:
            time.sleep(0.2)
        assert (folder / "run.pid").exists(), soak.communicate(timeout=60)
        kernel = psutil.Process(int((folder / "kernel.pid").read_text()))
        run = psutil.Process(int((folder / "run.pid").read_text()))
        assert list(tmp.glob("labsoak-*/in_flight-*/labutils-run-*"))  # the run's folder, in the run's own TMPDIR
        soak.send_signal(signal.SIGTERM)
        out, err = soak.communicate(timeout=90)
    finally:
        if soak.poll() is None:
            soak.kill()
            soak.wait()
    assert soak.returncode == 130, out + err
    assert "stopped by SIGTERM; every kernel stopped" in out, out + err
    assert "0 of 1 notebook run(s) ended before the stop" in out, out
    gone, alive = psutil.wait_procs([kernel, run], timeout=10)
    assert not alive, alive  # psutil.Process compares the start time too: a reused pid is not "alive" here
    assert list(tmp.iterdir()) == [], list(tmp.rglob("*"))  # the soak's folder went with it, runs' and all


LEAVES = """import os, tempfile
fd, name = tempfile.mkstemp(prefix="forgotten-")  # in the run's own temporary folder
os.close(fd)
assert os.path.dirname(name) != "/tmp", name"""


def test_a_notebook_that_leaves_a_file_in_its_temp_folder_fails_and_the_file_goes(tmp_path):
    folder, tmp = tmp_path / "nb", tmp_path / "tmp"
    folder.mkdir()
    tmp.mkdir()
    for name, source in (("leaves", LEAVES), ("tidy", "x = 1")):
        nb = {"cells": [_code(source)], "metadata": {"kernelspec": {"display_name": "Python 3",
              "language": "python", "name": "python3"}}, "nbformat": 4, "nbformat_minor": 5}
        (folder / f"{name}.ipynb").write_text(json.dumps(nb), encoding="utf-8")
    done = subprocess.run([sys.executable, str(SOAK), "--runs", "1", str(folder / "leaves.ipynb"),
                           str(folder / "tidy.ipynb")], capture_output=True, text=True, timeout=120,
                          env={**os.environ, "TMPDIR": str(tmp)})
    assert done.returncode == 1, done.stdout + done.stderr
    assert "-> after the last cell: left in its temporary folder: forgotten-" in done.stdout, done.stdout
    assert f"{folder / 'tidy.ipynb'}: 0 failing cell(s)" in done.stdout, done.stdout
    assert list(tmp.iterdir()) == [], list(tmp.rglob("*"))
