"""`python -m labutils tour` and `python -m labutils run`."""

import json
import os
import subprocess
import sys

from labutils.lab.tour import SCENARIOS, RunOptions, get_scenario

PY = sys.executable
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def labutils(*args, timeout=600):
    return subprocess.run([PY, "-m", "labutils", *args], capture_output=True, text=True, timeout=timeout,
                          cwd=ROOT)


def test_tour_only_prints_the_table_and_succeeds():
    done = labutils("tour", "--only", "ok,worker_exception")
    assert done.returncode == 0, done.stdout + done.stderr
    lines = done.stdout.splitlines()
    assert lines[0].split()[0] == "scenario" and "seconds" in lines[0]
    row = next(ln for ln in lines if ln.startswith("worker_exception"))
    assert row.split()[1] == "worker_exception" and row.split()[2] == "ok"
    assert "2/4" in done.stderr and "4/4" in done.stderr  # the progress bar


def test_tour_json():
    done = labutils("tour", "--only", "ok", "--json", "--quiet")
    assert done.returncode == 0, done.stderr
    data = json.loads(done.stdout)
    assert data["passed"] is True
    assert data["scenarios"][0]["scenario"] == "ok" and data["scenarios"][0]["fixed_outcome"] == "ok"
    assert done.stderr == ""


def test_tour_unknown_scenario_exits_2():
    done = labutils("tour", "--only", "ok,no_such_thing")
    assert done.returncode == 2
    assert "no_such_thing" in done.stderr and "worker_exception" in done.stderr  # lists the choices


def test_tour_list():
    done = labutils("tour", "--list")
    assert done.returncode == 0
    assert all(name in done.stdout for name in SCENARIOS)


def test_run_unknown_scenario_exits_2():
    done = labutils("run", "no_such_thing")
    assert done.returncode == 2 and "unknown scenario" in done.stderr
    assert "Traceback" not in done.stderr


def test_run_one_scenario_prints_the_evidence():
    done = labutils("run", "worker_exception")
    assert done.returncode == 0, done.stdout + done.stderr
    assert "cause: worker_exception" in done.stdout
    assert "KeyError" in done.stdout and "notebooks/01_read_the_error.ipynb" in done.stdout
    assert "as expected" in done.stdout


def test_run_options_as_cli_args():
    opts = RunOptions(timeout=30, memory_budget="400M", nofile=128, start_method="spawn", notebook_main=True)
    assert opts.cli_args() == ["--timeout", "30", "--memory-budget", "400M", "--nofile", "128",
                               "--start-method", "spawn", "--stdin-main"]
    assert get_scenario("oom_killed").broken_options.memory_budget == "800M"
