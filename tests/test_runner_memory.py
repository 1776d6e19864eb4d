"""memory_budget: the kernel's OOM killer in a cgroup of the run where the OS allows it, else the watchdog,
and both charge a page shared by forked workers once."""

from __future__ import annotations

import functools
import glob
import os
import subprocess
import sys
import textwrap

import pytest

from labutils import run_isolated
from labutils.runner import capabilities, cgroupfs, evidence, spec
from labutils.runner import cgroup as _cgroup
from labutils.runner import rundir as _rd
from labutils.runner.cgroup import RunCgroup

WORKER_HOG = textwrap.dedent("""
    import torch
    from torch.utils.data import DataLoader, Dataset

    class Hog(Dataset):
        def __init__(self):
            self.cache = []
        def __len__(self):
            return 10_000
        def __getitem__(self, i):
            self.cache.append(torch.ones(5 * 2**20 // 4))   # 5 MiB kept in this worker for good
            return i

    if __name__ == "__main__":
        for batch in DataLoader(Hog(), batch_size=4, num_workers=2):
            pass
""")

# The main process fills 300 MiB, then two fork workers read it (shared) or write it (copied).
SHARED = textwrap.dedent("""
    import time
    import numpy as np
    import labutils
    import torch
    from torch.utils.data import DataLoader, Dataset

    BIG = np.ones(300 * 2**20 // 8)

    class D(Dataset):
        def __len__(self):
            return 8
        def __getitem__(self, i):
            if {write}:
                BIG[:] = 2.0             # copy-on-write: this worker now has its own 300 MiB
            else:
                float(BIG[::4096].sum())  # reading shares the pages
            time.sleep(1.0)
            return i

    if __name__ == "__main__":
        n = sum(len(b) for b in DataLoader(D(), batch_size=1, num_workers=2, multiprocessing_context="fork"))
        labutils.emit(n=n)
""")


@functools.lru_cache(maxsize=None)
def _budget() -> str:
    """600 MiB on top of what ``import torch`` alone costs beyond the CPU build's 220 MiB: PyPI's CUDA build
    (what pip takes on Python 3.12 and 3.13) maps 500 MiB of libraries, and a flat 600M would kill the main
    process of the read-only run before its workers start."""
    out = subprocess.run([sys.executable, "-c", "import psutil, numpy, torch, torch.utils.data\n"
                          "print(psutil.Process().memory_info().rss)"], capture_output=True, text=True,
                         check=True, timeout=120).stdout
    extra = max(0, int(out) - 220 * 2**20)
    return f"{(600 * 2**20 + extra) >> 20}M"


def _kernel_or_skip(r):
    if r.memory_limit["enforced_by"] != "kernel":
        pytest.skip(f"the kernel cannot enforce a run's budget here: {r.memory_limit.get('why_not_kernel')}")


def test_a_worker_hog_is_killed_by_the_kernel_under_its_budget():
    r = run_isolated(WORKER_HOG, memory_budget=_budget(), timeout=120)
    _kernel_or_skip(r)
    assert r.outcome == "failed"
    record = r.memory_limit["kernel_record"]
    assert record["oom_kill"] >= 1, record  # the kernel's own count for the run's cgroup
    killed = [w for w in r.dataloader_workers if w.killed_by_kernel_oom]
    assert killed and all(w.signal == 9 for w in killed), [w.status for w in r.dataloader_workers]
    assert set(record["killed_pids"]) >= {w.pid for w in killed}
    if record["dmesg"] is not None:  # readable kernel log: it names the worker
        assert any(f"Killed process {killed[0].pid} " in line for line in record["dmesg"]), record["dmesg"]
    assert r.watchdog_kills == []
    assert "is killed by signal: Killed" in r.all_messages
    assert r.cause == "oom_killed"
    assert "enforced by the kernel" in r._repr_html_()
    assert not os.path.exists(record["cgroup"]), "the run's cgroup is removed after the run"


def test_the_same_hog_with_cgroups_refused_is_killed_by_the_watchdog(monkeypatch):
    monkeypatch.setenv(spec.MEMORY_ENFORCEMENT_ENV, "watchdog")
    r = run_isolated(WORKER_HOG, memory_budget=_budget(), timeout=120)
    assert r.memory_limit["enforced_by"] == "watchdog"
    assert r.outcome == "failed"
    killed = [w for w in r.dataloader_workers if w.killed_by_watchdog]
    assert killed and all(w.signal == 9 for w in killed)
    assert not any(w.killed_by_kernel_oom for w in r.workers)
    assert "watchdog" in str(r)
    assert r.cause == "oom_killed"


@pytest.mark.parametrize("enforcement", ["kernel", "watchdog"])
def test_pages_shared_with_forked_workers_are_charged_once(enforcement):
    # 3 x 300 MiB of RSS, but 300 MiB of memory: a 600 MiB budget (over torch's) holds when the workers only
    # read...
    r = run_isolated(SHARED.format(write="False"), memory_budget=_budget(), timeout=120,
                     memory_enforcement=enforcement, memory_detail=True)
    if r.outcome == "unsupported":
        pytest.skip(r.reason)
    assert r.ok, (r.reason, r.stderr[-2000:], r.watchdog_kills)
    assert r.values == {"n": 8}
    rss_sum = sum(max(s["rss"] for s in r.samples if s["pid"] == pid) for pid in {s["pid"] for s in r.samples})
    assert rss_sum > 800 * 2**20, "each process's RSS counts the shared pages again"
    # ...and fails when each worker writes its own copy of them
    r = run_isolated(SHARED.format(write="True"), memory_budget=_budget(), timeout=120,
                     memory_enforcement=enforcement)
    assert r.outcome == "failed", r.stderr[-2000:]
    assert r.signal == 9 or any(w.signal == 9 for w in r.dataloader_workers), r.stderr[-2000:]
    if enforcement == "kernel":
        assert r.memory_limit["kernel_record"]["oom_kill"] >= 1
    else:
        assert r.watchdog_kills and r.watchdog_kills[0]["charged"] > 600 * 2**20


def test_kernel_enforcement_demanded_where_impossible_is_unsupported(monkeypatch):
    monkeypatch.setattr(_cgroup, "prepare", lambda limit: (None, "cgroups refused for this test"))
    r = run_isolated("pass", memory_budget="600M", memory_enforcement="kernel")
    assert r.outcome == "unsupported" and r.returncode is None
    assert "cgroups refused for this test" in r.reason and "memory_enforcement='kernel'" in r.reason
    r = run_isolated("pass", memory_budget="600M")  # auto: the watchdog, saying why
    assert r.ok and r.memory_limit["enforced_by"] == "watchdog"
    assert r.memory_limit["why_not_kernel"] == "cgroups refused for this test"


def test_no_run_cgroup_is_left_under_the_labs_own():
    version, own = cgroupfs.own_cgroup("memory")
    if version is None:
        pytest.skip(own)
    r = run_isolated("import time\ntime.sleep(30)", memory_budget="200M", timeout=1)
    assert r.outcome == "timed_out"
    if r.memory_limit["enforced_by"] == "kernel":
        assert os.path.dirname(r.memory_limit["kernel_record"]["cgroup"]) == own
    assert glob.glob(os.path.join(own, f"labutils-run-{os.getpid()}-*")) == []


def test_cgroup_path_inside_a_cgroup_namespace_is_joined_to_its_mount():
    # /proc/self/cgroup names the path from the namespace's root; mountinfo says where that root is mounted
    mount = {"root": "/process_api/abc", "mount": "/sys/fs/cgroup/memory", "fstype": "cgroup", "options": "rw,memory"}
    assert cgroupfs.join(mount, "/process_api/abc/lab") == "/sys/fs/cgroup/memory/lab"
    assert cgroupfs.join({**mount, "root": "/"}, "/process_api/abc") == "/sys/fs/cgroup/memory/process_api/abc"


def test_kernel_record_names_the_killed_pid_from_the_kernel_log():
    class Group:
        directory = "/sys/fs/cgroup/memory/lab/labutils-run-1-x"

    class Mon:
        kernel_oom_pids: list = []

    lines = ["oom-kill:constraint=CONSTRAINT_MEMCG,oom_memcg=/lab/labutils-run-1-x,task=pt_data_worker,pid=42,uid=0",
             "Memory cgroup out of memory: Killed process 42 (pt_data_worker) total-vm:1kB",
             "Memory cgroup out of memory: Killed process 77 (other) total-vm:1kB"]
    rec = evidence._kernel_record({"oom_kill": 1}, lines, Group(), {41: 1, 42: 2}, Mon(), {42: None}, (1, 41, "exited"))
    assert rec["killed_pids"] == [42] and rec["killed_pids_from"] == "dmesg" and not rec["main_killed"]
    assert len(rec["dmesg"]) == 2  # the other group's kill is not this run's


def test_a_systemd_scope_that_enforces_nothing_is_reported_as_the_watchdog(tmp_path):
    """SIMULATED: a scope directory whose memory.max reads 'max' (systemd accepted MemoryMax= on a host whose
    memory controller is on cgroup v1, or not delegated)."""
    from labutils.runner.group import RunGroup

    scope = tmp_path / "labutils-run-1.2-abcd.scope"
    scope.mkdir()
    (scope / "memory.max").write_text("max\n")
    group = RunGroup()
    group.memory = RunCgroup("systemd", 2, str(scope), 300 * 2**20, "systemd-run ...", unit=scope.stem)
    group.memory_limit = {"enforced_by": "kernel", "limit": 300 * 2**20, "mechanism": "systemd", "kernel_record": None}
    assert group.watchdog_budget == 300 * 2**20  # armed until the scope's limit has been read back
    assert group.memory.verify() is False
    group.settle()
    assert group.memory_limit["enforced_by"] == "watchdog" and "reads max" in group.memory_limit["why_not_kernel"]
    (scope / "memory.max").write_text(f"{300 * 2**20}\n")
    group.memory.verified = None
    group.memory_limit["enforced_by"] = "kernel"
    assert group.memory.verify() is True and group.watchdog_budget is None


def test_locate_ignores_the_kernels_own_scope(monkeypatch):
    """SIMULATED /proc/PID/cgroup: first the kernel's terminal session scope, then the run's own."""
    lines = [[("0", [], "/user.slice/user-1000.slice/session-4.scope")],
             [("0", [], "/user.slice/user-1000.slice/user@1000.service/app.slice/labutils-run-1.2-ab.scope")]]
    monkeypatch.setattr(_cgroup, "proc_cgroups", lambda pid="self": lines.pop(0))
    monkeypatch.setattr(cgroupfs, "mountinfo", lambda: [{"root": "/", "mount": "/sys/fs/cgroup",
                                                        "fstype": "cgroup2", "options": "rw"}])
    g = RunCgroup("systemd", 2, None, 2**28, "systemd", unit="labutils-run-1.2-ab")
    g.locate(1)
    assert g.directory is None  # session-4.scope is the user's terminal, not the run
    g.locate(1)
    assert os.path.basename(g.directory) == "labutils-run-1.2-ab.scope"


class _Group:
    directory = "/sys/fs/cgroup/memory/lab/labutils-run-1-x"


class _Mon:
    kernel_oom_pids: list = []


HOST_KILL = ["oom-kill:constraint=CONSTRAINT_NONE,task_memcg=/system.slice/db.service,task=postgres,pid=42,uid=70",
             "Out of memory: Killed process 42 (postgres) total-vm:1kB"]


RUN_KILL = ["oom-kill:constraint=CONSTRAINT_MEMCG,oom_memcg=/lab/labutils-run-1-x,task=pt_data_worker,pid=42,uid=0",
            "Memory cgroup out of memory: Killed process 42 (pt_data_worker) total-vm:1kB"]


def test_in_a_private_pid_namespace_a_host_kill_with_our_number_is_not_the_runs(monkeypatch):
    """Simulated: this test machine's runner is in the initial pid namespace, so the namespace check is
    replaced by its answer in a container with its own pid namespace and a readable /dev/kmsg."""
    from labutils.runner import evidence

    assert evidence.host_pid_namespace() is True  # here (NSpid has one number)
    monkeypatch.setattr(evidence, "host_pid_namespace", lambda: False)
    rec = evidence._kernel_record({}, HOST_KILL, _Group(), {41: 1, 42: 2}, _Mon(), {}, (1, 41, "exited"))
    assert rec["killed_pids"] == [] and rec["dmesg"] == [], rec
    rec = evidence._kernel_record({}, RUN_KILL, _Group(), {41: 1, 42: 2}, _Mon(), {}, (1, 41, "exited"))
    assert rec["killed_pids"] == [42], rec  # the record names the run's cgroup: the run's worker


def test_in_the_host_pid_namespace_a_host_oom_kill_of_a_run_process_is_still_the_runs():
    from labutils.runner import evidence

    rec = evidence._kernel_record({}, HOST_KILL, _Group(), {41: 1, 42: 2}, _Mon(), {}, (1, 41, "exited"))
    assert rec["killed_pids"] == [42], rec  # a run without a budget killed by the host's OOM killer


def test_no_systemd_scope_is_tried_where_memory_is_on_cgroup_v1(monkeypatch):
    """systemd's MemoryMax= applies to the unified hierarchy only: on a v1 or hybrid host it limits
    nothing, so the scope must not even be probed (the probe would accept it)."""

    probed = []
    monkeypatch.setattr(capabilities, "systemd_scope", lambda: probed.append(1))
    group, reason = _cgroup._systemd_scope(64 * 2**20, 1)
    assert group is None and "v1" in reason and not probed, reason


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
