"""The review's remaining findings (../shared/reviews/runner.md: S3, S5, S6, W3's start-up, W5-W9, R1's warm
orphans), each with a test that fails without its fix. Where a machine's condition cannot be produced here
it is simulated, and the test says so."""

import os
import shutil
import subprocess
import sys
import tempfile
import time

import pytest

from labutils import run_isolated

# --------------------------------------------------------------------------- S5: SIGUSR1 and stale stack files
# A process of the run that does not catch SIGUSR1 (here `sleep`; in the review's scenario an exec'd worker,
# or a new process given the number of an earlier one) and a stacks/<pid>.txt for its number. At the time
# limit the runner asks for stacks; SIGUSR1's default action would end `sleep` with signal 10.
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


# --------------------------------------------------------------------------- S3: find_strays and others' runs
def _marked(run_dir, **kwargs):
    env = dict(os.environ, LABUTILS_RUN_DIR=run_dir)
    return subprocess.Popen(["sleep", "30"], env=env, **kwargs)


def _wait_listed(pid, present, seconds=3.0):
    from labutils.runner.ownership import find_strays

    deadline = time.monotonic() + seconds
    while True:
        listed = pid in find_strays()
        if listed == present or time.monotonic() > deadline:
            return listed
        time.sleep(0.05)


def test_find_strays_lists_this_users_stray_and_not_another_users():
    if os.getuid() != 0:
        pytest.skip("needs root to start a process as another user")
    gone = os.path.join(tempfile.gettempdir(), "labutils-run-gone-for-test")  # never made: a finished run
    mine, theirs = _marked(gone), _marked(gone, user=65534)
    try:
        assert _wait_listed(mine.pid, True), "this user's stray is not listed"
        assert not _wait_listed(theirs.pid, False), "another user's process is listed as this user's stray"
    finally:
        for p in (mine, theirs):
            p.kill()
            p.wait()


def test_find_strays_sees_a_run_dir_through_the_process_own_root(tmp_path):
    """A live run behind a private /tmp: its run dir exists in its mount namespace only (made here with
    ``unshare --mount`` and a tmpfs, as ``PrivateTmp=`` would), so it is not a stray."""
    if os.getuid() != 0 or shutil.which("unshare") is None:
        pytest.skip("needs root and unshare(1)")
    hidden = tmp_path / "private"
    hidden.mkdir()
    run_dir = str(hidden / "labutils-run-live")
    script = (f"mount -t tmpfs tmpfs {hidden} && mkdir {run_dir} && "
              f"LABUTILS_RUN_DIR={run_dir} exec sleep 30")
    p = subprocess.Popen(["unshare", "--mount", "--propagation", "private", "sh", "-c", script])
    try:
        deadline = time.monotonic() + 5
        while time.monotonic() < deadline:
            try:
                env = open(f"/proc/{p.pid}/environ", "rb").read()
            except OSError:
                env = b""
            if b"LABUTILS_RUN_DIR" in env:
                break
            if p.poll() is not None:
                pytest.skip("unshare --mount is not permitted here")
            time.sleep(0.02)
        assert not os.path.isdir(run_dir)  # invisible from here
        assert not _wait_listed(p.pid, False), "a live run behind a private /tmp is listed as a stray"
    finally:
        p.kill()
        p.wait()


# --------------------------------------------------------------------------- S6: OOM kills by pid number
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


# --------------------------------------------------------------------------- W8: replacing a busy template
def test_replacing_the_template_does_not_kill_another_threads_warm_run(monkeypatch):
    """The lab runs in a thread; meanwhile a cell runs after the kernel's environment changed, so the
    template is replaced. The lab's run must finish, not die of the old zygote's exit (PDEATHSIG)."""
    import threading

    from labutils.runner import warm

    first = run_isolated("pass", launcher="warm", timeout=60)  # a template for this environment
    assert first.outcome == "ok", first
    old = warm.template_pid()
    got = {}
    lab = threading.Thread(target=lambda: got.update(r=run_isolated(
        "import time, labutils\ntime.sleep(2.5)\nlabutils.emit(done=True)", launcher="warm", timeout=60)))
    lab.start()
    time.sleep(1.0)  # the lab's run is in flight
    monkeypatch.setenv("LABUTILS_TEST_NEW_TEMPLATE", "1")  # any variable an import might read
    cell = run_isolated("pass", launcher="warm", timeout=60)
    lab.join(60)
    assert cell.outcome == "ok" and warm.template_pid() != old, cell
    r = got["r"]
    assert r.outcome == "ok" and r.values.get("done"), r
    assert not os.path.exists(f"/proc/{old}") or open(f"/proc/{old}/stat").read().split()[2] == "Z", \
        "the replaced template was not closed once idle"
    monkeypatch.delenv("LABUTILS_TEST_NEW_TEMPLATE")
    warm.shutdown()


# --------------------------------------------------------------------------- W3: a template still starting
SLOW_ZYGOTE = """import runpy, sys, time
time.sleep({delay})
sys.argv = [{real!r}] + sys.argv[1:]
runpy.run_path({real!r}, run_name="__main__")
"""


def test_a_template_still_starting_does_not_take_the_runs_time(tmp_path, monkeypatch):
    """SIMULATED slow start (an NFS import of torch, a busy machine): the template's script sleeps 8 s
    first. A run with a 5 s timeout must not spend it waiting: it starts cold and finishes, and the
    template, left to start, serves the next run warm."""
    from labutils.runner import warm

    warm.shutdown()
    slow = tmp_path / "slow_zygote.py"
    slow.write_text(SLOW_ZYGOTE.format(delay=8, real=warm.ZYGOTE))
    monkeypatch.setattr(warm, "ZYGOTE", str(slow))
    try:
        r = run_isolated("print('done')", timeout=5)
        assert r.outcome == "ok" and r.stdout.strip() == "done", (r.outcome, r.launcher, r.stderr)
        assert r.launcher["kind"] == "cold" and "still starting" in r.launcher["why_cold"], r.launcher
        assert r.wall_time < 5, r.wall_time
        pid = warm.template_pid()
        assert pid is not None, "the template was discarded instead of left to start"
        nxt = run_isolated("print('warm')", timeout=60)
        assert nxt.outcome == "ok" and nxt.launcher["kind"] == "warm", nxt.launcher
        assert warm.template_pid() == pid and nxt.wall_time < 5, nxt.wall_time  # its start is not the run's time
    finally:
        warm.shutdown()


# --------------------------------------------------------------------------- W5: what a fresh process differs in
UMASK = "import os\nm = os.umask(0)\nos.umask(m)\nprint(oct(m))"


def test_a_changed_umask_gives_a_warm_run_the_kernels_new_umask():
    """A fresh process inherits the runner's umask now; the template's is that of its start."""
    from labutils.runner import warm

    first = run_isolated(UMASK, launcher="warm", timeout=60)
    old = os.umask(0o027)
    try:
        r = run_isolated(UMASK, launcher="warm", timeout=60)
    finally:
        os.umask(old)
    assert first.outcome == r.outcome == "ok", (first.stderr, r.stderr)
    assert r.stdout.strip() == "0o27" and first.stdout.strip() == oct(old), (first.stdout, r.stdout)
    assert r.launcher["kind"] == "warm", r.launcher
    warm.shutdown()


def test_an_install_into_site_packages_replaces_the_template(tmp_path, monkeypatch):
    """SIMULATED ``%pip install``: a directory standing for site-packages gets a new ``*.dist-info``, as an
    install does (the real ones are in the stamp list too, with torch's and numpy's ``__init__.py``)."""
    from labutils.runner import warm

    real = warm.package_dirs()
    assert any(p.endswith(os.path.join("torch", "__init__.py")) for p in real), real
    assert any(os.path.basename(p) in ("site-packages", "dist-packages") for p in real), real
    site = tmp_path / "site-packages"
    site.mkdir()
    monkeypatch.setattr(warm, "_packages", [*real, str(site)])
    assert run_isolated("pass", launcher="warm", timeout=60).outcome == "ok"
    before = warm.template_pid()
    assert run_isolated("pass", launcher="warm", timeout=60).outcome == "ok"
    assert warm.template_pid() == before  # nothing changed: the same template
    stamp = os.stat(site).st_mtime_ns
    (site / "newpkg-1.0.dist-info").mkdir()
    os.utime(site, ns=(stamp + 10**9, stamp + 10**9))  # a coarse-clock filesystem still sees the change
    r = run_isolated("pass", launcher="warm", timeout=60)
    assert r.outcome == "ok" and r.launcher["kind"] == "warm" and warm.template_pid() != before, r.launcher
    warm.shutdown()


# --------------------------------------------------------------------------- a killed runner's warm orphans
WARM_FORKER = """import os, time
pid = os.fork()
if pid == 0:
    time.sleep(120)
    os._exit(0)
with open({path!r} + ".tmp", "w") as fh:
    fh.write(str(pid))
os.rename({path!r} + ".tmp", {path!r})
time.sleep(120)
"""
RUNNER = """import sys
from labutils import run_isolated
run_isolated(open(sys.argv[1]).read(), launcher="warm", timeout=300)
"""


def test_a_killed_runners_warm_orphan_is_found_and_removed_from_proc_alone(tmp_path):
    """A kernel killed outright (SIGKILL, a restart) while a warm run's forked child lives: the template
    and the run's main process end with it, the forked child does not. Nothing of the runner's memory is
    left; this process never ran it: it is found (find_strays) and killed (the clean-up) by the template's
    mark in its environment, which names the dead runner."""
    from labutils.runner import ownership

    pid_file = tmp_path / "child.pid"
    cell = tmp_path / "cell.py"
    cell.write_text(WARM_FORKER.format(path=str(pid_file)))
    runs = tmp_path / "runs"
    runs.mkdir()
    env = {**os.environ, "TMPDIR": str(runs)}
    runner = subprocess.Popen([sys.executable, "-c", RUNNER, str(cell)], env=env)
    child = None
    try:
        child = _child_of(runner, pid_file, "the warm run did not start")
        assert ownership.template_mark(child) == (runner.pid, _procs_ticks(runner.pid)), "not a warm run"
        runner.kill()
        runner.wait()
        assert _alive(child), "the forked child should outlive its runner (it has no PDEATHSIG)"
        assert child in ownership.find_strays()
        done = ownership.clean_after_dead_runners(str(runs), force=True)
        assert child in done["processes"], done
        assert _gone_within(child, 5.0)
        assert not [n for n in os.listdir(runs) if n.startswith("labutils-run-")], os.listdir(runs)
    finally:
        _end(runner, child)


DETACHER = """import subprocess, sys, time
child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"], start_new_session=True)
with open({path!r} + ".tmp", "w") as fh:
    fh.write(str(child.pid))
import os
os.rename({path!r} + ".tmp", {path!r})
time.sleep(120)
"""
COLD_RUNNER = """import sys
from labutils import run_isolated
run_isolated(open(sys.argv[1]).read(), launcher="cold", timeout=300)
"""


def test_a_killed_runners_detached_child_is_removed_wherever_its_run_dir_was(tmp_path):
    """A cold run starts a process in a session of its own (out of the run's group and session), then the
    runner is killed outright. The run directory is in a temporary folder the next lab never looks at (a
    test session's own, here): the orphan is still found, by the runner's identity in its environment."""
    from labutils.runner import ownership

    pid_file = tmp_path / "child.pid"
    cell = tmp_path / "cell.py"
    cell.write_text(DETACHER.format(path=str(pid_file)))
    runs = tmp_path / "elsewhere"
    runs.mkdir()
    runner = subprocess.Popen([sys.executable, "-c", COLD_RUNNER, str(cell)], env={**os.environ, "TMPDIR": str(runs)})
    child = None
    try:
        child = _child_of(runner, pid_file, "the run did not start its child")
        assert ownership.runner_marks(child).get("LABUTILS_RUNNER") == (runner.pid, _procs_ticks(runner.pid))
        runner.kill()
        runner.wait()
        # asked at once: from now on any other lab's first clean-up (a neighbour test's kernel, under -n 3)
        # may remove this orphan too, as it should; a 0.5 s wait here lost that race once in a full run
        assert _alive(child), "a child in a session of its own outlives its runner"
        done = ownership.clean_after_dead_runners(str(tmp_path / "not-the-run-dirs-folder"), force=True)
        assert child in done["processes"], done
        assert _gone_within(child, 5.0)
    finally:
        _end(runner, child)
        shutil.rmtree(runs, ignore_errors=True)


def _child_of(runner, pid_file, why: str) -> int:
    """The pid the run wrote to ``pid_file`` (waited for up to 90 s, while the runner lives)."""
    deadline = time.monotonic() + 90
    while not pid_file.exists() and time.monotonic() < deadline and runner.poll() is None:
        time.sleep(0.1)
    assert pid_file.exists(), why
    return int(pid_file.read_text())


def _end(runner, child) -> None:
    """After the test, pass or fail: the runner killed, and the child too if it is still a lab run's."""
    from labutils.runner import ownership

    if runner.poll() is None:
        runner.kill()
        runner.wait()
    if child is not None and _alive(child) and ownership.runner_marks(child):
        os.kill(child, 9)


def _gone_within(pid: int, seconds: float) -> bool:
    deadline = time.monotonic() + seconds
    while _alive(pid) and time.monotonic() < deadline:
        time.sleep(0.05)
    return not _alive(pid)


def _procs_ticks(pid):
    from labutils.runner import procs

    return procs.start_ticks(pid)


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as fh:
            return fh.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


# --------------------------------------------------------------------------- W9: the live chart's USS
USS = "import torch, psutil, labutils\nlabutils.emit(uss=psutil.Process().memory_full_info().uss)"


def test_a_run_with_a_sample_listener_is_cold_so_its_uss_is_a_fresh_processes():
    """The live chart plots USS from on_sample; a warm main process shares torch's pages with the template
    and shows far less. Measured both ways: the warm figure is lower, and an on_sample run goes cold."""
    warm_run = run_isolated(USS, launcher="warm", timeout=60)
    charted = run_isolated(USS, on_sample=lambda sample: None, timeout=60)
    assert warm_run.launcher["kind"] == "warm", warm_run.launcher
    assert charted.launcher["kind"] == "cold" and "on_sample" in charted.launcher["why_cold"], charted.launcher
    assert charted.values["uss"] > warm_run.values["uss"] + 50 * 2**20, (charted.values, warm_run.values)


# --------------------------------------------------------------------------- one exception-chain walk
def test_one_chain_walk_for_the_kernel_the_diagnosis_and_the_notebook_preamble():
    import runpy

    from labutils.diagnosis import chain
    from labutils.diagnosis.evidence import _chain_of
    from labutils.kit.inkernel import _chain
    from labutils.runner import notebook

    try:
        try:
            raise ValueError("inner")
        except ValueError as inner:
            raise RuntimeError("outer") from inner
    except RuntimeError as exc:
        err = exc
    assert [(type(e).__name__, link) for e, link in _chain(err)] == [("RuntimeError", None), ("ValueError", "cause")]
    assert [(c.type, c.link) for _, c in _chain_of(err)] == [("RuntimeError", None), ("ValueError", "cause")]
    recs = chain.records(err)
    assert [(r["type"], r["link"], r["message"]) for r in recs] == [("RuntimeError", None, "outer"),
                                                                     ("ValueError", "cause", "inner")]
    preamble = runpy.run_path(os.path.join(os.path.dirname(notebook.__file__), "kernel_preamble.py"))
    assert os.path.samefile(preamble["_chain"].__code__.co_filename, chain.__file__)  # it runs this very file
