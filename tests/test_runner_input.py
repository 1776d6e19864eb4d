"""Bad input to the runner: one clear line each, naming what the user typed; odd but valid scripts run."""

from __future__ import annotations

import os
import resource
import subprocess
import sys
import textwrap

import pytest

from labutils import IsolationError, run_isolated

IPython = pytest.importorskip("IPython")


@pytest.fixture(scope="module")
def shell():
    from IPython.core.interactiveshell import InteractiveShell

    ip = InteractiveShell.instance()
    ip.run_line_magic("load_ext", "labutils")
    return ip


def _hard_nofile() -> int:
    hard = resource.getrlimit(resource.RLIMIT_NOFILE)[1]
    if hard == resource.RLIM_INFINITY:
        pytest.skip("no hard limit on open files here")
    return hard


def test_nofile_above_the_hard_limit_is_refused_in_the_parent():
    hard = _hard_nofile()
    with pytest.raises(IsolationError, match=f"hard limit of {hard}") as info:
        run_isolated("pass", nofile=hard + 1)
    assert "\n" not in str(info.value) and info.value.argument == "nofile"


def test_nofile_at_the_hard_limit_is_used():
    hard = _hard_nofile()
    r = run_isolated("import resource, labutils\nlabutils.emit(n=resource.getrlimit(resource.RLIMIT_NOFILE))",
                     nofile=hard)
    assert r.ok and r.values["n"] == [hard, hard]


@pytest.mark.parametrize("budget", [0, "1k", "63M"])
def test_tiny_memory_budget_is_refused_with_the_reason(budget):
    with pytest.raises(IsolationError, match="below the lab's floor of 64.0 MiB") as info:
        run_isolated("pass", memory_budget=budget)
    assert info.value.argument == "memory_budget"


def test_memory_budget_at_the_floor_runs():
    r = run_isolated("import labutils\nlabutils.emit(x=1)", memory_budget="64M")
    assert r.ok and r.values == {"x": 1}, r


@pytest.mark.parametrize("line, words", [
    ("--memory-budget lots", r"^%%isolate: --memory-budget lots: expected a number"),
    ("--memory-budget 1k", r"^%%isolate: --memory-budget 1k: is 1.0 KiB, below"),
    ("--shm-size 0", r"^%%isolate: --shm-size 0: is below 64 KiB"),
    ("--nofile 99999999", r"^%%isolate: --nofile 99999999: is above this machine's hard limit"),
    # the table's check, once the magic is built from spec.OPTIONS; argparse's "invalid choice" before that
    ("--memory-enforcement cgroup", "use one of auto, kernel, watchdog|invalid choice"),
])
def test_magic_names_the_option_as_typed(shell, line, words):
    from IPython.core.error import UsageError

    with pytest.raises(UsageError, match=words) as info:
        shell.run_cell_magic("isolate", line, "pass\n")
    assert "\n" not in str(info.value) and "memory_budget" not in str(info.value)


def test_python_argument_names_stay_in_the_python_message():
    with pytest.raises(IsolationError, match=r"^shm_size=0: is below 64 KiB") as info:
        run_isolated("pass", shm_size=0)
    assert info.value.for_option("--shm-size") == "--shm-size 0: is below 64 KiB; give e.g. '8M'"


BOM_SCRIPT = "\ufeffimport labutils\nlabutils.emit(ok='bom')\n".encode("utf-8")
LATIN1_SCRIPT = "# -*- coding: latin-1 -*-\nimport labutils\nlabutils.emit(word='caf\xe9')\n".encode("latin-1")


@pytest.mark.parametrize("notebook_main", [False, True])
@pytest.mark.parametrize("data, expected", [(BOM_SCRIPT, {"ok": "bom"}), (LATIN1_SCRIPT, {"word": "caf\xe9"})])
def test_bom_and_coding_cookie_scripts_run_as_python_runs_them(tmp_path, data, expected, notebook_main):
    script = tmp_path / "odd.py"
    script.write_bytes(data)
    r = run_isolated(file=script, notebook_main=notebook_main)
    assert r.ok, r.stderr
    assert r.values == expected


def test_a_cell_with_a_coding_cookie_keeps_its_text():
    code = textwrap.dedent("""\
        # -*- coding: latin-1 -*-
        import labutils
        labutils.emit(word='caf\xe9', n=len('caf\xe9'))
    """)
    r = run_isolated(code)
    assert r.ok, r.stderr
    assert r.values == {"word": "caf\xe9", "n": 4}


def test_memory_enforcement_bad_value_is_one_line(monkeypatch):
    with pytest.raises(IsolationError, match="memory_enforcement='cgroup': use one of auto, kernel, watchdog"):
        run_isolated("pass", memory_budget="100M", memory_enforcement="cgroup")
    monkeypatch.setenv("LABUTILS_MEMORY_ENFORCEMENT", "always")
    with pytest.raises(IsolationError, match="LABUTILS_MEMORY_ENFORCEMENT='always'"):
        run_isolated("pass", memory_budget="100M")


BAD = [
    (dict(timeout=float("inf")), "timeout", "finite number of seconds"),
    (dict(timeout=float("nan")), "timeout", "finite number of seconds"),
    (dict(stall=float("inf")), "stall", "finite number of seconds"),
    (dict(sample_interval=0), "sample_interval", "at least 0.01"),
    (dict(sample_interval=-1), "sample_interval", "at least 0.01"),
    (dict(sample_interval=None), "sample_interval", "at least 0.01"),
    (dict(sample_interval="x"), "sample_interval", "at least 0.01"),
    (dict(cwd="/nope-no-such-dir"), "cwd", "not an existing directory"),
    (dict(env={"A=B": "x"}), "env", "without '=' or NUL"),
    (dict(env={"A": "x\0y"}), "env", "cannot hold a NUL"),
    (dict(env={"A": None}), "env", "must be a str"),
    (dict(env={"LABUTILS_START_METHOD": "bogus"}), "env", "use one of fork, spawn, forkserver"),
    (dict(python="/nope/python"), "python", "not an executable Python interpreter"),
    (dict(argv="--epochs 3"), "argv", "give a list of strings"),
    (dict(argv=[3]), "argv", "every item must be a str"),
    (dict(memory_detail="yes"), "memory_detail", "True or False"),
]


@pytest.mark.parametrize("kwargs, argument, words", BAD, ids=[f"{a}-{i}" for i, (_k, a, _w) in enumerate(BAD)])
def test_bad_input_is_one_line_naming_the_argument_and_leaves_nothing(kwargs, argument, words):

    import psutil

    me = psutil.Process()
    fds, kids = len(os.listdir("/proc/self/fd")), {p.pid for p in me.children()}
    with pytest.raises(IsolationError) as info:
        run_isolated("print('never runs')", **kwargs)
    msg = str(info.value)
    assert words in msg and msg.startswith(argument + "=") and "\n" not in msg, msg
    assert info.value.argument == argument
    assert len(os.listdir("/proc/self/fd")) == fds  # nothing taken before the check
    assert {p.pid for p in me.children()} <= kids


def test_a_relative_file_is_found_in_cwd(tmp_path):
    (tmp_path / "train.py").write_text("import labutils, os\nlabutils.emit(cwd=os.getcwd())\n")
    r = run_isolated(file="train.py", cwd=tmp_path, timeout=60)
    assert r.ok and r.values == {"cwd": str(tmp_path)}, r.stderr
    with pytest.raises(IsolationError, match="is a directory"):
        run_isolated(file=tmp_path)


def test_run_isolated_keywords_are_the_specs():
    """RunSpec.build checks the same keywords, with the same defaults, as run_isolated offers."""
    import inspect

    from labutils.runner.spec import KEYWORDS

    params = inspect.signature(run_isolated).parameters
    assert {k: p.default for k, p in params.items() if k != "code"} == KEYWORDS


def test_diagnose_refuses_an_infinite_timeout_in_one_line(tmp_path):
    script = tmp_path / "train.py"
    script.write_text("print('hi')\n")
    p = subprocess.run([sys.executable, "-m", "labutils", "diagnose", "--timeout", "inf", str(script)],
                       capture_output=True, text=True, timeout=60)
    assert p.returncode == 2 and "timeout" in p.stderr and "Traceback" not in p.stderr, p.stderr
    assert "hi" not in p.stdout  # refused before anything ran
