"""`python -m labutils tour` and `python -m labutils run`.

One tour goes through the real command line (a fresh process: its table on stdout, its progress bar on
stderr, its exit status); the JSON tour and `run` call the commands' entry points in this process, whose
runs start from this process's warm template (`python -m labutils` dispatching to them is tested in
test_diagnose_cli)."""

import json
import os
import subprocess
import sys

from labutils.commands.tour import run_main, tour_main
from labutils.scenarios import SCENARIOS, RunOptions, get_scenario

PY = sys.executable
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def labutils(*args, timeout=600):
    return subprocess.run([PY, "-m", "labutils", *args], capture_output=True, text=True, timeout=timeout,
                          cwd=ROOT)


def test_tour_only_prints_the_table_and_succeeds():
    done = labutils("tour", "--only", "worker_exception")
    assert done.returncode == 0, done.stdout + done.stderr
    lines = done.stdout.splitlines()
    assert lines[0].split()[0] == "scenario" and "seconds" in lines[0]
    row = next(ln for ln in lines if ln.startswith("worker_exception"))
    assert row.split()[1] == "worker_exception" and row.split()[2] == "ok"
    assert "1 of 1 scenarios as expected" in done.stdout
    assert "1/2" in done.stderr and "2/2" in done.stderr  # the progress bar: broken, then fixed


def test_tour_json(capsys):
    assert tour_main(["--only", "ok", "--json", "--quiet"]) == 0
    out, err = capsys.readouterr()
    data = json.loads(out)
    assert data["passed"] is True
    assert data["scenarios"][0]["scenario"] == "ok" and data["scenarios"][0]["fixed_outcome"] == "ok"
    assert err == ""


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


def test_run_one_scenario_prints_the_evidence(capsys):
    rc = run_main(["worker_exception"])
    out, err = capsys.readouterr()
    assert rc == 0, out + err
    assert "cause: worker_exception" in out
    assert "KeyError" in out and "notebooks/01_read_the_error.ipynb" in out
    assert "as expected" in out


def test_run_options_as_cli_args():
    opts = RunOptions(timeout=30, memory_budget="400M", nofile=128, start_method="spawn", notebook_main=True)
    assert opts.cli_args() == ["--timeout", "30", "--memory-budget", "400M", "--nofile", "128",
                               "--start-method", "spawn", "--stdin-main"]
    assert get_scenario("oom_killed").broken_options.memory_budget == "800M"
