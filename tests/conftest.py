"""Shared fixtures: every test must leave no process and no /dev/shm file of its runs behind; each scenario
script is diagnosed once per session and its record shared by the tests that only read it."""

from __future__ import annotations

import contextlib
import fcntl
import functools
import io
import json
import os
import pickle

import pytest

# the suite's own plugin (tests/labsuite: passes per start method, leak check, scheduler); pytester: test_startmethod
# and test_schedule run that plugin in a scratch project
pytest_plugins = ["pytester", "labsuite.pytest_plugin"]


def shm_names() -> set:
    try:
        return {n for n in os.listdir("/dev/shm") if n.startswith(("torch_", "sem.mp-"))}
    except OSError:
        return set()


_OWN_SEMAPHORES: set = set()  # named semaphores this test process created itself (in-process DataLoaders)


def _record_own_semaphores() -> None:
    from multiprocessing import synchronize

    original = synchronize.SemLock.__init__

    def __init__(self, *args, **kwargs):
        original(self, *args, **kwargs)
        name = getattr(getattr(self, "_semlock", None), "name", None)
        if name:
            _OWN_SEMAPHORES.add("sem." + name.lstrip("/"))

    synchronize.SemLock.__init__ = __init__


_record_own_semaphores()


def _ours(names: set, ledger: str, me) -> set:
    """Which of ``names`` this test made: recorded by one of its isolated runs (the ledger, written by every
    run below this process, in subprocesses too), a semaphore of this process, or a torch segment named
    after this process, a descendant of it, or a process of one of its runs. A neighbour's files on a shared
    /dev/shm (another test session, a helper's notebook) are not this test's to judge."""
    created, pids = set(), {me.pid}
    try:
        with open(ledger, encoding="utf-8") as fh:
            for line in fh:
                rec = json.loads(line)
                created.update(rec.get("created", []))
                pids.update(rec.get("pids", []))
    except (OSError, ValueError):
        pass
    try:
        pids.update(p.pid for p in me.children(recursive=True))
    except Exception:  # noqa: BLE001, S110
        pass
    out = set()
    for name in names:
        parts = name.split("_")
        if name in created or name in _OWN_SEMAPHORES:
            out.add(name)
        elif name.startswith("torch_") and len(parts) > 1 and parts[1].isdigit() and int(parts[1]) in pids:
            out.add(name)
    return out


@pytest.fixture
def no_leaks(tmp_path, monkeypatch):
    """Fail the test if it leaves its own torch_*/sem.mp-* files in /dev/shm or child processes alive."""
    import psutil

    ledger = str(tmp_path / "shm-ledger.jsonl")
    monkeypatch.setenv("LABUTILS_SHM_LEDGER", ledger)
    before = shm_names()
    children_before = {p.pid for p in psutil.Process().children(recursive=True)}
    yield
    me = psutil.Process()
    import time

    deadline = time.monotonic() + 6.0  # a run's resource_tracker / torch_shm_manager unlink on their own, late
    while True:
        left = _ours(shm_names() - before, ledger, me)
        if not left or time.monotonic() > deadline:
            break
        time.sleep(0.2)
    assert not left, f"/dev/shm files left behind: {sorted(left)}"
    import labutils

    helpers = ("resource_tracker", "forkserver", "runner/zygote.py")  # multiprocessing's helpers; the warm launcher
    import gc

    gc.collect()  # a finished DataLoader iterator shuts its workers down when it is collected
    children = [p for p in me.children(recursive=True)
                if not any(h in " ".join(p.cmdline()) for h in helpers) and p.pid not in children_before]
    _gone, alive = psutil.wait_procs(children, timeout=10)  # workers get a moment to exit
    alive = [p for p in alive if p.status() != psutil.STATUS_ZOMBIE]
    assert not alive, f"processes left running: {[(p.pid, p.name()) for p in alive]}"
    assert labutils.find_strays() == [], "processes of finished isolated runs are still alive"


# --------------------------------------------------------------------------- one diagnose run per scenario
class ScenarioRuns:
    """``diagnose --json --launcher auto`` of a scenario script, through the command's entry point in this
    process (the warm launcher where it applies), once per session for each (scenario, script, start
    method): :meth:`report` is the command's JSON, :meth:`result` the run's ``RunResult`` itself.

    Tests that only read a run share it: the scenario tests, the launch tests and the damaged-record tests
    of ``test_diagnose_provoked`` would otherwise run every broken script two or three times. Under xdist
    the record is shared between the session's workers through a folder of this run's base temporary
    directory, one file lock per key (a worker that wants a run another is making waits for it). A fresh run
    (``fresh=True``, ``--lab-repeat``) is never cached."""

    def __init__(self, folder):
        self.folder = folder  # None: this process only (-n 0)
        self.memory: dict = {}

    def report(self, scenario, which: str, start_method=None, *, fresh: bool = False) -> dict:
        return self._get(scenario, which, start_method, fresh)[0]

    def result(self, scenario, which: str, start_method=None):
        return self._get(scenario, which, start_method, False)[1]

    def _get(self, scenario, which, start_method, fresh):
        key = f"{scenario.id}-{which}-{start_method or 'default'}"
        if fresh:
            return self._checked(_diagnose_record(scenario, which, start_method))
        if key not in self.memory:
            self.memory[key] = self._shared(key, scenario, which, start_method)
        return self._checked(self.memory[key])

    def _shared(self, key, scenario, which, start_method):
        if self.folder is None:
            return _diagnose_record(scenario, which, start_method)
        path = os.path.join(self.folder, key + ".pickle")
        with open(os.path.join(self.folder, key + ".lock"), "w") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)  # released when the file is closed
            if os.path.exists(path):
                with open(path, "rb") as fh:
                    return pickle.load(fh)
            record = _diagnose_record(scenario, which, start_method)
            try:
                data = pickle.dumps(record)
            except Exception:  # noqa: BLE001 - not shareable: this worker keeps it, another one runs its own
                return record
            with open(path + ".part", "wb") as fh:
                fh.write(data)
            os.replace(path + ".part", path)
            return record

    @staticmethod
    def _checked(record):
        rc, report, result, err = record
        if rc == 2 and "could not start" in err:
            pytest.skip(err.strip())
        assert rc in (0, 1), err
        return report, result


def _diagnose_record(scenario, which, start_method) -> tuple:
    """(exit status, JSON report, RunResult, stderr) of ``diagnose_main`` on one scenario script, with
    ``LABUTILS_START_METHOD`` set to ``start_method`` for that run (None: the session's own default, from
    ``--lab-start-method`` or the machine)."""
    from labutils.commands import diagnose as command
    from labutils.runner import isolate, startmethod

    opts = scenario.options(which)
    seen = []
    real = isolate.run_isolated

    @functools.wraps(real)  # the command reads its signature (which limits this runner supports)
    def recording(*args, **kwargs):
        seen.append(real(*args, **kwargs))
        return seen[-1]

    old = os.environ.get(startmethod.ENV)
    out, err = io.StringIO(), io.StringIO()
    try:
        isolate.run_isolated = command.run_isolated = recording  # the command imports it at its top
        if start_method is not None:
            os.environ[startmethod.ENV] = start_method
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            rc = command.diagnose_main(["--json", "--launcher", "auto", *opts.cli_args(), scenario.path(which)])
    finally:
        isolate.run_isolated = command.run_isolated = real
        if old is None:
            os.environ.pop(startmethod.ENV, None)
        else:
            os.environ[startmethod.ENV] = old
    report = json.loads(out.getvalue()) if rc in (0, 1) else None
    return rc, report, seen[-1] if seen else None, err.getvalue()


@pytest.fixture(scope="session")
def scenario_runs(request, tmp_path_factory):
    """The session's :class:`ScenarioRuns` (shared by the xdist workers of one run)."""
    if not hasattr(request.config, "workerinput"):  # not an xdist worker: nobody to share with
        return ScenarioRuns(None)
    folder = tmp_path_factory.getbasetemp().parent / "scenario-runs"  # the run's root, not one worker's
    folder.mkdir(exist_ok=True)
    return ScenarioRuns(str(folder))
