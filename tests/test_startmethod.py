"""The lab's start-method switch: LABUTILS_START_METHOD moves the default, never a choice already made."""

import multiprocessing
import os
import subprocess
import sys
import textwrap

import pytest

import labutils
from labutils.runner import startmethod

CHILD = textwrap.dedent('''
    import multiprocessing, sys
    from IPython.core.interactiveshell import InteractiveShell
    InteractiveShell.instance()  # a notebook kernel's shell: there, `import labutils` applies the switch
    import labutils  # applies LABUTILS_START_METHOD
    print(multiprocessing.get_start_method(allow_none=True), labutils.runner.startmethod.current())
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
    assert moved.ok and labutils.kit.measure.run_start_method(moved) == "spawn", moved
    pinned = labutils.run_isolated(code, env={startmethod.ENV: "spawn"}, start_method="fork", timeout=120)
    assert pinned.ok and labutils.kit.measure.run_start_method(pinned) == "fork", pinned


def test_a_runs_start_method_is_a_default_the_script_may_still_set():
    """start_method= used to *set* the method (set_start_method(force=True)), so a script's own
    set_start_method() failed with "context has already been set", which it never does outside the lab."""
    code = textwrap.dedent('''
        import multiprocessing

        import labutils

        if __name__ == "__main__":
            before = multiprocessing.get_start_method(allow_none=True)  # None: nothing set (a plain call would set it)
            multiprocessing.set_start_method("fork")
            labutils.emit(before=before, after=multiprocessing.get_start_method())
    ''')
    run = labutils.run_isolated(code, start_method="spawn", env={startmethod.ENV: "forkserver"}, timeout=120)
    assert run.ok, run.diagnosis
    assert run.values["before"] is None and run.values["after"] == "fork", run.values


def test_a_process_a_run_starts_with_its_own_interpreter_gets_the_switch_too():
    """torchrun's ranks are such processes: before, `import labutils` applied the switch in a notebook
    kernel only, so notebook 12's spawn and forkserver passes ran every rank's workers under fork."""
    probe = "import multiprocessing, labutils; print(multiprocessing.get_start_method())"
    code = textwrap.dedent(f'''
        import subprocess, sys
        import labutils

        if __name__ == "__main__":
            out = subprocess.run([sys.executable, "-c", {probe!r}], capture_output=True, text=True, check=True)
            labutils.emit(child=out.stdout.strip())
    ''')
    for method in ("spawn", "forkserver"):
        run = labutils.run_isolated(code, env={startmethod.ENV: method}, timeout=120)
        assert run.ok and run.values["child"] == method, (method, run.values, run.diagnosis)
    # outside the lab's runs, a learner's own script keeps Python's default
    env = {**os.environ, startmethod.ENV: "spawn"}
    env.pop("LABUTILS_RUNNER", None)
    outside = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, env=env, check=True)
    assert outside.stdout.strip() == startmethod.python_default(), outside.stdout


@pytest.mark.parametrize("launcher", ["warm", "cold"])
def test_the_scripts_own_import_of_labutils_keeps_the_runs_choice(launcher):
    """Notebook 02's `%%isolate --start-method spawn` cell imports labutils; under the switch set to fork,
    that import once moved the run's default back to fork, and the unpicklable dataset "worked"."""
    code = textwrap.dedent("""
        import multiprocessing, os

        if __name__ == "__main__":
            r, w = os.pipe()
            pid = os.fork()  # a plain fork (multiprocessing's own children get their method forced anyway)
            if pid == 0:  # its first import of labutils, in a fork of the run's main process
                import labutils
                os.write(w, multiprocessing.get_start_method().encode())
                os._exit(0)
            os.close(w)
            forked = os.read(r, 64).decode()
            os.waitpid(pid, 0)
            import labutils
            labutils.emit(method=multiprocessing.get_start_method(), forked=forked)
    """)
    run = labutils.run_isolated(code, start_method="spawn", env={startmethod.ENV: "fork"}, launcher=launcher,
                                timeout=120)
    assert run.ok and run.values == {"method": "spawn", "forked": "spawn"}, (run.values, run.launcher)


def test_python_default_matches_the_platform_rule():
    expected = "spawn" if sys.platform in ("darwin", "win32") else (
        "forkserver" if sys.version_info >= (3, 14) else "fork")
    assert startmethod.python_default() == expected
    assert startmethod.current() in startmethod.METHODS
    assert multiprocessing.get_start_method(allow_none=True) in (None, *startmethod.METHODS)


def test_the_plugin_adds_a_pass_per_extra_method(pytester, monkeypatch):
    # the extra pass is dropped where it equals the default: under `--lab-start-method spawn` the outer run
    # exports LABUTILS_START_METHOD=spawn, which the inner pytest would inherit
    monkeypatch.delenv(startmethod.ENV, raising=False)
    pytester.makepyfile(test_x='''
        def test_m(lab_start_method):
            assert lab_start_method in (None, "spawn")
    ''')
    result = pytester.runpytest("-p", "labsuite.pytest_plugin", "--lab-also-start-method", "spawn", "-v")
    result.assert_outcomes(passed=2)
    result.stdout.fnmatch_lines(["*test_m[[]default[]]*", "*test_m[[]spawn[]]*"])
    bad = pytester.runpytest("-p", "labsuite.pytest_plugin", "--lab-also-start-method", "sideways")
    assert bad.ret != 0
    bad.stderr.fnmatch_lines(["*--lab-also-start-method 'sideways': use one of*"])


PRELOAD_PROBE = textwrap.dedent('''
    import multiprocessing, os, sys
    method = multiprocessing.get_context().get_start_method()  # the default, in this process
    print("body", os.getpid(), method, sys.argv[1:], flush=True)
    import torch
    from torch.utils.data import DataLoader


    def pid(_):
        return os.getpid()


    if __name__ == "__main__":
        for epoch in range(2):
            workers = set(DataLoader(list(range(4)), batch_size=1, num_workers=2, collate_fn=pid))
            print("workers", *sorted(workers), flush=True)
''')


def _bodies_and_workers(result):
    bodies, workers = [], set()
    for line in result.stdout.splitlines():
        if line.startswith("body "):
            bodies.append(line.split(" ", 3))
        elif line.startswith("workers "):
            workers.update(int(p) for p in line.split()[1:])
    return bodies, workers


def test_the_forkserver_switch_preloads_the_script_once_as_python_3_14_does(tmp_path):
    script = tmp_path / "probe.py"
    script.write_text(PRELOAD_PROBE)
    switched = labutils.run_isolated(file=script, argv=["--epochs", "2"], env={startmethod.ENV: "forkserver"},
                                     timeout=120)
    assert switched.ok, switched
    bodies, workers = _bodies_and_workers(switched)
    assert len(workers) == 4, switched.stdout  # two loaders, two fresh workers each
    # the script's body ran in the main process and once more in the fork server, never in a worker;
    # and the server saw the script's own arguments (gh-143706) and has forkserver as its default too
    assert len(bodies) == 2 and not {int(b[1]) for b in bodies} & workers, switched.stdout
    assert all(b[3] == "['--epochs', '2']" for b in bodies), bodies
    assert all(b[2] == "forkserver" for b in bodies), bodies  # the server's own default, as on 3.14
    # an explicit forkserver without the switch is this Python's own fork server, as it is
    pinned = labutils.run_isolated(file=script, argv=["--epochs", "2"], start_method="forkserver",
                                   env={startmethod.ENV: ""}, timeout=120)
    assert pinned.ok, pinned
    bodies, workers = _bodies_and_workers(pinned)
    assert len(bodies) == (2 if startmethod.forkserver_preloads_main() else 1 + len(workers)), pinned.stdout


def test_the_forkserver_switch_leaves_multiprocessing_util_to_the_script():
    # multiprocessing.util registers the exit handler that joins a script's children as it is imported; had
    # the switch imported it, that handler would run after the script's own, not before as under python
    # (tests/parity/atexit_before_multiprocessing.py). The fork server is patched as the script imports it.
    code = ("import sys; print('multiprocessing.util' in sys.modules); "
            "import multiprocessing.forkserver as f; print(f.ForkServer.ensure_running._labutils_main_preload)")
    run = labutils.run_isolated(code=code, launcher="cold", env={startmethod.ENV: "forkserver"}, timeout=120)
    assert run.ok, run
    assert run.stdout.split() == ["False", "True"], run.stdout


def test_the_preload_emulation_leaves_a_fixed_python_alone(monkeypatch):
    from multiprocessing import forkserver

    original = forkserver.ForkServer.ensure_running
    monkeypatch.setattr(startmethod, "forkserver_preloads_main", lambda: True)
    assert startmethod.emulate_fixed_forkserver_preload() is False
    assert forkserver.ForkServer.ensure_running is original


def test_importing_the_fixes_leaves_a_scripts_start_method_alone():
    code = "import labutils.kit.fixes, multiprocessing as mp; print(mp.get_start_method())"
    env = {**os.environ, "LABUTILS_START_METHOD": "spawn"}
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, env=env)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == mp_default()


def mp_default() -> str:
    out = subprocess.run([sys.executable, "-c", "import multiprocessing as mp; print(mp.get_start_method())"],
                         capture_output=True, text=True, timeout=60, env={k: v for k, v in os.environ.items()
                                                                          if k != "LABUTILS_START_METHOD"})
    return out.stdout.strip()
