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

import labutils.runner.isolate as isolate
from labutils import run_isolated
from labutils.runner import cgroup as _cgroup
from labutils.runner import cgroupfs, spec

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
    rec = isolate._kernel_record({"oom_kill": 1}, lines, Group(), {41: 1, 42: 2}, Mon(), {42: None}, (1, 41, "exited"))
    assert rec["killed_pids"] == [42] and rec["killed_pids_from"] == "dmesg" and not rec["main_killed"]
    assert len(rec["dmesg"]) == 2  # the other group's kill is not this run's
