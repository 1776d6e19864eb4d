"""The session's own leftovers: files in /dev/shm and /tmp that this pytest session made and left.

A file is blamed on the session only by identity, never because it is new: ``/dev/shm`` and ``/tmp`` are
shared with every other user of the machine. The evidence, gathered while the session runs:

* the session ledger written by every Python process below the session (``_site/sitecustomize.py``):
  each process's pid and start time, each named semaphore it created (name and inode), each temporary
  file or folder it made through :mod:`tempfile` (path and inode), each with the test then running;
* the isolated runner's ledger (``LABUTILS_SHM_LEDGER``): the /dev/shm names each run created.

Every process of the session also gets the session's own temporary folder (``TMPDIR``, ``TEMP`` and
``TMP``: ``SESSION/tmp``), and every isolated run one of its own inside its run directory: xdist workers'
and notebook kernels' ``pymp-*`` and ``ipykernel_*`` folders, pytest's ``tmp_path`` folders, torchrun's
``torchelastic_*`` folders and the mkstemp files of runs stopped by their time limit go there, and are
removed with it (:meth:`Session.close`). What is left in the shared /tmp is then made by a process that
chose /tmp itself, and fails the session (:func:`failing`) just as a file in /dev/shm does.

At the end (:func:`leftovers`) an entry counts as the session's when it was not there at the start and
is still there, and: it is a recorded semaphore or temporary path with the same inode, or a name the
runner recorded as created by one of its runs, or a ``torch_<pid>_*`` segment whose ``<pid>`` is a
recorded process of the session and whose inode changed after that process started.
"""

from __future__ import annotations

import json
import os
import tempfile
import time
from dataclasses import dataclass, field
from typing import Optional

SHM = "/dev/shm"
LEDGER_ENV = "LABUTILS_SESSION_LEDGER"
RUNNER_LEDGER_ENV = "LABUTILS_SHM_LEDGER"
TMP_VARS = ("TMPDIR", "TEMP", "TMP")
SITE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "_site")


@dataclass
class Leftover:
    path: str
    pid: Optional[int] = None
    test: Optional[str] = None
    cmd: str = ""

    def line(self) -> str:
        who = f"made by pid {self.pid}" if self.pid else "made by a run of the session"
        if self.cmd:
            who += f" ({self.cmd[:80]})"
        return f"{self.path}: {who}" + (f", during {self.test}" if self.test else "")


def _entries(folder: str) -> dict:
    """``{name: inode}`` of the top-level entries of ``folder``."""
    out = {}
    try:
        with os.scandir(folder) as it:
            for entry in it:
                try:
                    out[entry.name] = entry.inode()
                except OSError:
                    continue
    except OSError:
        pass
    return out


def _read_jsonl(path: str) -> list:
    records = []
    try:
        with open(path, encoding="utf-8") as fh:
            for line in fh:
                try:
                    records.append(json.loads(line))
                except ValueError:
                    continue
    except OSError:
        pass
    return records


def _start_wall(ticks: Optional[int]) -> Optional[float]:
    if ticks is None:
        return None
    try:
        with open("/proc/stat", encoding="ascii") as fh:
            boot = next(int(ln.split()[1]) for ln in fh if ln.startswith("btime "))
        return boot + ticks / os.sysconf("SC_CLK_TCK")
    except (OSError, StopIteration, ValueError):
        return None


PREFIX = "labutils-session-"
OWNER = "owner.json"  #: the session's pytest process: pid and start ticks


def remove_dead_sessions(tmp: Optional[str] = None) -> list:
    """Remove the folders of test sessions whose pytest process is dead (killed by a signal, so its
    clean-up never ran), by the identity in their ``owner.json``; a folder without one is left alone. The
    processes its runs left are the lab's clean-up's (``LABUTILS_RUNNER``, see ``runner.ownership``)."""
    import shutil

    from labutils.runner import ownership

    tmp = tmp or tempfile.gettempdir()
    removed = []
    try:
        names = [n for n in os.listdir(tmp) if n.startswith(PREFIX)]
    except OSError:
        return removed
    ownership.clean_after_dead_runners(force=True)
    for name in names:
        path = os.path.join(tmp, name)
        try:
            with open(os.path.join(path, OWNER), encoding="utf-8") as fh:
                owner = json.load(fh)
        except (OSError, ValueError):
            continue
        if not isinstance(owner, dict) or os.lstat(path).st_uid != os.getuid():
            continue
        if not ownership.runner_alive(owner.get("pid"), owner.get("start_ticks")):
            shutil.rmtree(path, ignore_errors=True)
            removed.append(path)
    return removed


@dataclass
class Session:
    """What /dev/shm and /tmp held when the session began, and where its processes write their records."""

    folder: str
    tmp: str = field(default_factory=tempfile.gettempdir)
    before: dict = field(default_factory=dict)
    _saved: Optional[tuple] = None  # the environment environ() changed, and what it held

    @property
    def tmpdir(self) -> str:
        """The session's own temporary folder: TMPDIR of every process below the session."""
        return os.path.join(self.folder, "tmp")

    @property
    def ledger(self) -> str:
        return os.path.join(self.folder, "session.jsonl")

    @property
    def runner_ledger(self) -> str:
        return os.path.join(self.folder, "runs.jsonl")

    @classmethod
    def start(cls) -> "Session":
        remove_dead_sessions()  # before the snapshot: a killed session's folder is no leak of this one
        session = cls(folder=tempfile.mkdtemp(prefix=PREFIX))
        os.mkdir(session.tmpdir, 0o700)
        from labutils.runner import procs

        with open(os.path.join(session.folder, OWNER), "w", encoding="utf-8") as fh:
            json.dump({"pid": os.getpid(), "start_ticks": procs.start_ticks(os.getpid())}, fh)
        session.before = {SHM: _entries(SHM), session.tmp: _entries(session.tmp)}
        return session

    def environ(self, env: dict) -> dict:
        """The variables that make every process below record itself and use the session's temporary
        folder (``env`` is changed and returned; :meth:`close` puts back what it held). Given
        ``os.environ``, this process's :mod:`tempfile` reads the new folder too."""
        if self._saved is None:
            self._saved = (env, {k: env.get(k) for k in TMP_VARS})
        env.update(dict.fromkeys(TMP_VARS, self.tmpdir))
        if env is os.environ:
            tempfile.tempdir = None
        env[LEDGER_ENV] = self.ledger
        env.setdefault(RUNNER_LEDGER_ENV, self.runner_ledger)
        parts = [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p]
        if SITE not in parts:
            env["PYTHONPATH"] = os.pathsep.join([*parts, SITE])
        return env

    def leftovers(self, wait: float = 6.0) -> list:
        """The session's files still in /dev/shm and /tmp, waiting up to ``wait`` s for late unlinks (a
        resource tracker, torch's shm manager and multiprocessing finalizers remove theirs on their own)."""
        deadline = time.monotonic() + wait
        while True:
            found = self._find()
            if not found or time.monotonic() >= deadline:
                return found
            time.sleep(0.25)

    def _find(self) -> list:
        made, procs = {}, {}
        for rec in _read_jsonl(self.ledger):
            if rec.get("kind") == "process" and isinstance(rec.get("pid"), int):
                procs.setdefault(rec["pid"], []).append(rec)
            elif rec.get("kind") == "sem" and isinstance(rec.get("name"), str):
                made[os.path.join(SHM, rec["name"])] = rec
            elif rec.get("kind") == "tmp" and isinstance(rec.get("path"), str):
                made[os.path.normpath(rec["path"])] = rec
        by_runs = set()
        ledger = os.environ.get(RUNNER_LEDGER_ENV) or self.runner_ledger
        for rec in _read_jsonl(ledger) + _read_jsonl(self.runner_ledger):
            by_runs.update(n for n in rec.get("created", []) if isinstance(n, str))
        out = []
        for folder in (SHM, self.tmp):
            old = self.before.get(folder, {})
            for name, ino in _entries(folder).items():
                if old.get(name) == ino:
                    continue
                path = os.path.join(folder, name)
                if path == self.folder:
                    continue
                hit = self._blame(path, name, ino, made, procs, by_runs if folder == SHM else set())
                if hit is not None:
                    out.append(hit)
        return sorted(out, key=lambda x: x.path)

    @staticmethod
    def _blame(path, name, ino, made, procs, by_runs) -> Optional[Leftover]:
        rec = made.get(path)
        if rec is not None and rec.get("ino") in (None, ino):
            proc = (procs.get(rec.get("pid")) or [{}])[-1]
            return Leftover(path, rec.get("pid"), rec.get("test"), proc.get("cmd", ""))
        if name in by_runs:
            return Leftover(path)
        parts = name.split("_")
        if name.startswith("torch_") and len(parts) > 2 and parts[1].isdigit() and int(parts[1]) in procs:
            try:
                changed = os.stat(path).st_ctime
            except OSError:
                return None
            for proc in procs[int(parts[1])]:
                started = _start_wall(proc.get("ticks"))
                if started is not None and changed >= started - 0.05:
                    return Leftover(path, int(parts[1]), proc.get("test"), proc.get("cmd", ""))
        return None

    def close(self) -> None:
        """Remove the session's folder (its ledger and its temporary folder, with whatever its processes
        left there) and put back the temporary-folder variables :meth:`environ` changed."""
        import shutil

        if self._saved is not None:
            env, saved = self._saved
            for key, value in saved.items():
                if value is None:
                    env.pop(key, None)
                else:
                    env[key] = value
            if env is os.environ:
                tempfile.tempdir = None
            self._saved = None
        shutil.rmtree(self.folder, ignore_errors=True)


def failing(left: list) -> list:
    """The leftovers that fail the session: all of them. Each was made by one of the session's own
    processes (by identity, see :meth:`Session.leftovers`), in /dev/shm or in the shared /tmp; the
    session's and the runs' own temporary folders are removed with them, so nothing there is listed."""
    return list(left)


def watch_this_process() -> None:
    """Record this process the way ``_site/sitecustomize.py`` records every process started after it (a
    pytest with ``-n 0`` runs its tests here, and it started before the session's variables were set)."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("labutils_session_site", os.path.join(SITE, "sitecustomize.py"))
    if spec is None or spec.loader is None:
        return
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
