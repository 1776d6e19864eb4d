"""run_isolated(max_processes=N): a limit on the run's tasks, so that the kernel really refuses a fork."""

from __future__ import annotations

import os

import pytest

import labutils.runner.pids as pids
from labutils import IsolationError, run_isolated
from labutils.runner import cgroup as _cgroup

FORKS = """
import os
import labutils

pids, refused = [], None
for _ in range(12):
    try:
        pid = os.fork()
    except OSError as exc:
        refused = f"{type(exc).__name__}: {exc}"
        break
    if pid == 0:
        import time
        time.sleep(2)
        os._exit(0)
    pids.append(pid)
for pid in pids:
    os.waitpid(pid, 0)
labutils.emit(forked=len(pids), refused=refused)
"""


@pytest.mark.parametrize("value", [1, 0, "8", True, 2.5])
def test_bad_max_processes_gets_a_clear_message(value):
    with pytest.raises(IsolationError, match="max_processes"):
        run_isolated("pass", max_processes=value)


def test_no_mechanism_is_unsupported_with_the_reasons(monkeypatch):
    monkeypatch.setattr(pids, "prepare", lambda limit: (None, "no pids cgroup here; RLIMIT_NPROC does not bind root"))
    r = run_isolated("print('must not run')", max_processes=8)
    assert r.outcome == "unsupported" and "must not run" not in (r.stdout or "")
    assert "max_processes=8" in r.reason and "RLIMIT_NPROC" in r.reason and "root" in r.reason


def test_rlimit_nproc_is_refused_for_root_and_set_from_the_users_tasks(monkeypatch):
    monkeypatch.setattr(os, "geteuid", lambda: 0)
    value, reason = pids._rlimit_nproc(8)
    assert value is None and "root" in reason
    monkeypatch.setattr(os, "geteuid", lambda: 1000)
    monkeypatch.setattr(pids, "user_tasks", lambda uid: 40)
    value, reason = pids._rlimit_nproc(8)
    assert reason is None and value == 48


def test_a_fork_beyond_the_limit_is_refused_by_the_kernel():
    plan, reason = pids.prepare(6)
    if plan is None:
        pytest.skip(f"no process limit here: {reason}")
    if plan["group"] is not None:
        plan["group"].remove()
    r = run_isolated(FORKS, max_processes=6, timeout=60)
    assert r.outcome == "ok", r.stderr
    assert 1 <= r.values["forked"] < 6 and r.values["refused"].startswith("BlockingIOError: [Errno 11]")
    limit = r.options["process_limit"]
    assert limit["limit"] == 6 and limit["mechanism"]
    if "pids.max" in limit["mechanism"]:
        assert limit["refused"] >= 1  # the kernel's own count (pids.events max)
        assert not [n for n in os.listdir(os.path.dirname(plan["group"].directory)) if n.startswith("labutils-pids-")]
    free = run_isolated(FORKS, timeout=60)
    assert free.values["forked"] == 12 and free.values["refused"] is None


def test_a_refused_process_limit_removes_the_pids_group_it_made(monkeypatch):
    """SIMULATED: a v2 memory group (a systemd scope) and a pids child group: one run cannot be in both,
    so the limit is refused; the pids group, already made, must be removed, not left."""
    from labutils.runner import group as _group
    from labutils.runner import pids as _pids

    removed = []

    class Made:
        version, kind, directory = 2, "child", "/sys/fs/cgroup/labutils-pids-simulated"

        def remove(self, timeout=3.0):
            removed.append(self.directory)

    class Scope(Made):
        kind, directory = "systemd", None
        prefix, verified, mechanism, procs_file = [], True, "simulated scope", None

        def remove(self, timeout=3.0):
            return None

    monkeypatch.setattr(_cgroup, "prepare", lambda limit: (Scope(), None))
    monkeypatch.setattr(_pids, "prepare", lambda n: ({"group": Made(), "nproc": None, "mechanism": "pids"}, None))
    g = _group.RunGroup.prepare(600 * 2**20, "auto", 16)
    assert g.refusal and "max_processes=16" in g.refusal, g.refusal
    assert removed == [Made.directory]
