"""After a run and after a dead runner: what the runner removes, by identity (run directories, cgroups,
orphaned processes, warm or cold), what it keeps (a live runner's, another user's), and find_strays."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time

import pytest
from test_machine_capabilities import no_pidfd  # noqa: F401 - the fixture, defined there

from labutils.kit import leftovers
from labutils.runner import cgroup as _cgroup
from labutils.runner import ownership, procfs
from labutils.runner.isolate import run_isolated


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


@pytest.mark.usefixtures("no_pidfd")
def test_a_dead_runners_cgroup_processes_are_killed_without_pidfds():
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


FILE_SYSTEM_KEPT = '''
import torch
import torch.multiprocessing as mp
from torch.utils.data import DataLoader, Dataset

mp.set_sharing_strategy("file_system")


class Tiles(Dataset):
    def __len__(self):
        return 40

    def __getitem__(self, i):
        return torch.full((4, 4), float(i))


if __name__ == "__main__":
    kept = [b for b in DataLoader(Tiles(), batch_size=2, num_workers=2)]  # held until the interpreter ends
    print(len(kept))
'''


def test_torch_shm_manager_cleans_up_after_the_script_as_under_python(tmp_path, no_leaks):
    """Under file_system the batches still alive at exit are unlinked by torch_shm_manager after the main
    process is gone (python leaves none either): the runner waits for it as a helper, so the run leaves no
    file for the runner to remove. The kernel keeps 15 characters of its name ('torch_shm_manag'): the
    runner once missed it by the full name and killed it first."""
    script = tmp_path / "kept.py"
    script.write_text(FILE_SYSTEM_KEPT)
    result = run_isolated(file=str(script), launcher="cold", timeout=120)
    assert result.ok and result.stdout.strip() == "20", result.stderr
    assert result.shm_removed == [] and leftovers.not_clean({"run": result}) == {}, result.shm_removed[:3]
