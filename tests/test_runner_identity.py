"""The runner on a shared machine: it signals only its run's processes and removes only its run's files,
and it still finds every process of the run, even one that left the process tree and the process group."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time

import psutil
import pytest
from test_machine_capabilities import no_pidfd  # noqa: F401 - the fixture, defined there

import labutils
from labutils import run_isolated
from labutils.runner import ownership, procfs
from labutils.runner import procs as _procs

ESCAPEE = textwrap.dedent("""
    import subprocess, sys, labutils
    # a grandchild in a session of its own: neither in the run's process group nor, once the main
    # process is gone, in its process tree
    p = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"], start_new_session=True)
    labutils.emit(escapee=p.pid)
""")


def _alive(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def test_a_process_that_left_the_group_and_the_tree_is_still_killed():
    r = run_isolated(ESCAPEE, timeout=60)
    assert r.ok, r.stderr
    pid = r.values["escapee"]
    deadline = time.monotonic() + 5
    while _alive(pid) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not _alive(pid), f"pid {pid} of the run outlived it"
    assert labutils.find_strays() == []


def test_a_bystander_with_the_same_parent_is_not_signalled(tmp_path):
    # a process of the test (the lab's own parent side), started during the run: not the run's
    import subprocess
    import sys

    code = "import time\ntime.sleep(1.5)"
    bystander = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
    try:
        r = run_isolated(code, timeout=0.5)
        assert r.outcome == "timed_out"
        assert bystander.poll() is None, "the runner signalled a process that is not its run's"
    finally:
        bystander.kill()
        bystander.wait()


def test_registry_refuses_a_process_that_is_not_the_runs(tmp_path):
    import subprocess
    import sys

    leader = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
    other = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
    try:
        reg = _procs.RunProcesses(str(tmp_path), leader.pid)
        assert reg.adopt(other.pid) is None  # neither a descendant nor marked nor in the run's cgroup
        assert reg.adopt(leader.pid) is not None
        assert reg.adopt(leader.pid, ticks=procfs.start_ticks(leader.pid) + 1) is not None  # known already
        reg2 = _procs.RunProcesses(str(tmp_path), leader.pid)
        reg2.known.clear()
        assert reg2.adopt(leader.pid, ticks=procfs.start_ticks(leader.pid) + 1) is None  # a different start
        reg.close()
        reg2.close()
    finally:
        for p in (leader, other):
            p.kill()
            p.wait()


SPAWN_SEMS = textwrap.dedent("""
    import multiprocessing as mp, os, time, labutils
    if __name__ == "__main__":
        ctx = mp.get_context("spawn")
        locks = [ctx.Lock() for _ in range(3)]   # named semaphores in /dev/shm (not unlinked under spawn)
        labutils.emit(sems=sorted(n for n in os.listdir("/dev/shm") if n.startswith("sem.mp-")))
        time.sleep(600)
""")


def test_semaphores_of_a_killed_spawn_run_are_gone_and_recorded():
    r = run_isolated(SPAWN_SEMS, timeout=5)
    assert r.outcome == "timed_out"
    recorded = [n for n in r.shm_created if n.startswith("sem.mp-")]
    assert len(recorded) == 3, r.shm_created
    assert set(recorded) <= set(r.values["sems"])  # the run itself saw them in /dev/shm
    assert [n for n in recorded if os.path.exists("/dev/shm/" + n)] == []


def test_a_foreign_semaphore_file_made_during_the_run_survives():
    # Another program's semaphore, created while the run goes and mapped by nobody (its creator has it
    # closed): the old clean-up removed every such new sem.mp-* file; only the run's own may go.
    import threading
    import uuid

    path = f"/dev/shm/sem.mp-{uuid.uuid4().hex[:8]}"

    def make():
        time.sleep(0.8)
        with open(path, "wb") as fh:
            fh.write(b"\0" * 32)

    t = threading.Thread(target=make)
    t.start()
    try:
        r = run_isolated("import time\ntime.sleep(3)", timeout=1.5)
        t.join()
        assert r.outcome == "timed_out"
        assert os.path.exists(path), "the runner removed a semaphore that was not its run's"
        assert os.path.basename(path) not in r.shm_removed
    finally:
        t.join()
        if os.path.exists(path):
            os.unlink(path)


@pytest.mark.skipif(not os.path.isdir("/proc"), reason="needs /proc")
def test_zombie_status_reads_the_kernels_exit_code():
    pid = os.fork()
    if pid == 0:
        os._exit(7)
    try:
        deadline = time.monotonic() + 5
        status = None
        while status is None and time.monotonic() < deadline:
            status = procfs.zombie_status(pid)
            time.sleep(0.01)
        assert status is not None and os.WEXITSTATUS(status) == 7
    finally:
        os.waitpid(pid, 0)


def test_killpg_is_not_sent_once_the_leader_was_reaped_by_someone_else(tmp_path, monkeypatch):
    leader = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"], start_new_session=True)
    procs = _procs.RunProcesses(str(tmp_path), leader.pid)
    assert procs.leader_unreaped()
    leader.kill()
    leader.wait()  # reaped by "someone else" (the learner's SIGCHLD handler, say): the number is free now
    assert not procs.leader_unreaped()
    sent = []
    monkeypatch.setattr(os, "killpg", lambda pgid, sig: sent.append(pgid))
    procs.terminate(helper_grace=0.1)
    procs.close()
    assert sent == []  # a recycled number's group would have been SIGKILLed


@pytest.mark.usefixtures("no_pidfd")
def test_kill_verified_signals_only_while_the_check_holds():
    sleeper = subprocess.Popen(["sleep", "60"])
    try:
        assert not ownership.kill_verified(sleeper.pid, lambda pid: False)
        assert sleeper.poll() is None
        assert ownership.kill_verified(sleeper.pid, lambda pid: True)
        assert sleeper.wait(timeout=5) == -signal.SIGKILL
    finally:
        if sleeper.poll() is None:
            sleeper.kill()
            sleeper.wait()


STALE = """
import os, subprocess, threading, time, labutils
run_dir = os.environ["LABUTILS_RUN_DIR"]
p = subprocess.Popen(["sleep", "60"])
os.makedirs(os.path.join(run_dir, "stacks"), exist_ok=True)
stale = os.path.join(run_dir, "stacks", f"{p.pid}.txt")
open(stale, "w").close()
os.utime(stale, (time.time() - 3600, time.time() - 3600))  # simulated: the file of an earlier process
threading.Thread(target=lambda: open(OUT, "w").write(str(p.wait())), daemon=True).start()
labutils.emit(pid=p.pid)
time.sleep(60)
"""


def test_no_sigusr1_to_a_process_whose_stack_file_is_not_its_own(tmp_path):
    out = tmp_path / "rc"
    r = run_isolated(f"OUT = {str(out)!r}\n" + STALE, timeout=3)
    assert r.outcome == "timed_out", r
    rc = out.read_text() if out.exists() else None
    assert rc != "-10", "the runner sent SIGUSR1 to a process that had no stack dump registered"


def test_a_registered_process_still_dumps_its_stack():
    r = run_isolated("import time\ntime.sleep(60)\n", timeout=3)
    assert r.outcome == "timed_out", r
    assert any("time.sleep" in text or "line 2" in text for text in r.stacks.values()), r.stacks


def test_a_process_in_its_exec_is_read_again_before_it_is_taken_for_one_to_kill(tmp_path, monkeypatch):
    # a resource tracker started just as the main process ended was seen with no command line (mid-exec) and
    # killed as a worker, its leak warning lost (6 runs in 40 under load): it is read again until it has one
    sleeper = subprocess.Popen(["sleep", "30"])
    procs = _procs.RunProcesses(str(tmp_path), sleeper.pid)
    try:
        reads = iter([("python", False, False), ("python", False, False),
                      ("python", True, True)])  # no command line twice, then the tracker's
        monkeypatch.setattr(_procs, "_identify", lambda pid: next(reads))
        assert procs._became_helper(procs.known[sleeper.pid]) is True
        monkeypatch.setattr(_procs, "_identify", lambda pid: ("python", False, False))
        t0 = time.monotonic()
        assert procs._became_helper(procs.known[sleeper.pid]) is False  # never named: not waited for long
        assert time.monotonic() - t0 < 2
    finally:
        sleeper.kill()
        sleeper.wait()
        procs.close()
