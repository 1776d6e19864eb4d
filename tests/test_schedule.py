"""The suite's plugin and scheduler: one pass or the matrix, its leftover check, and the xdist groups."""

import json
import os
import shutil
import tempfile

from labsuite.xdist_schedule import DURATIONS, load_durations, split_scope

TESTS = os.path.dirname(os.path.abspath(__file__))  # labsuite, the plugin under test
ROOT = os.path.join(TESTS, "..")


def test_a_notebooks_cells_stay_in_one_group_per_pass():
    assert split_scope("notebooks/07_x.ipynb::Cell 0", ("forkserver",)) == "notebooks/07_x.ipynb"
    assert (
        split_scope("notebooks/07_x.ipynb[forkserver]::Cell 12", ("forkserver",)) == "notebooks/07_x.ipynb[forkserver]"
    )


def test_the_extra_start_method_pass_of_a_test_file_is_its_own_group():
    methods = ("forkserver",)
    assert split_scope("tests/test_s.py::test_a[forkserver-hang]", methods) == "tests/test_s.py::forkserver"
    assert split_scope("tests/test_s.py::test_a[forkserver]", methods) == "tests/test_s.py::forkserver"
    assert split_scope("tests/test_s.py::test_a[default-hang]", methods) == "tests/test_s.py"
    assert split_scope("tests/test_s.py::test_a[spawn]", methods) == "tests/test_s.py"  # a test's own parameter
    assert split_scope("tests/test_s.py::test_b", methods) == "tests/test_s.py"


def test_the_durations_file_names_groups_that_exist():
    durations = load_durations(ROOT)
    assert len(durations) > 20, "tests/durations.json is missing or empty: python tests/tools/update_durations.py"
    with open(os.path.join(ROOT, DURATIONS), encoding="utf-8") as fh:
        assert json.load(fh) == {k: v for k, v in durations.items()}
    for group in durations:
        path = group.split("::")[0].split("[")[0]
        assert os.path.isfile(os.path.join(ROOT, path)), f"{group}: no such file (refresh tests/durations.json)"


# --------------------------------------------------------------------------- the plugin's passes
TINY_NOTEBOOK = {
    "cells": [{"cell_type": "code", "execution_count": None, "id": "a", "metadata": {}, "outputs": [],
               "source": "x = 1"},
              {"cell_type": "code", "execution_count": None, "id": "b", "metadata": {}, "outputs": [],
               "source": "assert x == 1"}],
    "metadata": {"kernelspec": {"display_name": "Python 3", "language": "python", "name": "python3"}},
    "nbformat": 4, "nbformat_minor": 5,
}


def _collected(pytester, *args) -> list:
    result = pytester.runpytest("-p", "labsuite.pytest_plugin", "-p", "no:cacheprovider", "--nbval-lax",
                                "--collect-only", "-q", *args)
    assert result.ret == 0, result.stdout.str() + result.stderr.str()
    return [ln for ln in result.stdout.lines if "::" in ln]


def test_plain_pytest_is_one_pass_and_the_matrix_adds_forkserver_and_spawn(pytester, monkeypatch):
    """One notebook of 2 cells, one start-method test and one plain test: 4 items once, the matrix adds
    the notebook and the start-method test under forkserver and spawn (4 + 2 * 3 = 10)."""
    monkeypatch.delenv("LABUTILS_START_METHOD", raising=False)
    pytester.makefile(".ipynb", nb=json.dumps(TINY_NOTEBOOK))
    pytester.makepyfile(test_x='''
        def test_m(lab_start_method):
            pass

        def test_plain():
            pass
    ''')
    plain = _collected(pytester)
    assert len(plain) == 4, plain
    assert not [n for n in plain if "forkserver" in n or "spawn" in n], plain
    matrix = _collected(pytester, "--lab-matrix")
    assert len(matrix) == 10, matrix
    for method in ("forkserver", "spawn"):
        assert sum(f"nb.ipynb[{method}]::" in n for n in matrix) == 2, matrix
        assert f"test_x.py::test_m[{method}]" in matrix, matrix
    assert "test_x.py::test_m[default]" in matrix and "test_x.py::test_plain" in matrix
    # one method's pass, as before; a matrix method equal to the main one is not run twice
    assert len(_collected(pytester, "--lab-also-start-method", "forkserver")) == 7
    assert len(_collected(pytester, "--lab-matrix", "--lab-start-method", "spawn")) == 7
    assert len(_collected(pytester, "--lab-also-start-method", "none")) == 4


def test_the_repository_asks_for_one_pass_and_ci_for_the_matrix():
    import tomllib

    with open(os.path.join(ROOT, "pyproject.toml"), "rb") as fh:
        ini = tomllib.load(fh)["tool"]["pytest"]["ini_options"]
    assert not ini.get("lab_also_start_methods"), "plain pytest runs each notebook once (issue 16)"
    with open(os.path.join(ROOT, ".ci", "run"), encoding="utf-8") as fh:
        ci = fh.read()
    assert "pytest --lab-matrix" in ci and "pip install -r requirements.txt" in ci


# --------------------------------------------------------------------------- the session's leftovers
LEAKER = """
import multiprocessing, os, signal, sys, tempfile
lock = multiprocessing.get_context("spawn").Lock()  # a named semaphore, registered with a resource tracker
print("sem." + lock._semlock.name.lstrip("/"), flush=True)
print(tempfile.mkdtemp(prefix="lab-leak-test-"), flush=True)  # a temporary folder nobody removes
os.killpg(0, signal.SIGKILL)  # the process and its resource tracker die: nobody unlinks the name
"""


def _leak_test(strip_env: bool) -> str:
    return f'''
        import os, subprocess, sys

        def test_leak():
            env = dict(os.environ)
            if {strip_env!r}:  # a neighbour, simulated: started without the session's variables, as an outsider is
                env.pop("LABUTILS_SESSION_LEDGER", None)
                env["PYTHONPATH"] = os.pathsep.join(p for p in env.get("PYTHONPATH", "").split(os.pathsep)
                                                    if not p.endswith("_site"))
            done = subprocess.run([sys.executable, "-c", {LEAKER!r}], env=env, capture_output=True, text=True,
                                  start_new_session=True)
            with open("leaked.txt", "w") as fh:
                fh.write(done.stdout.strip())
    '''


def _run_leaker(pytester, monkeypatch, strip_env: bool):
    monkeypatch.delenv("LABUTILS_SESSION_LEDGER", raising=False)  # this session's own check stays outside
    monkeypatch.delenv("LABUTILS_SHM_LEDGER", raising=False)
    monkeypatch.setenv("PYTHONPATH", TESTS)
    pytester.makepyfile(test_leak=_leak_test(strip_env))
    result = pytester.runpytest_subprocess("-p", "labsuite.pytest_plugin", "-p", "no:cacheprovider")
    name, folder = (pytester.path / "leaked.txt").read_text().split()
    assert name.startswith("sem.mp-") and os.path.basename(folder).startswith("lab-leak-test-"), (name, folder)
    try:
        assert os.path.exists(os.path.join("/dev/shm", name)), "the leaker did not leak: the test proves nothing"
    finally:
        try:  # the test made them (their names came back from its own child): remove them
            os.unlink(os.path.join("/dev/shm", name))
        except FileNotFoundError:
            pass
        shutil.rmtree(folder, ignore_errors=True)
    return result, name, folder


def test_a_semaphore_left_by_the_sessions_process_fails_the_session_with_its_name(pytester, monkeypatch):
    result, name, folder = _run_leaker(pytester, monkeypatch, strip_env=False)
    assert result.ret == 1, result.stdout.str()
    result.stdout.fnmatch_lines_random([f"/dev/shm/{name}: made by pid * (*python* -c import multiprocessing*), "
                                        "during test_leak.py::test_leak (call)",
                                        "labutils: 1 file(s) in /dev/shm and * in /tmp made by this session's "
                                        "processes are still there*"])
    # its tempfile folder was made in the session's own temporary folder, and went with it: not listed
    assert os.path.basename(os.path.dirname(os.path.dirname(folder))).startswith("labutils-session-"), folder
    assert folder not in result.stdout.str()


def test_a_neighbours_semaphore_is_not_blamed(pytester, monkeypatch):
    result, name, folder = _run_leaker(pytester, monkeypatch, strip_env=True)
    assert result.ret == 0, result.stdout.str()
    assert name not in result.stdout.str() and folder not in result.stdout.str()


def test_a_notebook_kernel_is_stopped_as_jupyter_does_so_its_semaphores_go(pytester, monkeypatch):
    """nbval kills each kernel's process group (its resource tracker too): a spawn Lock the notebook still
    holds stayed in /dev/shm (notebook 08 left 11 a pass so). The plugin stops kernels with a shutdown
    request first; the kernel's finalizers unlink the name, and the session's check finds nothing."""
    monkeypatch.delenv("LABUTILS_SESSION_LEDGER", raising=False)
    monkeypatch.delenv("LABUTILS_SHM_LEDGER", raising=False)
    monkeypatch.setenv("PYTHONPATH", TESTS)
    nb = json.loads(json.dumps(TINY_NOTEBOOK))
    nb["cells"][0]["source"] = ("import multiprocessing\nlock = multiprocessing.get_context('spawn').Lock()\n"
                                "open('held.txt', 'w').write('sem.' + lock._semlock.name.lstrip('/'))")
    nb["cells"][1]["source"] = "assert lock.acquire(timeout=1)"
    pytester.makefile(".ipynb", held=json.dumps(nb))
    result = pytester.runpytest_subprocess("-p", "labsuite.pytest_plugin", "-p", "no:cacheprovider",
                                           "--nbval-lax", "held.ipynb")
    name = (pytester.path / "held.txt").read_text().strip()
    assert name.startswith("sem.mp-"), name
    gone = not os.path.exists(os.path.join("/dev/shm", name))
    if not gone:  # the test's own notebook made it: remove it before failing
        os.unlink(os.path.join("/dev/shm", name))
    assert result.ret == 0 and gone, result.stdout.str()


def test_the_sessions_temp_folders_go_with_it_and_one_left_in_the_shared_tmp_fails_it(pytester, monkeypatch):
    """A session's processes get its own TMPDIR: a folder made there goes with the session. A folder one
    of them makes in the shared temp folder itself (``dir=``) stays, and the session's check names it
    and the session fails on it."""
    monkeypatch.delenv("LABUTILS_SESSION_LEDGER", raising=False)  # this session's own check stays outside
    monkeypatch.delenv("LABUTILS_SHM_LEDGER", raising=False)
    monkeypatch.setenv("PYTHONPATH", TESTS)
    shared = tempfile.gettempdir()  # the inner session's "shared /tmp": the folder it starts with
    monkeypatch.setenv("LAB_TEST_SHARED_TMP", shared)
    pytester.makepyfile(test_tmp="""
import subprocess, sys
MAKE = "import os, tempfile; print(tempfile.mkdtemp(prefix='lab-leak-tmp-', dir=os.environ.get('IN')))"
def test_tmp():
    own = subprocess.run([sys.executable, "-c", MAKE], capture_output=True, text=True, check=True).stdout.strip()
    env = dict(__import__("os").environ, IN=__import__("os").environ["LAB_TEST_SHARED_TMP"])
    left = subprocess.run([sys.executable, "-c", MAKE], capture_output=True, text=True, check=True,
                          env=env).stdout.strip()
    open("made.txt", "w").write(own + "\\n" + left)
""")
    result = pytester.runpytest_subprocess("-p", "labsuite.pytest_plugin", "-p", "no:cacheprovider")
    own, left = (pytester.path / "made.txt").read_text().split("\n")
    try:
        assert os.path.dirname(left) == shared and os.path.isdir(left), (left, shared)
        assert os.path.dirname(own) != shared and not os.path.exists(own), own  # went with the session
        result.stdout.fnmatch_lines([f"{left}: made by pid *"])
        assert own not in result.stdout.str()
        assert result.ret == 1, result.stdout.str()  # the test itself passed: the leftover failed the session
    finally:
        shutil.rmtree(left, ignore_errors=True)
