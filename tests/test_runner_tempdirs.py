"""multiprocessing's /tmp/pymp-* folder of a run whose process was killed: removed by the runner, by
identity (recorded when made, same inode); a neighbour's folder of the same kind is left alone."""

import os
import tempfile

import pytest

from labutils import run_isolated

KILLED = """
import multiprocessing.util as util, os, signal, labutils
path = util.get_temp_dir()
labutils.emit(path=path, there=os.path.isdir(path))
os.kill(os.getpid(), signal.SIGKILL)  # as the OOM killer or a time limit would: no exit handlers run
"""


@pytest.mark.parametrize("launcher", ["warm", "cold"])
def test_a_killed_run_leaves_no_pymp_folder(launcher):
    neighbour = tempfile.mkdtemp(prefix="pymp-")  # not the run's: must survive
    try:
        r = run_isolated(KILLED, launcher=launcher, timeout=60)
        assert r.returncode == -9 or r.signal == 9, r
        path = r.values["path"]
        assert os.path.basename(path).startswith("pymp-") and r.values["there"], r.values
        assert not os.path.exists(path), f"{path} was left behind"
        assert os.path.isdir(neighbour)
    finally:
        os.rmdir(neighbour)


# --------------------------------------------------------------------------- the run's own TMPDIR
# The script makes the three kinds of /tmp file seen left by the suite (a mkstemp file, multiprocessing's
# pymp-* folder, a child's own temporary file), then is stopped by its time limit: nothing of it may stay.
STOPPED = """
import os, subprocess, sys, tempfile, time, multiprocessing.util as util, labutils
fd, path = tempfile.mkstemp()
child = subprocess.run([sys.executable, "-c", "import tempfile; print(tempfile.mkdtemp())"],
                       capture_output=True, text=True, check=True).stdout.strip()
labutils.emit(run_dir=os.environ["LABUTILS_RUN_DIR"], made=[path, util.get_temp_dir(), child],
              tmp=tempfile.gettempdir(), vars=[os.environ.get(k) for k in ("TMPDIR", "TEMP", "TMP")])
time.sleep(60)
"""


@pytest.mark.parametrize("launcher", ["warm", "cold"])
def test_a_run_stopped_by_its_time_limit_leaves_no_temporary_file(launcher):
    r = run_isolated(STOPPED, launcher=launcher, timeout=4)
    assert r.outcome == "timed_out", r
    own = os.path.join(r.values["run_dir"], "tmp")
    assert r.values["tmp"] == own and r.values["vars"] == [own] * 3, r.values
    for path in r.values["made"]:
        assert os.path.dirname(path) == own, path  # the run's folder, not the shared /tmp
        assert not os.path.lexists(path), f"{path} was left behind"
    assert not os.path.lexists(r.values["run_dir"])


@pytest.mark.parametrize("launcher", ["warm", "cold"])
def test_a_run_under_a_deep_tmpdir_gets_a_short_folder_of_its_own_and_leaves_nothing(launcher, tmp_path,
                                                                                     monkeypatch):
    """A caller's temporary folder too deep for RUN_DIR/tmp (AF_UNIX sockets below it: at most 107 bytes),
    as macOS's /var/folders/... or a soak's folder per notebook: the run's folder is made in /tmp instead,
    and goes with the run. Before, the run fell back to the caller's folder and left its files there."""
    deep = tmp_path / ("d" * 60)
    deep.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(deep))  # where this process makes the run directory
    r = run_isolated(STOPPED, launcher=launcher, timeout=4)
    assert r.outcome == "timed_out", r
    own = r.values["tmp"]
    assert os.path.dirname(r.values["run_dir"]) == str(deep), r.values
    assert os.path.dirname(own) == "/tmp" and os.path.basename(own).startswith("labutils-tmp-"), r.values
    assert r.values["vars"] == [own] * 3, r.values
    for path in r.values["made"]:
        assert os.path.dirname(path) == own, path
    assert not os.path.lexists(own) and not os.path.lexists(r.values["run_dir"])
    assert os.listdir(deep) == []


def test_a_dead_runners_short_folder_goes_with_its_run_dir_by_identity(tmp_path, monkeypatch):
    import json
    import shutil
    import subprocess
    import sys

    from labutils.runner import ownership, procfs

    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path / ("d" * 60)))
    os.mkdir(tempfile.tempdir)
    dead, replaced = ownership.make_run_dir(), ownership.make_run_dir()
    p = subprocess.Popen([sys.executable, "-c", "pass"])
    ticks = procfs.start_ticks(p.pid)
    p.wait()
    short = {}
    for d in (dead, replaced):
        with open(os.path.join(d, "runner.json"), "w") as fh:
            json.dump({"pid": p.pid, "start_ticks": ticks}, fh)
        short[d] = ownership.run_temp_dir(d)
        assert short[d].startswith("/tmp/labutils-tmp-") and os.path.isdir(short[d]), short
    shutil.rmtree(short[replaced])
    os.mkdir(short[replaced])  # the same name, made again (somebody else's now): maybe even the same inode
    orphan = ownership.make_run_dir()  # its run directory is gone (a test's tmp_path, removed by pytest)
    with open(os.path.join(ownership.run_temp_dir(orphan), ownership.TMP_OWNER)) as fh:
        owner = json.load(fh)
    short[orphan] = ownership.run_temp_dir(orphan)
    with open(os.path.join(short[orphan], ownership.TMP_OWNER), "w") as fh:
        json.dump({**owner, "pid": p.pid, "start_ticks": ticks}, fh)  # its runner is dead
    shutil.rmtree(orphan)
    live = ownership.make_run_dir()  # this process's own: alive, kept
    short[live] = ownership.run_temp_dir(live)
    try:
        done = ownership.clean_after_dead_runners(tempfile.tempdir, force=True)
        assert sorted(done["run_dirs"]) == sorted([dead, replaced]), done
        assert not os.path.lexists(short[dead]) and not os.path.lexists(dead)
        assert os.path.isdir(short[replaced])
        assert sorted(done["tmp_dirs"]) == sorted([short[dead], short[orphan]]), done
        assert not os.path.lexists(short[orphan]) and os.path.isdir(short[live]) and os.path.isdir(live)
    finally:
        for path in short.values():
            shutil.rmtree(path, ignore_errors=True)


def test_a_learners_own_tmpdir_wins():
    code = "import tempfile, labutils; labutils.emit(tmp=tempfile.gettempdir())"
    mine = tempfile.mkdtemp(prefix="labutils-test-")
    try:
        r = run_isolated(code, env={"TMPDIR": mine}, timeout=60)
        assert r.values["tmp"] == mine, r
    finally:
        os.rmdir(mine)


RANK = """
import os, tempfile, multiprocessing.util as util, labutils
labutils.emit(**{"rank" + os.environ["RANK"]: dict(
    tmp=tempfile.gettempdir(), pymp=util.get_temp_dir(), error_file=os.environ.get("TORCHELASTIC_ERROR_FILE"),
    run_dir=os.environ["LABUTILS_RUN_DIR"])})  # one key per rank: later keys win
"""


def test_torchrun_and_its_ranks_use_the_runs_temporary_folder(tmp_path):
    from labutils.runner.torchrun import run_torchrun

    script = tmp_path / "rank.py"
    script.write_text(RANK)
    r = run_torchrun(str(script), nproc_per_node=2, timeout=120)
    assert r.outcome == "ok", r
    assert sorted(r.values) == ["rank0", "rank1"], r.values
    ranks = [r.values["rank0"], r.values["rank1"]]
    own = os.path.join(ranks[0]["run_dir"], "tmp")
    for e in ranks:
        assert e["tmp"] == own and os.path.dirname(e["pymp"]) == own, e
        # torchelastic's log folder (torchelastic_*), made by the launcher with tempfile.mkdtemp
        assert e["error_file"] and e["error_file"].startswith(own + os.sep + "torchelastic_"), e
    assert not os.path.lexists(own)


# --------------------------------------------------------------------------- the session's own TMPDIR
LEAVES = """
import os, tempfile, multiprocessing.util as util
fd, path = tempfile.mkstemp()
print(path, util.get_temp_dir(), tempfile.mkstemp(dir=os.environ["SHARED"])[1])
os._exit(0)  # no exit handlers: as a worker or kernel that is killed
"""


def test_the_sessions_processes_use_its_temporary_folder_and_a_shared_tmp_file_fails_it(tmp_path):
    import subprocess
    import sys

    from labsuite import leaks

    shared = tmp_path  # stands in for the shared /tmp: the check scans the folder given as ``tmp``
    session = leaks.Session(folder=tempfile.mkdtemp(prefix="labutils-session-"), tmp=str(shared))
    os.mkdir(session.tmpdir)
    session.before = {leaks.SHM: leaks._entries(leaks.SHM), str(shared): leaks._entries(str(shared))}
    env = session.environ(dict(os.environ, SHARED=str(shared)))
    try:
        out = subprocess.run([sys.executable, "-c", LEAVES], env=env, capture_output=True, text=True,
                             check=True, timeout=60).stdout.split()
        made, pymp, in_shared = out
        assert os.path.dirname(made) == session.tmpdir and os.path.dirname(pymp) == session.tmpdir, out
        left = session.leftovers(wait=0)
        assert [item.path for item in left] == [in_shared], left  # by identity: the recorded file only
        assert leaks.failing(left) == left
    finally:
        session.close()
    assert not os.path.lexists(made) and not os.path.lexists(pymp)


def test_a_killed_test_sessions_folder_is_removed_by_the_next_and_a_live_ones_kept(tmp_path):
    """A pytest killed by a signal never runs its clean-up: the next session removes its folder, by the
    owner's identity (dead), and keeps a live session's and a folder without an owner."""
    import json
    import subprocess
    import sys

    from labsuite import leaks

    from labutils.runner import procs

    gone = subprocess.Popen([sys.executable, "-c", "pass"])
    ticks = procs.start_ticks(gone.pid)
    gone.wait()
    folders = {}
    for name, owner in (("dead", {"pid": gone.pid, "start_ticks": ticks}),
                        ("live", {"pid": os.getpid(), "start_ticks": procs.start_ticks(os.getpid())}),
                        ("unowned", None)):
        folders[name] = tmp_path / f"{leaks.PREFIX}{name}"
        (folders[name] / "tmp").mkdir(parents=True)
        if owner is not None:
            (folders[name] / leaks.OWNER).write_text(json.dumps(owner))
    removed = leaks.remove_dead_sessions(str(tmp_path))
    assert removed == [str(folders["dead"])] and not folders["dead"].exists()
    assert folders["live"].is_dir() and folders["unowned"].is_dir()
