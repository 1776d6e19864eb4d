"""The review's ranked findings (shared/reviews/runner.md), one test each: each fails without its fix."""

from __future__ import annotations

import errno
import json
import os
import resource
import shutil
import signal
import socket
import subprocess
import sys
import time

import psutil
import pytest

from labutils import run_isolated
from labutils.runner import capabilities, cgroupfs, ownership, procfs
from labutils.runner import cgroup as _cgroup
from labutils.runner import procs as _procs
from labutils.runner import warm as _warm
from labutils.runner.cgroup import RunCgroup


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


# ---------------------------------------------------------------- S1 / W2: pidfd probed by trying
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


def test_the_template_kills_a_child_it_cannot_hand_over(tmp_path):
    """SIMULATED in the template only: its pidfd_open fails after the fork; the child must not run on."""
    ours, theirs = socket.socketpair()
    code = ("import os, runpy, sys\n"
            "def refuse(pid, flags=0):\n    raise OSError(38, 'Function not implemented')\n"
            "os.pidfd_open = refuse\nsys.argv = [sys.argv[1], sys.argv[2]]\n"
            "runpy.run_path(sys.argv[0], run_name='__main__')\n")
    z = subprocess.Popen([sys.executable, "-c", code, _warm.ZYGOTE, str(theirs.fileno())],
                         pass_fds=(theirs.fileno(),), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    theirs.close()
    try:
        ours.settimeout(120)
        ours.sendall(b'{"op": "ping"}\n')
        assert b"ok" in ours.recv(4096)
        run_dir = tmp_path / "run"
        run_dir.mkdir()
        out = open(tmp_path / "out", "wb")
        req = json.dumps({"op": "spawn", "run_dir": str(run_dir), "cwd": str(tmp_path), "env": dict(os.environ)})
        socket.send_fds(ours, [req.encode() + b"\n"], [out.fileno(), out.fileno()])
        reply = json.loads(ours.recv(4096))
        out.close()
        assert "error" in reply and "killed and reaped" in reply["error"]
        assert not psutil.pid_exists(reply["pid"])  # killed and reaped: not even a zombie
    finally:
        ours.close()
        z.wait(timeout=30)


# ---------------------------------------------------------------- S2: the leader's bare number
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


# ---------------------------------------------------------------- C1: a limit is the kernel's once read back
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


def test_the_systemd_probe_reads_the_limit_back():
    cap = capabilities.systemd_verdict("max", 64 * 2**20, "tried", "watchdog")
    assert not cap.available and "enforces nothing" in cap.result
    assert capabilities.systemd_verdict(str(64 * 2**20), 64 * 2**20, "tried", "watchdog").available


# ---------------------------------------------------------------- C2: locate() takes only the run's unit
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


# ---------------------------------------------------------------- R2: output capped
def test_output_is_read_to_a_cap_and_the_result_says_what_was_cut(monkeypatch):
    from labutils.runner import evidence

    monkeypatch.setattr(evidence, "OUTPUT_CAP", 64 * 1024)
    r = run_isolated("import sys\nfor i in range(40000):\n    print(f'line {i:06d}')\n", timeout=60)
    assert r.ok
    cut = r.truncated["stdout"]
    assert cut["size"] == 40000 * 12 and cut["cap"] == 64 * 1024 and cut["cut"] == cut["size"] - 64 * 1024
    assert len(r.stdout) < 70 * 1024 and "line 000000" in r.stdout and "line 039999" in r.stdout
    assert "bytes cut here" in r.stdout and "stderr" not in r.truncated


def test_a_run_that_floods_its_output_is_stopped(monkeypatch):
    from labutils.runner import monitor

    monkeypatch.setattr(monitor, "OUTPUT_LIMIT", 4 * 2**20)
    r = run_isolated("while True:\n    print('x' * 1000)\n", timeout=60)
    assert r.outcome == "failed" and "MiB to stdout/stderr" in r.reason and r.wall_time < 30, r.reason


def test_a_run_that_floods_its_evidence_records_is_stopped(monkeypatch):
    """labutils.emit in a loop writes nothing to stdout, but fills RUN_DIR/emitted.jsonl in the shared /tmp."""
    from labutils.runner import monitor

    monkeypatch.setattr(monitor, "EVIDENCE_LIMIT", 2 * 2**20)
    r = run_isolated("import labutils\nwhile True:\n    labutils.emit(x='y' * 1000)\n", timeout=60)
    assert r.outcome == "failed" and "emitted.jsonl" in r.reason and r.wall_time < 30, (r.outcome, r.reason)


# ---------------------------------------------------------------- R1 / C3: after a dead runner
def _dead_identity():
    p = subprocess.Popen([sys.executable, "-c", "pass"])
    ticks = procfs.start_ticks(p.pid)
    p.wait()
    return p.pid, ticks


def test_what_a_dead_runner_left_is_removed_by_identity(tmp_path):
    pid, ticks = _dead_identity()
    dead = tmp_path / "labutils-run-dead"
    dead.mkdir()
    (dead / "runner.json").write_text(json.dumps({"pid": pid, "start_ticks": ticks}))
    straggler = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"],
                                 env={**os.environ, "LABUTILS_RUN_DIR": str(dead)})
    me = os.getpid()
    alive = tmp_path / "labutils-run-alive"
    alive.mkdir()
    (alive / "runner.json").write_text(json.dumps({"pid": me, "start_ticks": procfs.start_ticks(me)}))
    reused = tmp_path / "labutils-run-reused"  # the number is a live process's, but not the writer's
    reused.mkdir()
    (reused / "runner.json").write_text(json.dumps({"pid": me, "start_ticks": procfs.start_ticks(me) - 1}))
    bare = tmp_path / "labutils-run-bare"  # no identity: never removed
    bare.mkdir()
    try:
        time.sleep(0.3)
        done = ownership.clean_after_dead_runners(str(tmp_path), force=True)
        assert straggler.wait(timeout=5) == -signal.SIGKILL
        assert sorted(os.path.basename(d) for d in done["run_dirs"]) == ["labutils-run-dead", "labutils-run-reused"]
        assert alive.is_dir() and bare.is_dir() and not dead.exists()
        assert straggler.pid in done["processes"]
    finally:
        if straggler.poll() is None:
            straggler.kill()
            straggler.wait()


def test_a_run_dir_names_its_runner():
    d = ownership.make_run_dir()
    try:
        owner = json.load(open(os.path.join(d, "runner.json")))
        assert owner["pid"] == os.getpid() and owner["start_ticks"] == procfs.start_ticks(os.getpid())
    finally:
        shutil.rmtree(d)


def test_a_dead_runners_cgroup_is_removed_and_a_live_ones_kept():
    version, parent = _cgroup.own_cgroup("memory")
    if version is None or not os.access(parent, os.W_OK):
        pytest.skip(f"no writable memory cgroup here ({parent})")
    pid, ticks = _dead_identity()
    dead = os.path.join(parent, f"labutils-run-{pid}.{ticks}-0123abcd")
    mine = os.path.join(parent, f"labutils-run-{_cgroup.creator_tag()}-0123abcd")
    try:
        os.mkdir(dead)
        os.mkdir(mine)
    except OSError as exc:
        pytest.skip(f"cannot make a child cgroup here: {exc}")
    try:
        done = ownership.clean_after_dead_runners("/nonexistent", force=True)
        assert dead in done["cgroups"] and not os.path.exists(dead) and os.path.isdir(mine)
    finally:
        for d in (dead, mine):
            if os.path.isdir(d):
                os.rmdir(d)


def test_a_dead_runners_cgroup_processes_are_killed_without_pidfds(no_pidfd):
    """The clean-up of a dead runner's group on a kernel without pidfds (simulated, see no_pidfd): its
    process is still killed, by its start time checked around the membership check."""
    version, parent = _cgroup.own_cgroup("memory")
    if version != 1 or not os.access(parent, os.W_OK):
        pytest.skip(f"needs a writable v1 memory cgroup to move a process into ({parent})")
    pid, ticks = _dead_identity()
    dead = os.path.join(parent, f"labutils-run-{pid}.{ticks}-0123abce")
    try:
        os.mkdir(dead)
    except OSError as exc:
        pytest.skip(f"cannot make a child cgroup here: {exc}")
    sleeper = subprocess.Popen(["sleep", "60"])
    try:
        with open(os.path.join(dead, "cgroup.procs"), "w") as fh:  # a group this test made, for its own child
            fh.write(str(sleeper.pid))
        done = ownership.clean_after_dead_runners("/nonexistent", force=True)
        assert sleeper.wait(timeout=5) == -signal.SIGKILL
        assert dead in done["cgroups"] and not os.path.exists(dead)
    finally:
        if sleeper.poll() is None:
            sleeper.kill()
            sleeper.wait()
        if os.path.isdir(dead):
            os.rmdir(dead)


def test_kill_verified_signals_only_while_the_check_holds(no_pidfd):
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


# ---------------------------------------------------------------- R4: the monitor survives a bad tick
def test_the_monitor_survives_a_bad_tick_and_says_so(monkeypatch):
    from labutils.runner import monitor

    real, calls = monitor._rss, []

    def flaky(pid):
        calls.append(pid)
        if len(calls) == 1:
            raise RuntimeError("a bad tick")
        return real(pid)

    monkeypatch.setattr(monitor, "_rss", flaky)
    r = run_isolated("import time\ntime.sleep(1)\n", timeout=30)
    assert r.ok and any("a bad tick" in e for e in r.monitor_errors), r.monitor_errors
    assert r.peak_rss  # later ticks still measured the run


def test_a_watchdog_that_cannot_watch_stops_the_run(monkeypatch):
    from labutils.runner import monitor

    def broken(pid):
        raise RuntimeError("no /proc")

    monkeypatch.setattr(monitor, "_rss", broken)
    r = run_isolated("import time\ntime.sleep(60)\n", timeout=60, memory_budget="300M",
                     memory_enforcement="watchdog")
    assert r.outcome == "failed" and "could not watch" in r.reason and r.wall_time < 30


# ---------------------------------------------------------------- R5: poll, not select
def test_runs_work_in_a_process_holding_more_than_1024_fds():
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard != resource.RLIM_INFINITY and hard < 1200:
        pytest.skip("the hard limit on open files is below 1200")
    resource.setrlimit(resource.RLIMIT_NOFILE, (max(soft, 1200), hard))
    held = []
    try:
        while len(held) < 1100:
            held.append(os.open(os.devnull, os.O_RDONLY))
        r = run_isolated("import time\ntime.sleep(0.3)\nprint('fine')\n", timeout=30)
        assert r.ok and r.stdout.strip() == "fine", (r.outcome, r.stderr)
    finally:
        for fd in held:
            os.close(fd)
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))


# ---------------------------------------------------------------- W3: the template channel
def test_a_template_that_does_not_answer_is_discarded(monkeypatch):
    if not _warm.supported():
        pytest.skip("no warm launcher here")
    run_isolated("print(1)")  # a template now exists
    template = _warm._get({k: v for k, v in os.environ.items() if k != "LABUTILS_RUN_DIR"})
    os.kill(template.proc.pid, signal.SIGSTOP)  # a template stuck (in an NFS import, say): no answer comes
    with pytest.raises(OSError, match="did not answer"):
        template.ask({"op": "ping"}, timeout=0.3)
    assert template.poisoned and not template.matches(template.env)
    assert template.proc.poll() is not None  # discarded: killed, never asked again
    r = run_isolated("print(2)")  # a new template serves the next run; no answer is read out of turn
    assert r.ok and r.launcher["kind"] == "warm" and r.stdout.strip() == "2"


# ---------------------------------------------------------------- W4: env before import torch
def test_env_set_before_import_torch_starts_cold_and_takes_effect():
    cell = ('import os\nos.environ["OMP_NUM_THREADS"] = "1"\nimport torch, labutils\n'
            'labutils.emit(n=torch.get_num_threads())\n')
    r = run_isolated(cell, timeout=60)
    assert r.ok and r.launcher["kind"] == "cold" and "environment variable" in r.launcher["why_cold"]
    assert r.values["n"] == 1
    plain = run_isolated("import torch, os\nos.environ['X'] = '1'\n", timeout=60)
    assert plain.launcher["kind"] == ("warm" if _warm.supported() else "cold")


# ---------------------------------------------------------------- the start method of a learner's script
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


def test_doctor_lists_each_capability_and_warns_without_pidfd(no_pidfd):
    from labutils import doctor

    check = doctor()["runner"]
    names = [c["name"] for c in check.data["capabilities"]]
    assert names[:4] == ["pidfd", "cgroup_memory", "cgroup_pids", "kmsg"]
    assert check.status == "WARN" and "pidfd: no" in check.detail and "instead:" in check.detail
    assert all(c["tried"] and c["result"] for c in check.data["capabilities"])
