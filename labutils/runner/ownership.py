"""What belongs to a run, and cleaning up after it: its /dev/shm files (by identity), the leak ledger, the
processes left over from finished runs, and what a runner that died left behind."""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import tempfile
import threading
import time
from typing import Mapping, Optional, Sequence

import psutil

from . import capabilities as _caps
from . import procs as _procs
from . import rundir as _rd
from . import warm as _warm
from .cgroupfs import own_cgroup, read_file
from .procfs import start_ticks, start_wall, stat_fields

_SHM = "/dev/shm"


def shm_entries() -> set:
    try:
        return set(os.listdir(_SHM))
    except OSError:
        return set()


def torch_segment_pid(name: str) -> Optional[int]:
    """The pid in a ``/dev/shm`` name PyTorch gives a batch's segment (``torch_<pid>_<n>_<k>``), else None."""
    parts = (name or "").split("_")
    if name.startswith("torch_") and len(parts) > 2 and parts[1].isdigit():
        return int(parts[1])
    return None


def owned_shm(before: set, recorded: Mapping[str, Optional[int]], procs_by_pid: Mapping[int, int]) -> list:
    """Names of /dev/shm files this run created and that still exist.

    * ``sem.mp-*``: in ``recorded`` (name -> inode: ``RunRecords.created_shm``), with the same inode;
    * ``torch_<pid>_*``: not there when the run began, ``<pid>`` is a verified process of the run, and the
      file was last changed after that process started (so not by an earlier holder of the number).
    ``procs_by_pid`` maps each verified pid to its start time in clock ticks.
    """
    owned = []
    now = shm_entries()
    for name in now - before:
        path = os.path.join(_SHM, name)
        try:
            st = os.stat(path)
        except OSError:
            continue
        if name in recorded:
            if recorded[name] is None or recorded[name] == st.st_ino:
                owned.append(name)
        elif torch_segment_pid(name) in procs_by_pid:
            ticks = procs_by_pid[torch_segment_pid(name)]
            if ticks is not None and min(st.st_ctime, st.st_mtime) >= start_wall(ticks) - 0.02:
                owned.append(name)
    return sorted(owned)


def remove_temp_dirs(recorded: Sequence[tuple]) -> list:
    """Remove the multiprocessing temp folders the run's processes recorded (``(path, inode)``:
    ``RunRecords.created_tmp``) that are still there with the same inode: a process killed before its exit
    handlers ran leaves its ``pymp-*`` folder behind."""
    left = []
    for path, ino in recorded:
        try:
            st = os.lstat(path)
        except OSError:
            continue
        if ino is not None and st.st_ino != ino:
            continue  # the same name, made again by somebody else
        shutil.rmtree(path, ignore_errors=True)
        if os.path.lexists(path):
            left.append(path)
    return left


def remove_files(names: Sequence[str]) -> tuple:
    removed, left = [], []
    for name in names:
        try:
            os.unlink(os.path.join(_SHM, name))
            removed.append(name)
        except FileNotFoundError:
            pass
        except OSError:
            left.append(name)
    return removed, left


LEDGER_ENV = "LABUTILS_SHM_LEDGER"


def ledger(created: list, leftover: list, ticks: Mapping) -> None:
    """Append what this run created in /dev/shm, and its pids, to the file named by ``LABUTILS_SHM_LEDGER``
    (set by a test harness, inherited by every process below it): leak checks by identity, not by a diff of
    a /dev/shm that neighbours share."""
    path = os.environ.get(LEDGER_ENV)
    if not path:
        return
    record = {"created": list(created), "leftover": list(leftover), "pids": sorted(p for p in ticks if p)}
    try:
        with open(path, "a", encoding="utf-8") as fh:
            fh.write(json.dumps(record) + "\n")
    except OSError:
        pass


def find_strays() -> list:
    """Pids of this user's processes left over from finished isolated runs (expected: ``[]``).

    One has outlived its run when its environment names a run directory that is gone (as that process sees
    the file system, through ``/proc/PID/root``: a private /tmp hides a live run's directory from here), or
    a runner that is dead, or (a warm run's forked process, known by the template's mark) when its
    session's main process is gone. This is a report for a person to read, not a kill list: a pid listed
    here may be gone or reused by the time it is read.
    """
    strays = []
    me = os.getuid()
    for proc in psutil.process_iter(["pid"]):
        try:
            if proc.uids().real != me or proc.status() == psutil.STATUS_ZOMBIE:
                continue
            run_dir = proc.environ().get("LABUTILS_RUN_DIR")
            if run_dir and not _dir_seen_by(proc.pid, run_dir):
                strays.append(proc.pid)
            elif _outlived_its_run(proc.pid):
                strays.append(proc.pid)
        except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess, OSError, ValueError, IndexError):
            continue
    return strays


def template_mark(pid: int) -> Optional[tuple]:
    """``(runner pid, runner start ticks)`` from the template mark in ``pid``'s environment, or None."""
    return runner_marks(pid).get(_warm.TEMPLATE_ENV)


def runner_marks(pid: int) -> dict:
    """The runner identities in ``pid``'s environment (as it was started, from /proc): ``{variable: (runner
    pid, runner start ticks)}`` for the template's mark and the run's (``LABUTILS_TEMPLATE``,
    ``LABUTILS_RUNNER``); empty for a process that is no lab run's."""
    try:
        with open(f"/proc/{pid}/environ", "rb") as fh:
            env = fh.read()
    except OSError:
        return {}
    found = {}
    for name in (_warm.TEMPLATE_ENV, _warm.RUNNER_ENV):
        key = name.encode() + b"="
        for item in env.split(b"\0"):
            if item.startswith(key):
                try:
                    runner, ticks = item[len(key):].split(b".")
                    found[name] = (int(runner), int(ticks))
                except ValueError:
                    pass
                break
    return found


def _dead_runner(pid: int) -> Optional[tuple]:
    """The marks of ``pid`` if one of them names a dead runner (its orphan), else None."""
    marks = runner_marks(pid)
    if any(not runner_alive(*mark) for mark in marks.values()):
        return tuple(sorted(marks.items()))
    return None


def _outlived_its_run(pid: int) -> bool:
    if _dead_runner(pid) is not None:
        return True  # its runner is dead: nothing supervises it (the template and its runs end with it)
    mark = template_mark(pid)
    fields = stat_fields(pid)
    if mark is None or not fields:
        return False
    sid, ticks = int(fields[3]), int(fields[19])
    if sid == pid:
        return False  # a session's own leader: the template, or a warm run's main process, supervised
    leader = start_ticks(sid)
    return leader is None or leader > ticks  # its run's main process is gone (the number free or reused)


def _dir_seen_by(pid: int, path: str) -> bool:
    """Is ``path`` a directory in ``pid``'s view of the file system? True when that cannot be read (not
    provably missing, so not a stray)."""
    if not os.path.isabs(path) or os.path.isdir(path):
        return True
    root = f"/proc/{pid}/root"
    if not os.path.isdir(root + "/"):
        return True  # its root cannot be read from here
    return os.path.isdir(root + path)


def leftover_shm() -> list:
    """``/dev/shm`` entries named like PyTorch segments (``torch_*``) or multiprocessing semaphores."""
    return sorted(n for n in shm_entries() if n.startswith(("torch_", "sem.mp-")))



RUN_DIR_PREFIX = "labutils-run-"
_cleaned = threading.Event()
_NAME = re.compile(r"^labutils-(?:run|pids|probe)-(\d+)\.(\d+)-[0-9a-f]+$")


def make_run_dir() -> str:
    """A new run directory (``mkdtemp``), with ``runner.json`` naming its runner by pid and start ticks, and
    the run's own temporary folder (see :func:`run_temp_dir`)."""
    run_dir = tempfile.mkdtemp(prefix=RUN_DIR_PREFIX)
    me = os.getpid()
    with open(os.path.join(run_dir, _rd.RUNNER), "w", encoding="utf-8") as fh:
        json.dump({"pid": me, "start_ticks": start_ticks(me), "uid": os.getuid()}, fh)
    inside = os.path.join(run_dir, _rd.TMP)
    if len(inside) <= _rd.TMP_MAX_LEN:
        os.mkdir(inside, 0o700)
        return run_dir
    # Too deep for the sockets made below it (macOS's /var/folders/..., a test's nested TMPDIR): a folder
    # in the short /tmp, known by an owner file whose token the run directory records (see _tmp_elsewhere)
    for base in _SHORT_TMP_BASES:
        try:
            short = tempfile.mkdtemp(prefix=TMP_DIR_PREFIX, dir=base)
        except OSError:
            continue
        if len(short) > _rd.TMP_MAX_LEN:
            os.rmdir(short)
            continue
        token = os.urandom(8).hex()  # an inode number is reused at once after a removal: the token is not
        with open(os.path.join(short, TMP_OWNER), "w", encoding="utf-8") as fh:
            json.dump({"token": token, "pid": me, "start_ticks": start_ticks(me), "uid": os.getuid()}, fh)
        st = os.lstat(short)
        with open(os.path.join(run_dir, _rd.TMP_ELSEWHERE), "w", encoding="utf-8") as fh:
            json.dump({"path": short, "dev": st.st_dev, "ino": st.st_ino, "token": token}, fh)
        break
    return run_dir


#: a run's temporary folder outside its run directory (see make_run_dir) is made in the first of these
_SHORT_TMP_BASES = ("/tmp", "/var/tmp")
TMP_DIR_PREFIX = "labutils-tmp-"
TMP_OWNER = ".labutils-owner.json"  #: in that folder: its runner and the token its run directory records


def _short_owner(path: str) -> Optional[dict]:
    """The owner record of a ``labutils-tmp-*`` folder, if it is a real folder of this user's with one."""
    if not os.path.basename(path).startswith(TMP_DIR_PREFIX):
        return None
    try:
        st = os.lstat(path)
    except OSError:
        return None
    if not os.path.isdir(path) or os.path.islink(path) or st.st_uid != os.getuid():
        return None
    owner = _rd.read_json(os.path.join(path, TMP_OWNER))
    return owner if isinstance(owner, dict) and isinstance(owner.get("token"), str) else None


def _tmp_elsewhere(run_dir: str) -> Optional[str]:
    """The run's temporary folder outside its run directory, if it is still the folder made for it (same
    device and inode, this user's, its owner file holding the token the run directory records)."""
    rec = _rd.read_json(os.path.join(run_dir, _rd.TMP_ELSEWHERE))
    if not isinstance(rec, dict) or not isinstance(rec.get("path"), str):
        return None
    path = rec["path"]
    owner = _short_owner(path)
    if owner is None or owner["token"] != rec.get("token"):
        return None  # gone, replaced or unreadable: not provably the run's, so left alone
    st = os.lstat(path)
    return path if (st.st_dev, st.st_ino) == (rec.get("dev"), rec.get("ino")) else None


def run_temp_dir(run_dir: str) -> Optional[str]:
    """The folder a run's processes get as TMPDIR/TEMP/TMP (``rundir.TMP``): ``RUN_DIR/tmp``, or where that
    path is too long for the AF_UNIX sockets made below it, a ``labutils-tmp-*`` folder in /tmp made for this
    run. None where neither could be made: the run then uses the caller's temporary folder and
    :func:`remove_temp_dirs` removes the pymp-* folders it recorded."""
    path = os.path.join(run_dir, _rd.TMP)
    if len(path) <= _rd.TMP_MAX_LEN and os.path.isdir(path):
        return path
    return _tmp_elsewhere(run_dir)


def remove_run_dir(run_dir: str) -> Optional[str]:
    """Remove a run directory and its temporary folder, wherever that was made; returns the temporary
    folder it removed outside the run directory, if any."""
    elsewhere = _tmp_elsewhere(run_dir)
    if elsewhere is not None:
        shutil.rmtree(elsewhere, ignore_errors=True)
    shutil.rmtree(run_dir, ignore_errors=True)
    return elsewhere


def runner_alive(pid, ticks) -> bool:
    """Is the process that wrote ``pid``/``ticks`` still running? By identity: a live process with that
    number but another start time is someone else, and the writer is dead."""
    if not isinstance(pid, int) or not isinstance(ticks, int):
        return True  # no identity recorded: not provably dead, so not ours to remove
    now = start_ticks(pid)
    return now is not None and now == ticks


def clean_after_dead_runners(tmp: Optional[str] = None, force: bool = False) -> dict:
    """Once per process: remove what runners killed outright (SIGKILL, a kernel restart) left behind.

    * run directories in the temp folder whose ``runner.json`` names a dead runner of this user: every
      live process carrying that directory in its environment is SIGKILLed (through a pidfd, verified),
      then the directory is removed;
    * every live process of this user whose environment names a dead runner (``LABUTILS_RUNNER``, or the
      warm template's ``LABUTILS_TEMPLATE``), wherever its run directory was: SIGKILLed, verified by a handle;
    * ``labutils-tmp-*`` folders in /tmp (a run's temporary folder where its run directory's path was too
      long) whose owner file names a dead runner;
    * the lab's empty cgroups (``labutils-run-PID.TICKS-*``, ``labutils-pids-...``) under this process's
      own memory and pids cgroups whose creator is dead; their processes are killed first.

    A directory or group without a readable identity is left alone. Returns what was removed.
    """
    if _cleaned.is_set() and not force:
        return {}
    _cleaned.set()
    done = {"run_dirs": [], "processes": [], "cgroups": [], "tmp_dirs": []}
    _clean_run_dirs(tmp or tempfile.gettempdir(), done)
    _clean_orphans_of_dead_runners(done)
    _clean_short_tmp_dirs(done)
    _clean_cgroups(done)
    return done


def _clean_short_tmp_dirs(done: dict) -> None:
    for base in _SHORT_TMP_BASES:
        for path in _prefixed(base, TMP_DIR_PREFIX):
            owner = _short_owner(path)
            if owner is None or runner_alive(owner.get("pid"), owner.get("start_ticks")):
                continue
            shutil.rmtree(path, ignore_errors=True)
            done["tmp_dirs"].append(path)


def _clean_orphans_of_dead_runners(done: dict) -> None:
    me = os.getuid()
    try:
        entries = [int(e) for e in os.listdir("/proc") if e.isdigit()]
    except OSError:
        return
    for pid in entries:
        try:
            if pid == os.getpid() or os.stat(f"/proc/{pid}").st_uid != me:
                continue
        except OSError:
            continue
        marks = _dead_runner(pid)
        if marks is None:
            continue
        if kill_verified(pid, lambda p, marks=marks: _dead_runner(p) == marks):
            done["processes"].append(pid)


def kill_verified(pid: int, still_ours) -> bool:
    """SIGKILL ``pid`` if ``still_ours(pid)`` holds while a handle on it is held (a pidfd, else its start
    time read again: see ``procs``)."""
    ticks = start_ticks(pid)
    if ticks is None:
        return False
    fd = None
    if _caps.has_pidfd():
        try:
            fd = os.pidfd_open(pid)
        except OSError:
            return False
    try:
        if start_ticks(pid) != ticks or not still_ours(pid):
            return False
        if fd is not None:
            signal.pidfd_send_signal(fd, signal.SIGKILL)
        elif start_ticks(pid) == ticks:
            os.kill(pid, signal.SIGKILL)
        else:
            return False
        return True
    except OSError:
        return False
    finally:
        if fd is not None:
            os.close(fd)


def _prefixed(folder: str, prefix: str) -> list:
    """The paths of the entries of ``folder`` whose names start with ``prefix`` ([] if it cannot be read)."""
    try:
        return [os.path.join(folder, n) for n in os.listdir(folder) if n.startswith(prefix)]
    except OSError:
        return []


def _clean_run_dirs(tmp: str, done: dict) -> None:
    for path in _prefixed(tmp, RUN_DIR_PREFIX):
        try:
            st = os.lstat(path)
        except OSError:
            continue
        if not os.path.isdir(path) or os.path.islink(path) or st.st_uid != os.getuid():
            continue
        owner = _rd.read_json(os.path.join(path, _rd.RUNNER))
        if not isinstance(owner, dict) or runner_alive(owner.get("pid"), owner.get("start_ticks")):
            continue
        done["processes"].extend(_kill_marked(path))
        elsewhere = remove_run_dir(path)
        if elsewhere is not None:
            done["tmp_dirs"].append(elsewhere)
        done["run_dirs"].append(path)


def _kill_marked(run_dir: str) -> list:
    """SIGKILL every live process whose environment names ``run_dir``: verified by a handle, as a run's."""
    procs = _procs.RunProcesses(run_dir, None)
    procs.sweep()
    living = procs.living()
    for proc in living:
        procs.send(proc, signal.SIGKILL)
    procs.close()
    return [p.pid for p in living]


def _clean_cgroups(done: dict) -> None:
    for controller in ("memory", "pids"):
        version, parent = own_cgroup(controller)
        if version is None:
            continue
        try:
            names = os.listdir(parent)
        except OSError:
            continue
        for name in names:
            m = _NAME.match(name)
            if not m or runner_alive(int(m.group(1)), int(m.group(2))):
                continue
            path = os.path.join(parent, name)
            _kill_group(path)
            try:
                os.rmdir(path)
                done["cgroups"].append(path)
            except OSError:
                pass


def _kill_group(path: str) -> None:
    """Kill the processes of a dead runner's group (the lab's, made for that run), then leave it empty."""
    procs_file = os.path.join(path, "cgroup.procs")

    def in_group(pid: int) -> bool:  # checked with the handle held: the same process
        return str(pid) in (read_file(procs_file) or "").split()

    for _ in range(50):
        pids = [int(x) for x in (read_file(procs_file) or "").split() if x.isdigit()]
        if not pids:
            return
        for pid in pids:
            kill_verified(pid, in_group)
        time.sleep(0.02)
