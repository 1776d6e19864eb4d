"""The lab's start-method switch: LABUTILS_START_METHOD moves the default, never a choice already made."""

import multiprocessing
import subprocess
import sys
import textwrap

import pytest

import labutils
from labutils import startmethod

CHILD = textwrap.dedent('''
    import multiprocessing, sys
    import labutils  # applies LABUTILS_START_METHOD
    print(multiprocessing.get_start_method(allow_none=True), labutils.startmethod.current())
    multiprocessing.set_start_method("spawn")  # a script's own choice must still be allowed
    print(multiprocessing.get_start_method())
''')


def _child(env_value):
    import os

    env = dict(os.environ)
    env.pop(startmethod.ENV, None)
    if env_value is not None:
        env[startmethod.ENV] = env_value
    return subprocess.run([sys.executable, "-c", CHILD], capture_output=True, text=True, env=env, timeout=60)


def test_the_variable_moves_the_default_without_setting_it():
    done = _child("forkserver")
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["None", "forkserver", "spawn"]


def test_a_bad_value_is_one_clear_error():
    done = _child("sideways")
    assert done.returncode != 0
    assert "LABUTILS_START_METHOD='sideways': use one of fork, forkserver, spawn" in done.stderr
    with pytest.raises(labutils.IsolationError, match="use one of"):
        import os

        old = os.environ.get(startmethod.ENV)
        os.environ[startmethod.ENV] = "sideways"
        try:
            labutils.run_isolated("pass")
        finally:
            if old is None:
                os.environ.pop(startmethod.ENV)
            else:
                os.environ[startmethod.ENV] = old


def test_an_isolated_run_gets_the_default_and_an_explicit_choice_wins():
    code = textwrap.dedent('''
        import torch
        from torch.utils.data import DataLoader

        if __name__ == "__main__":
            list(DataLoader(list(range(4)), batch_size=2, num_workers=1))
    ''')
    moved = labutils.run_isolated(code, env={startmethod.ENV: "spawn"}, timeout=120)
    assert moved.ok and labutils.measure.run_start_method(moved) == "spawn", moved
    pinned = labutils.run_isolated(code, env={startmethod.ENV: "spawn"}, start_method="fork", timeout=120)
    assert pinned.ok and labutils.measure.run_start_method(pinned) == "fork", pinned


def test_python_default_matches_the_platform_rule():
    expected = "spawn" if sys.platform in ("darwin", "win32") else (
        "forkserver" if sys.version_info >= (3, 14) else "fork")
    assert startmethod.python_default() == expected
    assert startmethod.current() in startmethod.METHODS
    assert multiprocessing.get_start_method(allow_none=True) in (None, *startmethod.METHODS)


def test_the_plugin_adds_a_pass_per_extra_method(pytester):
    pytester.makepyfile(test_x='''
        def test_m(lab_start_method):
            assert lab_start_method in (None, "spawn")
    ''')
    result = pytester.runpytest("-p", "labutils.pytest_plugin", "--lab-also-start-method", "spawn", "-v")
    result.assert_outcomes(passed=2)
    result.stdout.fnmatch_lines(["*test_m[[]default[]]*", "*test_m[[]spawn[]]*"])
    bad = pytester.runpytest("-p", "labutils.pytest_plugin", "--lab-also-start-method", "sideways")
    assert bad.ret != 0
    bad.stderr.fnmatch_lines(["*--lab-also-start-method 'sideways': use one of*"])
