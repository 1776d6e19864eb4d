"""Fixes of the runner review (../shared/reviews/runner.md) that had landed without a test of their own:
one test each, each failing without its fix. Where a machine's condition cannot be produced here it is
simulated, and the test says so."""

import json
import os
import subprocess
import sys

import pytest

from labutils import IsolationError, run_isolated
from labutils.runner import cgroup as _cgroup
from labutils.runner import rundir as _rd


def _open_fds() -> set:
    return set(os.listdir("/proc/self/fd"))


# ---------------------------------------------------------------- C1 on a v1 host
def test_no_systemd_scope_is_tried_where_memory_is_on_cgroup_v1(monkeypatch):
    """systemd's MemoryMax= applies to the unified hierarchy only: on a v1 or hybrid host it limits
    nothing, so the scope must not even be probed (the probe would accept it)."""
    from labutils.runner import capabilities

    probed = []
    monkeypatch.setattr(capabilities, "systemd_scope", lambda: probed.append(1))
    group, reason = _cgroup._systemd_scope(64 * 2**20, 1)
    assert group is None and "v1" in reason and not probed, reason


# ---------------------------------------------------------------- R2 for the evidence files
def test_evidence_records_are_read_to_a_cap(tmp_path):
    from labutils.runner.rundir import read_json, read_jsonl

    path = tmp_path / _rd.LOADER
    path.write_text((json.dumps({"event": "error", "text": "x" * 100}) + "\n") * 5000)  # about 560 kB
    records = read_jsonl(str(path), cap=20_000)
    assert 0 < len(records) < 200, len(records)
    big = tmp_path / _rd.VALUE
    big.write_text(json.dumps({"v": "y" * 100_000}))
    assert read_json(str(big), cap=1000) is None  # cut, so not valid JSON: read as no record, not whole


# ---------------------------------------------------------------- C3: a group that stays is reported
def test_a_cgroup_that_cannot_be_removed_is_in_the_result(monkeypatch):
    """SIMULATED failure: the group is really removed, then reported as if it had stayed (EBUSY from a
    process in D state cannot be produced on demand); what is checked is that the report reaches the
    result instead of being dropped."""
    version, parent = _cgroup.own_cgroup("memory")
    if version is None or not os.access(parent, os.W_OK):
        pytest.skip(f"no writable memory cgroup here ({parent})")
    real = _cgroup.RunCgroup.remove

    def remove(self, timeout=3.0):
        real(self, timeout)
        return f"could not remove {self.directory}: Device or resource busy (simulated)"

    monkeypatch.setattr(_cgroup.RunCgroup, "remove", remove)
    r = run_isolated("pass", memory_budget="600MiB", timeout=60)
    if r.memory_limit["enforced_by"] != "kernel":
        pytest.skip(f"no kernel limit here: {r.memory_limit.get('why_not_kernel')}")
    assert r.ok and len(r.leftover_cgroups) == 1 and "simulated" in r.leftover_cgroups[0], r.leftover_cgroups


# ---------------------------------------------------------------- C3.3: the pids group of a refused run
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


# ---------------------------------------------------------------- R3: no fd left when the start fails
def test_a_run_whose_interpreter_cannot_start_leaves_no_fd(tmp_path):
    fake = tmp_path / "python"
    fake.write_bytes(b"\x7fELF not really an interpreter\n")
    fake.chmod(0o755)
    before = _open_fds()
    for _ in range(3):
        with pytest.raises(IsolationError, match="could not start the run's Python"):
            run_isolated("pass", python=str(fake), timeout=30)
    assert _open_fds() <= before, _open_fds() - before


def test_an_interrupt_during_a_run_leaves_no_fd_and_no_process(monkeypatch):
    import psutil

    from labutils.runner import isolate

    def interrupted(*args, **kwargs):
        raise KeyboardInterrupt

    for launcher in ("auto", "cold"):
        run_isolated("pass", launcher=launcher, timeout=60)  # the template (warm) exists before counting
        before = _open_fds()
        kids = {p.pid for p in psutil.Process().children()}
        with monkeypatch.context() as m:
            m.setattr(isolate, "_wait_leader", interrupted)
            with pytest.raises(KeyboardInterrupt):
                run_isolated("import time\ntime.sleep(30)", launcher=launcher, memory_budget=None, timeout=60)
        assert _open_fds() <= before, (launcher, _open_fds() - before)
        left = [p for p in psutil.Process().children() if p.pid not in kids and p.status() != psutil.STATUS_ZOMBIE]
        assert not left, (launcher, left)


# ---------------------------------------------------------------- bad input on the command line
def test_diagnose_refuses_an_infinite_timeout_in_one_line(tmp_path):
    script = tmp_path / "train.py"
    script.write_text("print('hi')\n")
    p = subprocess.run([sys.executable, "-m", "labutils", "diagnose", "--timeout", "inf", str(script)],
                       capture_output=True, text=True, timeout=60)
    assert p.returncode == 2 and "timeout" in p.stderr and "Traceback" not in p.stderr, p.stderr
    assert "hi" not in p.stdout  # refused before anything ran


# ---------------------------------------------------------------- C5: a failed join is the lab's, not the learner's
def test_a_run_that_cannot_join_its_cgroup_is_unsupported_not_failed(monkeypatch, tmp_path):
    """SIMULATED: the group's procs file cannot be written (a read-only cgroupfs after the group was made);
    the bootstrap says so and exits 3 before the learner's code: that is not the learner's failure."""
    from labutils.runner import group as _group

    missing = str(tmp_path / "gone" / "cgroup.procs")
    real = _group.RunGroup.config
    monkeypatch.setattr(_group.RunGroup, "config", lambda self: {**real(self), "cgroup_procs": missing})
    r = run_isolated("print('the learner ran')", timeout=60)
    assert r.outcome == "unsupported" and _rd.JOIN_FAILED_TEXT in r.reason, (r.outcome, r.reason)
    assert "the learner ran" not in r.stdout
