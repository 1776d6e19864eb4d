"""What the runner may use on this machine, found by trying once (``runner/capabilities.py``), what it
does without it, and how the doctor lists it."""

from __future__ import annotations

import errno
import os

import psutil
import pytest

from labutils import run_isolated
from labutils.runner import capabilities


@pytest.fixture
def no_pidfd(monkeypatch):
    """SIMULATED: a kernel older than 5.3 (or an old Docker seccomp profile): os.pidfd_open exists in this
    Python build but every call fails with ENOSYS. The capability probe must find that by trying."""
    def refuse(pid, flags=0):
        raise OSError(errno.ENOSYS, "Function not implemented")

    monkeypatch.setattr(os, "pidfd_open", refuse)
    capabilities.reset()
    yield
    monkeypatch.undo()
    capabilities.reset()


def test_no_pidfd_is_found_by_trying_and_runs_are_still_supervised(no_pidfd):
    cap = capabilities.pidfd()
    assert not cap.available and "ENOSYS" in cap.result and "start time" in cap.fallback
    # the run goes cold (no second copy from the template), its workers are adopted by start time, and
    # the time limit still kills them all
    cell = ("import os, time, multiprocessing as mp\n"
            "ps = [mp.get_context('fork').Process(target=time.sleep, args=(60,)) for _ in range(2)]\n"
            "[p.start() for p in ps]\ntime.sleep(60)\n")
    r = run_isolated(cell, timeout=4)
    assert r.launcher["kind"] == "cold" and "pidfds" in r.launcher["why_cold"], r.launcher
    assert r.launcher["tracking"].startswith("pid and start time")
    assert r.outcome == "timed_out" and r.processes_seen >= 3, (r.processes_seen, r.stderr)
    assert r.stray_processes == []
    for w in r.workers:
        assert not psutil.pid_exists(w.pid) or psutil.Process(w.pid).status() == psutil.STATUS_ZOMBIE


def test_the_systemd_probe_reads_the_limit_back():
    cap = capabilities.systemd_verdict("max", 64 * 2**20, "tried", "watchdog")
    assert not cap.available and "enforces nothing" in cap.result
    assert capabilities.systemd_verdict(str(64 * 2**20), 64 * 2**20, "tried", "watchdog").available


def test_doctor_lists_each_capability_and_warns_without_pidfd(no_pidfd):
    from labutils import doctor

    check = doctor()["runner"]
    names = [c["name"] for c in check.data["capabilities"]]
    assert names[:4] == ["pidfd", "cgroup_memory", "cgroup_pids", "kmsg"]
    assert check.status == "WARN" and "pidfd: no" in check.detail and "instead:" in check.detail
    assert all(c["tried"] and c["result"] for c in check.data["capabilities"])
