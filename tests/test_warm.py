"""The warm launcher: which runs start from the template, and that a warm run looks like a fresh process.

tests/test_scenarios.py checks that every scenario gets the same diagnosis warm and cold.
"""

import os
import subprocess
import sys
import time

import psutil
import pytest

from labutils.runner import warm as _warm
from labutils.runner.isolate import IsolationError, run_isolated

pytestmark = pytest.mark.skipif(not _warm.supported(), reason="the warm launcher needs Linux with fork and pidfds")

PROBE = """
import sys
TORCH_LOADED = "torch" in sys.modules  # before this cell's own import: it came from the template
import json, os, random, sys, multiprocessing
import numpy as np
import torch
import labutils
labutils.emit(
    argv0=sys.argv[0], cwd=os.getcwd(), fds=sorted(int(f) for f in os.listdir("/proc/self/fd")),
    authkey=multiprocessing.current_process().authkey.hex(), numpy=int(np.random.randint(0, 2**31)),
    sid=os.getsid(0), pid=os.getpid(), marker=os.environ.get("LABUTILS_RUN_DIR"),
    torch_loaded=TORCH_LOADED, torch_seed=torch.initial_seed(), torch_rand=torch.rand(1).item(),
    random=random.random(),
)
"""


def test_warm_runs_share_one_template_and_each_looks_fresh(tmp_path):
    first = run_isolated(PROBE, cwd=tmp_path)
    template = _warm.template_pid()
    second = run_isolated(PROBE, cwd=tmp_path)
    assert first.ok and second.ok, (first.stderr, second.stderr)
    assert first.launcher == second.launcher == {"kind": "warm", "why_cold": None, "tracking": "pidfd"}
    assert template is not None and _warm.template_pid() == template  # the second run reused it
    a, b = first.values, second.values
    assert a["torch_loaded"]  # it came from the template, which imported torch
    assert a["argv0"].endswith("lab_cell.py") and a["cwd"] == str(tmp_path)
    assert a["sid"] == a["pid"]  # its own session, as the cold path's start_new_session gives
    assert a["marker"] and a["marker"] != b["marker"]  # each run's own LABUTILS_RUN_DIR
    assert a["authkey"] != b["authkey"] and a["numpy"] != b["numpy"]  # a new identity, fresh seeds
    # torch seeded its default generator once, at `import torch` in the template: each warm run reseeds it
    # from the OS, as a cold run's own import does (same seed in both meant the same shuffles, worker seeds)
    assert a["torch_seed"] != b["torch_seed"] and a["torch_rand"] != b["torch_rand"]
    assert a["random"] != b["random"]  # CPython reseeds `random` at fork by itself
    assert len(a["fds"]) <= 6, a["fds"]  # 0-2 and what the probe opened: nothing of the template's


def test_cold_where_a_fork_of_the_template_would_differ():
    env_run = run_isolated("print('hi')", env={"OMP_NUM_THREADS": "1"})
    assert env_run.ok and env_run.launcher["kind"] == "cold"
    assert "before torch is imported" in env_run.launcher["why_cold"]
    detail = run_isolated("print('hi')", memory_detail=True)
    assert detail.launcher["kind"] == "cold" and "USS" in detail.launcher["why_cold"]
    asked = run_isolated("print('hi')", launcher="cold")
    assert asked.launcher["kind"] == "cold" and asked.launcher["why_cold"] == "the cold launcher was asked for"
    with pytest.raises(IsolationError, match="launcher='warm' is not possible"):
        run_isolated("print('hi')", launcher="warm", env={"X": "1"})
    session = run_isolated("import os\nif os.fork() == 0:\n    os.setsid()\n    os._exit(0)\nos.wait()\n")
    assert session.ok and session.launcher["kind"] == "cold" and "os.setsid" in session.launcher["why_cold"]


def test_a_warm_run_ends_with_the_interpreters_teardown(tmp_path):
    """The exit handlers of the template's imports and the script's run in python's order (torch's and
    multiprocessing's come with the script's import), the script's globals are alive in its own handler,
    and a destructor run by the teardown itself (an object hung on another module) still runs."""
    cell = ("import atexit, json\nimport torch\natexit.register(lambda: print('handler sees', json.dumps(1)))\n"
            "class D:\n    def __del__(self):\n        print('teardown ran', flush=True)\n"
            "torch._labutils_probe = D()\nprint('main done')\n")
    r = run_isolated(cell, cwd=tmp_path, launcher="warm")
    assert r.ok and r.launcher["kind"] == "warm", r.stderr
    assert r.stdout.splitlines() == ["main done", "handler sees 1", "teardown ran"], r.stdout
    assert r.stderr == "", r.stderr


def test_a_bad_launcher_setting_is_one_clear_error(monkeypatch):
    monkeypatch.setenv("LABUTILS_LAUNCHER", "tepid")
    with pytest.raises(IsolationError, match="use one of auto, warm, cold"):
        run_isolated("print('hi')")


def test_a_changed_environment_gets_a_new_template(monkeypatch):
    run_isolated("print('hi')")
    old = _warm.template_pid()
    monkeypatch.setenv("CRASHLAB_TEST_SOMETHING_NEW", "1")  # could change what an import does: a new template
    r = run_isolated("import os, labutils\nlabutils.emit(v=os.environ.get('CRASHLAB_TEST_SOMETHING_NEW'))")
    assert r.ok and r.launcher["kind"] == "warm" and r.values == {"v": "1"}
    assert _warm.template_pid() not in (None, old)
    assert not psutil.pid_exists(old) or psutil.Process(old).status() == psutil.STATUS_ZOMBIE


ORPHAN = """
import os, sys, time, labutils
r, w = os.pipe()
if os.fork() == 0:          # a child that leaves an orphan behind: its grandchild outlives it
    if os.fork() == 0:
        os.setpgid(0, 0)    # its own process group (as a shell job would): only the session still says whose
        os.write(w, str(os.getpid()).encode())
        time.sleep(120)
        os._exit(0)
    os._exit(0)
pid = int(os.read(r, 32))
labutils.emit(orphan=pid)
"""


def test_an_orphan_in_its_own_group_is_still_the_runs_and_is_killed(no_leaks):
    r = run_isolated(ORPHAN, timeout=60)
    assert r.ok and r.launcher["kind"] == "warm", r.stderr
    orphan = r.values["orphan"]
    deadline = time.monotonic() + 5
    while psutil.pid_exists(orphan) and psutil.Process(orphan).status() != psutil.STATUS_ZOMBIE:
        assert time.monotonic() < deadline, f"the run's orphan {orphan} outlived the run"
        time.sleep(0.05)


def test_template_ends_with_its_process(tmp_path):
    """A runner process that exits takes its template with it (end of file on the socket)."""
    import subprocess

    code = ("import labutils, sys\nfrom labutils.runner import warm as _warm\nr = labutils.run_isolated('print(1)')\n"
            "print(_warm.template_pid(), r.launcher['kind'])\nsys.stdout.flush()\nimport os\nos._exit(0)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120,
                         cwd=tmp_path, env={**os.environ, "LABUTILS_LAUNCHER": "auto"})
    pid, kind = out.stdout.split()
    assert kind == "warm"
    deadline = time.monotonic() + 10
    while psutil.pid_exists(int(pid)) and psutil.Process(int(pid)).status() != psutil.STATUS_ZOMBIE:
        assert time.monotonic() < deadline, "the template outlived its runner"
        time.sleep(0.1)


@pytest.mark.parametrize("launcher", ["cold", "auto"])
def test_a_run_dies_with_its_runner(launcher, tmp_path):
    """A runner killed with SIGKILL (a killed `diagnose`, a crashed kernel) leaves no run behind."""
    import signal
    import subprocess

    pidfile = tmp_path / "pid"
    cell = f"import os, time\nopen({str(pidfile)!r}, 'w').write(str(os.getpid()))\ntime.sleep(60)\n"
    script = tmp_path / "runner.py"
    script.write_text(f"import labutils\nlabutils.run_isolated({cell!r}, launcher={launcher!r}, timeout=90)\n")
    # its run directory goes under tmp_path: a runner killed with SIGKILL cannot remove it itself
    runner = subprocess.Popen([sys.executable, str(script)], env={**os.environ, "TMPDIR": str(tmp_path)})
    try:
        deadline = time.monotonic() + 60
        while not (pidfile.exists() and pidfile.read_text()):
            assert time.monotonic() < deadline and runner.poll() is None, "the run did not start"
            time.sleep(0.1)
        run_pid = int(pidfile.read_text())
        assert psutil.pid_exists(run_pid)
    finally:
        runner.send_signal(signal.SIGKILL)
        runner.wait()
    deadline = time.monotonic() + 10
    while psutil.pid_exists(run_pid) and psutil.Process(run_pid).status() != psutil.STATUS_ZOMBIE:
        assert time.monotonic() < deadline, f"run {run_pid} outlived its killed runner ({launcher})"
        time.sleep(0.1)
    # what it left on disk goes with the next runner's clean-up: its run directory, and the temporary folder
    # it had in /tmp (tmp_path is too deep for RUN_DIR/tmp), by the dead runner's identity in each
    from labutils.runner import ownership

    left = [p.name for p in tmp_path.iterdir() if p.name.startswith("labutils-run-")]
    assert len(left) == 1, left
    short = ownership.run_temp_dir(str(tmp_path / left[0]))
    done = ownership.clean_after_dead_runners(str(tmp_path), force=True)
    assert [os.path.basename(d) for d in done["run_dirs"]] == left, done
    assert short is None or (short in done["tmp_dirs"] and not os.path.lexists(short)), (short, done)


def test_a_warm_run_imports_no_module_a_fresh_python_would_not(tmp_path):
    # numpy 2 loads numpy.random on first use, and `import torch` does not use it: the reseeding of a warm
    # run must not load it either (it did, for every run: 14 ms, and a module python would not have)
    probe = "import sys\nimport torch\nprint(sorted(m for m in ('numpy', 'numpy.random') if m in sys.modules))\n"
    plain = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, cwd=tmp_path, check=True)
    r = run_isolated(probe, cwd=tmp_path, launcher="warm")
    assert r.ok and r.launcher["kind"] == "warm", r.stderr
    assert r.stdout == plain.stdout, (r.stdout, plain.stdout)
